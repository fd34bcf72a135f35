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
        }
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

/// A receive buffer NCCL posted, already registered.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvBuf {
    /// Buffer address.
    pub addr: u64,
    /// Capacity in bytes.
    pub size: u64,
    /// Remote keys of its registration, one per local member.
    pub rkeys: [u32; MAX_FUSED_MEMBERS],
    /// Expected tag.
    pub tag: i32,
    /// Registered as host memory: the eager path may copy into it.
    pub host: bool,
}

/// An eager message to copy out of the bounce ring before answering.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EagerCopy {
    /// Bounce slot holding the payload.
    pub bounce_slot: usize,
    /// Destination: the posted buffer.
    pub addr: u64,
    /// Bytes to copy (the message, clamped to the buffer).
    pub len: u64,
}

/// What `irecv` has the glue do: post receives, copy an eager message, and RDMA-write the
/// answer (CTS entries or an eager acknowledgement) into the sender's ring, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtsPost {
    /// Ring slot (entries go to `slot * MAX_RECVS` onwards).
    pub slot: usize,
    /// Post one receive on each of these QPs (empty when the message already arrived eagerly).
    pub recvs: std::ops::Range<usize>,
    /// The QP the answer is written on.
    pub qp: usize,
    /// What the entries say; [`Answer::entry`] spells them out. `None`: nothing is written (a
    /// quiet receive, or a copy the credit will account for).
    pub answer: Option<Answer>,
    /// Copy this first, when the message arrived eagerly and the receive can take it.
    pub copy: Option<EagerCopy>,
}

/// The receiver's answer to a message, as it goes into the sender's CTS ring.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// One CTS entry per buffer of the receive.
    Cts {
        /// The message.
        seq: u64,
        /// Flagged [`eager::REFUSED`]: an eager copy of this message is not taken, the sender
        /// writes it by rendezvous.
        refused: bool,
    },
    /// The one entry that acknowledges an eager message copied into the receive.
    Ack {
        /// The message.
        seq: u64,
        /// Bytes copied.
        delivered: u64,
    },
}

impl Answer {
    /// The message answered.
    pub fn seq(&self) -> u64 {
        match *self {
            Self::Cts { seq, .. } | Self::Ack { seq, .. } => seq,
        }
    }

    /// How many entries it writes for a receive of `bufs` buffers.
    pub fn entries(&self, bufs: usize) -> usize {
        match self {
            Self::Cts { .. } => bufs,
            Self::Ack { .. } => 1,
        }
    }

    /// Entry `i` (below [`Self::entries`]) of the answer to the receive of `bufs`. One entry at a
    /// time, built where it is written: a single receive's `irecv` builds one.
    pub fn entry(&self, bufs: &[RecvBuf], i: usize) -> Cts {
        match *self {
            Self::Cts { seq, refused } => {
                let nreqs = u32::try_from(bufs.len()).unwrap_or(0);
                Cts {
                    addr: bufs[i].addr,
                    size: bufs[i].size,
                    rkeys: bufs[i].rkeys,
                    tag: bufs[i].tag,
                    nreqs: if refused {
                        nreqs | eager::REFUSED
                    } else {
                        nreqs
                    },
                    seq_plus_one: seq + 1,
                }
            }
            Self::Ack { seq, delivered } => eager::ack(seq, delivered),
        }
    }
}

/// A completed receive, as `test` reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RecvDone {
    /// Buffers in the request.
    pub n: usize,
    /// The sizes are in the sizes ring ([`Layout::uses_sizes_ring`]); otherwise `imm_sum` is the
    /// size.
    pub ringed: bool,
    /// Sum of the immediates: the received size of a single buffer not `ringed`.
    pub imm_sum: u64,
}

#[derive(Copy, Clone, Debug)]
struct RecvSlot {
    seq: u64,
    n: usize,
    ringed: bool,
    pending: usize,
    imm_sum: u64,
    /// The buffer of a single receive.
    single: Option<RecvBuf>,
    /// Its CTS promised to copy an eager message with its tag (a single host-memory receive).
    promised: bool,
    /// Posted quietly: no CTS written (yet).
    quiet: bool,
}

/// An eager message that arrived before its receive was posted.
#[derive(Copy, Clone, Debug)]
struct Arrival {
    seq: u64,
    size: u64,
    tag: i32,
}

/// An eager message's header as the glue read it from the bounce slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EagerHeader {
    /// The sequence number it names.
    pub seq: u64,
    /// The send's tag.
    pub tag: i32,
}

/// What became of an eager message that arrived.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arrived {
    /// Kept for its receive, which is not posted yet (the glue posts the receive its
    /// write-with-immediate used again).
    Kept,
    /// Dropped: the sender writes it again by rendezvous or renumbers it (receive posted again,
    /// as for `Kept`).
    Dropped,
    /// Its receive was posted first, with a CTS that promised the copy: copy it now, and the
    /// receive is done. No receive is posted again: the receive posted for the rendezvous write
    /// that will not come takes its place.
    Copied(EagerCopy),
}

/// The sequence numbers a QP's write-with-immediates complete, oldest first. A receive
/// expects one per QP it uses and at most [`SLOTS`] are in flight, so a fixed ring holds them:
/// `irecv` pushes and every receive completion pops without a bounds check or a growth test.
#[derive(Copy, Clone, Debug, Default)]
struct SeqRing {
    seqs: [u64; SLOTS],
    head: usize,
    len: usize,
}

impl SeqRing {
    /// Append `seq`; `false`, and nothing changed, when the ring is full. The slot check
    /// before every push keeps it from filling: a full ring is a bug, and fails the comm.
    #[inline(always)]
    #[must_use]
    fn push_back(&mut self, seq: u64) -> bool {
        if self.len == SLOTS {
            return false;
        }
        self.seqs[(self.head + self.len) % SLOTS] = seq;
        self.len += 1;
        true
    }

    #[inline(always)]
    fn pop_front(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let seq = self.seqs[self.head % SLOTS];
        self.head = (self.head + 1) % SLOTS;
        self.len -= 1;
        Some(seq)
    }

    /// Drop `seq`, wherever it is (an eager copy completed its receive), keeping the order of
    /// the rest.
    fn remove(&mut self, seq: u64) {
        let mut kept = 0;
        for i in 0..self.len {
            let s = self.seqs[(self.head + i) % SLOTS];
            if s != seq {
                // Writes trail reads: nothing unread is overwritten.
                self.seqs[(self.head + kept) % SLOTS] = s;
                kept += 1;
            }
        }
        self.len = kept;
    }
}

/// The error of a QP whose ring of expected messages is full (out of line: `irecv` never
/// builds it).
#[cold]
#[inline(never)]
fn ring_full(qp: usize) -> Error {
    Error::misuse(format!(
        "more than {SLOTS} messages expected on QP index {qp} (a bug of this plugin)"
    ))
}

/// Receiver side of one connection.
#[derive(Debug)]
pub struct RecvSide {
    layout: Layout,
    next_seq: u64,
    slots: [Option<RecvSlot>; SLOTS],
    /// Per QP, the messages whose write-with-immediate it completes next.
    expected: Vec<SeqRing>,
    /// The message at which the sender renumbers its eager sends (a grouped receive, or one
    /// for another tag): eager messages after it are dropped unanswered, none is copied from
    /// it on.
    stopped_at: Option<u64>,
    /// Per bounce slot, an eager message waiting for its receive.
    arrivals: [Option<Arrival>; SLOTS],
    /// The latest message that arrived eagerly: the next receive may be quiet.
    last_eager: Option<u64>,
    /// The latest message that arrived came eagerly (none came by rendezvous since): the
    /// sender's messages come eagerly, and a receive posted now may stay quiet.
    eager_flowing: bool,
    /// Quiet receives whose CTS must be written now, and whether it refuses a copy
    /// ([`Self::late_answer`]).
    late: Vec<(u64, bool)>,
    /// Every message before this one completed.
    done_through: u64,
    /// The last credit handed to the glue.
    credited: u64,
    /// The latest message that completed without an answer (a copy the credit accounts for):
    /// the sender learns of it from a credit only.
    last_silent: Option<u64>,
}

impl RecvSide {
    /// A receiver whose first message is sequence 0.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            next_seq: 0,
            slots: [None; SLOTS],
            expected: vec![SeqRing::default(); layout.nqps],
            stopped_at: None,
            arrivals: [None; SLOTS],
            last_eager: None,
            eager_flowing: false,
            late: Vec::new(),
            done_through: 0,
            credited: 0,
            last_silent: None,
        }
    }

    /// The connection's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether eager messages are still copied on this connection.
    pub fn eager_active(&self) -> bool {
        self.layout.eager_bytes > 0 && self.stopped_at.is_none()
    }

    /// The next receive's message and its bounce slot while eager messages are still copied:
    /// an eager message for it that landed carries that sequence number in the slot's header.
    pub fn next_eager(&self) -> Option<(u64, usize)> {
        self.eager_active()
            .then(|| (self.next_seq, slot_of(self.next_seq)))
    }

    /// Whether eager message `seq` may be copied into its receive.
    fn copies(&self, seq: u64) -> bool {
        self.layout.eager_bytes > 0 && self.stopped_at.is_none_or(|at| seq < at)
    }

    /// The sender renumbers its eager sends from message `seq` on (see [`eager`]): receives
    /// from there on that were posted quietly get their CTS now.
    fn stop_at(&mut self, seq: u64) {
        if self.stopped_at.is_none() {
            self.stopped_at = Some(seq);
            for a in &mut self.arrivals {
                *a = a.filter(|a| a.seq <= seq);
            }
            for s in seq..self.next_seq {
                self.unquiet(s, true);
            }
        }
    }

    /// Quiet receive `seq` (if it is one) answers after all, with a CTS the glue writes from
    /// [`Self::late_answer`]: flagged refused, or a plain CTS that promises the copy.
    fn unquiet(&mut self, seq: u64, refused: bool) {
        let Some(s) = self.slots[slot_of(seq)]
            .as_mut()
            .filter(|s| s.seq == seq && s.quiet)
        else {
            return;
        };
        s.quiet = false;
        s.promised = !refused;
        self.late.push((seq, refused));
    }

    /// Every receive still quiet writes its CTS now (a plain one, which promises the copy): no
    /// eager message took them within the while the glue waits, so the sender may be holding a
    /// message that cannot go eagerly.
    pub fn announce_all(&mut self) {
        let quiet: Vec<u64> = self.quiet_receives().collect();
        for seq in quiet {
            self.unquiet(seq, false);
        }
    }

    /// Whether a receive is posted quietly (no CTS written yet).
    pub fn has_quiet(&self) -> bool {
        self.quiet_receives().next().is_some()
    }

    fn quiet_receives(&self) -> impl Iterator<Item = u64> + '_ {
        self.waiting().filter(|(_, s)| s.quiet).map(|(seq, _)| seq)
    }

    /// The receives whose message has not completed, in message order. None lies before
    /// [`Self::done_through`] (kept on connections with quiet receives), which only passes
    /// completed ones, nor a ring before the next: a ping-pong's poll looks at a slot or two.
    fn waiting(&self) -> impl Iterator<Item = (u64, &RecvSlot)> + '_ {
        let first = self
            .done_through
            .max(self.next_seq.saturating_sub(SLOTS as u64));
        (first..self.next_seq).filter_map(|seq| self.still_waiting(seq).map(|s| (seq, s)))
    }

    /// The receive of message `seq` when it is posted and its message has not completed.
    fn still_waiting(&self, seq: u64) -> Option<&RecvSlot> {
        self.slots[slot_of(seq)]
            .as_ref()
            .filter(|s| s.seq == seq && s.pending > 0)
    }

    /// The latest message that arrived eagerly.
    pub fn last_eager(&self) -> Option<u64> {
        self.last_eager
    }

    /// A CTS a quiet receive owes the sender now (an eager message it cannot take, a
    /// renumbering, or no message for a while), with the receive's buffer; `None` when none
    /// is owed.
    pub fn late_answer(&mut self) -> Option<(CtsPost, RecvBuf)> {
        let (seq, refused) = self.late.pop()?;
        let slot = slot_of(seq);
        let b = self.slots[slot].and_then(|s| s.single)?;
        let qp = self.layout.qps_for(seq, b.size).start;
        Some((
            CtsPost {
                slot,
                recvs: qp..qp,
                qp,
                answer: Some(Answer::Cts { seq, refused }),
                copy: None,
            },
            b,
        ))
    }

    /// The credit to write as the receive comm closes, when it returns anything: the sender's
    /// comm may be waiting for it to let go of its kept copies.
    pub fn final_credit(&mut self) -> Option<u64> {
        if !self.layout.quiet {
            return None;
        }
        self.advance_done_through();
        (self.done_through > self.credited).then(|| self.take_credit())
    }

    /// Move [`Self::done_through`] past every message whose receive completed.
    fn advance_done_through(&mut self) {
        // Past receives that are done, released, or released with their slot taken by a later
        // receive.
        while self.done_through < self.next_seq && self.still_waiting(self.done_through).is_none() {
            self.done_through += 1;
        }
    }

    /// The credit to write now: every message before [`Self::done_through`].
    fn take_credit(&mut self) -> u64 {
        self.credited = self.done_through;
        self.credited
    }

    /// On a connection with quiet receives, the credit to write into the sender's credit word
    /// now (`answering`: a CTS is being written): every message before it completed, so its
    /// bounce slot was read. Due every [`eager::CREDIT_EVERY`] messages while eager messages
    /// come, and at once when a message completed without an answer while the sender may wait
    /// for a CTS (one being written, or one written for a receive still waiting): the sender
    /// reads answers in message order, so it needs the credit to get past that message.
    pub fn credit_due(&mut self, answering: bool) -> Option<u64> {
        if !self.layout.quiet {
            return None;
        }
        self.advance_done_through();
        if self.done_through <= self.credited {
            return None;
        }
        let silent = self
            .last_silent
            .is_some_and(|s| s >= self.credited && s < self.done_through);
        let eager_since = self.last_eager.is_some_and(|e| e >= self.credited);
        let periodic = eager_since && self.done_through >= self.credited + eager::CREDIT_EVERY;
        (periodic || (silent && (answering || self.answered_waiting()))).then(|| self.take_credit())
    }

    /// Whether a receive whose CTS went out still waits for its message: the sender may be
    /// waiting for a credit to get past a silent message before it.
    fn answered_waiting(&self) -> bool {
        self.waiting().any(|(_, s)| !s.quiet)
    }

    /// `Some` when `imm` announces an eager message on a connection that negotiated them;
    /// the glue then reads its header from the bounce slot and calls [`Self::eager_arrived`].
    pub fn announced(&self, imm: u32) -> Option<Announced> {
        Announced::from_imm(imm).filter(|_| self.layout.eager_bytes > 0)
    }

    /// An eager message arrived (its write-with-immediate completed). Kept for its receive
    /// when that is not posted yet. When the receive was posted first, its CTS already told the
    /// sender what happens: a CTS that promised the copy (a single host-memory receive for this
    /// tag that the whole message fits) gets it now; any other CTS made the sender write the
    /// message again by rendezvous or renumber it, and the copy is dropped. Messages the sender
    /// renumbers are dropped too.
    ///
    /// # Errors
    /// `Remote` when the message cannot be one the sender may have sent.
    pub fn eager_arrived(&mut self, a: Announced, header: EagerHeader) -> Result<Arrived> {
        let seq = a.seq_near(self.next_seq, SLOTS as u64);
        let slot = slot_of(seq);
        let bad = |what: String| Err(Error::new(Kind::Remote, what));
        if a.size > self.layout.eager_bytes {
            return bad(format!(
                "eager message {seq} of {} bytes exceeds the agreed {} bytes",
                a.size, self.layout.eager_bytes
            ));
        }
        // A bounce slot is written again only after the receiver showed it read it (see
        // `eager`): a newer header here is a sender that broke that rule.
        if header.seq != seq {
            return bad(format!(
                "eager message {seq} arrived with the header of message {}",
                header.seq
            ));
        }
        if self.stopped_at.is_some_and(|at| seq > at) {
            return Ok(Arrived::Dropped);
        }
        self.last_eager = Some(self.last_eager.map_or(seq, |l| l.max(seq)));
        self.eager_flowing = true;
        if seq >= self.next_seq {
            self.arrivals[slot] = Some(Arrival {
                seq,
                size: a.size,
                tag: header.tag,
            });
            return Ok(Arrived::Kept);
        }
        let copies = self.copies(seq);
        let Some(posted) = self.slots[slot].as_mut() else {
            return bad(format!(
                "eager message {seq} arrived after its receive completed"
            ));
        };
        match posted.single {
            Some(b) if posted.promised && fits(a.size, &b, header.tag) && copies => {
                let len = a.size;
                if posted.quiet {
                    self.last_silent = Some(seq);
                }
                posted.pending = 0;
                posted.imm_sum = len;
                posted.quiet = false;
                for q in self.layout.qps_for(seq, b.size) {
                    // Its write-with-immediate never comes: the copy completed the receive.
                    self.expected[q].remove(seq);
                }
                Ok(Arrived::Copied(EagerCopy {
                    bounce_slot: slot,
                    addr: b.addr,
                    len,
                }))
            }
            Some(b) if b.tag != header.tag => {
                // The sender renumbers from here on, having read a CTS for another tag (a
                // quiet receive writes it now).
                self.stop_at(seq);
                Ok(Arrived::Dropped)
            }
            _ => {
                // A message too large for the buffer: a quiet receive writes its CTS now, and
                // the sender writes the message again by rendezvous, truncated.
                self.unquiet(seq, true);
                Ok(Arrived::Dropped)
            }
        }
    }

    /// Post `bufs` as one request. `Ok(None)`: every slot is busy, NCCL retries later.
    /// On success returns the request's sequence number and what the glue must do: post the
    /// receives, then (after copying an eager message that already arrived, which completes
    /// the request at once) write the answer into the sender's ring.
    ///
    /// # Errors
    /// `Misuse` when `bufs` is empty or longer than [`MAX_RECVS`], or a buffer is larger than
    /// [`MAX_MESSAGE_BYTES`].
    #[inline(always)]
    pub fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<(u64, CtsPost)>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::misuse(format!(
                "irecv with n={} (must be 1..={MAX_RECVS})",
                bufs.len()
            )));
        }
        for b in bufs {
            check_message_size(b.size, "a receive buffer")?;
        }
        let seq = self.next_seq;
        let slot = slot_of(seq);
        if self.slots[slot].is_some() {
            return Ok(None);
        }
        let capacity = capacity(bufs.iter().map(|b| b.size));
        let qps = self.layout.qps_for(seq, capacity);
        let single = (bufs.len() == 1).then(|| bufs[0]);
        let promised = single.is_some_and(|b| b.host) && self.copies(seq);
        if bufs.len() > 1 {
            // The sender cannot tell a grouped receive from single ones: it renumbers.
            self.stop_at(seq);
        }
        let arrival = self.arrivals[slot].take().filter(|a| a.seq == seq);
        if let Some(a) = arrival {
            if let Some(b) = single
                && b.host
                && fits(a.size, &b, a.tag)
                && self.copies(seq)
            {
                let len = a.size;
                let silent = self.layout.quiet;
                if silent {
                    self.last_silent = Some(seq);
                }
                self.slots[slot] = Some(RecvSlot {
                    seq,
                    n: 1,
                    ringed: false,
                    pending: 0,
                    imm_sum: len,
                    single,
                    promised,
                    quiet: false,
                });
                self.next_seq += 1;
                let copy = EagerCopy {
                    bounce_slot: slot,
                    addr: b.addr,
                    len,
                };
                return Ok(Some((
                    seq,
                    CtsPost {
                        slot,
                        recvs: qps.start..qps.start,
                        qp: qps.start,
                        // With quiet receives, the credit accounts for the copy.
                        answer: (!silent).then_some(Answer::Ack {
                            seq,
                            delivered: len,
                        }),
                        copy: Some(copy),
                    },
                )));
            }
            if single.is_some_and(|b| b.tag != a.tag) {
                self.stop_at(seq);
            }
        }
        // A message that arrived eagerly and was not copied above, or one the sender may have
        // sent eagerly already and that is not copied here, goes again by rendezvous.
        let refused = arrival.is_some() || (self.layout.eager_bytes > 0 && !promised);
        // The sender's latest message came eagerly, so this one likely will too (see the
        // module doc).
        let quiet = self.layout.quiet && promised && arrival.is_none() && self.eager_flowing;
        for q in qps.clone() {
            if !self.expected[q].push_back(seq) {
                return Err(ring_full(q));
            }
        }
        self.slots[slot] = Some(RecvSlot {
            seq,
            n: bufs.len(),
            ringed: self.layout.uses_sizes_ring(bufs.len(), capacity),
            pending: qps.len(),
            imm_sum: 0,
            single,
            promised,
            quiet,
        });
        self.next_seq += 1;
        Ok(Some((
            seq,
            CtsPost {
                slot,
                qp: qps.start,
                recvs: qps,
                answer: (!quiet).then_some(Answer::Cts { seq, refused }),
                copy: None,
            },
        )))
    }

    /// Account for a write-with-immediate that completed on QP `qp`.
    ///
    /// # Errors
    /// `Remote` when no message was expected on that QP (the peer broke the protocol).
    pub fn handle_completion(&mut self, qp: usize, imm: u32) -> Result<()> {
        let seq = self
            .expected
            .get_mut(qp)
            .and_then(SeqRing::pop_front)
            .ok_or_else(|| {
                Error::new(
                    Kind::Remote,
                    format!("unexpected write-with-immediate on QP index {qp}"),
                )
            })?;
        let slot = self.slots[slot_of(seq)].as_mut().ok_or_else(|| {
            Error::new(
                Kind::Remote,
                format!("completion for message {seq} whose receive is gone"),
            )
        })?;
        slot.pending = slot.pending.saturating_sub(1);
        slot.imm_sum += u64::from(imm);
        self.eager_flowing = false;
        Ok(())
    }

    /// The result of the request in `slot`, once every completion arrived.
    pub fn poll_done(&self, slot: usize) -> Option<RecvDone> {
        let s = self.slots.get(slot)?.as_ref()?;
        (s.pending == 0).then_some(RecvDone {
            n: s.n,
            ringed: s.ringed,
            imm_sum: s.imm_sum,
        })
    }

    /// Free `slot` after NCCL saw it done.
    pub fn release(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = None;
        }
    }

    /// Requests posted and not yet released.
    pub fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

/// A send buffer NCCL passed to `isend`, already registered.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SendBuf {
    /// Buffer address.
    pub addr: u64,
    /// Bytes to send.
    pub size: u64,
    /// Local keys of its registration, one per local member.
    pub lkeys: [u32; MAX_FUSED_MEMBERS],
    /// Tag (the sender's rank).
    pub tag: i32,
    /// Registered as host memory: the eager path may send it.
    pub host: bool,
}

/// One RDMA write from registered local memory into a peer's buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RdmaWrite {
    /// QP index.
    pub qp: usize,
    /// Source address (registered under `lkey`).
    pub local_addr: u64,
    /// Local key.
    pub lkey: u32,
    /// Bytes; may be 0.
    pub len: u64,
    /// Destination address.
    pub remote_addr: u64,
    /// Destination key.
    pub rkey: u32,
    /// The source is host memory (a `NCCL_PTR_HOST` registration, or the plugin's own), which
    /// the glue may let the provider copy with the CPU (inline data); never GPU memory.
    pub host: bool,
}

impl RdmaWrite {
    /// The part of `buf` the `pos`-th of `used` QPs carries into the buffer `cts` advertised,
    /// with the keys of the members QP `qp` connects.
    #[inline(always)]
    fn chunk(
        layout: &Layout,
        qp: usize,
        cts: &Cts,
        buf: &SendBuf,
        pos: usize,
        used: usize,
    ) -> Self {
        let (off, len) = Layout::chunk(buf.size, pos, used);
        Self {
            qp,
            local_addr: buf.addr + off,
            lkey: buf.lkeys[layout.local_member(qp)],
            len,
            remote_addr: cts.addr + off,
            rkey: cts.rkeys[layout.remote_member(qp)],
            host: buf.host,
        }
    }
}

impl RdmaWrite {
    /// This write as writes of at most [`MAX_WRITE_BYTES`] (one, possibly empty, when short).
    fn pieces(self) -> impl Iterator<Item = Self> {
        let count = self.len.div_ceil(MAX_WRITE_BYTES).max(1);
        (0..count).map(move |k| {
            let offset = k * MAX_WRITE_BYTES;
            Self {
                local_addr: self.local_addr + offset,
                remote_addr: self.remote_addr + offset,
                len: (self.len - offset).min(MAX_WRITE_BYTES),
                ..self
            }
        })
    }
}

/// A verbs operation the sender's glue must post, in order, per QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Post {
    /// Unsignaled RDMA write of payload bytes.
    Write(RdmaWrite),
    /// Unsignaled RDMA write of the message's sizes into the receiver's sizes ring slot.
    Sizes {
        /// QP index.
        qp: usize,
        /// Ring slot.
        slot: usize,
        /// Sizes of the `n` buffers (rest zero).
        sizes: [u64; MAX_RECVS],
    },
    /// Signaled RDMA write-with-immediate that completes the message on this QP.
    WriteImm {
        /// The write; its length may be 0.
        write: RdmaWrite,
        /// Immediate value.
        imm: u32,
        /// Slot whose completion this is.
        slot: usize,
    },
    /// An eager message: one signaled write-with-immediate of its [`eager::header`] and the
    /// payload behind it into the receiver's bounce slot `slot`.
    Eager {
        /// QP index.
        qp: usize,
        /// Message (and bounce) slot.
        slot: usize,
        /// Message sequence number.
        seq: u64,
        /// The send's tag.
        tag: i32,
        /// Payload address (registered under `lkey`).
        local_addr: u64,
        /// Local key of the payload.
        lkey: u32,
        /// Payload bytes.
        len: u64,
        /// Immediate ([`eager::imm`]).
        imm: u32,
    },
}

impl Post {
    /// The QP the operation goes on.
    pub fn qp(&self) -> usize {
        match self {
            Self::Write(w) | Self::WriteImm { write: w, .. } => w.qp,
            Self::Sizes { qp, .. } | Self::Eager { qp, .. } => *qp,
        }
    }

    /// The message slot the post completes or describes; `None` for a plain payload write,
    /// which goes with one that names it.
    pub fn message_slot(&self) -> Option<usize> {
        match self {
            Self::Write(_) => None,
            Self::WriteImm { slot, .. } | Self::Sizes { slot, .. } | Self::Eager { slot, .. } => {
                Some(*slot)
            }
        }
    }
}

/// The bytes one send request carries on one QP of its message (for the profiler's QP events).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpShare {
    /// The send's request index.
    pub req: usize,
    /// The QP.
    pub qp: usize,
    /// Bytes of the send on that QP (clamped to the receive, as written).
    pub len: u64,
    /// Written by the message's write-with-immediate on that QP (a single receive's message);
    /// otherwise by a plain write before it.
    pub with_imm: bool,
}

/// What `isend` accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The request index to hand NCCL (below [`SEND_REQUESTS`]).
    pub req: usize,
    /// Entry of the message's CTS this send matched (0 for an eager message).
    pub entry: usize,
    /// `(requested, delivered)` when the send was larger than the posted receive.
    pub truncated: Option<(u64, u64)>,
    /// Operations to post now (empty until every entry of a grouped receive is matched).
    pub posts: Vec<Post>,
}

/// What [`SendSide::isend_single`] accepted: a send that one write carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct SingleSend {
    /// The request index to hand NCCL.
    pub req: usize,
    /// `(requested, delivered)` when the send was larger than the posted receive.
    pub truncated: Option<(u64, u64)>,
    /// The write-with-immediate that carries the message ([`Post::WriteImm`]).
    pub post: Post,
}

/// Requests a send side can have in flight: every entry of every slot, plus the eager sends a
/// renumbering holds back (one per slot).
pub const SEND_REQUESTS: usize = SLOTS * (MAX_RECVS + 1);

/// How an eager message goes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Eager {
    /// Before its CTS: the receiver answers it, or (quiet receive) the credit accounts for it.
    Unannounced,
    /// Into a receive whose CTS promised the copy: delivered once written.
    Promised,
}

/// The request of an eager send NCCL already saw done (its payload is in the staging ring):
/// what is left of it completes without NCCL.
const DETACHED: usize = usize::MAX;

/// The sender's staging ring for eager messages on a connection with quiet receives: slot `s`
/// at [`eager::slot_offset`]`(s)`, a header and then the payload, as in the bounce ring.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Staging {
    /// Address of slot 0.
    pub addr: u64,
    /// Local keys of its registration, one per local member.
    pub lkeys: [u32; MAX_FUSED_MEMBERS],
}

/// A message whose CTS the sender captured. One per slot, reused: a message's CTS is copied
/// into it in place, never built and moved (over 1 KiB with eight entries), and starting over
/// clears two masks, not the matched sends.
#[derive(Copy, Clone, Debug, Default)]
struct Rendezvous {
    cts: Group<Cts>,
    /// The send matched to each entry, with its request: valid where `matched` has the bit.
    sends: [(SendBuf, usize); MAX_RECVS],
    /// Entries matched to a send (bit `i` for entry `i`).
    matched: u8,
    /// Entries NCCL saw done.
    tested: u8,
    pending: usize,
    posted: bool,
}

/// The mask of the first `n` entries.
fn entries_mask(n: usize) -> u8 {
    u8::try_from((1u16 << n) - 1).unwrap_or(u8::MAX)
}

impl Rendezvous {
    /// Start over for the message whose CTS entries are `cts`.
    fn reset(&mut self, cts: &[Cts]) {
        self.cts.clear();
        for c in cts {
            self.cts.push(*c);
        }
        self.matched = 0;
        self.tested = 0;
        self.pending = 0;
        self.posted = false;
    }

    fn all_matched(&self) -> bool {
        self.matched == entries_mask(self.cts.len())
    }

    /// The first unmatched entry with `tag`.
    fn free_entry(&self, tag: i32) -> Option<usize> {
        (0..self.cts.len()).find(|&i| self.matched & (1 << i) == 0 && self.cts[i].tag == tag)
    }

    /// The matched sends, with their entries.
    fn matched_sends(&self) -> impl Iterator<Item = (usize, &(SendBuf, usize))> {
        (0..self.cts.len())
            .filter(|&i| self.matched & (1 << i) != 0)
            .map(|i| (i, &self.sends[i]))
    }

    /// The entry request `req`'s send was matched to.
    fn entry_of(&self, req: usize) -> Option<usize> {
        self.matched_sends()
            .find(|(_, (_, q))| *q == req)
            .map(|(e, _)| e)
    }

    /// Match `buf` (request `req`) to unmatched entry `entry` (of its tag), clamped to the
    /// entry's size; returns `(requested, delivered)` when truncated.
    #[inline(always)]
    fn take_entry(&mut self, entry: usize, buf: SendBuf, req: usize) -> Option<(u64, u64)> {
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
    fn take(&mut self, buf: SendBuf, req: usize) -> Option<(usize, Option<(u64, u64)>)> {
        let entry = self.free_entry(buf.tag)?;
        Some((entry, self.take_entry(entry, buf, req)))
    }
}

#[derive(Copy, Clone, Debug)]
enum SlotState {
    /// Sent eagerly; `delivered` (whole) once the receiver acknowledged it, promised the copy
    /// or went past it, `sent` once the sender's own write completed (NCCL may then reuse the
    /// buffer). With quiet receives, `buf` is the copy in the staging ring and the send is
    /// done once sent; NCCL may release it before it is delivered (`req` is then [`DETACHED`]).
    Eager {
        req: usize,
        buf: SendBuf,
        delivered: bool,
        sent: bool,
    },
    /// By rendezvous: the slot's [`Rendezvous`] holds its CTS and matched sends.
    Rendezvous,
}

#[derive(Copy, Clone, Debug)]
struct SendSlot {
    seq: u64,
    state: SlotState,
}

/// Where a request stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Request {
    Free,
    /// Part of message `seq`.
    In(u64),
    /// An eager send whose message was renumbered, waiting for a CTS entry with its tag.
    Held,
}

/// Sender side of one connection.
#[derive(Debug)]
pub struct SendSide {
    layout: Layout,
    /// The message the next send joins.
    next_seq: u64,
    slots: [Option<SendSlot>; SLOTS],
    /// Per slot, the CTS and matched sends of the message in it while it goes by rendezvous.
    rendezvous: Vec<Rendezvous>,
    requests: Vec<Request>,
    free_requests: Vec<usize>,
    /// Eager messages whose answer has not been read, oldest first.
    awaiting: VecDeque<u64>,
    /// Eager sends a renumbering took back, in sending order, for the next CTS entries.
    held: VecDeque<(usize, SendBuf)>,
    /// The eager path is negotiated and no renumbering switched it off.
    eager: bool,
    /// The tag of the last single receive whose CTS arrived: only a send with this tag goes
    /// eager. A connection's first message, and a send for another tag, wait for their CTS as
    /// with NCCL's own transport (a tag nobody receives stays a NULL request, and a guess that
    /// would renumber the messages is not made).
    expected_tag: Option<i32>,
    /// Per slot, completions of eager writes whose message went on by rendezvous or was
    /// renumbered before the sender's own completion arrived.
    strays: [u32; SLOTS],
    /// Per slot, the eager message written into its bounce slot that the receiver has not yet
    /// shown it read: an acknowledgement shows it (written after the copy), and so does any
    /// later answer in the slot (the receive of the next message there is posted only after
    /// this one completed) or a credit past it. A promise or a refusal does not: the receiver
    /// reads the bounce slot when it handles the arrival, which may come after the sender's own
    /// write completed. No eager message goes into such a slot.
    unread: [Option<u64>; SLOTS],
    /// The vector the next [`Accepted::posts`] is built in, handed back by [`Self::recycle`]
    /// so that sending allocates nothing once it has grown to a message's posts.
    spare_posts: Vec<Post>,
    /// Where eager payloads are copied with quiet receives.
    staging: Option<Staging>,
    /// The latest credit taken.
    credit: u64,
}

impl SendSide {
    /// A sender whose first message is sequence 0.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            next_seq: 0,
            slots: [None; SLOTS],
            rendezvous: vec![Rendezvous::default(); SLOTS],
            requests: vec![Request::Free; SEND_REQUESTS],
            free_requests: (0..SEND_REQUESTS).rev().collect(),
            awaiting: VecDeque::with_capacity(SLOTS),
            held: VecDeque::with_capacity(SLOTS),
            eager: layout.eager_bytes > 0,
            expected_tag: None,
            strays: [0; SLOTS],
            unread: [None; SLOTS],
            credit: 0,
            spare_posts: Vec::new(),
            staging: None,
        }
    }

    /// A sender on a connection with quiet receives, whose eager payloads go through `staging`.
    pub fn with_staging(layout: Layout, staging: Staging) -> Self {
        Self {
            staging: Some(staging),
            ..Self::new(layout)
        }
    }

    /// Whether the glue should read the credit word for [`Self::handle_credit`]: on a
    /// connection with quiet receives.
    pub fn wants_credit(&self) -> bool {
        self.layout.quiet
    }

    /// The receiver's credit: every message before `credit` completed. Each eager message
    /// among them whose answer was not read was copied (a refused one could not complete
    /// before the sender wrote it again), and its bounce slot was read.
    ///
    /// # Errors
    /// `Remote` when the credit covers an awaited eager message that is no longer in its slot.
    pub fn handle_credit(&mut self, credit: u64) -> Result<()> {
        if credit <= self.credit {
            return Ok(());
        }
        self.credit = credit;
        for u in &mut self.unread {
            *u = u.filter(|&s| s >= credit);
        }
        while let Some(&seq) = self.awaiting.front().filter(|&&s| s < credit) {
            let slot = slot_of(seq);
            match self.slots[slot] {
                Some(SendSlot {
                    seq: s,
                    state: SlotState::Eager { .. },
                }) if s == seq => {}
                _ => {
                    return Err(Error::new(
                        Kind::Remote,
                        format!("credit {credit} covers message {seq}, which is not in its slot"),
                    ));
                }
            }
            self.awaiting.pop_front();
            self.unread[slot] = None;
            self.delivered(slot);
        }
        Ok(())
    }

    /// The eager message in `slot` was delivered whole; the slot is free if NCCL already saw
    /// its send done.
    fn delivered(&mut self, slot: usize) {
        if let Some(SendSlot {
            state: SlotState::Eager { req, delivered, .. },
            ..
        }) = self.slots[slot].as_mut()
        {
            *delivered = true;
            if *req == DETACHED {
                self.slots[slot] = None;
            }
        }
    }

    /// The connection's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether the eager path is still in use on this connection.
    pub fn eager_active(&self) -> bool {
        self.eager
    }

    /// Give back the posts of an [`Accepted`] once they were posted, for the next message.
    pub fn recycle(&mut self, posts: Vec<Post>) {
        self.spare_posts = posts;
    }

    /// Whether sends wait on the CTS ring for more than the next `isend`: eager messages for
    /// their answers, held sends for their CTS. `test` then reads the ring too.
    pub fn waits_on_ring(&self) -> bool {
        !self.awaiting.is_empty() || !self.held.is_empty()
    }

    /// `Some((seq, slot))`: the glue should read that CTS ring slot and, once its entries
    /// carry `seq + 1`, pass them to [`Self::handle_cts`]; when the first entry carries a later
    /// number, pass that entry alone. The oldest eager message's answer comes first; otherwise
    /// the next message's CTS, when its slot is free. Inlined: `isend` asks once per call.
    #[inline(always)]
    pub fn wants_cts(&self) -> Option<(u64, usize)> {
        if let Some(&seq) = self.awaiting.front() {
            return Some((seq, slot_of(seq)));
        }
        let slot = slot_of(self.next_seq);
        self.slots[slot].is_none().then_some((self.next_seq, slot))
    }

    /// Take the entries the glue read for [`Self::wants_cts`]'s message (all `nreqs` of them,
    /// or the one acknowledgement of an eager message). Returns posts to make now: a refused
    /// eager message written again by rendezvous, or held sends that completed a message.
    ///
    /// An eager message's answer can be gone before the sender reads it: a receive that copied
    /// the message completes without the sender, and NCCL may post the next receive in that
    /// slot (a ring later), whose CTS overwrites the answer. Such a later entry is taken as the
    /// answer: the message was copied whole. (A message that goes by rendezvous cannot be
    /// overtaken so: its receive waits for the sender's write.)
    ///
    /// # Errors
    /// `Remote` when the entries are inconsistent (the receiver broke the protocol).
    pub fn handle_cts(&mut self, entries: &[Cts]) -> Result<Vec<Post>> {
        if let Some(&seq) = self.awaiting.front() {
            return self.answer(seq, entries);
        }
        self.take_cts(entries)?;
        Ok(self.match_held())
    }

    /// The next message goes by rendezvous into the receive whose CTS is `entries`.
    #[inline(always)]
    fn take_cts(&mut self, entries: &[Cts]) -> Result<&mut Rendezvous> {
        let seq = self.next_seq;
        let refusing = refused(entries);
        check_cts(seq, entries)?;
        // The receive of `seq` was posted, so the one of the eager message before it in this
        // slot completed: its bounce slot was read.
        self.unread[slot_of(seq)] = None;
        if entries.len() > 1 {
            // A grouped receive: the receiver stops taking eager messages too.
            self.eager = false;
        }
        // Only a receive that would take a copy predicts the next message's.
        self.expected_tag = (entries.len() == 1 && !refusing).then(|| entries[0].tag);
        Ok(self.start_rendezvous(seq, entries))
    }

    /// Where the CTS [`Self::isend_single`] takes lies: `Some((seq, slot))` when no eager
    /// message awaits its answer, no send is held and the next message's slot is free, so
    /// that reading the ring would hand [`Self::handle_cts`] that message's CTS and nothing
    /// before it.
    #[inline(always)]
    pub fn single_cts(&self) -> Option<(u64, usize)> {
        if !self.awaiting.is_empty() || !self.held.is_empty() {
            return None;
        }
        self.wants_cts()
    }

    /// NCCL's usual send in one step: what [`Self::handle_cts`] with the single entry `cts`
    /// (read for [`Self::single_cts`]) and then [`Self::isend`] of `buf` do, when `buf`
    /// matches that entry and the message goes as one write on one QP. `Ok(None)`, with
    /// nothing changed, for anything else: the caller then takes the general way.
    ///
    /// # Errors
    /// `Misuse` when `buf` is larger than [`MAX_MESSAGE_BYTES`].
    #[inline(always)]
    pub fn isend_single(&mut self, cts: &Cts, buf: SendBuf) -> Result<Option<SingleSend>> {
        check_message_size(buf.size, "a send")?;
        let seq = self.next_seq;
        let slot = slot_of(seq);
        if self.promise_takes(cts, &buf) {
            // It goes eagerly into the promised copy instead (see `isend`).
            return Ok(None);
        }
        let single = cts.seq_plus_one == seq + 1
            && cts.nreqs & !eager::REFUSED == 1
            && cts.tag == buf.tag
            && self.single_cts().is_some()
            && !self.free_requests.is_empty();
        let Some(qp) = single
            .then(|| self.one_write(seq, cts.size, buf.size))
            .flatten()
        else {
            return Ok(None);
        };
        let layout = self.layout;
        self.take_cts(std::slice::from_ref(cts))?;
        let req = self.take_request(seq).unwrap_or_default();
        let rendezvous = &mut self.rendezvous[slot];
        let truncated = rendezvous.take_entry(0, buf, req);
        let write = RdmaWrite::chunk(&layout, qp, cts, &rendezvous.sends[0].0, 0, 1);
        rendezvous.pending = 1;
        rendezvous.posted = true;
        self.next_seq += 1;
        Ok(Some(SingleSend {
            req,
            truncated,
            post: Post::WriteImm {
                write,
                imm: u32::try_from(write.len).unwrap_or(u32::MAX),
                slot,
            },
        }))
    }

    /// The QP, when message `seq` of a `size`-byte send into a single receive of `capacity`
    /// bytes goes as one write-with-immediate on one QP (NCCL's usual message): its size
    /// travels in the immediate and one write carries the payload.
    #[inline(always)]
    fn one_write(&self, seq: u64, capacity: u64, size: u64) -> Option<usize> {
        let qps = self.layout.qps_for(seq, capacity);
        let single = qps.len() == 1
            && !self.layout.uses_sizes_ring(1, capacity)
            && size.min(capacity) <= MAX_WRITE_BYTES;
        single.then_some(qps.start)
    }

    /// The receiver's answer to eager message `seq`: an acknowledgement (it copied the message),
    /// or the CTS of its receive: one that promises the copy, one that refuses it (the message
    /// goes again by rendezvous), or one for another shape or tag (renumbering).
    fn answer(&mut self, seq: u64, entries: &[Cts]) -> Result<Vec<Post>> {
        let slot = slot_of(seq);
        let Some(SendSlot {
            state: SlotState::Eager { req, buf, sent, .. },
            ..
        }) = self.slots[slot]
        else {
            return Err(Error::misuse(format!("no eager message {seq} in its slot")));
        };
        let first = entries.first().copied().unwrap_or_default();
        let copied = if first.seq_plus_one > seq + 1 {
            // A later message's CTS in this slot: the receiver completed this message without
            // the sender, which only a copy does (of the whole message, see `fits`), and wrote
            // the next receive's CTS over the answer. It read the bounce slot.
            if !(first.seq_plus_one - 1 - seq).is_multiple_of(SLOTS as u64) {
                return Err(Error::new(
                    Kind::Remote,
                    format!(
                        "CTS for message {} in the slot of message {seq}",
                        first.seq_plus_one - 1
                    ),
                ));
            }
            self.unread[slot] = None;
            true
        } else if first.nreqs == 0 && entries.len() == 1 {
            // Acknowledged after the copy: the bounce slot was read.
            if first.size != buf.size || first.seq_plus_one != seq + 1 {
                return Err(Error::new(
                    Kind::Remote,
                    format!(
                        "acknowledged {} bytes of eager message {seq} of {} bytes",
                        first.size, buf.size
                    ),
                ));
            }
            self.unread[slot] = None;
            true
        } else {
            let refusing = refused(entries);
            check_cts(seq, entries)?;
            let same = entries.len() == 1 && entries[0].tag == buf.tag;
            if !same {
                return Ok(self.renumber(seq, entries));
            }
            // The same message either way: copied on arrival as promised when it fits, or
            // written again by rendezvous into the buffer (in GPU memory, or too small: then
            // truncated) from the one NCCL still holds for us (or our copy of it).
            !refusing && buf.size <= entries[0].size
        };
        self.awaiting.pop_front();
        if copied {
            self.delivered(slot);
            return Ok(Vec::new());
        }
        self.expected_tag = None;
        self.strays[slot] += u32::from(!sent);
        self.start_rendezvous(seq, entries).take(buf, req);
        Ok(self.layout_posts(slot))
    }

    /// The receive of message `seq` is grouped or waits for another tag: the messages from `seq`
    /// on are numbered differently than the eager sends assumed. Take every eager send back and
    /// match them, in order, to the receiver's entries; the receiver drops their copies.
    fn renumber(&mut self, seq: u64, entries: &[Cts]) -> Vec<Post> {
        self.eager = false;
        for s in self.awaiting.drain(..) {
            let slot = slot_of(s);
            if let Some(SendSlot {
                state: SlotState::Eager { req, buf, sent, .. },
                ..
            }) = self.slots[slot].take()
            {
                self.strays[slot] += u32::from(!sent);
                if let Some(r) = self.requests.get_mut(req) {
                    *r = Request::Held;
                }
                self.held.push_back((req, buf));
            }
        }
        self.next_seq = seq;
        self.start_rendezvous(seq, entries);
        self.match_held()
    }

    /// Message `seq` goes by rendezvous into the receive that posted `entries`.
    #[inline(always)]
    fn start_rendezvous(&mut self, seq: u64, entries: &[Cts]) -> &mut Rendezvous {
        let slot = slot_of(seq);
        self.slots[slot] = Some(SendSlot {
            seq,
            state: SlotState::Rendezvous,
        });
        let rendezvous = &mut self.rendezvous[slot];
        rendezvous.reset(entries);
        rendezvous
    }

    /// Match held sends, oldest first, to the next message's CTS entries; its posts once every
    /// entry is matched.
    fn match_held(&mut self) -> Vec<Post> {
        let seq = self.next_seq;
        let slot = slot_of(seq);
        let Some(rendezvous) = rendezvous_at(&self.slots, &mut self.rendezvous, seq) else {
            return Vec::new();
        };
        let mut k = 0;
        while k < self.held.len() {
            let (req, buf) = self.held[k];
            if rendezvous.take(buf, req).is_some() {
                if let Some(r) = self.requests.get_mut(req) {
                    *r = Request::In(seq);
                }
                self.held.remove(k);
            } else {
                k += 1;
            }
        }
        if !rendezvous.all_matched() {
            return Vec::new();
        }
        self.next_seq += 1;
        self.layout_posts(slot)
    }

    /// Accept `buf` for the next message: matched to the first unmatched entry of its CTS
    /// with the same tag (entries with equal tags fill in posting order), or sent eagerly when
    /// its CTS has not arrived and the eager path may take it. `Ok(None)`: neither is possible
    /// yet (no CTS, or no unmatched entry with this tag); NCCL retries later, as with its own
    /// transport (`ncclIbIsend` returns a NULL request after the tag loop, net_ib/p2p.cc).
    ///
    /// The glue reads the ring for [`Self::wants_cts`] first, so "no CTS" means it had not
    /// arrived at that moment.
    ///
    /// # Errors
    /// `Misuse` when `buf` is larger than [`MAX_MESSAGE_BYTES`].
    pub fn isend(&mut self, buf: SendBuf) -> Result<Option<Accepted>> {
        check_message_size(buf.size, "a send")?;
        if self.held.iter().any(|(_, h)| h.tag == buf.tag) {
            // An earlier send with this tag is still unmatched: this one must not overtake it.
            return Ok(None);
        }
        let slot = slot_of(self.next_seq);
        match &self.slots[slot] {
            Some(SendSlot {
                seq,
                state: SlotState::Rendezvous,
            }) if *seq == self.next_seq && !self.rendezvous[slot].posted => {
                let r = &self.rendezvous[slot];
                if r.cts.len() == 1 && r.matched == 0 && self.promise_takes(&r.cts[0], &buf) {
                    return Ok(self.send_eager(buf, Eager::Promised));
                }
                Ok(self.match_send(buf))
            }
            None if self.awaiting.len() < SLOTS && self.eager_fits(&buf) => {
                Ok(self.send_eager(buf, Eager::Unannounced))
            }
            _ => Ok(None),
        }
    }

    /// With quiet receives, whether a send into the single receive whose CTS is `cts` goes
    /// eagerly into the copy that CTS promised rather than by rendezvous: one write either
    /// way, and the receiver, seeing an eager message, may post the next receive quietly.
    #[inline(always)]
    fn promise_takes(&self, cts: &Cts, buf: &SendBuf) -> bool {
        self.layout.quiet
            && cts.nreqs == 1
            && cts.tag == buf.tag
            && buf.size <= cts.size
            && self.eager_may_carry(buf)
    }

    /// Whether an eager send with no CTS yet may carry `buf`, for the tag the sender expects.
    fn eager_fits(&self, buf: &SendBuf) -> bool {
        self.expected_tag == Some(buf.tag) && self.eager_may_carry(buf)
    }

    /// What every eager send needs: the eager path still in use, a host-memory buffer within the
    /// threshold, a bounce slot the receiver has read, and no sends held for renumbering.
    fn eager_may_carry(&self, buf: &SendBuf) -> bool {
        self.eager
            && self.unread[slot_of(self.next_seq)].is_none()
            && buf.host
            && buf.size <= self.layout.eager_bytes
            && self.held.is_empty()
    }

    #[inline(always)]
    fn take_request(&mut self, seq: u64) -> Option<usize> {
        let req = self.free_requests.pop()?;
        self.requests[req] = Request::In(seq);
        Some(req)
    }

    /// Send `buf` eagerly.
    fn send_eager(&mut self, buf: SendBuf, how: Eager) -> Option<Accepted> {
        let seq = self.next_seq;
        let slot = slot_of(seq);
        let req = self.take_request(seq)?;
        // With quiet receives the payload is copied into the staging ring (by the glue, from
        // the post), and a refused message is written again from there.
        let kept = match self.staging {
            Some(st) => SendBuf {
                addr: st.addr
                    + eager::slot_offset(slot, self.layout.eager_bytes)
                    + eager::HEADER_BYTES as u64,
                lkeys: st.lkeys,
                ..buf
            },
            None => buf,
        };
        self.slots[slot] = Some(SendSlot {
            seq,
            state: SlotState::Eager {
                req,
                buf: kept,
                delivered: how == Eager::Promised,
                sent: false,
            },
        });
        if how != Eager::Promised {
            self.awaiting.push_back(seq);
        }
        self.unread[slot] = Some(seq);
        self.next_seq += 1;
        let qp = self.layout.qps_for(seq, buf.size).start;
        let mut posts = std::mem::take(&mut self.spare_posts);
        posts.clear();
        posts.push(Post::Eager {
            qp,
            slot,
            seq,
            tag: buf.tag,
            local_addr: buf.addr,
            lkey: buf.lkeys[self.layout.local_member(qp)],
            len: buf.size,
            imm: eager::imm(seq, buf.size),
        });
        Some(Accepted {
            req,
            entry: 0,
            truncated: None,
            posts,
        })
    }

    fn match_send(&mut self, buf: SendBuf) -> Option<Accepted> {
        let seq = self.next_seq;
        let slot = slot_of(seq);
        // Peek first: a request is taken only for a send that matches.
        let entry = self.rendezvous[slot].free_entry(buf.tag)?;
        let req = self.take_request(seq)?;
        let rendezvous = &mut self.rendezvous[slot];
        let truncated = rendezvous.take_entry(entry, buf, req);
        let mut accepted = Accepted {
            req,
            entry,
            truncated,
            posts: Vec::new(),
        };
        if rendezvous.all_matched() {
            accepted.posts = self.layout_posts(slot);
            self.next_seq += 1;
        }
        Some(accepted)
    }

    fn layout_posts(&mut self, slot_index: usize) -> Vec<Post> {
        let layout = self.layout;
        let Some(SendSlot {
            seq,
            state: SlotState::Rendezvous,
        }) = self.slots[slot_index]
        else {
            return Vec::new();
        };
        let slot = &mut self.rendezvous[slot_index];
        let n = slot.cts.len();
        let capacity = capacity(slot.cts.iter().map(|c| c.size));
        let qps = layout.qps_for(seq, capacity);
        let used = qps.len();
        // Called once every entry is matched, so the first one is.
        let first = slot.sends[0].0;
        let ringed = layout.uses_sizes_ring(n, capacity);
        let mut posts = std::mem::take(&mut self.spare_posts);
        posts.clear();
        for (pos, qp) in qps.enumerate() {
            if !ringed {
                // The payload's last write carries the immediate: the bytes this QP delivered
                // (they fit: the capacity does).
                let write = RdmaWrite::chunk(&layout, qp, &slot.cts[0], &first, pos, used);
                let imm = u32::try_from(write.len).unwrap_or(u32::MAX);
                if write.len <= MAX_WRITE_BYTES {
                    // NCCL's usual message: one write carries it.
                    posts.push(Post::WriteImm {
                        write,
                        imm,
                        slot: slot_index,
                    });
                    continue;
                }
                let mut pieces = write.pieces().peekable();
                while let Some(piece) = pieces.next() {
                    posts.push(if pieces.peek().is_some() {
                        Post::Write(piece)
                    } else {
                        Post::WriteImm {
                            write: piece,
                            imm,
                            slot: slot_index,
                        }
                    });
                }
                continue;
            }
            let mut sizes = [0u64; MAX_RECVS];
            for (i, (buf, _)) in slot.sends[..n].iter().enumerate() {
                let cts = &slot.cts[i];
                sizes[i] = buf.size;
                let write = RdmaWrite::chunk(&layout, qp, cts, buf, pos, used);
                posts.extend(write.pieces().filter(|w| w.len > 0).map(Post::Write));
            }
            posts.push(Post::Sizes {
                qp,
                slot: slot_index,
                sizes,
            });
            // A zero-length write-with-immediate closes the message on this QP.
            let write = RdmaWrite {
                len: 0,
                ..RdmaWrite::chunk(&layout, qp, &slot.cts[0], &first, 0, 1)
            };
            posts.push(Post::WriteImm {
                write,
                imm: 0,
                slot: slot_index,
            });
        }
        slot.pending = used;
        slot.posted = true;
        posts
    }

    /// Account for a signaled write of `slot` completing on one QP.
    ///
    /// # Errors
    /// `Misuse` for a slot with nothing in flight (a stray completion).
    pub fn handle_completion(&mut self, slot: usize) -> Result<()> {
        if let Some(strays) = self.strays.get_mut(slot).filter(|s| **s > 0) {
            // Completions on a QP arrive in posting order: an eager write posted earlier in
            // this slot completes before anything posted after it.
            *strays -= 1;
            return Ok(());
        }
        match self.slots.get_mut(slot).and_then(Option::as_mut) {
            Some(SendSlot {
                state: SlotState::Eager { sent, .. },
                ..
            }) if !*sent => {
                *sent = true;
                Ok(())
            }
            Some(SendSlot {
                state: SlotState::Rendezvous,
                ..
            }) if self.rendezvous[slot].pending > 0 => {
                let r = &mut self.rendezvous[slot];
                r.pending -= 1;
                if r.pending == 0 && r.tested == entries_mask(r.cts.len()) {
                    // Only sends NCCL saw done before (detached eager ones): nobody tests it.
                    self.slots[slot] = None;
                }
                Ok(())
            }
            _ => Err(Error::misuse(format!(
                "send completion for idle slot {slot}"
            ))),
        }
    }

    /// The slot of request `req`'s message, while the request is in flight.
    fn slot_of_request(&self, req: usize) -> Option<usize> {
        let Request::In(seq) = *self.requests.get(req)? else {
            return None;
        };
        let slot = slot_of(seq);
        self.slots[slot]
            .as_ref()
            .is_some_and(|s| s.seq == seq)
            .then_some(slot)
    }

    /// Whether messages whose requests may be done still need this side: eager messages whose
    /// fate is not known (a refusal is written again from the kept copy), held sends, and
    /// rendezvous writes in flight.
    pub fn undelivered(&self) -> bool {
        !self.awaiting.is_empty()
            || !self.held.is_empty()
            || self.slots.iter().zip(&self.rendezvous).any(|(s, r)| {
                matches!(
                    s,
                    Some(SendSlot {
                        state: SlotState::Rendezvous,
                        ..
                    })
                ) && r.pending > 0
            })
    }

    /// Bytes delivered by request `req`, once its message completed (an eager one once the
    /// receiver acknowledged it).
    pub fn poll_done(&self, req: usize) -> Option<u64> {
        let slot = self.slot_of_request(req)?;
        match &self.slots[slot].as_ref()?.state {
            SlotState::Eager {
                buf,
                delivered,
                sent,
                ..
            } => {
                let kept = self.staging.is_some();
                (*sent && (*delivered || kept)).then_some(buf.size)
            }
            SlotState::Rendezvous => {
                let r = &self.rendezvous[slot];
                (r.posted && r.pending == 0)
                    .then(|| r.entry_of(req))
                    .flatten()
                    .map(|e| r.sends[e].0.size)
            }
        }
    }

    /// What each send of the message in `slot` carries on each QP, once its writes were
    /// handed out: the eager message's one write, or each matched send's chunk on every QP
    /// the message uses (as [`Self::isend`] laid them out). Empty for a slot with nothing
    /// posted.
    pub fn qp_shares(&self, slot: usize) -> Vec<QpShare> {
        let Some(Some(s)) = self.slots.get(slot) else {
            return Vec::new();
        };
        match s.state {
            SlotState::Eager { req, buf, .. } => vec![QpShare {
                req,
                qp: self.layout.qps_for(s.seq, buf.size).start,
                len: buf.size,
                with_imm: true,
            }],
            SlotState::Rendezvous => {
                let r = &self.rendezvous[slot];
                if !r.posted {
                    return Vec::new();
                }
                let n = r.cts.len();
                let capacity = capacity(r.cts.iter().map(|c| c.size));
                let with_imm = !self.layout.uses_sizes_ring(n, capacity);
                let qps = self.layout.qps_for(s.seq, capacity);
                let used = qps.len();
                qps.enumerate()
                    .flat_map(|(pos, qp)| {
                        r.sends[..n].iter().map(move |&(buf, req)| QpShare {
                            req,
                            qp,
                            len: Layout::chunk(buf.size, pos, used).1,
                            with_imm,
                        })
                    })
                    .collect()
            }
        }
    }

    /// NCCL saw request `req` done; a message's slot is freed when all its requests were.
    pub fn release(&mut self, req: usize) {
        let Some(slot) = self.slot_of_request(req) else {
            return;
        };
        let free = match self.slots[slot].as_mut().map(|s| &mut s.state) {
            Some(SlotState::Rendezvous) => {
                let r = &mut self.rendezvous[slot];
                if let Some(e) = r.entry_of(req) {
                    r.tested |= 1 << e;
                }
                r.tested == entries_mask(r.cts.len())
            }
            Some(SlotState::Eager {
                delivered: false,
                req,
                ..
            }) => {
                // A send whose copy is in the staging ring: the slot stays until delivered.
                *req = DETACHED;
                false
            }
            _ => true,
        };
        if free {
            self.slots[slot] = None;
        }
        self.requests[req] = Request::Free;
        self.free_requests.push(req);
    }
}

/// The captured CTS of message `seq`, when its slot holds one.
fn rendezvous_at<'a>(
    slots: &[Option<SendSlot>],
    rendezvous: &'a mut [Rendezvous],
    seq: u64,
) -> Option<&'a mut Rendezvous> {
    let slot = slot_of(seq);
    match slots[slot] {
        Some(SendSlot {
            state: SlotState::Rendezvous,
            ..
        }) => Some(&mut rendezvous[slot]),
        _ => None,
    }
}

/// Whether the receiver flagged `entries` [`eager::REFUSED`].
fn refused(entries: &[Cts]) -> bool {
    entries
        .first()
        .is_some_and(|e| e.nreqs & eager::REFUSED != 0)
}

/// Check that `entries` are the whole CTS of message `seq`: 1..=MAX_RECVS entries, each
/// carrying `seq + 1` and the entry count (the refusal flag aside).
#[inline(always)]
fn check_cts(seq: u64, entries: &[Cts]) -> Result<()> {
    let n = entries.len();
    let consistent = (1..=MAX_RECVS).contains(&n)
        && entries
            .iter()
            .all(|e| e.seq_plus_one == seq + 1 && (e.nreqs & !eager::REFUSED) as usize == n);
    if consistent {
        return Ok(());
    }
    Err(Error::new(
        Kind::Remote,
        format!("inconsistent CTS for message {seq}"),
    ))
}

#[cfg(test)]
#[path = "proto_sim.rs"]
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

#[cfg(test)]
mod seq_ring_tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Step {
        Push,
        Pop,
        /// Remove the entry this far from the front (modulo the length); `SLOTS`: a number
        /// not there.
        Remove(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => Just(Step::Push),
            2 => Just(Step::Pop),
            1 => (0..SLOTS + 1).prop_map(Step::Remove),
        ]
    }

    proptest! {
        /// The ring answers as a queue of at most `SLOTS` would, through many wraps.
        #[test]
        fn the_ring_keeps_the_order_a_queue_keeps(steps in proptest::collection::vec(step(), 1..400)) {
            let mut ring = SeqRing::default();
            let mut model = VecDeque::new();
            let mut next = 0u64;
            for s in steps {
                match s {
                    Step::Push if model.len() < SLOTS => {
                        prop_assert!(ring.push_back(next));
                        model.push_back(next);
                        next += 1;
                    }
                    // A full ring refuses, and keeps what it holds (checked below).
                    Step::Push => prop_assert!(!ring.push_back(next)),
                    Step::Pop => prop_assert_eq!(ring.pop_front(), model.pop_front()),
                    Step::Remove(k) => {
                        let present = (k < SLOTS).then(|| model.get(k % model.len().max(1))).flatten();
                        let seq = present.copied().unwrap_or(u64::MAX);
                        ring.remove(seq);
                        model.retain(|&s| s != seq);
                    }
                }
                let held: Vec<u64> = (0..ring.len).map(|i| ring.seqs[(ring.head + i) % SLOTS]).collect();
                prop_assert_eq!(held, Vec::from(model.clone()));
            }
        }
    }
}
