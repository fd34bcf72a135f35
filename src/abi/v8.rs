//! `ncclNetPlugin_v8` (NCCL 2.20+): `int` sizes, one process-wide `init`, no virtual devices
//! (the ports of a NIC are fused at init, [`DeviceModel::Fused`]).

use std::ffi::{c_int, c_void};
use std::ptr;

use super::entry::{
    self, Properties, net_accept, net_close_listen, net_close_recv, net_close_send, net_dereg_mr,
    net_devices, net_iflush, net_reg_mr, net_reg_mr_dma_buf, net_test, non_negative, properties,
};
use super::types::{
    ncclDebugLogger_t, ncclNet_v8_t, ncclNetDeviceHandle_v8_t, ncclNetProperties_v8_t, ncclResult_t,
};
use crate::plugin::DeviceModel;

/// Looked up by NCCL with `dlsym(handle, "ncclNetPlugin_v8")` (NCCL 2.20 and later).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v8: ncclNet_v8_t = ncclNet_v8_t {
    name: super::NAME.as_ptr(),
    init: Some(net_init_v8),
    devices: Some(net_devices),
    getProperties: Some(net_get_properties_v8),
    listen: Some(net_listen_v8),
    connect: Some(net_connect_v8),
    accept: Some(net_accept),
    regMr: Some(net_reg_mr),
    regMrDmaBuf: Some(net_reg_mr_dma_buf),
    deregMr: Some(net_dereg_mr),
    isend: Some(net_isend_v8),
    irecv: Some(net_irecv_v8),
    iflush: Some(net_iflush),
    test: Some(net_test),
    closeSend: Some(net_close_send),
    closeRecv: Some(net_close_recv),
    closeListen: Some(net_close_listen),
    // Host plugins have no device-side memory handles or receive-consumed notifications.
    getDeviceMr: None,
    irecvConsumed: None,
};

/// v8 and v9's `init(logger)`.
pub(super) unsafe extern "C" fn net_init_v8(logger: ncclDebugLogger_t) -> ncclResult_t {
    entry::init(logger, DeviceModel::Fused)
}

/// Copy `p` into v8's struct.
pub(super) fn properties_v8(p: Properties) -> ncclNetProperties_v8_t {
    properties!(ncclNetProperties_v8_t, p, {})
}

pub(super) unsafe extern "C" fn net_get_properties_v8(
    dev: c_int,
    props: *mut ncclNetProperties_v8_t,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::get_properties`).
    unsafe { entry::get_properties(dev, props, |p| Ok(properties_v8(p))) }
}

/// v8 to v10's `listen(dev, ...)`.
pub(super) unsafe extern "C" fn net_listen_v8(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::listen`).
    unsafe { entry::listen(dev, handle, listen_comm, || Ok(())) }
}

/// v8 and v9's `connect(dev, handle, ...)`: no communicator config.
pub(super) unsafe extern "C" fn net_connect_v8(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::connect`).
    unsafe { entry::connect(dev, handle, send_comm, || Ok(None)) }
}

pub(super) unsafe extern "C" fn net_isend_v8(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    let size = non_negative(size, "size");
    let none = ptr::null_mut();
    // SAFETY: forwarded from NCCL (see `entry::isend`); no profiler handle before v10.
    unsafe { entry::isend(send_comm, data, size, tag, mhandle, none, request) }
}

pub(super) unsafe extern "C" fn net_irecv_v8(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    let none = ptr::null_mut();
    // SAFETY: forwarded from NCCL (see `entry::irecv`); no profiler handles before v10.
    unsafe { entry::irecv(recv_comm, n, data, sizes, tags, mhandles, none, request) }
}
