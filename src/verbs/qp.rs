//! Reliable-connected queue pairs: creation, INIT → RTR → RTS, and posting.

use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use super::{Access, CompletionQueue, ProtectionDomain};
use crate::core::error::{Error, Result};

/// Queue depths of a QP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
}

/// Bytes a work request may carry inline (copied into the WQE at post time, so the NIC need
/// not fetch them): CTS entries and small payloads. A device that refuses gets 0.
const MAX_INLINE: u32 = 64;

/// The remote end a QP connects to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RemoteEndpoint {
    /// Remote QP number.
    pub qpn: u32,
    /// Remote LID (InfiniBand).
    pub lid: u16,
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
    /// Use a global route header (RoCE always).
    pub global: bool,
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

/// One send-queue work request over registered memory.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Id returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: Op,
    /// Local address (source of a write, destination of a read).
    pub local_addr: u64,
    /// Bytes; 0 posts no scatter/gather entry.
    pub len: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Generate a completion.
    pub signaled: bool,
}

/// Work requests posted with one `ibv_post_send` at most (longer lists are split).
const MAX_CHAIN: usize = 16;

/// An RC queue pair.
#[derive(Debug)]
pub struct QueuePair {
    raw: NonNull<sys::ibv_qp>,
    qpn: u32,
    max_inline: u32,
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
        for max_inline in [MAX_INLINE, 0] {
            // SAFETY: all-zero is a valid ibv_qp_init_attr (plain C data); fields set below.
            let mut attr: sys::ibv_qp_init_attr = unsafe { MaybeUninit::zeroed().assume_init() };
            attr.send_cq = cq.raw();
            attr.recv_cq = cq.raw();
            attr.qp_type = IBV_QPT_RC;
            attr.cap.max_send_wr = caps.max_send_wr;
            attr.cap.max_recv_wr = caps.max_recv_wr;
            attr.cap.max_send_sge = 1;
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

    /// RESET → INIT with the given remote access rights.
    ///
    /// # Errors
    /// `System` when the transition fails.
    pub fn to_init(&self, port: u8, access: Access) -> Result<()> {
        let mut a = Self::zeroed_attr();
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
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
        a.ah_attr.dlid = remote.lid;
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

    /// Post `wrs` as one chain on the send queue.
    ///
    /// # Safety
    /// Every local range must stay registered and unchanged (for writes) or writable (for reads),
    /// and every remote range valid for the peer, until the chain's completions are polled or the
    /// QP is destroyed.
    ///
    /// # Errors
    /// `System` when the provider refuses the post (e.g. ENOMEM: send queue full).
    pub unsafe fn post_send(&self, wrs: &[WorkRequest]) -> Result<()> {
        for chain in wrs.chunks(MAX_CHAIN) {
            // SAFETY: forwarded contract.
            unsafe { self.post_chain(chain) }?;
        }
        Ok(())
    }

    /// # Safety
    /// As `post_send`; `wrs.len() <= MAX_CHAIN`.
    unsafe fn post_chain(&self, wrs: &[WorkRequest]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        // Only the used entries are written: zeroing all MAX_CHAIN work requests (2 KiB) on
        // every post measurably slowed small messages.
        let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; MAX_CHAIN];
        let mut chain = [const { MaybeUninit::<sys::ibv_send_wr>::uninit() }; MAX_CHAIN];
        for (i, w) in wrs.iter().enumerate() {
            sges[i].write(sys::ibv_sge {
                addr: w.local_addr,
                length: w.len,
                lkey: w.lkey,
            });
            // SAFETY: all-zero is a valid ibv_send_wr (NULL pointers, zero fields).
            let mut c: sys::ibv_send_wr = unsafe { MaybeUninit::zeroed().assume_init() };
            c.wr_id = w.wr_id;
            c.num_sge = i32::from(w.len > 0);
            c.opcode = match w.op {
                Op::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                Op::WriteImm(imm) => {
                    c.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                }
                Op::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
            };
            let inline = w.len > 0 && w.len <= self.max_inline && !matches!(w.op, Op::Read);
            c.send_flags = (if w.signaled { IBV_SEND_SIGNALED } else { 0 })
                | (if inline { IBV_SEND_INLINE } else { 0 });
            c.wr.rdma = sys::rdma_t {
                remote_addr: w.remote_addr,
                rkey: w.rkey,
            };
            chain[i].write(c);
        }
        // Link the chain only now: no reference to either array is taken after these pointers.
        let (sge_base, chain_base) = (sges.as_mut_ptr(), chain.as_mut_ptr());
        for i in 0..wrs.len() {
            let entry = chain_base.wrapping_add(i);
            // SAFETY: `entry` points into `chain` (i < wrs.len() <= MAX_CHAIN); no other access
            // to the array is live.
            let entry = unsafe { &mut *entry };
            // SAFETY: entries 0..wrs.len() were written above.
            let c = unsafe { entry.assume_init_mut() };
            if c.num_sge > 0 {
                c.sg_list = sge_base.wrapping_add(i).cast();
            }
            if i + 1 < wrs.len() {
                c.next = chain_base.wrapping_add(i + 1).cast();
            }
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP and a well-formed chain whose SGEs and WRs outlive the call; memory
        // validity is the caller's contract.
        let rc = unsafe { sys::ibv_post_send(self.raw.as_ptr(), chain_base.cast(), &mut bad) };
        if rc != 0 {
            let device = self.pd.device().name();
            return Err(Error::system(
                format!(
                    "ibv_post_send of {} work requests on {device} QP {:#x} failed",
                    wrs.len(),
                    self.qpn
                ),
                io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
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
