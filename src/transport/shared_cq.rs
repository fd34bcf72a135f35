//! CQs shared by the comms of a process: each member port keeps a few CQs that the QPs of every
//! comm on it complete on, so a comm creates and destroys no CQ of its own (on rxe each CQ is a
//! kernel queue mapped into the process and unmapped at close, on mlx5 pinned memory), and one
//! poll serves every comm on the CQ.
//!
//! A comm reserves room on one CQ per member for everything its QPs there may have
//! outstanding (what its own CQ was sized for), so a shared CQ never overflows. Its QPs are
//! adopted by QP number: whichever comm polls hands each completion to its QP's comm, which
//! takes it at its next poll. A comm takes what others found for it before it polls, both under
//! the CQ's lock, so its completions keep their order.
//!
//! QP numbers are unique among a device's live QPs, and providers hand a destroyed QP's number
//! out again only much later (rxe cycles through its whole range, mlx5 cleans a destroyed QP's
//! entries from its CQ): a completion of a QP no comm owns any more is dropped.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::core::error::Result;
use crate::verbs::{Completion, CompletionQueue, Device};

/// Entries of a port's first CQ; each later one has twice the slots of the one before, up to
/// [`MOST_ENTRIES`]: a process with one comm keeps a small CQ, one with thousands a few large.
/// Every size is one less than a power of two: rxe and mlx5 give a CQ the next power of two
/// above its entries in slots, so 256 entries would take 512 slots.
const FIRST_ENTRIES: u32 = 255;
/// Entries of one CQ at most (or the device's limit): 1 MiB of 64-byte slots, the room of
/// about 350 send comms of one lane.
const MOST_ENTRIES: u32 = 16_383;

/// The shared CQs of one member port.
#[derive(Debug)]
pub(super) struct CqPool {
    device: Arc<Device>,
    /// Entries of one CQ at most: [`MOST_ENTRIES`], or the device's limit where lower.
    most: u32,
    shelf: Arc<Mutex<Shelf>>,
}

/// The pool's CQs that may have room, and how large the next one is.
#[derive(Debug, Default)]
struct Shelf {
    /// CQs with room when last seen, the one to try first last.
    roomy: Vec<Weak<SharedCq>>,
    /// Entries of the latest CQ created.
    latest: u32,
}

/// One CQ shared by comms.
#[derive(Debug)]
struct SharedCq {
    cq: Arc<CompletionQueue>,
    entries: u32,
    room: Mutex<Room>,
    dispatch: Mutex<Dispatch>,
    shelf: Weak<Mutex<Shelf>>,
}

#[derive(Debug, Default)]
struct Room {
    /// Entries the comms on it reserved.
    reserved: u32,
    /// It is on the pool's shelf of CQs with room.
    shelved: bool,
}

/// A comm's room on a shared CQ: its QPs complete there.
#[derive(Debug)]
pub(super) struct CqShare {
    shared: Arc<SharedCq>,
    id: u64,
    entries: u32,
}

impl CqPool {
    /// The pool of `device`'s shared CQs.
    ///
    /// # Errors
    /// `System` when the device cannot be queried.
    pub(super) fn new(device: &Arc<Device>) -> Result<Self> {
        Ok(Self {
            device: Arc::clone(device),
            most: MOST_ENTRIES.min(device.max_cqe()?.max(1)),
            shelf: Arc::default(),
        })
    }

    /// Room for `entries` completions on one of the pool's CQs: a CQ with room, or a new one.
    ///
    /// # Errors
    /// `System` when a new CQ is needed and `ibv_create_cq` fails (even at `entries`).
    pub(super) fn share(&self, entries: u32) -> Result<CqShare> {
        let mut shelf = self.shelf.lock();
        while let Some(top) = shelf.roomy.last() {
            if let Some(shared) = top.upgrade() {
                if let Some(share) = shared.reserve(entries) {
                    return Ok(share);
                }
                shared.room.lock().shelved = false;
            }
            shelf.roomy.pop();
        }
        let wanted = next_entries(shelf.latest, entries, self.most);
        let (cq, created) = match CompletionQueue::new(&self.device, wanted) {
            Ok(cq) => (cq, wanted),
            // A large CQ may be what the memlock limit refuses: try the room alone.
            Err(_) if wanted > entries => (CompletionQueue::new(&self.device, entries)?, entries),
            Err(e) => return Err(e),
        };
        shelf.latest = created;
        let shared = Arc::new(SharedCq {
            cq,
            entries: created,
            room: Mutex::new(Room {
                reserved: 0,
                shelved: true,
            }),
            dispatch: Mutex::default(),
            shelf: Arc::downgrade(&self.shelf),
        });
        shelf.roomy.push(Arc::downgrade(&shared));
        Ok(shared
            .reserve(entries)
            .expect("a new CQ has room for what it was created for"))
    }
}

/// Entries of a pool's next CQ after one of `latest`, for a comm that needs `needed`.
fn next_entries(latest: u32, needed: u32, most: u32) -> u32 {
    latest
        .saturating_add(1)
        .saturating_mul(2)
        .saturating_sub(1)
        .clamp(FIRST_ENTRIES.min(most), most)
        .max(needed)
}

impl SharedCq {
    /// A share of `entries`, if it has room for them.
    fn reserve(self: &Arc<Self>, entries: u32) -> Option<CqShare> {
        {
            let mut room = self.room.lock();
            let reserved = room.reserved.checked_add(entries)?;
            if reserved > self.entries {
                return None;
            }
            room.reserved = reserved;
        }
        let id = self.dispatch.lock().join();
        Some(CqShare {
            shared: Arc::clone(self),
            id,
            entries,
        })
    }
}

impl CqShare {
    /// The CQ its QPs are created on.
    pub(super) fn cq(&self) -> &Arc<CompletionQueue> {
        &self.shared.cq
    }

    /// From now on the completions of QP `qpn` are this comm's.
    pub(super) fn adopt(&self, qpn: u32) {
        self.shared.dispatch.lock().adopt(self.id, qpn);
    }

    /// QP `qpn` (destroyed, or drained and about to be) is no longer this comm's.
    pub(super) fn disown(&self, qpn: u32) {
        self.shared.dispatch.lock().disown(self.id, qpn);
    }

    /// Hand each completion of this comm's QPs to `each`, in order, until the CQ is empty:
    /// first those other comms' polls found, then the CQ's; the others' wait for their comms.
    ///
    /// # Errors
    /// `System` when `ibv_poll_cq` fails, or the first error of `each` (what was polled with
    /// the completion it failed on is dropped, as the comm has failed).
    pub(super) fn poll(&self, mut each: impl FnMut(&Completion) -> Result<()>) -> Result<()> {
        loop {
            let mut mine = [Completion::default(); CompletionQueue::BATCH];
            let mut n = 0;
            let (found, polled) = {
                let mut dispatch = self.shared.dispatch.lock();
                let found = dispatch.take_found(self.id);
                let polled = self.shared.cq.poll_each(|c| {
                    if dispatch.sort(self.id, c) {
                        mine[n] = *c;
                        n += 1;
                    }
                    Ok(())
                })?;
                (found, polled)
            };
            found.iter().chain(&mine[..n]).try_for_each(&mut each)?;
            if polled < CompletionQueue::BATCH {
                return Ok(());
            }
        }
    }
}

impl Drop for CqShare {
    fn drop(&mut self) {
        self.shared.dispatch.lock().leave(self.id);
        let shelve = {
            let mut room = self.shared.room.lock();
            room.reserved -= self.entries;
            let shelve = !room.shelved && room.reserved <= self.shared.entries / 2;
            room.shelved |= shelve;
            shelve
        };
        // Back on the shelf once half empty; outside the room's lock, as `share` takes the
        // shelf's before a room's.
        if shelve && let Some(shelf) = self.shared.shelf.upgrade() {
            shelf.lock().roomy.push(Arc::downgrade(&self.shared));
        }
    }
}

/// Who owns each QP on a shared CQ, and what polls found for comms that have not taken it yet.
#[derive(Debug, Default)]
struct Dispatch {
    /// QP number to the share whose comm owns it.
    owners: HashMap<u32, u64>,
    shares: HashMap<u64, Held>,
    next_id: u64,
}

#[derive(Debug, Default)]
struct Held {
    /// Its QPs, to disown when it leaves.
    qpns: Vec<u32>,
    /// Its completions that another comm's poll found, in their order.
    found: Vec<Completion>,
}

impl Dispatch {
    /// A new share's id.
    fn join(&mut self) -> u64 {
        self.next_id += 1;
        self.shares.insert(self.next_id, Held::default());
        self.next_id
    }

    fn adopt(&mut self, id: u64, qpn: u32) {
        // A number still listed is a destroyed QP's that its comm never disowned.
        if let Some(earlier) = self.owners.insert(qpn, id)
            && let Some(held) = self.shares.get_mut(&earlier)
        {
            held.qpns.retain(|&q| q != qpn);
        }
        if let Some(held) = self.shares.get_mut(&id) {
            held.qpns.push(qpn);
        }
    }

    fn disown(&mut self, id: u64, qpn: u32) {
        if let Entry::Occupied(owner) = self.owners.entry(qpn)
            && *owner.get() == id
        {
            owner.remove();
        }
        if let Some(held) = self.shares.get_mut(&id) {
            held.qpns.retain(|&q| q != qpn);
        }
    }

    fn leave(&mut self, id: u64) {
        if let Some(held) = self.shares.remove(&id) {
            for qpn in held.qpns {
                if self.owners.get(&qpn) == Some(&id) {
                    self.owners.remove(&qpn);
                }
            }
        }
    }

    /// What other polls found for share `id`, taken.
    fn take_found(&mut self, id: u64) -> Vec<Completion> {
        self.shares
            .get_mut(&id)
            .map(|held| std::mem::take(&mut held.found))
            .unwrap_or_default()
    }

    /// Whether `c` is share `id`'s; another share's is kept for it, an unowned QP's dropped.
    fn sort(&mut self, id: u64, c: &Completion) -> bool {
        match self.owners.get(&c.qp_num) {
            Some(&owner) if owner == id => true,
            Some(owner) => {
                if let Some(held) = self.shares.get_mut(owner) {
                    held.found.push(*c);
                }
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(qp_num: u32, wr_id: u64) -> Completion {
        Completion {
            qp_num,
            wr_id,
            ..Completion::default()
        }
    }

    #[test]
    fn each_completion_goes_to_its_qps_share_in_order() {
        let mut d = Dispatch::default();
        let (a, b) = (d.join(), d.join());
        d.adopt(a, 10);
        d.adopt(b, 20);
        d.adopt(b, 21);
        // `a` polls: its own come back to it, `b`'s wait for `b` in their order.
        let mine: Vec<u64> = [(20, 1), (10, 2), (21, 3), (20, 4)]
            .into_iter()
            .map(|(q, w)| completion(q, w))
            .filter(|c| d.sort(a, c))
            .map(|c| c.wr_id)
            .collect();
        assert_eq!(mine, [2]);
        let found: Vec<u64> = d.take_found(b).iter().map(|c| c.wr_id).collect();
        assert_eq!(found, [1, 3, 4]);
        assert!(d.take_found(b).is_empty());
        assert!(d.take_found(a).is_empty());
    }

    #[test]
    fn a_qp_no_share_owns_is_dropped_and_a_reused_number_follows_its_new_owner() {
        let mut d = Dispatch::default();
        let (a, b) = (d.join(), d.join());
        d.adopt(a, 7);
        d.disown(a, 7);
        assert!(!d.sort(b, &completion(7, 1)));
        assert!(
            d.take_found(a).is_empty(),
            "a disowned QP's completion is dropped"
        );
        // `a` never disowned QP 8; its number comes back for `b`'s QP.
        d.adopt(a, 8);
        d.adopt(b, 8);
        assert!(d.sort(b, &completion(8, 2)));
        d.leave(a);
        assert!(
            d.sort(b, &completion(8, 3)),
            "`a` leaving takes no QP that is `b`'s"
        );
        d.disown(a, 8);
        assert!(d.sort(b, &completion(8, 4)), "nor does a stale disown");
    }

    #[test]
    fn what_a_leaving_share_was_owed_goes_with_it() {
        let mut d = Dispatch::default();
        let (a, b) = (d.join(), d.join());
        d.adopt(a, 1);
        d.adopt(b, 2);
        assert!(!d.sort(a, &completion(2, 9)));
        d.leave(b);
        assert!(d.take_found(b).is_empty());
        assert!(!d.sort(a, &completion(2, 10)), "its QPs are no one's");
        assert!(d.owners.len() == 1 && d.shares.len() == 1);
    }

    #[test]
    fn cqs_grow_from_small_to_the_most_fill_their_slots_and_always_fit_the_comm() {
        assert_eq!(next_entries(0, 47, MOST_ENTRIES), FIRST_ENTRIES);
        assert_eq!(next_entries(255, 47, MOST_ENTRIES), 511);
        assert_eq!(next_entries(8_191, 47, MOST_ENTRIES), MOST_ENTRIES);
        assert_eq!(next_entries(MOST_ENTRIES, 47, MOST_ENTRIES), MOST_ENTRIES);
        assert_eq!(next_entries(255, 20_000, MOST_ENTRIES), 20_000);
        // Every size fills the power of two of slots the providers round a CQ up to.
        let mut size = 0;
        while size < MOST_ENTRIES {
            size = next_entries(size, 47, MOST_ENTRIES);
            assert!((size + 1).is_power_of_two(), "{size}");
        }
        // A device whose CQs are smaller than the first size.
        assert_eq!(next_entries(0, 47, 128), 128);
    }
}
