//! `ncclNetPlugin_v11` (NCCL 2.28+): `init` once per communicator, returning a context that
//! `listen` and `connect` get back (its traffic class applies to the comm's QPs) and `finalize`
//! releases; `setNetAttr` hints; `maxMultiRequestSize` in the properties.

use std::ffi::{c_int, c_void};

use super::entry::{
    self, Properties, entry, net_accept, net_close_listen, net_close_recv, net_close_send,
    net_dereg_mr, net_devices, net_iflush, net_reg_mr, net_reg_mr_dma_buf, net_test, properties,
};
use super::handles;
use super::out::Out;
use super::types::{
    NCCL_NET_MAX_DEVS_PER_NIC_V11, NCCL_NET_TRAFFIC_CLASS_UNDEF, ncclDebugLogger_t, ncclNet_v11_t,
    ncclNetAttr_v11_t, ncclNetCommConfig_v11_t, ncclNetDeviceHandle_v11_t, ncclNetProperties_v11_t,
    ncclNetVDeviceProps_v11_t, ncclProfilerCallback_t, ncclResult_t,
};
use super::v9::{V9_TO_V11, net_make_vdevice_v9};
use super::v10::{net_irecv_v10, net_isend_v10};
use crate::core::error::{Error, Result};
use crate::plugin::{DeviceModel, NetHints, Plugin, RawNetAttr};

/// Looked up by NCCL 2.28 and later.
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v11: ncclNet_v11_t = ncclNet_v11_t {
    name: super::NAME.as_ptr(),
    init: Some(net_init_v11),
    devices: Some(net_devices),
    getProperties: Some(net_get_properties_v11),
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
    makeVDevice: Some(net_make_vdevice_v9),
    finalize: Some(net_finalize_v11),
    setNetAttr: Some(net_set_net_attr_v11),
};

pub(super) unsafe extern "C" fn net_init_v11(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v11_t,
    logger: ncclDebugLogger_t,
    profiler: ncclProfilerCallback_t,
) -> ncclResult_t {
    // SAFETY: forwarded: NCCL's arguments to init.
    unsafe { init_context(ctx, comm_id, config, logger, profiler, V9_TO_V11) }
}

/// v11 and v12's `init`: one context per communicator, on the device table `model` (which
/// says how many ports the table's virtual devices list).
///
/// # Safety
/// NCCL's arguments to `init`: `ctx` NULL or its context slot, `config` NULL or its config.
pub(super) unsafe fn init_context(
    ctx: *mut *mut c_void,
    comm_id: u64,
    config: *mut ncclNetCommConfig_v11_t,
    logger: ncclDebugLogger_t,
    profiler: ncclProfilerCallback_t,
    model: DeviceModel,
) -> ncclResult_t {
    super::logger::set(logger);
    super::profiler::install(profiler);
    entry("init", || {
        // SAFETY: NCCL passes a pointer to its context slot (checked for NULL).
        let out = unsafe { Out::new(ctx, "ctx") }?;
        // SAFETY: NCCL passes NULL or a pointer to the communicator's config.
        let class =
            unsafe { config.as_ref() }.map_or(NCCL_NET_TRAFFIC_CLASS_UNDEF, |c| c.trafficClass);
        out.write(handles::context_into_raw(Plugin::open_context(
            comm_id, class, model,
        )?));
        Ok(())
    })
}

/// Copy `p` into v11's struct.
fn properties_v11(p: Properties) -> Result<ncclNetProperties_v11_t> {
    let (ndevs, devs) = p.virtual_members::<NCCL_NET_MAX_DEVS_PER_NIC_V11>()?;
    Ok(properties!(ncclNetProperties_v11_t, p, {
        forceFlush: p.force_flush,
        vProps: ncclNetVDeviceProps_v11_t { ndevs, devs },
        maxP2pBytes: p.max_bytes,
        maxCollBytes: p.max_bytes,
        maxMultiRequestSize: 1,
    }))
}

pub(super) unsafe extern "C" fn net_get_properties_v11(
    dev: c_int,
    props: *mut ncclNetProperties_v11_t,
) -> ncclResult_t {
    // SAFETY: forwarded from NCCL (see `entry::get_properties`).
    unsafe { entry::get_properties(dev, props, properties_v11) }
}

/// v11 and v12's `listen(ctx, dev, ...)`: the context must be one `init` returned.
pub(super) unsafe extern "C" fn net_listen_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    // SAFETY: NCCL passes back the context init returned.
    let context = || unsafe { handles::context(ctx) }.map(drop);
    // SAFETY: forwarded from NCCL (see `entry::listen`).
    unsafe { entry::listen(dev, handle, listen_comm, context) }
}

/// v11 and v12's `connect(ctx, dev, ...)`: the context's traffic class applies.
pub(super) unsafe extern "C" fn net_connect_v11(
    ctx: *mut c_void,
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v11_t,
) -> ncclResult_t {
    // SAFETY: NCCL passes back the context init returned.
    let class = || unsafe { handles::context(ctx) }.map(|c| c.traffic_class);
    // SAFETY: forwarded from NCCL (see `entry::connect`).
    unsafe { entry::connect(dev, handle, send_comm, class) }
}

/// v11 and v12's `finalize`: release the context (the process state goes with the last one).
pub(super) unsafe extern "C" fn net_finalize_v11(ctx: *mut c_void) -> ncclResult_t {
    entry("finalize", || {
        // SAFETY: NCCL passes back the context init returned, once.
        Plugin::close_context(unsafe { handles::take_context(ctx) }?.value);
        Ok(())
    })
}

/// v11 and v12's `setNetAttr`: validated, recorded per context, logged at TRACE.
pub(super) unsafe extern "C" fn net_set_net_attr_v11(
    ctx: *mut c_void,
    attr: *mut ncclNetAttr_v11_t,
) -> ncclResult_t {
    entry("setNetAttr", || {
        // SAFETY: NCCL passes back the context init returned.
        let context = unsafe { handles::context(ctx) }?;
        // SAFETY: NCCL passes NULL or a pointer to its attributes.
        let a = unsafe { attr.as_ref() }.ok_or_else(|| Error::misuse("NULL netAttr"))?;
        let side = |c: &super::types::ncclNetCommAttr_v11_t| {
            [
                c.maxConcurrentPeers,
                c.minConcurrentPeers,
                c.maxFlowsPerPeer,
                c.minFlowsPerPeer,
            ]
        };
        context.set_hints(NetHints::parse(&RawNetAttr {
            send: side(&a.sendCommAttr),
            recv: side(&a.recvCommAttr),
            op: a.op,
            algo: a.algo,
            proto: a.proto,
        })?);
        Ok(())
    })
}
