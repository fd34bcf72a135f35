//! `extern "C"` trampolines behind the v8 table: each one line of argument checking, then into
//! the plugin, all through [`entry`].

use std::any::Any;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::Arc;

use super::handles::{self, RequestOwner};
use super::out::Out;
use super::to_nccl;
use super::types::{
    NCCL_NET_DEVICE_HOST, NCCL_NET_DEVICE_INVALID_VERSION, NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_CUDA,
    NCCL_PTR_DMABUF, NCCL_PTR_HOST, ncclDebugLogger_t, ncclInternalError, ncclNetDeviceHandle_v8_t,
    ncclNetProperties_v8_t, ncclResult_t, ncclSuccess,
};
use crate::core::error::{Error, Result};
use crate::core::wire::ListenHandle;
use crate::log;
use crate::plugin::{MAX_GROUPED_RECVS, MemorySupport, Plugin};
use crate::transport::{Connecting, ListenComm, RecvTarget};

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
    entry("init", || Plugin::init().map(|_| ()))
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
            guid: device.virt.first().guid,
            ptrSupport: ptr_support_bits(device.memory),
            regIsGlobal: 0,
            speed: clamp_to_c_int(device.virt.speed_mbps()),
            port: clamp_to_c_int(device.virt.first().port),
            latency: 0.0,
            maxComms: clamp_to_c_int(device.virt.max_comms()),
            maxRecvs: clamp_to_c_int(MAX_GROUPED_RECVS),
            netDeviceType: NCCL_NET_DEVICE_HOST,
            netDeviceVersion: NCCL_NET_DEVICE_INVALID_VERSION,
        });
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
) -> ncclResult_t {
    entry("listen", || {
        // SAFETY: NCCL passes a pointer to its listen-comm slot (checked for NULL).
        let out = unsafe { Out::new(listen_comm, "listenComm") }?;
        if handle.is_null() {
            return Err(Error::misuse("NULL handle"));
        }
        let ctx = Plugin::get()?.context(dev)?;
        let comm = ListenComm::new(Arc::clone(ctx))?;
        let mut wire = [0u8; ListenHandle::LEN];
        comm.handle().emit(&mut wire);
        // SAFETY: NCCL's handle buffer holds NCCL_NET_HANDLE_MAXSIZE (128) writable bytes.
        let buf =
            unsafe { std::slice::from_raw_parts_mut(handle.cast::<u8>(), NCCL_NET_HANDLE_MAXSIZE) };
        buf.fill(0);
        buf[..ListenHandle::LEN].copy_from_slice(&wire);
        out.write(handles::listen_into_raw(comm));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    _send_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    entry("connect", || {
        // SAFETY: NCCL passes a pointer to its send-comm slot (checked for NULL).
        let out = unsafe { Out::new(send_comm, "sendComm") }?;
        if handle.is_null() {
            return Err(Error::misuse("NULL handle"));
        }
        let handle = handle.cast::<u8>();
        let start = |h| Ok(Connecting::new(Arc::clone(Plugin::get()?.context(dev)?), h));
        // SAFETY: NCCL's 128-byte handle, written by our listen and passed unchanged to every
        // connect call of this connection.
        let mut state = unsafe { handles::resume_connect(handle, start) }?;
        match state.progress()? {
            Some(comm) => out.write(handles::send_into_raw(comm)),
            None => {
                // SAFETY: as above.
                unsafe { handles::park_connect(handle, state) };
                out.write(ptr::null_mut());
            }
        }
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_accept(
    listen_comm: *mut c_void,
    recv_comm: *mut *mut c_void,
    _recv_dev_comm: *mut *mut ncclNetDeviceHandle_v8_t,
) -> ncclResult_t {
    entry("accept", || {
        // SAFETY: NCCL passes a pointer to its recv-comm slot (checked for NULL).
        let out = unsafe { Out::new(recv_comm, "recvComm") }?;
        // SAFETY: NCCL passes back the pointer listen() returned.
        let listen = unsafe { handles::listen_comm(listen_comm) }?;
        out.write(
            listen
                .accept()?
                .map_or(ptr::null_mut(), handles::recv_into_raw),
        );
        Ok(())
    })
}

fn check_mr_type(kind: c_int) -> Result<()> {
    if kind == NCCL_PTR_HOST || kind == NCCL_PTR_CUDA {
        return Ok(());
    }
    Err(Error::misuse(format!(
        "regMr with unknown memory type {kind}"
    )))
}

pub(super) unsafe extern "C" fn net_reg_mr(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    entry("regMr", || {
        // SAFETY: NCCL passes a pointer to its mhandle slot (checked for NULL).
        let out = unsafe { Out::new(mhandle, "mhandle") }?;
        check_mr_type(kind)?;
        // SAFETY: NCCL passes back a comm connect()/accept() returned.
        let ctx = unsafe { handles::any_comm_context(comm) }?;
        // SAFETY: NCCL keeps `data[..size]` mapped until it calls deregMr on this handle.
        let mr = unsafe { ctx.register(data as u64, size as u64) }?;
        out.write(handles::mr_into_raw(mr));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_reg_mr_dma_buf(
    comm: *mut c_void,
    data: *mut c_void,
    size: usize,
    kind: c_int,
    offset: u64,
    fd: c_int,
    mhandle: *mut *mut c_void,
) -> ncclResult_t {
    entry("regMrDmaBuf", || {
        // SAFETY: NCCL passes a pointer to its mhandle slot (checked for NULL).
        let out = unsafe { Out::new(mhandle, "mhandle") }?;
        check_mr_type(kind)?;
        // SAFETY: NCCL passes back a comm connect()/accept() returned.
        let ctx = unsafe { handles::any_comm_context(comm) }?;
        let mr = ctx.register_dmabuf(data as u64, size as u64, offset, fd)?;
        out.write(handles::mr_into_raw(mr));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_dereg_mr(
    _comm: *mut c_void,
    mhandle: *mut c_void,
) -> ncclResult_t {
    entry("deregMr", || {
        if mhandle.is_null() {
            return Ok(());
        }
        // SAFETY: NCCL passes back a handle regMr returned, once.
        drop(unsafe { handles::take_mr(mhandle) }?);
        Ok(())
    })
}

fn non_negative(value: c_int, what: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::misuse(format!("negative {what} {value}")))
}

pub(super) unsafe extern "C" fn net_isend_v8(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: c_int,
    tag: c_int,
    mhandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry("isend", || {
        // SAFETY: NCCL passes a pointer to its request slot (checked for NULL).
        let out = unsafe { Out::new(request, "request") }?;
        let size = non_negative(size, "size")?;
        // SAFETY: NCCL passes back the pointer connect() returned.
        let comm = unsafe { handles::send_comm(send_comm) }?;
        // SAFETY: NCCL passes back a handle regMr returned.
        let mr = unsafe { handles::mr(mhandle) }?;
        // SAFETY: NCCL keeps `data[..size]` unchanged until test() reports this request done.
        let started = unsafe { comm.comm.isend(data as u64, size, tag, mr) }?;
        out.write(started.map_or(ptr::null_mut(), |i| comm.request(i)));
        Ok(())
    })
}

/// Read `n` elements of an array NCCL passed.
///
/// # Safety
/// `ptr` is NULL or points at `n` readable elements.
unsafe fn array<'a, T>(ptr: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if ptr.is_null() {
        return Err(Error::misuse(format!("NULL {what}")));
    }
    // SAFETY: non-NULL and `n` elements long per the contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, n) })
}

fn group_size(n: c_int) -> Result<usize> {
    usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_GROUPED_RECVS as usize).contains(n))
        .ok_or_else(|| Error::misuse(format!("n={n} (must be 1..={MAX_GROUPED_RECVS})")))
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
    entry("irecv", || {
        // SAFETY: NCCL passes a pointer to its request slot, possibly holding the 0x1 sentinel,
        // which is overwritten, never read.
        let out = unsafe { Out::new(request, "request") }?;
        let n = group_size(n)?;
        // SAFETY: NCCL passes back the pointer accept() returned.
        let comm = unsafe { handles::recv_comm(recv_comm) }?;
        // SAFETY: NCCL passes arrays of `n` elements.
        let data = unsafe { array(data, n, "data") }?;
        // SAFETY: as above.
        let sizes = unsafe { array(sizes, n, "sizes") }?;
        // SAFETY: as above.
        let tags = unsafe { array(tags, n, "tags") }?;
        // SAFETY: as above.
        let mhandles = unsafe { array(mhandles, n, "mhandles") }?;
        let mut mrs = Vec::with_capacity(n);
        for &mh in mhandles {
            // SAFETY: NCCL passes back handles regMr returned.
            mrs.push(unsafe { handles::mr(mh) }?);
        }
        let mut targets = Vec::with_capacity(n);
        for i in 0..n {
            targets.push(RecvTarget {
                addr: data[i] as u64,
                size: non_negative(sizes[i], "size")?,
                tag: tags[i],
                mr: mrs[i],
            });
        }
        // SAFETY: NCCL keeps the buffers writable until test() reports this request done.
        let started = unsafe { comm.comm.irecv(&targets) }?;
        out.write(started.map_or(ptr::null_mut(), |i| comm.request(i)));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_iflush(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut c_int,
    mhandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry("iflush", || {
        // SAFETY: NCCL passes a pointer to its request slot (checked for NULL).
        let out = unsafe { Out::new(request, "request") }?;
        let n = group_size(n)?;
        // SAFETY: NCCL passes back the pointer accept() returned.
        let comm = unsafe { handles::recv_comm(recv_comm) }?;
        // SAFETY: NCCL passes arrays of `n` elements.
        let data = unsafe { array(data, n, "data") }?;
        // SAFETY: as above.
        let sizes = unsafe { array(sizes, n, "sizes") }?;
        // SAFETY: as above.
        let mhandles = unsafe { array(mhandles, n, "mhandles") }?;
        let mut targets = Vec::with_capacity(n);
        for i in 0..n {
            let size = non_negative(sizes[i], "size")?;
            if size > 0 {
                // SAFETY: NCCL passes back handles regMr returned.
                targets.push((data[i] as u64, size, unsafe { handles::mr(mhandles[i]) }?));
            }
        }
        let started = comm.comm.iflush(&targets)?;
        out.write(started.map_or(ptr::null_mut(), |i| comm.request(i)));
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_test(
    request: *mut c_void,
    done: *mut c_int,
    sizes: *mut c_int,
) -> ncclResult_t {
    entry("test", || {
        // SAFETY: NCCL passes a pointer to one int (checked for NULL).
        let done = unsafe { Out::new(done, "done") }?;
        // SAFETY: NCCL passes back a request isend/irecv/iflush returned, before its comm closed.
        let owner = unsafe { handles::request(request) }?;
        let finished: Option<Vec<u64>> = match owner {
            RequestOwner::Send(h, i) => h.comm.test(i)?.map(|size| vec![size]),
            RequestOwner::Recv(h, i) => h.comm.test(i)?,
        };
        let Some(finished) = finished else {
            done.write(0);
            return Ok(());
        };
        if !sizes.is_null() {
            for (i, size) in finished.iter().enumerate() {
                let value = c_int::try_from(*size).unwrap_or(c_int::MAX);
                // SAFETY: NCCL's sizes array has room for one entry per buffer of the request
                // (NCCL_PROXY_MAX_SUBS for receives, one for sends).
                let slot = unsafe { sizes.add(i) };
                // SAFETY: as above.
                unsafe { slot.write(value) };
            }
        }
        done.write(1);
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_close_send(send_comm: *mut c_void) -> ncclResult_t {
    entry("closeSend", || {
        // SAFETY: NCCL passes back the pointer connect() returned, once.
        drop(unsafe { handles::take_send_comm(send_comm) }?);
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_close_recv(recv_comm: *mut c_void) -> ncclResult_t {
    entry("closeRecv", || {
        // SAFETY: NCCL passes back the pointer accept() returned, once.
        drop(unsafe { handles::take_recv_comm(recv_comm) }?);
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_close_listen(listen_comm: *mut c_void) -> ncclResult_t {
    entry("closeListen", || {
        // SAFETY: NCCL passes back the pointer listen() returned, once.
        drop(unsafe { handles::take_listen_comm(listen_comm) }?);
        Ok(())
    })
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
