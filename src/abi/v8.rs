//! The exported v8 table: the library's only dynamic symbol.

use super::entry::{
    net_accept, net_close_listen, net_close_recv, net_close_send, net_connect, net_dereg_mr,
    net_devices, net_get_properties, net_iflush, net_init, net_irecv_v8, net_isend_v8, net_listen,
    net_reg_mr, net_reg_mr_dma_buf, net_test,
};
use super::types::ncclNet_v8_t;

/// Looked up by NCCL with `dlsym(handle, "ncclNetPlugin_v8")` (NCCL 2.20 and later).
#[unsafe(no_mangle)]
pub static ncclNetPlugin_v8: ncclNet_v8_t = ncclNet_v8_t {
    name: c"RsIB".as_ptr(),
    init: Some(net_init),
    devices: Some(net_devices),
    getProperties: Some(net_get_properties),
    listen: Some(net_listen),
    connect: Some(net_connect),
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
