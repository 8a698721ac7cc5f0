//! Host uid/gid ranges for the jails' user namespaces: one range of 65,536 ids per
//! live jail, never shared with another jail of this host or with host root.
//!
//! Every worker on a host (several `space up` clusters, tests running side by
//! side) draws from the same slots, so a slot is held through an exclusive `flock`
//! on `<lock dir>/<slot>` for as long as its jail lives: the kernel drops the lock
//! when the holder dies, and no other worker can take the slot meanwhile. A worker
//! that restarts and re-adopts a running jail takes its slot again
//! ([`UidRanges::hold`]).

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Mutex;

use nix::fcntl::{Flock, FlockArg};

use crate::substrate::SubstrateError;

/// Ids per range: every id an ordinary Linux system uses (`nobody` is 65534).
pub const RANGE_SIZE: u32 = 65_536;

/// First host id of slot 0 by default: above the ranges `/etc/subuid` hands out by
/// default (100000 + 65536 per user) for the first 250 users.
pub const DEFAULT_FIRST_ID: u32 = 1 << 24;

/// Slots by default: up to the end of the 32-bit id space (the last id is invalid).
pub const DEFAULT_SLOTS: u32 = ((u32::MAX - DEFAULT_FIRST_ID) / RANGE_SIZE) - 1;

/// Where the slot locks live by default (a tmpfs: locks do not outlive a boot).
pub const DEFAULT_LOCK_DIR: &str = "/run/space/userns";

/// Which host ids jails may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UidRangeConfig {
    /// First host id of slot 0.
    pub first_id: u32,
    /// Number of slots.
    pub slots: u32,
    /// Directory of the slot locks (shared by every worker of the host).
    pub lock_dir: PathBuf,
}

impl Default for UidRangeConfig {
    fn default() -> Self {
        Self {
            first_id: DEFAULT_FIRST_ID,
            slots: DEFAULT_SLOTS,
            lock_dir: PathBuf::from(DEFAULT_LOCK_DIR),
        }
    }
}

impl UidRangeConfig {
    /// Checks that every slot's range fits in the id space.
    pub fn validate(&self) -> Result<(), SubstrateError> {
        let end = u64::from(self.first_id) + u64::from(self.slots) * u64::from(RANGE_SIZE);
        if self.slots == 0 || self.first_id == 0 || end >= u64::from(u32::MAX) {
            return Err(SubstrateError::InvalidSpec(format!(
                "user namespace ranges {}+{}×{RANGE_SIZE} do not fit below 2^32-1 (or include uid 0)",
                self.first_id, self.slots
            )));
        }
        Ok(())
    }
}

/// The slots this process holds.
#[derive(Debug)]
pub struct UidRanges {
    config: UidRangeConfig,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    /// Base id → the lock keeping the slot.
    locks: HashMap<u32, Flock<File>>,
    /// Where the next search starts (spreads workers over the slots).
    next: u32,
}

impl UidRanges {
    /// Ranges under `config`; creates the lock directory (0700).
    pub fn new(config: UidRangeConfig) -> Result<Self, SubstrateError> {
        config.validate()?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.lock_dir)
            .and_then(|()| fs::set_permissions(&config.lock_dir, fs::Permissions::from_mode(0o700)))
            .map_err(|e| SubstrateError::io(format!("create {}", config.lock_dir.display()), e))?;
        let start = std::process::id() % config.slots;
        Ok(Self {
            config,
            held: Mutex::new(Held {
                locks: HashMap::new(),
                next: start,
            }),
        })
    }

    fn try_lock(&self, slot: u32) -> Result<Option<Flock<File>>, SubstrateError> {
        let path = self.config.lock_dir.join(slot.to_string());
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| SubstrateError::io(format!("open {}", path.display()), e))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
            Err((_, e)) => Err(SubstrateError::io(
                format!("lock {}", path.display()),
                e.into(),
            )),
        }
    }

    fn base_of(&self, slot: u32) -> u32 {
        self.config.first_id + slot * RANGE_SIZE
    }

    /// Takes a free slot; returns its first host id.
    pub fn allocate(&self) -> Result<u32, SubstrateError> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..self.config.slots {
            let slot = (held.next + i) % self.config.slots;
            let base = self.base_of(slot);
            if held.locks.contains_key(&base) {
                continue;
            }
            if let Some(lock) = self.try_lock(slot)? {
                held.locks.insert(base, lock);
                held.next = (slot + 1) % self.config.slots;
                return Ok(base);
            }
        }
        Err(SubstrateError::Unsupported(format!(
            "all {} user namespace ranges of this host are in use",
            self.config.slots
        )))
    }

    /// Takes the slot starting at `base` again (a re-adopted jail's); `false` when
    /// another process holds it or `base` is not a slot of this configuration.
    pub fn hold(&self, base: u32) -> Result<bool, SubstrateError> {
        let Some(offset) = base.checked_sub(self.config.first_id) else {
            return Ok(false);
        };
        let slot = offset / RANGE_SIZE;
        if offset % RANGE_SIZE != 0 || slot >= self.config.slots {
            return Ok(false);
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.locks.contains_key(&base) {
            return Ok(true);
        }
        match self.try_lock(slot)? {
            Some(lock) => {
                held.locks.insert(base, lock);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Gives the slot starting at `base` back.
    pub fn release(&self, base: u32) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        // Dropping the Flock unlocks; the lock file stays for the next holder.
        held.locks.remove(&base);
    }

    /// How many slots this process holds.
    pub fn held(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .locks
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path, slots: u32) -> UidRangeConfig {
        UidRangeConfig {
            first_id: DEFAULT_FIRST_ID,
            slots,
            lock_dir: dir.to_path_buf(),
        }
    }

    #[test]
    fn two_allocators_of_one_host_never_hand_out_the_same_range() {
        let dir = tempfile::tempdir().unwrap();
        let a = UidRanges::new(config(dir.path(), 4)).unwrap();
        let b = UidRanges::new(config(dir.path(), 4)).unwrap();
        let mut bases: Vec<u32> = (0..2).map(|_| a.allocate().unwrap()).collect();
        bases.extend((0..2).map(|_| b.allocate().unwrap()));
        let mut unique = bases.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 4, "{bases:?}");
        assert!(a.allocate().is_err() && b.allocate().is_err());
        b.release(bases[2]);
        assert_eq!(a.allocate().unwrap(), bases[2]);
        assert!(!b.hold(bases[2]).unwrap(), "a holds it now");
    }

    #[test]
    fn ranges_that_do_not_fit_the_id_space_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path(), DEFAULT_SLOTS + 2);
        assert!(c.validate().is_err());
        c.slots = DEFAULT_SLOTS;
        assert!(c.validate().is_ok());
        c.first_id = 0;
        assert!(c.validate().is_err());
    }
}
