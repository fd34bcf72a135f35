//! The receiver-driven RDMA-write protocol, without I/O.
//!
//! The receiver posts buffers ([`RecvSide::irecv`]): the glue posts one receive WQE on every QP
//! the message will use, then RDMA-writes the returned [`Cts`] entries into the sender's CTS ring
//! at the message's slot. The sender reads that slot ([`SendSide::wants_cts`],
//! [`SendSide::handle_cts`]), matches each `isend` to an entry by tag ([`SendSide::isend`]), and
//! once every entry of the slot is matched returns the [`Post`]s: RDMA writes of the payload,
//! clamped to the posted size, ending with one write-with-immediate per QP used. The receiver
//! counts those completions ([`RecvSide::handle_completion`]); for a single buffer the immediates
//! add up to the received size, for a grouped receive the sender also writes the sizes into the
//! receiver's sizes ring ([`Post::Sizes`]). NCCL's usual send, into a single receive whose CTS
//! is already there and that one write carries, takes both sender steps at once
//! ([`SendSide::isend_single`]), with the same outcome.
//!
//! Message `seq` lives in slot `seq % SLOTS` on both sides and uses the QPs
//! [`Layout::qps_for`]`(seq, capacity)`, where both sides know the capacity from the CTS; completions on one QP arrive in posting order, so each side keeps,
//! per QP, the queue of messages whose completion it expects next.
//!
//! A small send from host memory may go before its CTS, eagerly, into the receiver's bounce
//! ring; [`super::eager`] gives the rules, [`SendSide`] and [`RecvSide`] keep both paths.
//!
//! Quiet receives ([`Layout::quiet`], both hellos offer them): while the sender's messages
//! come eagerly, a single host-memory receive writes nothing at first. The receiver posts a
//! receive quietly when the latest message arrived eagerly, and writes its CTS only when no
//! eager message took it within a while ([`RecvSide::announce_all`]; the glue keeps the time,
//! and its watcher thread calls it when the client makes no call): a message that cannot go
//! eagerly (GPU memory, too large, another tag) waits for that CTS, as any send waits for it. An
//! eager send keeps a copy of its payload in the sender's staging ring, so it completes with
//! its own write; the receiver returns bounce slots with a cumulative credit
//! ([`eager::CREDIT_EVERY`]), and a refused message is written again from the copy.
//!
//! Nothing here touches memory, verbs or the clock: addresses and keys are plain numbers.

use std::collections::VecDeque;

use super::config::MAX_FUSED_MEMBERS;
use super::eager::{self, Announced};
use super::error::{Error, Kind, Result};
use super::group::Group;
use super::wire::{Cts, MAX_RECVS};

/// Message slots per connection: receives (and grouped receives) in flight per comm.
pub const SLOTS: usize = 32;

/// Where the entries of a message's CTS lie in the sender's ring, in entries of [`Cts::LEN`]
/// bytes; both sides take it from the revision the other announced.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CtsLayout {
    /// Both sides of revision 3 or later: every slot's first entry in one array (slot `s` at
    /// entry `s`), the further entries of grouped receives behind it (`SLOTS + 7 s + i - 1`).
    /// The answers to consecutive single receives are adjacent, so a batch of them is one
    /// write.
    Dense,
    /// A peer of an older revision: a slot's entries together (`MAX_RECVS s + i`).
    Legacy,
}

impl CtsLayout {
    /// The layout of a connection whose peer announced data-path revision `peer_revision`.
    pub fn with_peer(peer_revision: u8) -> Self {
        if peer_revision >= 3 {
            Self::Dense
        } else {
            Self::Legacy
        }
    }

    /// Byte offset of entry `entry` of slot `slot` in the ring.
    pub fn offset(self, slot: usize, entry: usize) -> usize {
        let index = match (self, entry) {
            (Self::Dense, 0) => slot,
            (Self::Dense, _) => SLOTS + (MAX_RECVS - 1) * slot + entry - 1,
            (Self::Legacy, _) => MAX_RECVS * slot + entry,
        };
        index * Cts::LEN
    }
}

/// Payload split granularity: LL/LL128 lines must never be split across QPs.
const CHUNK_ALIGN: u64 = 128;

/// Receives of at least this many bytes are striped over every member of a fused connection
/// (one QP per member); smaller ones go whole over one QP, rotating by message.
pub const STRIPE_MIN_BYTES: u64 = 64 * 1024;

/// Largest message one `isend` may carry and one receive buffer may hold: `maxP2pBytes` and
/// `maxCollBytes` as the v9+ properties advertise them.
pub const MAX_MESSAGE_BYTES: u64 = 4 << 30;

/// Largest RDMA write the protocol posts: mlx5 devices report a `max_msg_sz` of 1 GiB, so
/// longer chunks go as several writes.
pub const MAX_WRITE_BYTES: u64 = 1 << 30;

/// Writes one buffer's chunk on one QP may take.
pub const WRITES_PER_CHUNK: usize = (MAX_MESSAGE_BYTES / MAX_WRITE_BYTES) as usize;

/// Most work requests one message posts on one QP: every buffer's writes, the sizes write and
/// the closing write-with-immediate.
pub const POSTS_PER_MESSAGE: usize = MAX_RECVS * WRITES_PER_CHUNK + 2;

/// Refuse a message or buffer larger than [`MAX_MESSAGE_BYTES`], naming both sizes.
///
/// # Errors
/// `Misuse` (NCCL never passes more than the `maxP2pBytes` it was told).
#[inline(always)]
pub fn check_message_size(size: u64, what: &str) -> Result<()> {
    if size > MAX_MESSAGE_BYTES {
        return Err(too_large(size, what));
    }
    Ok(())
}

/// [`check_message_size`]'s error, out of line: every `isend` and `irecv` makes the check.
#[cold]
fn too_large(size: u64, what: &str) -> Error {
    Error::misuse(format!(
        "{what} of {size} bytes is larger than the {MAX_MESSAGE_BYTES} bytes this plugin \
         advertises as maxP2pBytes"
    ))
}

/// How a connection spreads messages over its QPs. QP `i` lives on local member
/// `i % local_members` and is connected to the peer's member `i % remote_members`, so `rails()`
/// consecutive QPs cover every member on both sides.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// QPs in the connection: `rails() * NCCL_IB_QPS_PER_CONNECTION`.
    pub nqps: usize,
    /// Split every message over all QPs (`NCCL_IB_SPLIT_DATA_ON_QPS=1`) instead of rotating.
    pub split: bool,
    /// Ports of this side's (fused) device.
    pub local_members: usize,
    /// Ports of the peer's device.
    pub remote_members: usize,
    /// Largest message the eager path carries on this connection; 0 when it is not used (either
    /// side's knob is 0, the peer predates it, or the connection has more than one QP).
    pub eager_bytes: u64,
    /// Receives may stay quiet (both hellos offer it, eager path in use): see [`RecvSide`].
    pub quiet: bool,
    /// Slots of the receiver's bounce ring, a power of two of at most [`SLOTS`]
    /// ([`eager::agreed_bounce_slots`]): eager message `seq` lands in slot `seq % bounce_slots`.
    pub bounce_slots: usize,
}

impl Layout {
    /// A connection between two single-port devices.
    pub fn single(nqps: usize, split: bool) -> Self {
        Self {
            nqps,
            split,
            local_members: 1,
            remote_members: 1,
            eager_bytes: 0,
            quiet: false,
            bounce_slots: SLOTS,
        }
    }

    /// The bounce slot eager message `seq` lands in.
    pub fn bounce_slot(&self, seq: u64) -> usize {
        usize::try_from(seq % self.bounce_slots.max(1) as u64).unwrap_or(0)
    }

    /// Whether a message's sizes travel in the receiver's sizes ring instead of the immediates:
    /// for grouped receives, and for single buffers whose size may not fit the immediate (32
    /// bits, or 31 where the eager path claims the top bit). Both sides decide from the CTS (`n`
    /// and the capacity) and the layout they agreed on, so they agree.
    pub fn uses_sizes_ring(&self, n: usize, capacity: u64) -> bool {
        let limit = if self.eager_bytes > 0 {
            eager::MAX_RENDEZVOUS_IMM
        } else {
            u64::from(u32::MAX)
        };
        n > 1 || capacity > limit
    }

    /// Members of the larger side: QPs come in groups of this many.
    pub fn rails(&self) -> usize {
        self.local_members.max(self.remote_members)
    }

    /// The local member QP `qp` lives on.
    pub fn local_member(&self, qp: usize) -> usize {
        member_of(qp, self.local_members)
    }

    /// The peer's member QP `qp` is connected to.
    pub fn remote_member(&self, qp: usize) -> usize {
        member_of(qp, self.remote_members)
    }

    /// The QPs message `seq`, whose receive buffers hold `capacity` bytes, uses, in order.
    #[inline(always)]
    pub fn qps_for(&self, seq: u64, capacity: u64) -> std::ops::Range<usize> {
        if self.split || self.nqps == 1 {
            return 0..self.nqps;
        }
        let rails = self.rails();
        if rails > 1 && capacity >= STRIPE_MIN_BYTES {
            let groups = (self.nqps / rails).max(1) as u64;
            let g = usize::try_from(seq % groups).unwrap_or(0) * rails;
            return g..g + rails;
        }
        let q = usize::try_from(seq % self.nqps as u64).unwrap_or(0);
        q..q + 1
    }

    /// The part `(offset, len)` of a `size`-byte payload carried by the `pos`-th of `used` QPs.
    pub fn chunk(size: u64, pos: usize, used: usize) -> (u64, u64) {
        if used <= 1 {
            return (0, size);
        }
        let per_qp = size.div_ceil(used as u64).div_ceil(CHUNK_ALIGN) * CHUNK_ALIGN;
        let offset = (per_qp * pos as u64).min(size);
        (offset, per_qp.min(size - offset))
    }
}

/// Bytes a (grouped) receive can take: what both sides pass to [`Layout::qps_for`], the
/// receiver from its buffers and the sender from the CTS entries, so they pick the same QPs.
fn capacity(sizes: impl Iterator<Item = u64>) -> u64 {
    sizes.fold(0, u64::saturating_add)
}

/// `qp % members`, without the division for a single member (every connection of an unfused
/// device): the data path asks for every message's keys, and a division costs tens of cycles
/// (a helper call under emulation).
fn member_of(qp: usize, members: usize) -> usize {
    if members == 1 { 0 } else { qp % members }
}

fn slot_of(seq: u64) -> usize {
    usize::try_from(seq % SLOTS as u64).unwrap_or(0)
}

/// Whether an eager message of `size` bytes for `tag` is copied into receive buffer `b`: only
/// whole. A larger message goes again by rendezvous and is truncated there, as any send; so a
/// copied message delivered every byte, which the sender knows without reading the answer
/// (the receiver may overwrite it first, see [`SendSide::handle_cts`]).
fn fits(size: u64, b: &RecvBuf, tag: i32) -> bool {
    b.tag == tag && size <= b.size
}

mod answers;
mod posts;
mod recv;
mod rendezvous;
mod send;

pub use answers::*;
pub use posts::*;
pub use recv::*;
pub use send::*;

#[cfg(test)]
mod sim;

#[cfg(test)]
mod layout_tests {
    use super::*;

    #[test]
    fn every_entry_of_every_slot_has_its_own_place_in_the_ring() {
        for layout in [CtsLayout::Dense, CtsLayout::Legacy] {
            let mut seen = std::collections::HashSet::new();
            for slot in 0..SLOTS {
                for entry in 0..MAX_RECVS {
                    let at = layout.offset(slot, entry);
                    assert!(at + Cts::LEN <= SLOTS * MAX_RECVS * Cts::LEN, "{layout:?}");
                    assert!(seen.insert(at), "{layout:?} slot {slot} entry {entry}");
                }
            }
        }
    }

    /// What makes a batch of answers one write: consecutive single receives' entries touch,
    /// and a grouped receive's further entries follow each other.
    #[test]
    fn dense_answers_to_consecutive_slots_are_adjacent() {
        let dense = CtsLayout::Dense;
        for slot in 1..SLOTS {
            assert_eq!(dense.offset(slot, 0), dense.offset(slot - 1, 0) + Cts::LEN);
        }
        for entry in 2..MAX_RECVS {
            assert_eq!(
                dense.offset(5, entry),
                dense.offset(5, entry - 1) + Cts::LEN
            );
        }
        assert_eq!(
            CtsLayout::Legacy.offset(3, 1),
            (3 * MAX_RECVS + 1) * Cts::LEN
        );
        assert_eq!(CtsLayout::with_peer(2), CtsLayout::Legacy);
        assert_eq!(CtsLayout::with_peer(0), CtsLayout::Legacy);
        assert_eq!(CtsLayout::with_peer(3), CtsLayout::Dense);
    }
}
