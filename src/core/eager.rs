//! The eager path's wire rules: how an eager message announces itself in the immediate, the
//! header it leaves in the receiver's bounce ring, and how the receiver's writes into the CTS
//! ring answer it.
//!
//! A sender whose next message has no clear-to-send yet may write a small payload from host
//! memory, for the tag the previous receive expected, straight into the receiver's bounce ring
//! (message `seq` in bounce slot `seq % B`, B a power of two of at most [`SLOTS`] agreed in
//! the handshake, see [`agreed_bounce_slots`]: the credits travel with the CTS traffic). A
//! bounce slot is written again only once the receiver has shown that it read the message in
//! it: by an acknowledgement of it or of a later eager message (written after the copy, and the
//! receiver handles arrivals in order), by the CTS of a receive at least a ring of [`SLOTS`]
//! later (receives are posted in order, and one is posted only after the receive a ring before
//! it, in its message slot, completed), by a CTS that says how far the receiver has read
//! ([`read_through`], on a ring of fewer slots than [`SLOTS`]), or by a credit past it. A
//! promise or a refusal shows nothing of the kind: the receiver reads the slot when it handles
//! the arrival, which can be after the sender's own write completed. Each eager message is answered by exactly one write the receiver makes
//! anyway, in the message's CTS slot:
//! - its receive was posted after the message landed: an acknowledgement ([`ack`]) once the
//!   message was copied into the posted buffer;
//! - its receive was posted first: the receive's CTS. A plain CTS of a single receive promises
//!   the copy of an eager message with its tag that fits it; a CTS flagged [`REFUSED`] (a
//!   receive in GPU memory, or a grouped one) makes the sender write the message again by
//!   rendezvous, as does a buffer smaller than the message (truncated there, as any send). The
//!   receiver flags every CTS that would not take a copy, since it cannot know whether an
//!   eager message is on its way.
//!
//! So no answer costs an extra write, and a send that went eagerly into a legal receive needs
//! nothing more from the sender's side to be delivered. A copy is always of the whole message,
//! so the sender needs nothing from the answer but its arrival, and an answer the receiver
//! overwrote (the copied receive completed, and the next receive in its slot, a ring later,
//! posted its CTS there) still tells it: only a copy lets the receiver go past a message on its
//! own. A grouped receive or a receive for another tag numbers the messages that follow
//! differently than the eager sends assumed: the sender takes those sends back and matches them
//! to the CTS entries in sending order, the receiver drops the eager messages from that point
//! unanswered, and both sides stop using the eager path on that connection.
//!
//! Eager messages are used only on connections of one QP: everything then travels in one
//! ordered queue, so an eager message always reaches the receiver before the rendezvous write
//! of the same message, and before any later eager message.

use super::config::MAX_FUSED_MEMBERS;
use super::proto::SLOTS;
use super::wire::Cts;

/// Largest eager threshold the knob accepts: the size must fit the immediate's 24 bits, and a
/// bounce ring of [`super::proto::SLOTS`] slots of this size is pinned per receive comm.
pub const MAX_EAGER_BYTES: u64 = 64 * 1024;

/// Bytes of an eager message's header in its bounce slot: the message's sequence number, then
/// its tag.
pub const HEADER_BYTES: usize = 16;

const EAGER_FLAG: u32 = 1 << 31;
const SEQ_SHIFT: u32 = 24;
const SEQ_MASK: u32 = 0x7f;
const SIZE_MASK: u32 = (1 << SEQ_SHIFT) - 1;

/// Largest immediate a rendezvous single-buffer message may carry on a connection that uses
/// the eager path: larger capacities send their size through the sizes ring instead, so an
/// immediate with the top bit set always means "eager".
pub const MAX_RENDEZVOUS_IMM: u64 = (EAGER_FLAG - 1) as u64;

/// Bytes of a bounce ring of `slots` slots that take `eager_bytes` (none when the eager path is
/// off).
pub fn ring_bytes(eager_bytes: u64, slots: usize) -> u64 {
    if eager_bytes == 0 {
        return 0;
    }
    slots as u64 * (HEADER_BYTES as u64 + eager_bytes)
}

/// The bounce ring's slots on a connection whose hellos offered `connector` and `acceptor`
/// slots ([`super::wire::Hello::bounce_slots`]): the smaller offer, so both sides reach the
/// same count from the same two hellos. A whole ring of [`SLOTS`] where either side predates
/// the offer (it sends 0 and indexes by message slot) or quiet receives are agreed (their
/// credit comes every [`CREDIT_EVERY`] messages, which needs more slots than that in flight).
pub fn agreed_bounce_slots(connector: u8, acceptor: u8, quiet: bool) -> usize {
    if connector == 0 || acceptor == 0 || quiet {
        SLOTS
    } else {
        usize::from(connector.min(acceptor))
    }
}

/// Offset of bounce slot `slot` in a ring whose slots take `eager_bytes`: the message's header,
/// then its payload right behind it, so that one write carries both.
pub fn slot_offset(slot: usize, eager_bytes: u64) -> u64 {
    slot as u64 * (HEADER_BYTES as u64 + eager_bytes)
}

/// The immediate of eager message `seq` of `size` bytes (`size <= MAX_EAGER_BYTES`).
pub fn imm(seq: u64, size: u64) -> u32 {
    let seq_bits = (seq & u64::from(SEQ_MASK)) as u32;
    EAGER_FLAG | (seq_bits << SEQ_SHIFT) | (size.min(u64::from(SIZE_MASK)) as u32)
}

/// An eager message's announcement, decoded from its immediate.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Announced {
    /// The sequence number's low 7 bits ([`Announced::seq_near`] recovers it).
    pub seq_bits: u8,
    /// Payload bytes.
    pub size: u64,
}

impl Announced {
    /// `Some` when `imm` announces an eager message.
    pub fn from_imm(imm: u32) -> Option<Self> {
        (imm & EAGER_FLAG != 0).then(|| Self {
            seq_bits: ((imm >> SEQ_SHIFT) & SEQ_MASK) as u8,
            size: u64::from(imm & SIZE_MASK),
        })
    }

    /// The full sequence number, given that it lies in `[next - SLOTS, next + SLOTS)` where
    /// `next` is the receiver's next receive: an eager message is at most `SLOTS` ahead of the
    /// receiver (the sender's slots), and one that is behind is still in its slot.
    pub fn seq_near(&self, next: u64, slots: u64) -> u64 {
        let window = u64::from(SEQ_MASK) + 1;
        let base = next.saturating_sub(slots);
        base + (u64::from(self.seq_bits).wrapping_sub(base) % window)
    }

    /// The bounce slot the payload landed in.
    pub fn slot(&self, slots: usize) -> usize {
        usize::from(self.seq_bits) % slots
    }
}

/// The header the sender writes before the payload.
pub fn header(seq: u64, tag: i32) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[0..8].copy_from_slice(&seq.to_le_bytes());
    out[8..12].copy_from_slice(&tag.to_le_bytes());
    out
}

/// On a connection with quiet receives, the receiver writes its credit (every message before it
/// completed) once at least this many more messages completed since the last one it wrote. Half
/// the ring: the sender still has half of it to go on with when a credit is written, and the
/// write, a system call on a software NIC and often in the `test` that finds a message, comes
/// every 16 messages (every 8 measured slower: docs/history/measurements-2026-11.md).
pub const CREDIT_EVERY: u64 = (SLOTS / 2) as u64;

/// Flag in a CTS entry's `nreqs`: this receive takes no eager copy; a message sent eagerly is
/// written again by rendezvous into these buffers (a message that was not is sent as usual).
pub const REFUSED: u32 = 1 << 31;

/// Where a CTS entry of a connection with an eager ring of fewer slots than message slots
/// carries the receiver's read-through point: the last remote key, unused there (the eager path
/// runs on connections of one QP, whose entries use the first key only).
const READ_THROUGH_KEY: usize = MAX_FUSED_MEMBERS - 1;

/// `rkeys` with the low 32 bits of `read_through` in the key the eager path leaves unused (none
/// when `read_through` is 0).
pub fn with_read_through(
    mut rkeys: [u32; MAX_FUSED_MEMBERS],
    read_through: u64,
) -> [u32; MAX_FUSED_MEMBERS] {
    if read_through > 0 {
        rkeys[READ_THROUGH_KEY] = read_through as u32;
    }
    rkeys
}

/// The read-through point an entry of the CTS for message `seq` carries, if any: every message
/// before it completed at the receiver. It lies at or before `seq` (the receive of `seq` is
/// still waiting when its CTS is written), so the low bits say which.
pub fn read_through(entry: &Cts, seq: u64) -> Option<u64> {
    let low = entry.rkeys[READ_THROUGH_KEY];
    (low != 0).then(|| seq.saturating_sub(u64::from((seq as u32).wrapping_sub(low))))
}

/// The acknowledgement of eager message `seq`, written where its CTS would go: `nreqs` 0 and
/// the bytes copied (the whole message) in `size`.
pub fn ack(seq: u64, delivered: u64) -> Cts {
    Cts {
        size: delivered,
        nreqs: 0,
        seq_plus_one: seq + 1,
        ..Cts::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_through_point_rides_in_the_unused_key_and_survives_the_wrap() {
        let keys = [7, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(with_read_through(keys, 0), keys, "none: nothing written");
        for (read, seq) in [
            (5, 9),
            (9, 9),
            ((1 << 32) - 3, (1 << 32) + 4),
            ((1 << 33) + 1, (1 << 33) + 40),
        ] {
            let entry = Cts {
                rkeys: with_read_through(keys, read),
                ..Cts::default()
            };
            assert_eq!(entry.rkeys[0], 7, "the connection's own key stays");
            assert_eq!(read_through(&entry, seq), Some(read), "{read} at {seq}");
        }
        assert_eq!(read_through(&Cts::default(), 9), None);
    }

    #[test]
    fn both_sides_agree_on_the_smaller_ring_and_a_whole_one_for_old_peers_and_quiet() {
        assert_eq!(agreed_bounce_slots(8, 8, false), 8);
        assert_eq!(agreed_bounce_slots(16, 4, false), 4);
        assert_eq!(agreed_bounce_slots(4, 16, false), 4);
        // A peer before 0.3.10 indexes the ring by message slot.
        assert_eq!(agreed_bounce_slots(0, 8, false), SLOTS);
        assert_eq!(agreed_bounce_slots(8, 0, false), SLOTS);
        assert_eq!(agreed_bounce_slots(8, 8, true), SLOTS);
        assert_eq!(ring_bytes(4096, 8), 8 * 4112);
        assert_eq!(ring_bytes(0, 8), 0);
    }

    #[test]
    fn immediates_round_trip_and_rendezvous_ones_never_look_eager() {
        for (seq, size) in [
            (0, 0),
            (5, 8),
            (127, 4096),
            (128, MAX_EAGER_BYTES),
            (1000, 1),
        ] {
            let a = Announced::from_imm(imm(seq, size)).unwrap();
            assert_eq!(a.size, size);
            assert_eq!(u64::from(a.seq_bits), seq % 128);
        }
        assert_eq!(Announced::from_imm(MAX_RENDEZVOUS_IMM as u32), None);
        assert_eq!(Announced::from_imm(0), None);
    }

    #[test]
    fn sequence_numbers_are_recovered_anywhere_in_the_window() {
        for next in [0u64, 1, 31, 32, 33, 127, 128, 1000, 1 << 40] {
            let lo = next.saturating_sub(32);
            for seq in lo..next + 32 {
                let a = Announced::from_imm(imm(seq, 1)).unwrap();
                assert_eq!(a.seq_near(next, 32), seq, "next {next}");
                assert_eq!(a.slot(32), (seq % 32) as usize);
            }
        }
    }
}
