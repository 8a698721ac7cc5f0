//! A VM's link as the bridge holds it: one at a time, watched.
//!
//! Over the serial transport, and QEMU's vhost-vsock (which resets connections only
//! on the restored side of a snapshot, never on the VM that goes on), the bridge ends
//! with its link (the VMM exited, the guest broke the protocol): nothing reconnects. Over vsock, Firecracker itself resets every
//! vsock connection whenever it writes a snapshot — the VM goes on, its link does not
//! — so the bridge links again, to the recorded VMM only: each attempt a new
//! connection verified as the first was (path, peer process, socket table), the same
//! activation sent, `ready` awaited. It links again only after an end that looks like
//! the VMM's reset — the transport's end of file, a reset or a broken pipe
//! ([`Link::ended_by_transport`]) — and at most [`MAX_RELINKS`] times in
//! [`RELINK_WINDOW`]. It exits as soon as the VMM is gone or not the recorded process,
//! or the guest breaks the protocol (a malformed frame, a stream past its credit, a
//! stalled write), or the relinks come too often. Worker connections of the old
//! link end with it; the worker connects again, and is verified again, as after any
//! dropped connection.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use space_mux::Link;

use crate::error::BridgeError;
use crate::spec::BridgeSpec;

/// The bridge's current link.
#[derive(Debug)]
pub struct SharedLink {
    current: Mutex<Link>,
}

impl SharedLink {
    /// Holds `link`.
    pub fn new(link: Link) -> Arc<Self> {
        Arc::new(Self {
            current: Mutex::new(link),
        })
    }

    /// The current link.
    pub fn get(&self) -> Link {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn replace(&self, link: Link) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = link;
    }
}

/// Pause between two attempts to link again.
const RELINK_PAUSE: Duration = Duration::from_secs(1);
/// The most links made again within [`RELINK_WINDOW`] (a snapshot each: far more than
/// a worker takes); one more and the bridge exits.
pub const MAX_RELINKS: usize = 8;
/// See [`MAX_RELINKS`].
pub const RELINK_WINDOW: Duration = Duration::from_secs(60);

/// Whether a link that ended (`by_transport`: as a VMM's reset ends it) may be made
/// again, given the times of the earlier relinks (kept to [`RELINK_WINDOW`]); records
/// this one if so.
fn may_relink(by_transport: bool, earlier: &mut VecDeque<Instant>, now: Instant) -> bool {
    if !by_transport {
        return false;
    }
    while earlier
        .front()
        .is_some_and(|t| now.duration_since(*t) > RELINK_WINDOW)
    {
        earlier.pop_front();
    }
    if earlier.len() >= MAX_RELINKS {
        return false;
    }
    earlier.push_back(now);
    true
}

/// Watches `shared`: when its link ends, exits this process — or, with `relink` (the
/// vsock transport), links again as the module says.
pub fn watch(shared: Arc<SharedLink>, spec: BridgeSpec, relink: bool) {
    let _ = std::thread::Builder::new()
        .name("link-watch".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            let mut relinked = VecDeque::new();
            loop {
                std::thread::sleep(Duration::from_millis(100));
                let link = shared.get();
                let Some(why) = link.dead() else {
                    continue;
                };
                if !relink {
                    eprintln!("spaced-host: the guest link ended ({why}); exiting");
                    std::process::exit(3);
                }
                if !may_relink(link.ended_by_transport(), &mut relinked, Instant::now()) {
                    eprintln!(
                        "spaced-host: the guest link ended ({why}), not as a VMM's reset \
                         does or too often; exiting"
                    );
                    std::process::exit(3);
                }
                eprintln!("spaced-host: the guest link ended ({why}); linking again");
                match link_again(&spec) {
                    Ok(link) => shared.replace(link),
                    Err(e) => {
                        eprintln!("spaced-host: no new link ({e}); exiting");
                        std::process::exit(3);
                    }
                }
            }
        });
}

/// A new vsock link to the recorded VMM, tried while it runs (a VM paused for its
/// snapshot answers once resumed); refusals other than "not yet" end the tries.
fn link_again(spec: &BridgeSpec) -> Result<Link, BridgeError> {
    loop {
        crate::serial::check_vmm(spec)?;
        match crate::vsock::connect_agent(spec, crate::serial::READY_WAIT) {
            Ok(link) => return Ok(link),
            Err(e @ (BridgeError::Transport(_) | BridgeError::Handshake(_))) => return Err(e),
            Err(e) => {
                eprintln!("spaced-host: linking again: {e}");
                std::thread::sleep(RELINK_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_transports_end_is_relinked_and_only_so_often() {
        let mut earlier = VecDeque::new();
        let t0 = Instant::now();
        assert!(!may_relink(false, &mut earlier, t0));
        for i in 0..MAX_RELINKS {
            assert!(may_relink(
                true,
                &mut earlier,
                t0 + Duration::from_secs(i as u64)
            ));
        }
        assert!(!may_relink(true, &mut earlier, t0 + Duration::from_secs(9)));
        // Once the window has passed, again.
        assert!(may_relink(
            true,
            &mut earlier,
            t0 + RELINK_WINDOW + Duration::from_secs(MAX_RELINKS as u64)
        ));
    }
}
