//! Guest context IDs for QEMU's vhost-vsock VMs: host-wide unique (the kernel refuses
//! a CID another vhost-vsock device holds, `EADDRINUSE`), so each VM of this worker
//! gets one no other live VM of it holds, and a start that finds its CID taken by
//! another process of the host tries the next. Pure: no I/O, the first CID tried
//! passed in (random per driver, so that the workers of one host rarely meet).

use std::collections::BTreeMap;

/// The lowest guest CID: 0 is the hypervisor's, 1 local, 2 the host's.
pub const FIRST_GUEST_CID: u32 = 3;
/// `VMADDR_CID_ANY`: never a guest's.
pub const CID_ANY: u32 = u32::MAX;

/// Whether `cid` may be a guest's.
pub fn is_guest_cid(cid: u32) -> bool {
    cid >= FIRST_GUEST_CID && cid != CID_ANY
}

/// The CIDs this worker's live VMs hold, each with its owner (the execution's
/// directory name), and where the next search starts.
#[derive(Debug, Clone)]
pub struct CidAllocator {
    held: BTreeMap<u32, String>,
    next: u32,
}

impl CidAllocator {
    /// An allocator whose first CID tried is `start` (made a guest's if it is not).
    pub fn new(start: u32) -> Self {
        Self {
            held: BTreeMap::new(),
            next: wrap(start),
        }
    }

    /// A CID for `owner`: the first from the search's start that no VM of this worker
    /// holds, then held; the search goes on after it (a CID just given back is the
    /// last one taken again). `None` only if every guest CID is held.
    pub fn allocate(&mut self, owner: &str) -> Option<u32> {
        let mut cid = self.next;
        // Each held CID can be met once: a free one is found within that many steps.
        for _ in 0..=self.held.len() {
            if let std::collections::btree_map::Entry::Vacant(free) = self.held.entry(cid) {
                free.insert(owner.to_owned());
                self.next = wrap(cid.wrapping_add(1));
                return Some(cid);
            }
            cid = wrap(cid.wrapping_add(1));
        }
        None
    }

    /// Makes the next search start at `start` (made a guest's if it is not): after a
    /// CID another process of the host holds, somewhere it cannot guess.
    pub fn search_from(&mut self, start: u32) {
        self.next = wrap(start);
    }

    /// Holds `cid` for `owner` (a VM re-adopted after a restart); `false` if it is no
    /// guest's CID or another owner holds it.
    pub fn hold(&mut self, cid: u32, owner: &str) -> bool {
        if !is_guest_cid(cid) {
            return false;
        }
        match self.held.get(&cid) {
            Some(o) => o == owner,
            None => {
                self.held.insert(cid, owner.to_owned());
                true
            }
        }
    }

    /// Gives `cid` back, if `owner` holds it (a release of an earlier execution's, or
    /// a second one, never frees a CID another VM holds now).
    pub fn release(&mut self, cid: u32, owner: &str) {
        if self.held.get(&cid).is_some_and(|o| o == owner) {
            self.held.remove(&cid);
        }
    }
}

/// `cid` if it is a guest's, else the first guest CID (the search wraps past
/// `CID_ANY` to [`FIRST_GUEST_CID`]).
fn wrap(cid: u32) -> u32 {
    if is_guest_cid(cid) {
        cid
    } else {
        FIRST_GUEST_CID
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_cid_taken_elsewhere_the_search_goes_on_where_it_is_told() {
        let mut a = CidAllocator::new(100);
        assert_eq!(a.allocate("x"), Some(100));
        // 101 was found taken on the host: the next search starts somewhere else,
        // not at the CID after the one a watcher saw.
        a.search_from(7_000_000);
        assert_eq!(a.allocate("y"), Some(7_000_000));
        // Past the last CID it wraps to the first guest CID; a held one is skipped.
        a.search_from(u32::MAX);
        assert_eq!(a.allocate("z"), Some(FIRST_GUEST_CID));
        a.search_from(100);
        assert_eq!(a.allocate("w"), Some(101));
    }

    #[test]
    fn reserved_context_ids_are_never_given_out() {
        for start in [0, 1, 2, CID_ANY] {
            let mut a = CidAllocator::new(start);
            assert_eq!(a.allocate("x"), Some(FIRST_GUEST_CID), "{start}");
        }
        // The search wraps past VMADDR_CID_ANY, never onto it.
        let mut a = CidAllocator::new(CID_ANY - 1);
        assert_eq!(a.allocate("a"), Some(CID_ANY - 1));
        assert_eq!(a.allocate("b"), Some(FIRST_GUEST_CID));
        for cid in [0, 1, 2, CID_ANY] {
            assert!(!is_guest_cid(cid));
            assert!(!a.hold(cid, "c"), "{cid}");
        }
    }

    #[test]
    fn a_context_id_held_by_a_live_vm_is_not_given_to_another() {
        let mut a = CidAllocator::new(10);
        assert!(a.hold(11, "readopted"));
        assert_eq!(a.allocate("a"), Some(10));
        // 11 is the re-adopted VM's: skipped.
        assert_eq!(a.allocate("b"), Some(12));
        assert_eq!(a.held.len(), 3);
        assert!(!a.hold(12, "other"), "a second owner of 12");
        assert!(a.hold(12, "b"), "its own owner again");
    }

    #[test]
    fn a_released_context_id_is_taken_again_only_after_the_others() {
        let mut a = CidAllocator::new(3);
        let first = a.allocate("a").unwrap();
        a.release(first, "a");
        // The search goes on after it: a CID whose guest just went is not the next.
        assert_eq!(a.allocate("b"), Some(first + 1));
        // A CID taken by another process of the host (its start failed): given back,
        // the next start gets another.
        let taken = a.allocate("c").unwrap();
        a.release(taken, "c");
        assert_ne!(a.allocate("c"), Some(taken));
    }

    #[test]
    fn a_release_by_an_earlier_owner_does_not_free_a_context_id_held_now() {
        let mut a = CidAllocator::new(3);
        let cid = a.allocate("old").unwrap();
        a.release(cid, "old");
        assert!(a.hold(cid, "new"));
        // The old execution's destroy, run again.
        a.release(cid, "old");
        assert!(!a.hold(cid, "third"), "the new VM's CID was freed");
    }

    #[test]
    fn nothing_is_given_out_when_every_candidate_is_held() {
        let mut a = CidAllocator::new(5);
        // A full table cannot be built in a test (2^32 - 4 CIDs); the search is
        // bounded by the held count, so a table of held CIDs around the start is
        // stepped over and the first free one after them found.
        for cid in 5..105 {
            assert!(a.hold(cid, "x"));
        }
        assert_eq!(a.allocate("y"), Some(105));
    }
}
