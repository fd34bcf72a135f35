//! NCCL's profiler callback (v10+ `init`) as the transport's event sink: each QP event goes to
//! NCCL as an IB-style descriptor (`pluginId` = IB type, version 1), as NCCL's own IB transport
//! reports it (net_ib/p2p.cc), so a profiler plugin reads this plugin's events as NCCL's.

use std::ffi::{c_int, c_void};
use std::ptr;

use super::types::{
    NCCL_PROFILE_QP, NCCL_PROFILER_NET_EVENT_START, NCCL_PROFILER_NET_EVENT_STOP,
    NCCL_PROFILER_NET_IB_VER, NCCL_PROFILER_NET_TYPE_IB, ncclProfilerCallback_t,
    ncclProfilerNetIbDescr_v1_t, ncclProfilerNetIbQp_v1_t, ncclResult_t, ncclSuccess,
};
use crate::transport::{EventHandle, Parent, QpEvent, Sink, install_profiler};

/// `ibv_wr_opcode` values of the two writes the plugin reports.
const IBV_WR_RDMA_WRITE: c_int = 0;
const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;

/// NCCL's callback, never NULL.
struct NcclProfiler(
    unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> ncclResult_t,
);

/// Install `callback` (an `init`'s `profFunction`) as the sink of QP events; NULL installs
/// nothing.
pub(super) fn install(callback: ncclProfilerCallback_t) {
    if let Some(f) = callback {
        install_profiler(Box::new(NcclProfiler(f)));
    }
}

impl Sink for NcclProfiler {
    fn start(&self, parent: Parent, event: &QpEvent) -> Option<EventHandle> {
        let mut descr = ncclProfilerNetIbDescr_v1_t {
            type_: NCCL_PROFILE_QP,
            qp: ncclProfilerNetIbQp_v1_t {
                device: c_int::try_from(event.member).unwrap_or(c_int::MAX),
                wr_id: event.wr_id,
                opcode: if event.with_imm {
                    IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    IBV_WR_RDMA_WRITE
                },
                // NCCL's field is an int; QP numbers are 24 bits.
                qpNum: c_int::try_from(event.qp_num).unwrap_or(c_int::MAX),
                length: usize::try_from(event.length).unwrap_or(usize::MAX),
            },
        };
        let mut handle: *mut c_void = ptr::null_mut();
        // SAFETY: NCCL's callback with the parent NCCL passed for this request (non-NULL, its
        // proxy step), a descriptor that outlives the call (NCCL's profiler reads it during
        // the call) and a handle slot for the event.
        let rc = unsafe {
            (self.0)(
                &raw mut handle,
                NCCL_PROFILER_NET_EVENT_START,
                ptr::with_exposed_provenance_mut(parent.0.get()),
                NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER,
                (&raw mut descr).cast(),
            )
        };
        (rc == ncclSuccess && !handle.is_null()).then(|| EventHandle(handle.expose_provenance()))
    }

    fn stop(&self, event: EventHandle) {
        let mut handle: *mut c_void = ptr::with_exposed_provenance_mut(event.0);
        // SAFETY: a handle the callback gave at start, stopped once.
        let _ = unsafe {
            (self.0)(
                &raw mut handle,
                NCCL_PROFILER_NET_EVENT_STOP,
                ptr::null_mut(),
                0,
                ptr::null_mut(),
            )
        };
    }
}
