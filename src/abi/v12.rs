//! `ncclNetPlugin_v12` (NCCL 2.30+, the newest): v11 with eight-member virtual devices and rail
//! and plane ids in the properties. NCCL casts this table to its internal `ncclNet_t` directly.

use std::ffi::{c_int, c_void};

use super::entry::{
    self, Properties, net_accept, net_close_listen, net_close_recv, net_close_send, net_dereg_mr,
    net_devices, net_iflush, net_reg_mr, net_reg_mr_dma_buf, net_test, properties,
};
use super::types::{
    NCCL_NET_ID_UNDEF, NCCL_NET_MAX_DEVS_PER_NIC_V12, ncclDebugLogger_t, ncclNet_v12_t,
    ncclNetCommConfig_v11_t, ncclNetProperties_v12_t, ncclNetVDeviceProps_v12_t,
    ncclProfilerCallback_t, ncclResult_t,
};
use super::v10::{net_irecv_v10, net_isend_v10};
use super::v11::{
    init_context, net_connect_v11, net_finalize_v11, net_listen_v11, net_set_net_attr_v11,
};
use crate::core::error::{Error, Result};
use crate::plugin::DeviceModel;

/// Looked up first by NCCL 2.30 and later.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v12: ncclNet_v12_t = ncclNet_v12_t {
    name: super::NAME.as_ptr(),
    init: Some(net_init_v12),
    devices: Some(net_devices),
    getProperties: Some(net_get_properties_v12),
    listen: Some(net_listen_v11),
    connect: Some(net_connect_v11),
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
    makeVDevice: Some(net_make_vdevice_v12),
    finalize: Some(net_finalize_v11),
    setNetAttr: Some(net_set_net_attr_v11),
};

/// v11's `init`, on a device table whose virtual devices list up to 8 ports.
pub(super) unsafe extern "C" fn net_init_v12(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v11_t,
    logger: ncclDebugLogger_t,
    profiler: ncclProfilerCallback_t,
) -> ncclResult_t {
    let model = DeviceModel::Ports {
        devs_per_nic: NCCL_NET_MAX_DEVS_PER_NIC_V12,
    };
    // SAFETY: forwarded: NCCL's arguments to init.
    unsafe { init_context(ctx, comm_id, config, logger, profiler, model) }
}

/// Copy `p` into v12's struct. Rails and planes are not known (`NCCL_NET_ID_UNDEF`).
fn properties_v12(p: Properties) -> Result<ncclNetProperties_v12_t> {
    let (ndevs, devs) = p.virtual_members::<NCCL_NET_MAX_DEVS_PER_NIC_V12>()?;
    Ok(properties!(ncclNetProperties_v12_t, p, {
        forceFlush: p.force_flush,
        vProps: ncclNetVDeviceProps_v12_t { ndevs, devs },
        maxP2pBytes: p.max_bytes,
        maxCollBytes: p.max_bytes,
        maxMultiRequestSize: 1,
        railId: NCCL_NET_ID_UNDEF,
        planeId: NCCL_NET_ID_UNDEF,
    }))
}

pub(super) unsafe extern "C" fn net_get_properties_v12(
    dev: c_int,
    props: *mut ncclNetProperties_v12_t,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::get_properties`).
    unsafe { entry::get_properties(dev, props, properties_v12) }
}

pub(super) unsafe extern "C" fn net_make_vdevice_v12(
    d: *mut c_int,
    props: *mut ncclNetVDeviceProps_v12_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes NULL or a pointer to its vProps struct.
    let members = unsafe { props.as_ref() }
        .ok_or_else(|| Error::misuse("NULL props"))
        .and_then(|p| entry::listed_members(p.ndevs, &p.devs));
    // SAFETY: forwarded from NCCL (see `entry::make_vdevice`).
    unsafe { entry::make_vdevice(d, members, NCCL_NET_MAX_DEVS_PER_NIC_V12) }
}
