//! What the sender's glue posts: send buffers, RDMA writes and the operations of a message on
//! each QP, and what `isend` hands back.

use super::*;

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
    /// with the keys of `members` (this side's, the peer's), the members QP `qp` connects.
    #[inline(always)]
    pub(super) fn chunk(
        qp: usize,
        members: (usize, usize),
        cts: &Cts,
        buf: &SendBuf,
        pos: usize,
        used: usize,
    ) -> Self {
        let (off, len) = Layout::chunk(buf.size, pos, used);
        Self {
            qp,
            local_addr: buf.addr + off,
            lkey: buf.lkeys[members.0],
            len,
            remote_addr: cts.addr + off,
            rkey: cts.rkeys[members.1],
            host: buf.host,
        }
    }
}

impl RdmaWrite {
    /// This write as writes of at most [`MAX_WRITE_BYTES`] (one, possibly empty, when short).
    pub(super) fn pieces(self) -> impl Iterator<Item = Self> {
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
        /// The members the QP connects (this side's, the peer's): whose keys it uses.
        members: (usize, usize),
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
    /// payload behind it into the receiver's bounce slot `bounce`.
    Eager {
        /// QP index.
        qp: usize,
        /// Message slot.
        slot: usize,
        /// Bounce slot ([`super::Layout::bounce_slot`]).
        bounce: usize,
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
