//! `extern "C"` trampolines behind the v8 table: each one line of argument checking, then into
//! the plugin, all through [`entry`].

use std::any::Any;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use super::out::Out;
use super::to_nccl;
use super::types::{
    NCCL_NET_DEVICE_HOST, NCCL_NET_DEVICE_INVALID_VERSION, NCCL_PTR_CUDA, NCCL_PTR_DMABUF,
    NCCL_PTR_HOST, ncclDebugLogger_t, ncclInternalError, ncclNetDeviceHandle_v8_t,
    ncclNetProperties_v8_t, ncclResult_t, ncclSuccess,
};
use crate::core::error::{Error, Result};
use crate::log;
use crate::plugin::{MAX_GROUPED_RECVS, MemorySupport, Plugin};

/// Run one NCCL entry point: catch panics, map errors once, log once.
pub(super) fn entry(op: &'static str, body: impl FnOnce() -> Result<()>) -> ncclResult_t {
    let outcome = catch_unwind(AssertUnwindSafe(|| log::scoped(body)));
    let code = match &outcome {
        Ok(Ok(())) => return ncclSuccess,
        Ok(Err(e)) => to_nccl(e.kind()),
        Err(_) => ncclInternalError,
    };
    // Logging must not unwind into C either; if it panics the line is lost, the code is not.
    let _ = catch_unwind(AssertUnwindSafe(|| {
        log::scoped(|| match &outcome {
            Ok(Err(e)) => tracing::warn!("{op} failed: {e}"),
            Err(payload) => tracing::error!("panic in {op}: {}", panic_message(payload.as_ref())),
            Ok(Ok(())) => {}
        })
    }));
    code
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)")
}

fn ptr_support_bits(memory: MemorySupport) -> c_int {
    let mut bits = 0;
    if memory.host {
        bits |= NCCL_PTR_HOST;
    }
    if memory.cuda {
        bits |= NCCL_PTR_CUDA;
    }
    if memory.dmabuf {
        bits |= NCCL_PTR_DMABUF;
    }
    bits
}

fn clamp_to_c_int(value: u32) -> c_int {
    c_int::try_from(value).unwrap_or(c_int::MAX)
}

pub(super) unsafe extern "C" fn net_init(logger: ncclDebugLogger_t) -> ncclResult_t {
    super::logger::set(logger);
    entry("init", || {
        Plugin::init();
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_devices(ndev: *mut c_int) -> ncclResult_t {
    entry("devices", || {
        // SAFETY: NCCL passes a pointer to one int (checked for NULL by `Out::new`).
        let out = unsafe { Out::new(ndev, "ndev") }?;
        let count = Plugin::get()?.devices().len();
        out.write(c_int::try_from(count).unwrap_or(c_int::MAX));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_get_properties(
    dev: c_int,
    props: *mut ncclNetProperties_v8_t,
) -> ncclResult_t {
    entry("getProperties", || {
        // SAFETY: NCCL passes a pointer to a properties struct it owns (checked for NULL).
        let out = unsafe { Out::new(props, "props") }?;
        let device = Plugin::get()?.device(dev)?;
        out.write(ncclNetProperties_v8_t {
            name: device.c_name.as_ptr().cast_mut(),
            pciPath: device
                .c_pci_path
                .as_ref()
                .map_or(ptr::null_mut(), |p| p.as_ptr().cast_mut()),
            guid: device.net.guid,
            ptrSupport: ptr_support_bits(device.memory),
            regIsGlobal: 0,
            speed: clamp_to_c_int(device.net.speed_mbps),
            port: clamp_to_c_int(device.net.port),
            latency: 0.0,
            maxComms: clamp_to_c_int(device.net.max_comms),
            maxRecvs: clamp_to_c_int(MAX_GROUPED_RECVS),
            netDeviceType: NCCL_NET_DEVICE_HOST,
            netDeviceVersion: NCCL_NET_DEVICE_INVALID_VERSION,
        });
        Ok(())
    })
}

/// The data path is not part of this build yet; every connection entry says so plainly.
fn data_path_missing(op: &'static str) -> ncclResult_t {
    entry(op, || {
        Err(Error::misuse(
            "the data path is not implemented in this build (device discovery only)",
        ))
    })
}

pub(super) unsafe extern "C" fn net_listen(
    _dev: c_int,
    _handle: *mut c_void,
    _listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    data_path_missing("listen")
}

pub(super) unsafe extern "C" fn net_connect(
    _dev: c_int,
    _handle: *mut c_void,
    _send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    data_path_missing("connect")
}

pub(super) unsafe extern "C" fn net_accept(
    _listen_comm: *mut c_void,
    _recv_comm: *mut *mut c_void,
    _recv_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    data_path_missing("accept")
}

pub(super) unsafe extern "C" fn net_reg_mr(
    _comm: *mut c_void,
    _data: *mut c_void,
    _size: usize,
    _type: c_int,
    _mhandle: *mut *mut c_void,
) -> ncclResult_t {
    data_path_missing("regMr")
}

pub(super) unsafe extern "C" fn net_dereg_mr(
    _comm: *mut c_void,
    _mhandle: *mut c_void,
) -> ncclResult_t {
    data_path_missing("deregMr")
}

pub(super) unsafe extern "C" fn net_isend_v8(
    _send_comm: *mut c_void,
    _data: *mut c_void,
    _size: c_int,
    _tag: c_int,
    _mhandle: *mut c_void,
    _request: *mut *mut c_void,
) -> ncclResult_t {
    data_path_missing("isend")
}

pub(super) unsafe extern "C" fn net_irecv_v8(
    _recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _tags: *mut c_int,
    _mhandles: *mut *mut c_void,
    _request: *mut *mut c_void,
) -> ncclResult_t {
    data_path_missing("irecv")
}

pub(super) unsafe extern "C" fn net_iflush(
    _recv_comm: *mut c_void,
    _n: c_int,
    _data: *mut *mut c_void,
    _sizes: *mut c_int,
    _mhandles: *mut *mut c_void,
    _request: *mut *mut c_void,
) -> ncclResult_t {
    data_path_missing("iflush")
}

pub(super) unsafe extern "C" fn net_test(
    _request: *mut c_void,
    _done: *mut c_int,
    _sizes: *mut c_int,
) -> ncclResult_t {
    data_path_missing("test")
}

pub(super) unsafe extern "C" fn net_close_send(_send_comm: *mut c_void) -> ncclResult_t {
    data_path_missing("closeSend")
}

pub(super) unsafe extern "C" fn net_close_recv(_recv_comm: *mut c_void) -> ncclResult_t {
    data_path_missing("closeRecv")
}

pub(super) unsafe extern "C" fn net_close_listen(_listen_comm: *mut c_void) -> ncclResult_t {
    data_path_missing("closeListen")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::types::{ncclInvalidUsage, ncclSystemError};
    use crate::core::error::Kind;

    #[test]
    fn a_panic_becomes_internal_error() {
        assert_eq!(entry("test-op", || panic!("boom")), ncclInternalError);
        assert_eq!(
            entry("test-op", || std::panic::panic_any(7_u32)),
            ncclInternalError
        );
    }

    #[test]
    fn errors_map_through_their_kind() {
        assert_eq!(
            entry("test-op", || Err(Error::new(Kind::Config, "bad knob"))),
            ncclInvalidUsage
        );
        let io = std::io::Error::from_raw_os_error(libc::ENOMEM);
        assert_eq!(
            entry("test-op", || Err(Error::system("ibv_reg_mr failed", io))),
            ncclSystemError
        );
        assert_eq!(entry("test-op", || Ok(())), ncclSuccess);
    }

    #[test]
    fn null_out_pointers_are_internal_errors() {
        // SAFETY: the pointer is NULL, which the trampoline must reject without dereferencing.
        let rc = unsafe { net_devices(ptr::null_mut()) };
        assert_eq!(rc, ncclInternalError);
    }

    #[test]
    fn ptr_support_bits_follow_the_memory_verdicts() {
        let host_only = MemorySupport {
            host: true,
            cuda: false,
            dmabuf: false,
        };
        assert_eq!(ptr_support_bits(host_only), NCCL_PTR_HOST);
        let all = MemorySupport {
            host: true,
            cuda: true,
            dmabuf: true,
        };
        assert_eq!(
            ptr_support_bits(all),
            NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF
        );
    }
}
