//! `ncclNetPlugin_v10` (NCCL 2.26+): v9 plus a profiler callback at `init`, the communicator's
//! config (traffic class) at `connect`, and profiler handles on `isend`/`irecv`, under which the
//! plugin reports its QP events (`super::profiler`).

use std::ffi::{c_int, c_void};

use super::entry::{
    self, net_accept, net_close_listen, net_close_recv, net_close_send, net_dereg_mr, net_devices,
    net_iflush, net_reg_mr, net_reg_mr_dma_buf, net_test,
};
use super::types::{
    ncclDebugLogger_t, ncclNet_v10_t, ncclNetCommConfig_v10_t, ncclNetDeviceHandle_v10_t,
    ncclProfilerCallback_t, ncclResult_t,
};
use super::v8::net_listen_v8;
use super::v9::{V9_TO_V11, net_get_properties_v9, net_make_vdevice_v9};
use crate::plugin::traffic_class_of;

/// Looked up by NCCL 2.26 and later.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v10: ncclNet_v10_t = ncclNet_v10_t {
    name: super::NAME.as_ptr(),
    init: Some(net_init_v10),
    devices: Some(net_devices),
    getProperties: Some(net_get_properties_v9),
    listen: Some(net_listen_v8),
    connect: Some(net_connect_v10),
    accept: Some(net_accept),
    regMr: Some(net_reg_mr),
    regMrDmaBuf: Some(net_reg_mr_dma_buf),
    deregMr: Some(net_dereg_mr),
    isend: Some(net_isend_v10),
    irecv: Some(net_irecv_v10),
    iflush: Some(net_iflush),
    test: Some(net_test),
    closeSend: Some(net_close_send),
    closeRecv: Some(net_close_recv),
    closeListen: Some(net_close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(net_make_vdevice_v9),
};

pub(super) unsafe extern "C" fn net_init_v10(
    logger: ncclDebugLogger_t,
    profiler: ncclProfilerCallback_t,
) -> ncclResult_t {
    super::profiler::install(profiler);
    entry::init(logger, V9_TO_V11)
}

pub(super) unsafe extern "C" fn net_connect_v10(
    dev: c_int,
    config: *mut ncclNetCommConfig_v10_t,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v10_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes NULL or a pointer to the communicator's config.
    let class =
        || unsafe { config.as_ref() }.map_or(Ok(None), |c| traffic_class_of(c.trafficClass));
    // SAFETY: forwarded from NCCL (see `entry::connect`).
    unsafe { entry::connect(dev, handle, send_comm, class) }
}

/// v10+'s `isend`, with the profiler handle its QP events go under.
pub(super) unsafe extern "C" fn net_isend_v10(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::isend`).
    unsafe {
        entry::isend(
            send_comm,
            data,
            Ok(size as u64),
            tag,
            mhandle,
            phandle,
            request,
        )
    }
}

/// v10+'s `irecv`, with the profiler handles (one per buffer) its QP events go under.
pub(super) unsafe extern "C" fn net_irecv_v10(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::irecv`).
    unsafe { entry::irecv(recv_comm, n, data, sizes, tags, mhandles, phandles, request) }
}
