//! Reliable-connected queue pairs: creation, INIT → RTR → RTS, and posting.

use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use super::{Access, CompletionQueue, ProtectionDomain};
use crate::core::error::{Error, Result};

pub use crate::core::queues::QpCaps;

/// Why [`QueuePair::post`] left requests in the chain.
#[derive(Debug)]
pub enum PostRefused {
    /// The send queue is full (`ENOMEM`): the requests the provider did not take are still in
    /// the chain, in order, to be posted once completions make room.
    Full,
    /// Any other failure; the chain is emptied.
    Failed(Error),
}

impl From<PostRefused> for Error {
    fn from(r: PostRefused) -> Self {
        match r {
            PostRefused::Full => Self::system(
                "ibv_post_send: send queue full",
                io::Error::from_raw_os_error(libc::ENOMEM),
            ),
            PostRefused::Failed(e) => e,
        }
    }
}

/// The remote end a QP connects to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RemoteEndpoint {
    /// Remote QP number.
    pub qpn: u32,
    /// Remote GID.
    pub gid: [u8; 16],
}

/// Path and retry parameters (NCCL's knobs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PathParams {
    /// Local port.
    pub port: u8,
    /// Path MTU (`ibv_mtu` code): the smaller of both sides.
    pub mtu: u8,
    /// Use a global route header (RoCE always; InfiniBand across subnets or where the port
    /// requires one).
    pub global: bool,
    /// Destination LID (InfiniBand): the peer's, or its FLID across subnets.
    pub dlid: u16,
    /// Local GID index.
    pub sgid_index: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Ack timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
}

/// What one work request does.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA write.
    Write,
    /// RDMA write with immediate data (host order).
    WriteImm(u32),
    /// RDMA read.
    Read,
}

/// A piece of registered local memory.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Sge {
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Local key of its registration.
    pub lkey: u32,
}

/// One send-queue work request over registered memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Id returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: Op,
    /// Local memory (source of a write, destination of a read); 0 bytes posts no
    /// scatter/gather entry.
    pub local: Sge,
    /// More local memory gathered right after `local` (an eager message's payload behind its
    /// header); none when empty.
    pub tail: Sge,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Generate a completion.
    pub signaled: bool,
    /// The local memory is host memory the CPU may read while posting. Only then may a small
    /// write go inline: the provider copies inline data with the CPU (mlx5's
    /// `set_data_inl_seg` is a `memcpy` from the SGE's address), and a GPU buffer's bytes must
    /// be read by the NIC. NCCL's IB transport posts no data inline at all (only its CTS, with
    /// `NCCL_IB_USE_INLINE=1`).
    pub cpu_readable: bool,
}

impl WorkRequest {
    /// Bytes the request moves.
    pub fn bytes(&self) -> u64 {
        u64::from(self.local.len) + u64::from(self.tail.len)
    }
}

/// Work requests one [`SendChain`] holds: what one `ibv_post_send` posts at most.
const CHAIN_CAPACITY: usize = 16;

/// An RC queue pair.
#[derive(Debug)]
pub struct QueuePair {
    raw: NonNull<sys::ibv_qp>,
    qpn: u32,
    max_inline: u32,
    /// It was created with a receive queue (`max_recv_wr` > 0).
    receives: bool,
    // Keep the PD and CQ alive until the QP is destroyed.
    pd: Arc<ProtectionDomain>,
    _cq: Arc<CompletionQueue>,
}

// SAFETY: verbs objects may be used from any thread; freed only in `Drop`.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

const IBV_QPS_INIT: u32 = 1;
const IBV_QPS_RTR: u32 = 2;
const IBV_QPS_RTS: u32 = 3;
const IBV_QPS_ERR: u32 = 6;
const IBV_QPT_RC: u32 = 2;
const IBV_SEND_SIGNALED: u32 = 2;
const IBV_SEND_INLINE: u32 = 8;

impl QueuePair {
    /// Create an RC QP on `pd` whose send and receive completions go to `cq`.
    ///
    /// # Errors
    /// `System` when `ibv_create_qp` fails.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Self> {
        let mut last_error = None;
        let ladder = [caps.max_inline, caps.max_inline.min(64), 0];
        for (i, &max_inline) in ladder.iter().enumerate() {
            if i > 0 && max_inline == ladder[i - 1] {
                continue;
            }
            // SAFETY: all-zero is a valid ibv_qp_init_attr (plain C data); fields set below.
            let mut attr: sys::ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
            attr.send_cq = cq.raw();
            attr.recv_cq = cq.raw();
            attr.qp_type = IBV_QPT_RC;
            attr.cap.max_send_wr = caps.max_send_wr;
            attr.cap.max_recv_wr = caps.max_recv_wr;
            attr.cap.max_send_sge = 2;
            attr.cap.max_recv_sge = 1;
            attr.cap.max_inline_data = max_inline;
            // SAFETY: live PD and a fully initialised attribute struct.
            let raw = unsafe { sys::ibv_create_qp(pd.raw(), &mut attr) };
            match NonNull::new(raw) {
                Some(raw) => {
                    // SAFETY: a QP just created by libibverbs.
                    let qpn = unsafe { raw.as_ref() }.qp_num;
                    return Ok(Self {
                        raw,
                        qpn,
                        max_inline,
                        receives: caps.max_recv_wr > 0,
                        pd: Arc::clone(pd),
                        _cq: Arc::clone(cq),
                    });
                }
                None => last_error = Some(io::Error::last_os_error()),
            }
        }
        Err(Error::system(
            format!("ibv_create_qp on {} failed", pd.device().name()),
            last_error.unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL)),
        ))
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// `"rxe0 QP 0x11"`, for log lines.
    pub fn label(&self) -> String {
        format!("{} QP {:#x}", self.pd.device().name(), self.qpn)
    }

    /// The traffic class and service level of the QP's path, as the device reports them
    /// (`ibv_query_qp` of the address vector).
    ///
    /// # Errors
    /// `System` when the query fails.
    pub fn qos(&self) -> Result<(u8, u8)> {
        let mut attr = Self::zeroed_attr();
        // SAFETY: all-zero is a valid ibv_qp_init_attr (plain C data).
        let mut init: sys::ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
        // IBV_QP_AV
        let mask = 128;
        // SAFETY: live QP and writable attribute structs.
        let rc = unsafe { sys::ibv_query_qp(self.raw.as_ptr(), &mut attr, mask, &mut init) };
        if rc != 0 {
            return Err(Error::system(
                format!("ibv_query_qp of QP {:#x}", self.qpn),
                io::Error::from_raw_os_error(rc),
            ));
        }
        Ok((attr.ah_attr.grh.traffic_class, attr.ah_attr.sl))
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: u32, what: &str) -> Result<()> {
        let mask = i32::try_from(mask).unwrap_or(0);
        // SAFETY: live QP; `attr` is a valid attribute struct for the fields in `mask`.
        let rc = unsafe { sys::ibv_modify_qp(self.raw.as_ptr(), attr, mask) };
        if rc != 0 {
            let device = self.pd.device().name();
            return Err(Error::system(
                format!(
                    "ibv_modify_qp to {what} failed on {device} QP {:#x}",
                    self.qpn
                ),
                io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    fn zeroed_attr() -> sys::ibv_qp_attr {
        // SAFETY: all-zero is a valid ibv_qp_attr (plain C data).
        unsafe { MaybeUninit::<sys::ibv_qp_attr>::zeroed().assume_init() }
    }

    /// RESET → INIT on `port`'s partition at `pkey_index`, with the given remote access rights.
    ///
    /// # Errors
    /// `System` when the transition fails (e.g. EINVAL for an empty P_Key entry).
    pub fn to_init(&self, port: u8, pkey_index: u16, access: Access) -> Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = pkey_index;
        a.port_num = port;
        a.qp_access_flags = access.bits();
        // STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
        self.modify(&mut a, 1 | 16 | 32 | 8, "INIT")
    }

    /// INIT → RTR towards `remote`.
    ///
    /// # Errors
    /// `System` when the transition fails (e.g. EINVAL for a bad GID index or MTU).
    pub fn to_rtr(&self, remote: &RemoteEndpoint, path: &PathParams) -> Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = u32::from(path.mtu);
        a.dest_qp_num = remote.qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = path.dlid;
        a.ah_attr.sl = path.service_level;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = path.port;
        if path.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.flow_label = 0;
            a.ah_attr.grh.sgid_index = path.sgid_index;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.traffic_class = path.traffic_class;
        }
        // STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER
        self.modify(
            &mut a,
            1 | 128 | 256 | 1_048_576 | 4096 | 131_072 | 32_768,
            "RTR",
        )
    }

    /// RTR → RTS.
    ///
    /// # Errors
    /// `System` when the transition fails.
    pub fn to_rts(&self, path: &PathParams) -> Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = IBV_QPS_RTS;
        a.timeout = path.timeout;
        a.retry_cnt = path.retry_cnt;
        a.rnr_retry = 7;
        a.sq_psn = 0;
        a.max_rd_atomic = 1;
        // STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC
        self.modify(&mut a, 1 | 512 | 1024 | 2048 | 65_536 | 8192, "RTS")
    }

    /// Any state → ERR: nothing more is sent or received through the QP, and every work
    /// request it holds, or that is posted to it from now on, completes with an error.
    ///
    /// # Errors
    /// `System` when the transition fails.
    pub fn to_error(&self) -> Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = IBV_QPS_ERR;
        self.modify(&mut a, 1, "ERR")
    }

    /// Post a signaled zero-byte write numbered `send_id`, and a receive numbered `recv_id`,
    /// to a QP in ERR:
    /// they complete (flushed) after everything posted before them, so their completions say
    /// the QP is drained (how the kernel's `ib_drain_qp` does it). A QP without a receive queue
    /// gets no receive marker: none of its receives can complete. Returns whether it got one.
    ///
    /// # Errors
    /// `System` when a post fails.
    pub fn post_drain_markers(&self, send_id: u64, recv_id: u64) -> Result<bool> {
        let marker = WorkRequest {
            wr_id: send_id,
            op: Op::Write,
            local: Sge::default(),
            tail: Sge::default(),
            remote_addr: 0,
            rkey: 0,
            signaled: true,
            cpu_readable: true,
        };
        // SAFETY: a zero-byte write reads and writes no memory, and on a QP in ERR nothing is
        // sent at all.
        unsafe { self.post_one(&marker) }.map_err(Error::from)?;
        if !self.receives {
            return Ok(false);
        }
        self.post_recv(recv_id).map(|()| true)
    }

    /// An empty chain for this QP (it knows how much the QP takes inline).
    pub fn chain(&self) -> SendChain {
        SendChain::new(self.max_inline)
    }

    /// Post what `chain` holds with one `ibv_post_send`, and empty it.
    ///
    /// # Safety
    /// `chain` came from [`Self::chain`] of this QP. Every local range must stay registered and
    /// unchanged (for writes) or writable (for reads), and every remote range valid for the
    /// peer, until the chain's completions are polled or the QP is destroyed; ranges the QP
    /// takes inline are copied by the post (for requests the chain keeps, by a later post).
    ///
    /// # Errors
    /// [`PostRefused::Full`] when the send queue had no room for every request: the ones it
    /// did not take stay in the chain, in order. [`PostRefused::Failed`] for any other refusal;
    /// the chain is emptied.
    pub unsafe fn post(&self, chain: &mut SendChain) -> std::result::Result<(), PostRefused> {
        let n = chain.len;
        if n == 0 {
            return Ok(());
        }
        chain.len = 0;
        let first = chain.wrs.as_ptr();
        // The requests are linked up front; cut the link after the last one for this post.
        let last = first.wrapping_add(n - 1);
        // SAFETY: `last` is one of the chain's CHAIN_CAPACITY requests (n <= CHAIN_CAPACITY);
        // only raw pointers into the chain exist.
        let after = unsafe { (*last).next };
        // SAFETY: as above.
        unsafe { (*last).next = std::ptr::null_mut() };
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; the first n requests are initialised and linked, their SGEs point
        // into the chain; memory validity is the caller's contract.
        let rc = unsafe { sys::ibv_post_send(self.raw.as_ptr(), first, &mut bad) };
        // SAFETY: as above.
        unsafe { (*last).next = after };
        if rc == 0 {
            return Ok(());
        }
        if rc == libc::ENOMEM {
            // The provider took the requests before `bad` (posted in order), none from it on.
            let taken = (0..n).find(|&i| first.wrapping_add(i) == bad);
            if let Some(taken) = taken {
                chain.keep_from(taken, n);
                return Err(PostRefused::Full);
            }
        }
        Err(PostRefused::Failed(self.post_failed(n, rc)))
    }

    /// Post `w` alone with one `ibv_post_send`, its C request built on the stack: what
    /// [`Self::post`] of a chain holding only `w` does, without a chain.
    ///
    /// # Safety
    /// As [`Self::post`], for `w`'s ranges.
    ///
    /// # Errors
    /// As [`Self::post`]; on [`PostRefused::Full`] nothing was posted (`w` is the caller's to
    /// keep).
    #[inline(always)]
    pub unsafe fn post_one(&self, w: &WorkRequest) -> std::result::Result<(), PostRefused> {
        // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero fields).
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        let empty = sys::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        let mut pair = [empty; 2];
        fill(&mut wr, &mut pair, w, self.max_inline);
        wr.sg_list = pair.as_mut_ptr();
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; `wr` and its SGEs live across the call (inline data is copied by
        // it, the rest the provider reads from the registered memory the caller vouched for).
        let rc = unsafe { sys::ibv_post_send(self.raw.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(self.refused(rc));
        }
        Ok(())
    }

    /// What a refused single post means. Out of line, as [`Self::post_failed`].
    #[cold]
    #[inline(never)]
    fn refused(&self, rc: i32) -> PostRefused {
        if rc == libc::ENOMEM {
            PostRefused::Full
        } else {
            PostRefused::Failed(self.post_failed(1, rc))
        }
    }

    /// The error of an `ibv_post_send` of `n` requests that returned `rc`. Out of line: the
    /// posts' success path should carry none of this.
    #[cold]
    #[inline(never)]
    fn post_failed(&self, n: usize, rc: i32) -> Error {
        let device = self.pd.device().name();
        Error::system(
            format!(
                "ibv_post_send of {n} work requests on {device} QP {:#x} failed",
                self.qpn
            ),
            io::Error::from_raw_os_error(rc),
        )
    }

    /// Post one receive with no scatter/gather entry (it only absorbs a write-with-immediate).
    ///
    /// # Errors
    /// `System` when the receive queue is full or the QP is broken.
    pub fn post_recv(&self, wr_id: u64) -> Result<()> {
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: live QP; a zero-SGE receive references no memory.
        let rc = unsafe { sys::ibv_post_recv(self.raw.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            let device = self.pd.device().name();
            return Err(Error::system(
                format!("ibv_post_recv on {device} QP {:#x} failed", self.qpn),
                io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_qp`, destroyed once.
        let rc = unsafe { sys::ibv_destroy_qp(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "ibv_destroy_qp on {} QP {:#x} failed (QP leaked): {}",
                self.pd.device().name(),
                self.qpn,
                io::Error::from_raw_os_error(rc)
            );
        }
    }
}

/// Work requests built in place for one `ibv_post_send`. The C structures are allocated and
/// linked once, so adding a request writes only its own fields (no zeroing, no conversion at
/// post time), and a write that continues the previous one extends it instead of adding one
/// (a run of adjacent answers goes as one write). Only raw pointers reach into the arrays:
/// the provider reads them through the links while posting.
#[derive(Debug)]
pub struct SendChain {
    wrs: NonNull<sys::ibv_send_wr>,
    sges: NonNull<[sys::ibv_sge; 2]>,
    len: usize,
    max_inline: u32,
}

// SAFETY: the pointers reach only into the chain's own allocations, which move with it.
unsafe impl Send for SendChain {}

/// `ibv_send_wr::send_flags` of a request moving `bytes`: signaled as asked, inline when the QP
/// takes that much inline and the CPU may read the source (reads never are).
fn send_flags(signaled: bool, bytes: u64, max_inline: u32, op: Op, cpu_readable: bool) -> u32 {
    let inline = cpu_readable && bytes > 0 && bytes <= u64::from(max_inline) && op != Op::Read;
    (if signaled { IBV_SEND_SIGNALED } else { 0 }) | (if inline { IBV_SEND_INLINE } else { 0 })
}

/// Write `w` into C request `wr` and its two SGEs, for a QP that takes `max_inline` bytes
/// inline (`wr.sg_list`, pointing at `pair`, and `wr.next` are the caller's). Always inlined:
/// [`QueuePair::post_one`] runs it for every message, and out of line it costs some 40 more
/// instructions per post (measured when LLVM stopped inlining it by itself).
#[inline(always)]
fn fill(wr: &mut sys::ibv_send_wr, pair: &mut [sys::ibv_sge; 2], w: &WorkRequest, max_inline: u32) {
    let pieces = match (w.local.len, w.tail.len) {
        (0, _) => 0,
        (_, 0) => 1,
        _ => 2,
    };
    let (opcode, imm) = match w.op {
        Op::Write => (sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, 0),
        Op::WriteImm(imm) => (sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM, imm),
        Op::Read => (sys::ibv_wr_opcode::IBV_WR_RDMA_READ, 0),
    };
    let sge = |s: &Sge| sys::ibv_sge {
        addr: s.addr,
        length: s.len,
        lkey: s.lkey,
    };
    *pair = [sge(&w.local), sge(&w.tail)];
    wr.wr_id = w.wr_id;
    wr.num_sge = pieces;
    wr.opcode = opcode;
    wr.send_flags = send_flags(w.signaled, w.bytes(), max_inline, w.op, w.cpu_readable);
    wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
    wr.wr.rdma = sys::rdma_t {
        remote_addr: w.remote_addr,
        rkey: w.rkey,
    };
}

/// A bitwise copy of `wr` (a plain C struct whose pointers the caller re-points).
fn copy_fields(wr: &sys::ibv_send_wr) -> sys::ibv_send_wr {
    // SAFETY: ibv_send_wr is plain C data; the copy's pointers are replaced before use.
    unsafe { std::ptr::read(wr) }
}

impl SendChain {
    fn new(max_inline: u32) -> Self {
        let wrs = NonNull::from(Box::leak(
            // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero fields).
            unsafe { Box::<[sys::ibv_send_wr]>::new_zeroed_slice(CHAIN_CAPACITY).assume_init() },
        ))
        .cast::<sys::ibv_send_wr>();
        let sges = NonNull::from(Box::leak(
            // SAFETY: all-zero is a valid ibv_sge.
            unsafe { Box::<[[sys::ibv_sge; 2]]>::new_zeroed_slice(CHAIN_CAPACITY).assume_init() },
        ))
        .cast::<[sys::ibv_sge; 2]>();
        let mut chain = Self {
            wrs,
            sges,
            len: 0,
            max_inline,
        };
        for i in 0..CHAIN_CAPACITY {
            let next = if i + 1 < CHAIN_CAPACITY {
                wrs.as_ptr().wrapping_add(i + 1)
            } else {
                std::ptr::null_mut()
            };
            let (wr, pair) = chain.entry(i);
            wr.sg_list = pair.as_mut_ptr();
            wr.next = next;
        }
        chain
    }

    /// Request `i` and its two SGEs. The references end before any post: the provider reads
    /// the chain only inside [`QueuePair::post`].
    fn entry(&mut self, i: usize) -> (&mut sys::ibv_send_wr, &mut [sys::ibv_sge; 2]) {
        assert!(i < CHAIN_CAPACITY, "send chain entry out of bounds");
        let (wr, pair) = (
            self.wrs.as_ptr().wrapping_add(i),
            self.sges.as_ptr().wrapping_add(i),
        );
        // SAFETY: in bounds of the chain's allocation (checked); `&mut self` excludes any
        // other access.
        let wr = unsafe { &mut *wr };
        // SAFETY: as above, in the other allocation.
        let pair = unsafe { &mut *pair };
        (wr, pair)
    }

    /// Whether the chain holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Requests in the chain.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no request can be added.
    pub fn is_full(&self) -> bool {
        self.len == CHAIN_CAPACITY
    }

    /// Keep requests `from..n` (a post took the ones before): moved to the front, in order.
    /// The links and SGE pointers stay where they are; only the requests' own fields move.
    fn keep_from(&mut self, from: usize, n: usize) {
        for (to, i) in (from..n).enumerate() {
            let (wr, pair) = self.entry(i);
            let (wr, pair) = (copy_fields(wr), *pair);
            let (dst, dst_pair) = self.entry(to);
            let (next, sg_list) = (dst.next, dst.sg_list);
            *dst = wr;
            dst.next = next;
            dst.sg_list = sg_list;
            *dst_pair = pair;
        }
        self.len = n - from;
    }

    /// Append `w`; `false` (and nothing added) when the chain is full.
    pub fn push(&mut self, w: &WorkRequest) -> bool {
        if self.len == CHAIN_CAPACITY {
            return false;
        }
        let max_inline = self.max_inline;
        let (wr, pair) = self.entry(self.len);
        fill(wr, pair, w, max_inline);
        self.len += 1;
        true
    }

    /// Extend the last request by `w` when `w` continues it: both RDMA writes of one piece,
    /// the last one unsignaled, `w` reading the local bytes right after the last one's and
    /// writing the remote bytes right after its own, under the same keys. Returns whether it
    /// did (the merged write is signaled, with `w`'s id, when `w` is).
    pub fn merge(&mut self, w: &WorkRequest) -> bool {
        if self.len == 0 || w.op != Op::Write || w.tail.len != 0 || w.local.len == 0 {
            return false;
        }
        let max_inline = self.max_inline;
        let (wr, pair) = self.entry(self.len - 1);
        if wr.opcode != sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            || wr.num_sge != 1
            || wr.send_flags & IBV_SEND_SIGNALED != 0
        {
            return false;
        }
        // SAFETY: an RDMA write's `wr` union holds `rdma` (set by `push`).
        let rdma = unsafe { wr.wr.rdma };
        let last = &mut pair[0];
        let continues = last.lkey == w.local.lkey
            && rdma.rkey == w.rkey
            && last.addr + u64::from(last.length) == w.local.addr
            && rdma.remote_addr + u64::from(last.length) == w.remote_addr;
        let Some(total) = last.length.checked_add(w.local.len).filter(|_| continues) else {
            return false;
        };
        last.length = total;
        // Under the same local key, both pieces are of one registration, so of one kind.
        wr.send_flags = send_flags(
            w.signaled,
            u64::from(total),
            max_inline,
            Op::Write,
            w.cpu_readable,
        );
        if w.signaled {
            wr.wr_id = w.wr_id;
        }
        true
    }
}

impl Drop for SendChain {
    fn drop(&mut self) {
        let wrs = std::ptr::slice_from_raw_parts_mut(self.wrs.as_ptr(), CHAIN_CAPACITY);
        let sges = std::ptr::slice_from_raw_parts_mut(self.sges.as_ptr(), CHAIN_CAPACITY);
        // SAFETY: a boxed slice of CHAIN_CAPACITY entries leaked in `new`, freed once.
        drop(unsafe { Box::from_raw(wrs) });
        // SAFETY: as above.
        drop(unsafe { Box::from_raw(sges) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(local: u64, remote: u64, len: u32, signaled: bool) -> WorkRequest {
        WorkRequest {
            wr_id: local,
            op: Op::Write,
            local: Sge {
                addr: local,
                len,
                lkey: 5,
            },
            tail: Sge::default(),
            remote_addr: remote,
            rkey: 9,
            signaled,
            cpu_readable: true,
        }
    }

    /// The C view of request `i`: (wr_id, num_sge, flags, first SGE length, remote address).
    fn view(c: &mut SendChain, i: usize) -> (u64, i32, u32, u32, u64) {
        let (wr, pair) = c.entry(i);
        // SAFETY: every request in these tests is an RDMA operation.
        let remote = unsafe { wr.wr.rdma }.remote_addr;
        (wr.wr_id, wr.num_sge, wr.send_flags, pair[0].length, remote)
    }

    #[test]
    fn adjacent_unsignaled_writes_merge_into_one_and_a_signaled_one_closes_the_run() {
        let mut c = SendChain::new(64);
        assert!(c.push(&write(1000, 5000, 64, false)));
        assert!(c.merge(&write(1064, 5064, 64, false)));
        // The merged write is 128 bytes: too long to go inline.
        assert_eq!(view(&mut c, 0), (1000, 1, 0, 128, 5000));
        // A signaled continuation joins and makes the write signaled, with its id.
        assert!(c.merge(&write(1128, 5128, 64, true)));
        assert_eq!(view(&mut c, 0), (1128, 1, IBV_SEND_SIGNALED, 192, 5000));
        // Nothing joins a signaled write (its completion stands for what it carries).
        assert!(!c.merge(&write(1192, 5192, 64, false)));
        assert_eq!(c.len, 1);
    }

    #[test]
    fn writes_that_do_not_continue_the_last_one_are_not_merged() {
        let mut c = SendChain::new(64);
        assert!(!c.merge(&write(0, 0, 64, false)), "nothing to merge into");
        assert!(c.push(&write(1000, 5000, 64, false)));
        for (w, why) in [
            (write(1064, 6000, 64, false), "remote gap"),
            (write(2000, 5064, 64, false), "local gap"),
            (
                WorkRequest {
                    rkey: 8,
                    ..write(1064, 5064, 64, false)
                },
                "other rkey",
            ),
            (
                WorkRequest {
                    op: Op::WriteImm(1),
                    ..write(1064, 5064, 64, false)
                },
                "immediate",
            ),
            (write(1064, 5064, 0, false), "empty"),
        ] {
            assert!(!c.merge(&w), "{why}");
        }
        assert_eq!(view(&mut c, 0), (1000, 1, IBV_SEND_INLINE, 64, 5000));
    }

    #[test]
    fn two_pieces_gather_behind_each_other_and_inline_when_small() {
        let mut c = SendChain::new(64);
        let eager = WorkRequest {
            op: Op::WriteImm(7),
            tail: Sge {
                addr: 9000,
                len: 8,
                lkey: 6,
            },
            ..write(1000, 5000, 16, true)
        };
        assert!(c.push(&eager));
        let (wr, pair) = c.entry(0);
        assert_eq!(wr.num_sge, 2);
        assert_eq!(wr.send_flags, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
        assert_eq!((pair[1].addr, pair[1].length, pair[1].lkey), (9000, 8, 6));
        // SAFETY: reading the immediate written by `push`.
        let imm = unsafe { wr.imm_data_invalidated_rkey_union.imm_data };
        assert_eq!(imm, 7u32.to_be());
    }

    /// A GPU buffer's bytes are read by the NIC: a write from memory the CPU cannot read never
    /// goes inline, however small, alone or merged (the provider would copy it with the CPU
    /// while posting; NCCL's transport posts no data inline).
    #[test]
    fn a_write_from_memory_the_cpu_cannot_read_never_goes_inline() {
        let gpu = |local, remote, len, signaled| WorkRequest {
            cpu_readable: false,
            ..write(local, remote, len, signaled)
        };
        let mut c = SendChain::new(64);
        assert!(c.push(&gpu(1000, 5000, 8, false)));
        assert_eq!(view(&mut c, 0), (1000, 1, 0, 8, 5000));
        assert!(c.merge(&gpu(1008, 5008, 8, true)));
        assert_eq!(view(&mut c, 0), (1008, 1, IBV_SEND_SIGNALED, 16, 5000));
        // The same write from host memory goes inline.
        let mut c = SendChain::new(64);
        assert!(c.push(&write(1000, 5000, 8, false)));
        assert_eq!(view(&mut c, 0), (1000, 1, IBV_SEND_INLINE, 8, 5000));
    }

    #[test]
    fn a_full_chain_refuses_more_and_its_links_stay_in_place() {
        let mut c = SendChain::new(0);
        for i in 0..CHAIN_CAPACITY as u64 {
            assert!(c.push(&write(i * 4096, i * 4096, 8, false)));
        }
        assert!(!c.push(&write(0, 0, 8, false)));
        let base = c.wrs.as_ptr();
        for i in 0..CHAIN_CAPACITY {
            let (wr, pair) = c.entry(i);
            let expected = if i + 1 < CHAIN_CAPACITY {
                base.wrapping_add(i + 1)
            } else {
                std::ptr::null_mut()
            };
            assert_eq!(wr.next, expected);
            assert_eq!(wr.sg_list, pair.as_mut_ptr());
        }
    }
}
