//! Completion queues: `ibv_create_cq`, `ibv_poll_cq`.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use super::Device;
use crate::core::error::{Error, Result};

/// Completions read per `ibv_poll_cq` call.
const POLL_BATCH: usize = 16;

/// `ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM`.
pub const OPCODE_RECV_RDMA_WITH_IMM: u32 = 129;
const WC_WITH_IMM: u32 = 2;

/// A completion queue.
#[derive(Debug)]
pub struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    device: Arc<Device>,
}

// SAFETY: verbs objects may be used from any thread; freed only in `Drop`.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

/// One work completion, copied out of the CQ.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// `IBV_WC_*` status (0 = success).
    pub status: u32,
    /// `IBV_WC_*` opcode (valid on success).
    pub opcode: u32,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// QP number the completion belongs to.
    pub qp_num: u32,
    /// Immediate data (host order), if any.
    pub imm: Option<u32>,
}

impl Completion {
    /// Whether the work request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == 0
    }

    /// libibverbs' name for the status, e.g. "transport retry counter exceeded".
    pub fn status_name(&self) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let s = unsafe { sys::ibv_wc_status_str(self.status) };
        if s.is_null() {
            return format!("status {}", self.status);
        }
        // SAFETY: non-NULL static NUL-terminated string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

impl CompletionQueue {
    /// Create a CQ of at least `entries` entries on `device`.
    ///
    /// # Errors
    /// `System` when `ibv_create_cq` fails.
    pub fn new(device: &Arc<Device>, entries: u32) -> Result<Arc<Self>> {
        let cqe = i32::try_from(entries).unwrap_or(i32::MAX);
        // SAFETY: open context; no channel, no context pointer.
        let raw = unsafe {
            sys::ibv_create_cq(
                device.raw(),
                cqe,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::system(
                format!("ibv_create_cq({entries}) on {} failed", device.name()),
                io::Error::last_os_error(),
            )
        })?;
        Ok(Arc::new(Self {
            raw,
            device: Arc::clone(device),
        }))
    }

    pub(super) fn raw(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }

    /// Read up to one batch of completions and hand each to `each`, in order; returns how
    /// many there were (fewer than a full batch: the queue is now empty). The batch stays in
    /// this stack frame: polling is the hot loop of every `test`, and moving a batch of work
    /// completions around costs more than the poll itself.
    ///
    /// # Errors
    /// `System` when `ibv_poll_cq` fails (the CQ is broken), or the first error of `each`.
    pub fn poll_each(&self, mut each: impl FnMut(&Completion) -> Result<()>) -> Result<usize> {
        let mut wcs = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
        // SAFETY: live CQ; `wcs` has room for POLL_BATCH entries, which the provider writes.
        let n = unsafe { sys::ibv_poll_cq(self.raw(), POLL_BATCH as i32, wcs.as_mut_ptr().cast()) };
        if n < 0 {
            return Err(Error::system(
                format!("ibv_poll_cq on {} failed", self.device.name()),
                io::Error::from_raw_os_error(-n),
            ));
        }
        let n = n as usize;
        for wc in &wcs[..n] {
            // SAFETY: the provider initialised the first `n` entries.
            let wc = unsafe { wc.assume_init_ref() };
            // SAFETY: reading a plain u32 out of a union of u32s.
            let imm = unsafe { wc.imm_data_invalidated_rkey_union.imm_data };
            each(&Completion {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                vendor_err: wc.vendor_err,
                qp_num: wc.qp_num,
                imm: (wc.wc_flags & WC_WITH_IMM != 0).then(|| u32::from_be(imm)),
            })?;
        }
        Ok(n)
    }

    /// Completions one [`poll_each`](Self::poll_each) reads at most.
    pub const BATCH: usize = POLL_BATCH;
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_cq`, destroyed once after every QP using it (QPs hold Arcs).
        let rc = unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "ibv_destroy_cq on {} failed: {}",
                self.device.name(),
                io::Error::from_raw_os_error(rc)
            );
        }
    }
}
