//! Which of the receiver's staged answers the NIC has read.
//!
//! The receiver writes each answer (its clear-to-send entries) into the sender's ring from a
//! staging ring with one place per message slot, so a slot's staged bytes may be rewritten only
//! once the NIC read the answer staged there before. For a receive that completed by the
//! sender's write-with-immediate that is certain: the sender read the answer first. A receive
//! that copied an eager message completes without the sender, and the next receive of its slot,
//! a ring later, may come before the NIC read the answer. A send queue completes in order, so a
//! signaled write's completion says that every write posted before it on that QP was read: the
//! glue numbers the writes it posts into the sender's ring (answers and credits, on the one QP
//! of a connection that copies eager messages) and records, per slot, the write of the answer
//! staged there.

use super::SLOTS;

/// A write into the sender's ring, numbered in posting order.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RingWrite {
    /// Its number: 0 for the connection's first.
    pub index: u64,
    /// Whether it is signaled (its completion is polled).
    pub signaled: bool,
}

/// What restaging a slot waits for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Restage {
    /// Its answer was read (or it has none): the slot may be staged again.
    Free,
    /// A signaled write posted with or after its answer is in flight: its completion frees it.
    Reading,
    /// No signaled write follows its answer: one must be posted (a fence) before it frees.
    Unfenced,
}

/// The writes into the sender's ring and which of them the NIC read.
#[derive(Debug)]
pub struct AnswerReads {
    signal_every: u64,
    /// Writes numbered so far.
    posted: u64,
    /// Every write numbered below this was read.
    read_before: u64,
    /// The latest signaled write's number + 1 (0: none).
    signaled_before: u64,
    /// Per slot, the number + 1 of the write of the answer staged there (0: none).
    staged: [u64; SLOTS],
}

impl AnswerReads {
    /// Writes of which every `signal_every`th is signaled, so that the send queue drains.
    pub fn new(signal_every: u64) -> Self {
        Self {
            signal_every: signal_every.max(1),
            posted: 0,
            read_before: 0,
            signaled_before: 0,
            staged: [0; SLOTS],
        }
    }

    /// Whether no write was numbered yet.
    pub fn none_posted(&self) -> bool {
        self.posted == 0
    }

    /// Number the next write.
    pub fn post(&mut self) -> RingWrite {
        let signaled = self.posted.is_multiple_of(self.signal_every);
        self.number(signaled)
    }

    /// Number the next write, signaled: a fence whose completion says every write before it
    /// was read.
    pub fn post_signaled(&mut self) -> RingWrite {
        self.number(true)
    }

    fn number(&mut self, signaled: bool) -> RingWrite {
        let index = self.posted;
        self.posted += 1;
        if signaled {
            self.signaled_before = index + 1;
        }
        RingWrite { index, signaled }
    }

    /// Number the write of the answer staged in `slot` (also when a repair writes it again),
    /// and record it as that slot's.
    pub fn post_answer(&mut self, slot: usize) -> RingWrite {
        let write = self.post();
        if let Some(s) = self.staged.get_mut(slot) {
            *s = write.index + 1;
        }
        write
    }

    /// Signaled write `index` completed: it and every write before it were read.
    pub fn completed(&mut self, index: u64) {
        self.read_before = self.read_before.max(index + 1);
    }

    /// The QP was replaced: signaled writes still in flight on the old one never complete
    /// (the repair writes the answers again, numbered anew).
    pub fn lost_in_flight(&mut self) {
        self.signaled_before = self.signaled_before.min(self.read_before);
    }

    /// What staging `slot` again waits for.
    pub fn restage(&self, slot: usize) -> Restage {
        let answer = self.staged.get(slot).copied().unwrap_or(0);
        if answer <= self.read_before {
            Restage::Free
        } else if self.signaled_before >= answer {
            Restage::Reading
        } else {
            Restage::Unfenced
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nth_write_is_signaled_and_numbers_run_in_posting_order() {
        let mut reads = AnswerReads::new(4);
        let writes: Vec<RingWrite> = (0..9).map(|_| reads.post()).collect();
        let signaled: Vec<u64> = writes
            .iter()
            .filter(|w| w.signaled)
            .map(|w| w.index)
            .collect();
        assert_eq!(signaled, [0, 4, 8]);
        assert_eq!(writes.last().map(|w| w.index), Some(8));
    }

    #[test]
    fn a_slot_frees_when_a_signaled_write_at_or_after_its_answer_completes() {
        let mut reads = AnswerReads::new(4);
        assert_eq!(reads.restage(3), Restage::Free, "nothing staged yet");
        reads.post(); // 0, signaled
        let answer = reads.post_answer(3); // 1
        assert!(!answer.signaled);
        assert_eq!(
            reads.restage(3),
            Restage::Unfenced,
            "no signaled write after it"
        );
        reads.post(); // 2
        reads.post(); // 3
        let later = reads.post(); // 4, signaled
        assert!(later.signaled);
        assert_eq!(reads.restage(3), Restage::Reading);
        reads.completed(0);
        assert_eq!(
            reads.restage(3),
            Restage::Reading,
            "a signaled write before it says nothing"
        );
        reads.completed(later.index);
        assert_eq!(reads.restage(3), Restage::Free);
        assert_eq!(
            reads.restage(4),
            Restage::Free,
            "other slots were free all along"
        );
    }

    #[test]
    fn a_fence_reads_an_unfenced_answer_and_its_own_write_counts_too() {
        let mut reads = AnswerReads::new(8);
        reads.post();
        reads.post_answer(0); // 1
        let fence = reads.post_signaled();
        assert!(fence.signaled);
        assert_eq!(reads.restage(0), Restage::Reading);
        reads.completed(fence.index);
        assert_eq!(reads.restage(0), Restage::Free);
        // A signaled answer is its own proof.
        for _ in 3..8 {
            reads.post();
        }
        let signaled = reads.post_answer(1); // 8
        assert!(signaled.signaled);
        assert_eq!(reads.restage(1), Restage::Reading);
        reads.completed(signaled.index);
        assert_eq!(reads.restage(1), Restage::Free);
    }

    #[test]
    fn after_a_replaced_qp_only_writes_on_the_new_one_free_a_slot() {
        let mut reads = AnswerReads::new(1);
        reads.post_answer(5); // 0, signaled, lost with the old QP
        assert_eq!(reads.restage(5), Restage::Reading);
        reads.lost_in_flight();
        assert_eq!(
            reads.restage(5),
            Restage::Unfenced,
            "its completion never comes"
        );
        // The repair writes the answer again.
        let again = reads.post_answer(5);
        assert_eq!(reads.restage(5), Restage::Reading);
        reads.completed(again.index);
        assert_eq!(reads.restage(5), Restage::Free);
    }
}
