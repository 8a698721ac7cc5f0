//! A VM's link as the bridge holds it: one at a time, watched.
//!
//! Over the serial transport the bridge ends with its link (the VMM exited, the guest
//! broke the protocol): nothing reconnects. Over vsock, Firecracker itself resets every
//! vsock connection whenever it writes a snapshot — the VM goes on, its link does not
//! — so the bridge links again, to the recorded VMM only: each attempt a new
//! connection verified as the first was (path, peer process, socket table), the same
//! activation sent, `ready` awaited. It exits as soon as the VMM is gone or not the
//! recorded process, or the guest breaks the protocol. Worker connections of the old
//! link end with it; the worker connects again, and is verified again, as after any
//! dropped connection.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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

/// Watches `shared`: when its link ends, exits this process — or, with `relink` (the
/// vsock transport), links again as the module says.
pub fn watch(shared: Arc<SharedLink>, spec: BridgeSpec, relink: bool) {
    let _ = std::thread::Builder::new()
        .name("link-watch".into())
        .stack_size(128 * 1024)
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(100));
                let Some(why) = shared.get().dead() else {
                    continue;
                };
                if !relink {
                    eprintln!("spaced-host: the guest link ended ({why}); exiting");
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
