//! The engine side of every table: [`entry`] (panics caught, errors mapped and logged once), the
//! trampolines whose signature is the same in every version, and the helpers the versions'
//! shims (`v8.rs` .. `v12.rs`) call after converting their arguments. Nothing here knows which
//! version called it.

use std::any::Any;
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;

use super::handles::{self, RequestOwner};
use super::out::Out;
use super::to_nccl;
use super::types::{
    NCCL_NET_DEVICE_HOST, NCCL_NET_DEVICE_INVALID_VERSION, NCCL_NET_HANDLE_MAXSIZE, NCCL_PTR_CUDA,
    NCCL_PTR_DMABUF, NCCL_PTR_HOST, ncclDebugLogger_t, ncclInternalError, ncclNetDeviceHandle_v8_t,
    ncclResult_t, ncclSuccess,
};
use crate::core::error::{Error, Result};
use crate::core::group::Group;
use crate::core::proto::{MAX_MESSAGE_BYTES, RecvBuf};
use crate::core::wire::ListenHandle;
use crate::log;
use crate::plugin::{DeviceModel, MAX_GROUPED_RECVS, MemorySupport, Plugin};
use crate::transport::{Connecting, ListenComm, Parent, Sizes};

/// Run one NCCL entry point: answers a receive comm holds for a batch go first (see
/// [`crate::transport::post_held`]), then `body`; panics caught, errors mapped and logged once.
pub(super) fn entry(op: &'static str, body: impl FnOnce() -> Result<()>) -> ncclResult_t {
    guarded(op, || {
        crate::transport::post_held();
        body()
    })
}

/// Catch panics, map errors once, log once: every entry point, `irecv` without posting what is
/// held first (its comm's answers may join the one it writes). Inlined into each C function,
/// whose body it is; the failures move into their out-of-line reports, so it calls no drop glue.
#[inline(always)]
fn guarded(op: &'static str, body: impl FnOnce() -> Result<()>) -> ncclResult_t {
    match catch_unwind(AssertUnwindSafe(|| log::scoped(body))) {
        Ok(Ok(())) => ncclSuccess,
        Ok(Err(e)) => failed(op, e),
        Err(payload) => panicked(op, payload),
    }
}

/// The code and WARN line of an entry point that returned an error. Out of line: `test` runs
/// through `entry` on every poll, and the success path should carry none of this.
#[cold]
#[inline(never)]
fn failed(op: &'static str, e: Error) -> ncclResult_t {
    log_unwinding_nothing(|| tracing::warn!("{op} failed: {e}"));
    to_nccl(e.kind())
}

/// The code and ERROR line of an entry point that panicked.
#[cold]
#[inline(never)]
fn panicked(op: &'static str, payload: Box<dyn Any + Send>) -> ncclResult_t {
    // Moved in: dropping a payload may panic too, and that must be caught as well.
    log_unwinding_nothing(move || {
        tracing::error!("panic in {op}: {}", panic_message(payload.as_ref()));
        drop(payload);
    });
    ncclInternalError
}

/// Log through the plugin's dispatcher; logging must not unwind into C either: if it panics
/// the line is lost, the code is not.
fn log_unwinding_nothing(line: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(|| log::scoped(line)));
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

fn clamp_to_c_int(value: impl TryInto<c_int>) -> c_int {
    value.try_into().unwrap_or(c_int::MAX)
}

/// What every version's `getProperties` reports, before it is copied into that version's struct.
#[derive(Debug)]
pub(super) struct Properties {
    pub(super) name: *mut std::ffi::c_char,
    pub(super) pci_path: *mut std::ffi::c_char,
    pub(super) guid: u64,
    pub(super) ptr_support: c_int,
    /// NCCL must flush after every GDR receive: only mlx5 Data-Direct devices need that, and
    /// this plugin drives none, so 0.
    pub(super) force_flush: c_int,
    pub(super) speed: c_int,
    pub(super) port: c_int,
    pub(super) max_comms: c_int,
    pub(super) max_recvs: c_int,
    pub(super) device_type: c_int,
    pub(super) device_version: c_int,
    /// The physical devices (ports) it is made of.
    pub(super) members: Vec<c_int>,
    /// `maxP2pBytes` and `maxCollBytes`.
    pub(super) max_bytes: usize,
}

impl Properties {
    /// The device's properties.
    pub(super) fn of(dev: c_int) -> Result<Self> {
        let device = Plugin::get()?.device(dev)?;
        Ok(Self {
            name: device.c_name.as_ptr().cast_mut(),
            pci_path: device
                .c_pci_path
                .map_or(ptr::null_mut(), |p| p.as_ptr().cast_mut()),
            guid: device.virt.first().guid,
            ptr_support: ptr_support_bits(device.memory),
            force_flush: 0,
            speed: clamp_to_c_int(device.virt.speed_mbps()),
            port: clamp_to_c_int(device.virt.first().port),
            max_comms: clamp_to_c_int(device.virt.max_comms()),
            max_recvs: clamp_to_c_int(MAX_GROUPED_RECVS),
            device_type: NCCL_NET_DEVICE_HOST,
            device_version: NCCL_NET_DEVICE_INVALID_VERSION,
            members: device.physical.iter().map(|&i| clamp_to_c_int(i)).collect(),
            max_bytes: usize::try_from(MAX_MESSAGE_BYTES).unwrap_or(usize::MAX),
        })
    }

    /// `vProps.ndevs` and `vProps.devs` for a version that lists at most `N` members.
    pub(super) fn virtual_members<const N: usize>(&self) -> Result<(c_int, [c_int; N])> {
        if self.members.len() > N {
            return Err(Error::misuse(format!(
                "this device fuses {} ports; this ncclNet version can describe at most {N} \
                 (use ncclNet v12, NCCL 2.30+, or a smaller NCCL_NET_RS_FUSE group)",
                self.members.len()
            )));
        }
        let mut devs = [0; N];
        devs[..self.members.len()].copy_from_slice(&self.members);
        Ok((clamp_to_c_int(self.members.len()), devs))
    }
}

/// `$t { .. }` filled from the [`Properties`] `$p`: the fields of v8's struct, then `$extra`
/// (what later versions add).
macro_rules! properties {
    ($t:ident, $p:expr, { $($field:ident: $value:expr),* $(,)? }) => {
        $t {
            name: $p.name,
            pciPath: $p.pci_path,
            guid: $p.guid,
            ptrSupport: $p.ptr_support,
            regIsGlobal: 0,
            speed: $p.speed,
            port: $p.port,
            latency: 0.0,
            maxComms: $p.max_comms,
            maxRecvs: $p.max_recvs,
            netDeviceType: $p.device_type,
            netDeviceVersion: $p.device_version,
            $($field: $value),*
        }
    };
}
pub(super) use properties;

/// `init` of every version: remember the logger, then build (or join) the plugin state.
pub(super) fn init(logger: ncclDebugLogger_t, model: DeviceModel) -> ncclResult_t {
    super::logger::set(logger);
    entry("init", || Plugin::init(model).map(drop))
}

pub(super) unsafe extern "C" fn net_devices(ndev: *mut c_int) -> ncclResult_t {
    entry("devices", || {
        // SAFETY: NCCL passes a pointer to one int (checked for NULL by `Out::new`).
        let out = unsafe { Out::new(ndev, "ndev") }?;
        out.write(clamp_to_c_int(Plugin::get()?.device_count()));
        Ok(())
    })
}

/// `getProperties`: fill `props` through `convert` (the version's struct).
///
/// # Safety
/// `props` is NULL or points at NCCL's properties struct of type `P`.
pub(super) unsafe fn get_properties<P>(
    dev: c_int,
    props: *mut P,
    convert: impl FnOnce(Properties) -> Result<P>,
) -> ncclResult_t {
    entry("getProperties", || {
        // SAFETY: NCCL passes a pointer to a properties struct it owns (checked for NULL).
        let out = unsafe { Out::new(props, "props") }?;
        out.write(convert(Properties::of(dev)?)?);
        Ok(())
    })
}

/// `listen` on device `dev`, once `context` (the version's check of its context) passed.
///
/// # Safety
/// `handle` is NULL or NCCL's 128-byte handle buffer; `listen_comm` NULL or its out-slot.
pub(super) unsafe fn listen(
    dev: c_int,
    handle: *mut c_void,
    listen_comm: *mut *mut c_void,
    context: impl FnOnce() -> Result<()>,
) -> ncclResult_t {
    entry("listen", || {
        context()?;
        // SAFETY: NCCL passes a pointer to its listen-comm slot (checked for NULL).
        let out = unsafe { Out::new(listen_comm, "listenComm") }?;
        if handle.is_null() {
            return Err(Error::misuse("NULL handle"));
        }
        let ctx = Plugin::get()?.context(dev)?;
        let comm = ListenComm::new(ctx)?;
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

/// `connect` to the listener in `handle`, for a communicator with traffic class `comm_class`.
///
/// # Safety
/// `handle` is NULL or NCCL's 128-byte handle buffer, the same for every call of one connect;
/// `send_comm` NULL or its out-slot.
pub(super) unsafe fn connect(
    dev: c_int,
    handle: *mut c_void,
    send_comm: *mut *mut c_void,
    comm_class: impl FnOnce() -> Result<Option<u8>>,
) -> ncclResult_t {
    entry("connect", || {
        // SAFETY: NCCL passes a pointer to its send-comm slot (checked for NULL).
        let out = unsafe { Out::new(send_comm, "sendComm") }?;
        if handle.is_null() {
            return Err(Error::misuse("NULL handle"));
        }
        let handle = handle.cast::<u8>();
        let start = |h| {
            let ctx = Plugin::get()?.context(dev)?;
            Ok(Connecting::new(ctx, h, comm_class()?))
        };
        // SAFETY: NCCL's 128-byte handle, passed unchanged to every connect call of this
        // connection.
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
        let mr = unsafe { ctx.register(data as u64, size as u64, kind == NCCL_PTR_HOST) }?;
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

/// A size NCCL passed as a C `int` (v8's isend, irecv and every version's iflush).
pub(super) fn non_negative(value: c_int, what: &str) -> Result<u64> {
    u64::try_from(value).map_err(|_| Error::misuse(format!("negative {what} {value}")))
}

/// `isend` of `size` bytes (converted by the version).
///
/// # Safety
/// NCCL's isend contract: `send_comm` from connect, `mhandle` from regMr, `data[..size]` valid
/// and unchanged until `test` reports the request done, `phandle` NULL or NCCL's profiler
/// handle, `request` NULL or its out-slot.
pub(super) unsafe fn isend(
    send_comm: *mut c_void,
    data: *mut c_void,
    size: Result<u64>,
    tag: c_int,
    mhandle: *mut c_void,
    phandle: *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    entry("isend", || {
        // SAFETY: NCCL passes a pointer to its request slot (checked for NULL).
        let out = unsafe { Out::new(request, "request") }?;
        let size = size?;
        // SAFETY: NCCL passes back the pointer connect() returned.
        let comm = unsafe { handles::send_comm(send_comm) }?;
        // SAFETY: NCCL passes back a handle regMr returned.
        let mr = unsafe { handles::mr(mhandle) }?;
        // SAFETY: NCCL keeps `data[..size]` unchanged until test() reports this request done.
        let started = unsafe { comm.comm.isend(data as u64, size, tag, mr, parent(phandle)) }?;
        out.write(started.map_or(ptr::null_mut(), |i| comm.request(i)));
        Ok(())
    })
}

/// Read `n` elements of an array NCCL passed.
///
/// # Safety
/// `ptr` is NULL or points at `n` readable elements.
#[inline]
pub(super) unsafe fn array<'a, T>(ptr: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if ptr.is_null() {
        return Err(handles::null_pointer(what));
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

/// A receive buffer's size as a version passes it: `int` in v8, `size_t` from v9.
pub(super) trait Capacity: Copy {
    /// The size in bytes; `Misuse` for a negative `int`.
    fn bytes(self) -> Result<u64>;
}

impl Capacity for c_int {
    fn bytes(self) -> Result<u64> {
        non_negative(self, "size")
    }
}

impl Capacity for usize {
    fn bytes(self) -> Result<u64> {
        Ok(self as u64)
    }
}

/// `irecv` of `n` buffers whose capacities are `sizes` (in the version's type, each converted
/// as its buffer is looked at).
///
/// # Safety
/// NCCL's irecv contract: arrays of `n` elements (`phandles` NULL before v10), buffers
/// writable until `test` reports the request done, `request` NULL or its out-slot (possibly
/// holding the 0x1 sentinel).
#[allow(clippy::too_many_arguments)] // NCCL's arguments, one each
pub(super) unsafe fn irecv(
    recv_comm: *mut c_void,
    n: c_int,
    data: *mut *mut c_void,
    sizes: *mut impl Capacity,
    tags: *mut c_int,
    mhandles: *mut *mut c_void,
    phandles: *mut *mut c_void,
    request: *mut *mut c_void,
) -> ncclResult_t {
    guarded("irecv", || {
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
        let phandles = if phandles.is_null() {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { array(phandles, n, "phandles") }?
        };
        let parent_of = |i: usize| phandles.get(i).copied().and_then(parent);
        let arrays = (data, sizes, tags, mhandles);
        // A single receive, NCCL's usual case, builds no group of eight, and its call of the
        // inlined `irecv` knows it has one buffer.
        let started = if n == 1 {
            // SAFETY: NCCL passes back handles regMr returned.
            let single = [unsafe { recv_buf(arrays, 0) }?];
            // SAFETY: NCCL keeps the buffers writable until test() reports this request done.
            unsafe { comm.comm.irecv(&single, &[parent_of(0)]) }?
        } else {
            let mut group = Group::default();
            for i in 0..n {
                // SAFETY: NCCL passes back handles regMr returned.
                group.push(unsafe { recv_buf(arrays, i) }?);
            }
            let parents: Group<Option<Parent>> = (0..n).map(parent_of).collect();
            // SAFETY: as above.
            unsafe { comm.comm.irecv(&group, &parents) }?
        };
        out.write(started.map_or(ptr::null_mut(), |i| comm.request(i)));
        Ok(())
    })
}

/// NCCL's profiler handle of a request (`phandle`), when it passed one.
fn parent(phandle: *mut c_void) -> Option<Parent> {
    std::num::NonZeroUsize::new(phandle.expose_provenance()).map(Parent)
}

/// Buffer `i` of an `irecv`'s arrays, checked against its registration. Inlined at both of
/// `irecv`'s calls (a closure called twice is not): a single receive is every call's cost.
///
/// # Safety
/// `mhandles` holds handles regMr returned.
#[inline(always)]
unsafe fn recv_buf(
    (data, sizes, tags, mhandles): (&[*mut c_void], &[impl Capacity], &[c_int], &[*mut c_void]),
    i: usize,
) -> Result<RecvBuf> {
    // SAFETY: forwarded from this function's contract.
    let mr = unsafe { handles::mr(mhandles[i]) }?;
    mr.recv_buf(data[i] as u64, sizes[i].bytes()?, tags[i])
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

/// `test` of every version. Sizes are C `int`s in every version (NCCL's `test` signature): a
/// transfer of more than `INT_MAX` bytes reports `INT_MAX`.
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
        let finished = match owner {
            RequestOwner::Send(h, i) => h.comm.test(i)?.map(|size| {
                // SAFETY: NCCL's sizes array is NULL or has room for a send's one entry.
                unsafe { report_sizes(sizes, &[size]) };
            }),
            RequestOwner::Recv(h, i) => h.comm.test(i)?.map(|finished| match finished {
                // SAFETY: NCCL's sizes array is NULL or has room for one entry per buffer of
                // the receive (NCCL_PROXY_MAX_SUBS).
                Sizes::One(size) => unsafe { report_sizes(sizes, &[size]) },
                // SAFETY: as above.
                Sizes::Group(group) => unsafe { report_sizes(sizes, &group) },
            }),
        };
        done.write(c_int::from(finished.is_some()));
        Ok(())
    })
}

/// Write a finished request's sizes into NCCL's `sizes` array, unless it is NULL.
///
/// # Safety
/// `sizes` is NULL or has room for `finished.len()` entries.
unsafe fn report_sizes(sizes: *mut c_int, finished: &[u64]) {
    if sizes.is_null() {
        return;
    }
    for (i, size) in finished.iter().enumerate() {
        // SAFETY: within the room the caller vouched for.
        let slot = unsafe { sizes.add(i) };
        // SAFETY: as above.
        unsafe { slot.write(clamp_to_c_int(*size)) };
    }
}

pub(super) unsafe extern "C" fn net_close_send(send_comm: *mut c_void) -> ncclResult_t {
    entry("closeSend", || {
        // SAFETY: NCCL passes back the pointer connect() returned, once.
        let handle = unsafe { handles::take_send_comm(send_comm) }?;
        handle.value.comm.into_inner().close();
        Ok(())
    })
}

pub(super) unsafe extern "C" fn net_close_recv(recv_comm: *mut c_void) -> ncclResult_t {
    entry("closeRecv", || {
        // SAFETY: NCCL passes back the pointer accept() returned, once.
        let handle = unsafe { handles::take_recv_comm(recv_comm) }?;
        drop(handle.value.comm.into_inner());
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

/// `makeVDevice` with the members the version's struct listed (at most `max` of them).
///
/// # Safety
/// `d` is NULL or NCCL's out-slot for the new index.
pub(super) unsafe fn make_vdevice(
    d: *mut c_int,
    members: Result<Vec<c_int>>,
    max: usize,
) -> ncclResult_t {
    entry("makeVDevice", || {
        // SAFETY: NCCL passes a pointer to one int (checked for NULL).
        let out = unsafe { Out::new(d, "d") }?;
        out.write(Plugin::get()?.make_virtual_device(&members?, max)?);
        Ok(())
    })
}

/// The members a `vProps` struct lists: `ndevs` of `devs`, checked against its capacity.
pub(super) fn listed_members(ndevs: c_int, devs: &[c_int]) -> Result<Vec<c_int>> {
    usize::try_from(ndevs)
        .ok()
        .filter(|n| (1..=devs.len()).contains(n))
        .map(|n| devs[..n].to_vec())
        .ok_or_else(|| {
            Error::misuse(format!(
                "makeVDevice with ndevs={ndevs} (must be 1..={})",
                devs.len()
            ))
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
    fn a_panic_whose_payload_panics_when_dropped_stays_on_this_side() {
        struct PanicsWhenDropped;
        impl Drop for PanicsWhenDropped {
            fn drop(&mut self) {
                panic!("dropping the payload");
            }
        }
        assert_eq!(
            entry("test-op", || std::panic::panic_any(PanicsWhenDropped)),
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

    #[test]
    fn vprops_members_are_checked_against_the_capacity() {
        assert_eq!(listed_members(2, &[3, 4, 0, 0]).unwrap(), [3, 4]);
        assert!(listed_members(0, &[0; 4]).is_err());
        assert!(listed_members(5, &[0; 4]).is_err());
        assert!(listed_members(-1, &[0; 8]).is_err());
    }
}
