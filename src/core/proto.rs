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
//! receiver's sizes ring ([`Post::Sizes`]).
//!
//! Message `seq` lives in slot `seq % SLOTS` on both sides and uses the QPs
//! [`Layout::qps_for`]`(seq, capacity)`, where both sides know the capacity from the CTS; completions on one QP arrive in posting order, so each side keeps,
//! per QP, the queue of messages whose completion it expects next.
//!
//! Nothing here touches memory, verbs or the clock: addresses and keys are plain numbers.

use std::collections::VecDeque;

use super::config::MAX_FUSED_MEMBERS;
use super::error::{Error, Kind, Result};
use super::group::Group;
use super::wire::{Cts, MAX_RECVS};

/// Message slots per connection: receives (and grouped receives) in flight per comm.
pub const SLOTS: usize = 32;

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

/// Whether a message's sizes travel in the receiver's sizes ring instead of the immediates: for
/// grouped receives, and for single buffers whose size may not fit the 32-bit immediate. Both
/// sides decide from the CTS (`n` and the capacity), so they agree.
pub fn uses_sizes_ring(n: usize, capacity: u64) -> bool {
    n > 1 || capacity > u64::from(u32::MAX)
}

/// Refuse a message or buffer larger than [`MAX_MESSAGE_BYTES`], naming both sizes.
///
/// # Errors
/// `Misuse` (NCCL never passes more than the `maxP2pBytes` it was told).
pub fn check_message_size(size: u64, what: &str) -> Result<()> {
    if size > MAX_MESSAGE_BYTES {
        return Err(Error::misuse(format!(
            "{what} of {size} bytes is larger than the {MAX_MESSAGE_BYTES} bytes this plugin \
             advertises as maxP2pBytes"
        )));
    }
    Ok(())
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
}

impl Layout {
    /// A connection between two single-port devices.
    pub fn single(nqps: usize, split: bool) -> Self {
        Self {
            nqps,
            split,
            local_members: 1,
            remote_members: 1,
        }
    }

    /// Members of the larger side: QPs come in groups of this many.
    pub fn rails(&self) -> usize {
        self.local_members.max(self.remote_members)
    }

    /// The local member QP `qp` lives on.
    pub fn local_member(&self, qp: usize) -> usize {
        qp % self.local_members
    }

    /// The peer's member QP `qp` is connected to.
    pub fn remote_member(&self, qp: usize) -> usize {
        qp % self.remote_members
    }

    /// The QPs message `seq`, whose receive buffers hold `capacity` bytes, uses, in order.
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

fn slot_of(seq: u64) -> usize {
    usize::try_from(seq % SLOTS as u64).unwrap_or(0)
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
}

/// CTS entries the glue must RDMA-write into the sender's ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtsPost {
    /// Ring slot (entries go to `slot * MAX_RECVS` onwards).
    pub slot: usize,
    /// The QPs the message uses: post one receive on each, and the CTS write on the first.
    pub qps: std::ops::Range<usize>,
    /// The entries, one per buffer.
    pub entries: Group<Cts>,
}

/// A completed receive, as `test` reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RecvDone {
    /// Buffers in the request.
    pub n: usize,
    /// The sizes are in the sizes ring ([`uses_sizes_ring`]); otherwise `imm_sum` is the size.
    pub ringed: bool,
    /// Sum of the immediates: the received size of a single buffer not `ringed`.
    pub imm_sum: u64,
}

#[derive(Copy, Clone, Debug)]
struct RecvSlot {
    n: usize,
    ringed: bool,
    pending: usize,
    imm_sum: u64,
}

/// Receiver side of one connection.
#[derive(Debug)]
pub struct RecvSide {
    layout: Layout,
    next_seq: u64,
    slots: Vec<Option<RecvSlot>>,
    expected: Vec<VecDeque<u64>>,
}

impl RecvSide {
    /// A receiver whose first message is sequence 0.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            next_seq: 0,
            slots: vec![None; SLOTS],
            expected: vec![VecDeque::new(); layout.nqps],
        }
    }

    /// The connection's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Post `bufs` as one request. `Ok(None)`: every slot is busy, NCCL retries later.
    /// On success returns the request's slot and the CTS to write; the glue must first post one
    /// receive WQE on each QP of `layout().qps_for(seq)`, where `seq` is the returned sequence.
    ///
    /// # Errors
    /// `Misuse` when `bufs` is empty or longer than [`MAX_RECVS`], or a buffer is larger than
    /// [`MAX_MESSAGE_BYTES`].
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
        for q in qps.clone() {
            self.expected[q].push_back(seq);
        }
        self.slots[slot] = Some(RecvSlot {
            n: bufs.len(),
            ringed: uses_sizes_ring(bufs.len(), capacity),
            pending: qps.len(),
            imm_sum: 0,
        });
        self.next_seq += 1;
        let nreqs = u32::try_from(bufs.len()).unwrap_or(0);
        let entries = bufs
            .iter()
            .map(|b| Cts {
                addr: b.addr,
                size: b.size,
                rkeys: b.rkeys,
                tag: b.tag,
                nreqs,
                seq_plus_one: seq + 1,
            })
            .collect();
        Ok(Some((seq, CtsPost { slot, qps, entries })))
    }

    /// Account for a write-with-immediate that completed on QP `qp`.
    ///
    /// # Errors
    /// `Remote` when no message was expected on that QP (the peer broke the protocol).
    pub fn handle_completion(&mut self, qp: usize, imm: u32) -> Result<()> {
        let seq = self
            .expected
            .get_mut(qp)
            .and_then(VecDeque::pop_front)
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
}

impl RdmaWrite {
    /// The part of `buf` the `pos`-th of `used` QPs carries into the buffer `cts` advertised,
    /// with the keys of the members QP `qp` connects.
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
}

impl Post {
    /// The QP the operation goes on.
    pub fn qp(&self) -> usize {
        match self {
            Self::Write(w) | Self::WriteImm { write: w, .. } => w.qp,
            Self::Sizes { qp, .. } => *qp,
        }
    }
}

/// What `isend` accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Slot of the message.
    pub slot: usize,
    /// Entry of the slot this send matched.
    pub entry: usize,
    /// `(requested, delivered)` when the send was larger than the posted receive.
    pub truncated: Option<(u64, u64)>,
    /// Operations to post now (empty until every entry of a grouped receive is matched).
    pub posts: Vec<Post>,
}

#[derive(Copy, Clone, Debug)]
struct SendSlot {
    seq: u64,
    cts: Group<Cts>,
    /// The send matched to each entry (the first `cts.len()` are used).
    matched: [Option<SendBuf>; MAX_RECVS],
    /// Which entries NCCL saw done.
    tested: [bool; MAX_RECVS],
    pending: usize,
    posted: bool,
}

impl SendSlot {
    fn all_matched(&self) -> bool {
        self.matched[..self.cts.len()].iter().all(Option::is_some)
    }
}

/// Sender side of one connection.
#[derive(Debug)]
pub struct SendSide {
    layout: Layout,
    next_seq: u64,
    slots: Vec<Option<SendSlot>>,
    /// The vector the next [`Accepted::posts`] is built in, handed back by [`Self::recycle`]
    /// so that sending allocates nothing once it has grown to a message's posts.
    spare_posts: Vec<Post>,
}

impl SendSide {
    /// A sender whose first message is sequence 0.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            next_seq: 0,
            slots: vec![None; SLOTS],
            spare_posts: Vec::new(),
        }
    }

    /// The connection's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Give back the posts of an [`Accepted`] once they were posted, for the next message.
    pub fn recycle(&mut self, posts: Vec<Post>) {
        self.spare_posts = posts;
    }

    /// `Some((seq, slot))` when the next message's CTS has not been captured yet and its slot is
    /// free: the glue should look at that ring slot.
    pub fn wants_cts(&self) -> Option<(u64, usize)> {
        let slot = slot_of(self.next_seq);
        self.slots[slot].is_none().then_some((self.next_seq, slot))
    }

    /// Capture the CTS entries of the next message (all `nreqs` of them, each carrying
    /// `seq + 1`, as read from the ring).
    ///
    /// # Errors
    /// `Remote` when the entries are inconsistent (the receiver broke the protocol).
    pub fn handle_cts(&mut self, entries: Group<Cts>) -> Result<()> {
        let seq = self.next_seq;
        let n = entries.len();
        let consistent = (1..=MAX_RECVS).contains(&n)
            && entries
                .iter()
                .all(|e| e.seq_plus_one == seq + 1 && e.nreqs as usize == n);
        if !consistent {
            return Err(Error::new(
                Kind::Remote,
                format!("inconsistent CTS for message {seq}"),
            ));
        }
        self.slots[slot_of(seq)] = Some(SendSlot {
            seq,
            cts: entries,
            matched: [None; MAX_RECVS],
            tested: [false; MAX_RECVS],
            pending: 0,
            posted: false,
        });
        Ok(())
    }

    /// Match `buf` to the next message's first unmatched entry with the same tag (entries with
    /// equal tags fill in posting order). `Ok(None)`: the CTS has not arrived yet, or no
    /// unmatched entry of that message carries this tag; NCCL retries later, as with its own
    /// transport (`ncclIbIsend` returns a NULL request after the tag loop, net_ib/p2p.cc).
    ///
    /// # Errors
    /// `Misuse` when `buf` is larger than [`MAX_MESSAGE_BYTES`].
    pub fn isend(&mut self, buf: SendBuf) -> Result<Option<Accepted>> {
        check_message_size(buf.size, "a send")?;
        Ok(self.match_send(buf))
    }

    fn match_send(&mut self, buf: SendBuf) -> Option<Accepted> {
        let seq = self.next_seq;
        let slot_index = slot_of(seq);
        let slot = self.slots[slot_index]
            .as_mut()
            .filter(|s| s.seq == seq && !s.posted)?;
        let entry = (0..slot.cts.len())
            .find(|&i| slot.matched[i].is_none() && slot.cts[i].tag == buf.tag)?;
        let capacity = slot.cts[entry].size;
        let truncated = (buf.size > capacity).then_some((buf.size, capacity));
        slot.matched[entry] = Some(SendBuf {
            size: buf.size.min(capacity),
            ..buf
        });
        let mut accepted = Accepted {
            slot: slot_index,
            entry,
            truncated,
            posts: Vec::new(),
        };
        if slot.all_matched() {
            accepted.posts = self.layout_posts(slot_index);
            self.next_seq += 1;
        }
        Some(accepted)
    }

    fn layout_posts(&mut self, slot_index: usize) -> Vec<Post> {
        let layout = self.layout;
        let Some(slot) = self.slots[slot_index].as_mut() else {
            return Vec::new();
        };
        let capacity = capacity(slot.cts.iter().map(|c| c.size));
        let qps = layout.qps_for(slot.seq, capacity);
        let used = qps.len();
        let n = slot.cts.len();
        let bufs: Group<SendBuf> = slot.matched.iter().flatten().copied().collect();
        let ringed = uses_sizes_ring(n, capacity);
        let mut posts = std::mem::take(&mut self.spare_posts);
        posts.clear();
        for (pos, qp) in qps.enumerate() {
            if !ringed {
                // The payload's last write carries the immediate: the bytes this QP delivered
                // (they fit: the capacity does).
                let write = RdmaWrite::chunk(&layout, qp, &slot.cts[0], &bufs[0], pos, used);
                let imm = u32::try_from(write.len).unwrap_or(u32::MAX);
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
            for (i, (cts, buf)) in slot.cts.iter().zip(&bufs).enumerate() {
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
                ..RdmaWrite::chunk(&layout, qp, &slot.cts[0], &bufs[0], 0, 1)
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

    /// Account for the signaled write-with-immediate of `slot` completing on one QP.
    ///
    /// # Errors
    /// `Misuse` for a slot with nothing in flight (a stray completion).
    pub fn handle_completion(&mut self, slot: usize) -> Result<()> {
        let s = self
            .slots
            .get_mut(slot)
            .and_then(Option::as_mut)
            .filter(|s| s.pending > 0);
        let s = s.ok_or_else(|| Error::misuse(format!("send completion for idle slot {slot}")))?;
        s.pending -= 1;
        Ok(())
    }

    /// Bytes delivered by the send matched to `entry` of `slot`, once its message completed.
    pub fn poll_done(&self, slot: usize, entry: usize) -> Option<u64> {
        let s = self.slots.get(slot)?.as_ref()?;
        if !s.posted || s.pending > 0 {
            return None;
        }
        s.matched.get(entry).copied().flatten().map(|b| b.size)
    }

    /// NCCL saw `entry` of `slot` done; the slot is freed when all its entries were.
    pub fn release(&mut self, slot: usize, entry: usize) {
        let Some(s) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if let Some(t) = s.tested.get_mut(entry) {
            *t = true;
        }
        if s.tested[..s.cts.len()].iter().all(|&t| t) {
            self.slots[slot] = None;
        }
    }
}

#[cfg(test)]
#[path = "proto_sim.rs"]
mod sim;
