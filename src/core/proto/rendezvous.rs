//! A message whose clear-to-send the sender captured: its entries and the sends matched to
//! them.

use super::send::DETACHED;
use super::*;

/// A message whose CTS the sender captured. One per slot, reused: a message's CTS is copied
/// into it in place, never built and moved (over 1 KiB with eight entries), and starting over
/// clears two masks, not the matched sends.
#[derive(Copy, Clone, Debug, Default)]
pub(super) struct Rendezvous {
    pub(super) cts: Group<Cts>,
    /// The send matched to each entry, with its request: valid where `matched` has the bit.
    pub(super) sends: [(SendBuf, usize); MAX_RECVS],
    /// Entries matched to a send (bit `i` for entry `i`).
    pub(super) matched: u8,
    /// Entries NCCL saw done.
    pub(super) tested: u8,
    pub(super) pending: usize,
    pub(super) posted: bool,
}

/// The mask of the first `n` entries.
pub(super) fn entries_mask(n: usize) -> u8 {
    u8::try_from((1u16 << n) - 1).unwrap_or(u8::MAX)
}

impl Rendezvous {
    /// Start over for the message whose CTS entries are `cts`.
    pub(super) fn reset(&mut self, cts: &[Cts]) {
        self.cts.clear();
        for c in cts {
            self.cts.push(*c);
        }
        self.matched = 0;
        self.tested = 0;
        self.pending = 0;
        self.posted = false;
    }

    pub(super) fn all_matched(&self) -> bool {
        self.matched == entries_mask(self.cts.len())
    }

    /// The first unmatched entry with `tag`.
    pub(super) fn free_entry(&self, tag: i32) -> Option<usize> {
        (0..self.cts.len()).find(|&i| self.matched & (1 << i) == 0 && self.cts[i].tag == tag)
    }

    /// The matched sends, with their entries.
    pub(super) fn matched_sends(&self) -> impl Iterator<Item = (usize, &(SendBuf, usize))> {
        (0..self.cts.len())
            .filter(|&i| self.matched & (1 << i) != 0)
            .map(|i| (i, &self.sends[i]))
    }

    /// The entry request `req`'s send was matched to.
    pub(super) fn entry_of(&self, req: usize) -> Option<usize> {
        self.matched_sends()
            .find(|(_, (_, q))| *q == req)
            .map(|(e, _)| e)
    }

    /// Match `buf` (request `req`) to unmatched entry `entry` (of its tag), clamped to the
    /// entry's size; returns `(requested, delivered)` when truncated.
    #[inline(always)]
    pub(super) fn take_entry(
        &mut self,
        entry: usize,
        buf: SendBuf,
        req: usize,
    ) -> Option<(u64, u64)> {
        let capacity = self.cts[entry].size;
        let truncated = (buf.size > capacity).then_some((buf.size, capacity));
        let clamped = SendBuf {
            size: buf.size.min(capacity),
            ..buf
        };
        self.sends[entry] = (clamped, req);
        self.matched |= 1 << entry;
        if req == DETACHED {
            // NCCL saw this send done already.
            self.tested |= 1 << entry;
        }
        truncated
    }

    /// Match `buf` to the first unmatched entry with its tag; returns the entry and
    /// `(requested, delivered)` when truncated.
    pub(super) fn take(&mut self, buf: SendBuf, req: usize) -> Option<(usize, Option<(u64, u64)>)> {
        let entry = self.free_entry(buf.tag)?;
        Some((entry, self.take_entry(entry, buf, req)))
    }
}
