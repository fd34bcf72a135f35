//! `ncclNetPlugin_v9` (NCCL 2.24+): `size_t` sizes, virtual devices made by NCCL through
//! `makeVDevice` ([`DeviceModel::Ports`]), and v9 properties (`forceFlush`, `vProps`, sizes).

use std::ffi::{c_int, c_void};
use std::ptr;

use super::entry::{
    self, Properties, net_accept, net_close_listen, net_close_recv, net_close_send, net_dereg_mr,
    net_devices, net_iflush, net_reg_mr, net_reg_mr_dma_buf, net_test, properties,
};
use super::types::{
    NCCL_NET_MAX_DEVS_PER_NIC_V11, ncclDebugLogger_t, ncclNet_v9_t, ncclNetProperties_v9_t,
    ncclNetVDeviceProps_v9_t, ncclResult_t,
};
use super::v8::{net_connect_v8, net_listen_v8};
use super::v10::{net_irecv_v10, net_isend_v10};
use crate::core::error::Result;
use crate::plugin::DeviceModel;

/// Looked up by NCCL 2.24 and later.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v9: ncclNet_v9_t = ncclNet_v9_t {
    name: super::NAME.as_ptr(),
    init: Some(net_init_v9),
    devices: Some(net_devices),
    getProperties: Some(net_get_properties_v9),
    listen: Some(net_listen_v8),
    connect: Some(net_connect_v8),
    accept: Some(net_accept),
    regMr: Some(net_reg_mr),
    regMrDmaBuf: Some(net_reg_mr_dma_buf),
    deregMr: Some(net_dereg_mr),
    isend: Some(net_isend_v9),
    irecv: Some(net_irecv_v9),
    iflush: Some(net_iflush),
    test: Some(net_test),
    closeSend: Some(net_close_send),
    closeRecv: Some(net_close_recv),
    closeListen: Some(net_close_listen),
    getDeviceMr: None,
    irecvConsumed: None,
    makeVDevice: Some(net_make_vdevice_v9),
};

/// The device table of v9 to v11: their properties list at most 4 ports per virtual device.
pub(super) const V9_TO_V11: DeviceModel = DeviceModel::Ports {
    devs_per_nic: NCCL_NET_MAX_DEVS_PER_NIC_V11,
};
// The survey names these tables by the same limit (its WARN for larger groups, the doctor's).
const _: () = assert!(NCCL_NET_MAX_DEVS_PER_NIC_V11 == crate::plugin::SMALL_VDEVICE_LIMIT);

pub(super) unsafe extern "C" fn net_init_v9(logger: ncclDebugLogger_t) -> ncclResult_t {
    entry::init(logger, V9_TO_V11)
}

/// Copy `p` into v9's (and v10's) struct.
pub(super) fn properties_v9(p: Properties) -> Result<ncclNetProperties_v9_t> {
    let (ndevs, devs) = p.virtual_members::<NCCL_NET_MAX_DEVS_PER_NIC_V11>()?;
    Ok(properties!(ncclNetProperties_v9_t, p, {
        forceFlush: p.force_flush,
        vProps: ncclNetVDeviceProps_v9_t { ndevs, devs },
        maxP2pBytes: p.max_bytes,
        maxCollBytes: p.max_bytes,
    }))
}

/// v9 and v10's `getProperties`.
pub(super) unsafe extern "C" fn net_get_properties_v9(
    dev: c_int,
    props: *mut ncclNetProperties_v9_t,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::get_properties`).
    unsafe { entry::get_properties(dev, props, properties_v9) }
}

/// v9's `isend`: v10's without a profiler handle.
pub(super) unsafe extern "C" fn net_isend_v9(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    let none = ptr::null_mut();
    // SAFETY: forwarded from NCCL (see `entry::isend`); no profiler handle before v10.
    unsafe { net_isend_v10(send_comm, data, size, tag, mhandle, none, request) }
}

/// v9's `irecv`: v10's without profiler handles.
pub(super) unsafe extern "C" fn net_irecv_v9(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut usize,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    let none = ptr::null_mut();
    // SAFETY: forwarded from NCCL (see `entry::irecv`); no profiler handles before v10.
    unsafe { net_irecv_v10(recv_comm, n, data, sizes, tags, mhandles, none, request) }
}

/// v9 to v11's `makeVDevice` (at most four members).
pub(super) unsafe extern "C" fn net_make_vdevice_v9(
    d: *mut c_int,
    props: *mut ncclNetVDeviceProps_v9_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes NULL or a pointer to its vProps struct.
    let members = unsafe { props.as_ref() }
        .ok_or_else(|| crate::core::error::Error::misuse("NULL props"))
        .and_then(|p| entry::listed_members(p.ndevs, &p.devs));
    // SAFETY: forwarded from NCCL (see `entry::make_vdevice`).
    unsafe { entry::make_vdevice(d, members, NCCL_NET_MAX_DEVS_PER_NIC_V11) }
}
