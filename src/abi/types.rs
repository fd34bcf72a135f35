//! Rust mirrors of the ncclNet v8 C types, with NCCL's exact names.
//!
//! This is the only file that uses C spellings. `nccl-headers/nccl_net_v8.h` declares the same
//! types for C; the const block at the bottom pins every size and offset at compile time and
//! `tests/abi_layout.rs` checks them against what a C compiler makes of the header.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_float, c_int, c_ulong, c_void};
use std::mem::{offset_of, size_of};

/// `ncclResult_t`: a C enum, carried as its 4-byte value so an unknown value is never UB.
#[repr(transparent)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ncclResult_t(pub c_int);

/// Success.
pub const ncclSuccess: ncclResult_t = ncclResult_t(0);
/// A CUDA call failed.
pub const ncclUnhandledCudaError: ncclResult_t = ncclResult_t(1);
/// A call into the kernel or a system library failed.
pub const ncclSystemError: ncclResult_t = ncclResult_t(2);
/// NCCL used the plugin incorrectly, or the plugin hit a bug (a caught panic).
pub const ncclInternalError: ncclResult_t = ncclResult_t(3);
/// Defined for completeness; argument checking is NCCL's job, so the plugin never returns it.
pub const ncclInvalidArgument: ncclResult_t = ncclResult_t(4);
/// Most likely a user error: misconfiguration or a size mismatch.
pub const ncclInvalidUsage: ncclResult_t = ncclResult_t(5);
/// The peer or the network failed.
pub const ncclRemoteError: ncclResult_t = ncclResult_t(6);

/// `ncclDebugLogLevel` values passed to the logger.
pub const NCCL_LOG_WARN: c_int = 2;
/// Informational lines (`NCCL_DEBUG=INFO`).
pub const NCCL_LOG_INFO: c_int = 3;
/// Trace lines (`NCCL_DEBUG=TRACE`).
pub const NCCL_LOG_TRACE: c_int = 5;

/// `ncclDebugLogSubSys` bit for initialisation lines.
pub const NCCL_INIT: c_ulong = 0x1;
/// `ncclDebugLogSubSys` bit for network lines.
pub const NCCL_NET: c_ulong = 0x10;

/// Size of the opaque buffer `listen` fills and `connect` consumes.
pub const NCCL_NET_HANDLE_MAXSIZE: usize = 128;
/// Requests in flight per comm that a plugin must accept.
pub const NCCL_NET_MAX_REQUESTS: usize = 32;
/// The sentinel NCCL may store in `*request` before calling `irecv`.
pub const NCCL_NET_OPTIONAL_RECV_COMPLETION: usize = 0x1;

/// `ptrSupport` bit: host memory.
pub const NCCL_PTR_HOST: c_int = 0x1;
/// `ptrSupport` bit: CUDA memory through a peer-memory module.
pub const NCCL_PTR_CUDA: c_int = 0x2;
/// `ptrSupport` bit: CUDA memory through DMA-BUF.
pub const NCCL_PTR_DMABUF: c_int = 0x4;

/// `netDeviceType` of a plugin without device-side offload.
pub const NCCL_NET_DEVICE_HOST: c_int = 0;
/// `netDeviceVersion` of a HOST device.
pub const NCCL_NET_DEVICE_INVALID_VERSION: c_int = 0;

/// NCCL's printf-style logger. Calling a C-variadic function pointer is stable Rust; defining
/// one is not, which is why test loggers are written in C.
pub type ncclDebugLogger_t =
    Option<unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...)>;

/// Device-side handle for offload plugins. A HOST plugin never writes it.
#[repr(C)]
#[derive(Debug)]
pub struct ncclNetDeviceHandle_v8_t {
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needsProxyProgress: c_int,
}

/// What `getProperties` reports for one device.
#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v8_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
}

type R = ncclResult_t;

/// The v8 function table, exported as the data symbol `ncclNetPlugin_v8`.
#[repr(C)]
#[derive(Debug)]
pub struct ncclNet_v8_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t) -> R>,
    pub devices: Option<unsafe extern "C" fn(*mut c_int) -> R>,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v8_t) -> R>,
    pub listen: Option<unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> R>,
    pub connect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut ncclNetDeviceHandle_v8_t,
        ) -> R,
    >,
    pub accept: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut *mut c_void,
            *mut *mut ncclNetDeviceHandle_v8_t,
        ) -> R,
    >,
    pub regMr:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, *mut *mut c_void) -> R>,
    pub regMrDmaBuf: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            usize,
            c_int,
            u64,
            c_int,
            *mut *mut c_void,
        ) -> R,
    >,
    pub deregMr: Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> R>,
    pub isend: Option<
        unsafe extern "C" fn(
            *mut c_void,
            *mut c_void,
            c_int,
            c_int,
            *mut c_void,
            *mut *mut c_void,
        ) -> R,
    >,
    pub irecv: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut *mut c_void,
            *mut c_int,
            *mut c_int,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> R,
    >,
    pub iflush: Option<
        unsafe extern "C" fn(
            *mut c_void,
            c_int,
            *mut *mut c_void,
            *mut c_int,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> R,
    >,
    pub test: Option<unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> R>,
    pub closeSend: Option<unsafe extern "C" fn(*mut c_void) -> R>,
    pub closeRecv: Option<unsafe extern "C" fn(*mut c_void) -> R>,
    pub closeListen: Option<unsafe extern "C" fn(*mut c_void) -> R>,
    pub getDeviceMr: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> R>,
    pub irecvConsumed: Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> R>,
}

// SAFETY: the table is immutable after construction; `name` points at a 'static C string and the
// entries are plain function pointers, so sharing it between NCCL's threads is sound.
unsafe impl Sync for ncclNet_v8_t {}

// LP64 layout of NCCL's net_v8.h (nccl-net-abi.md §1.5, rust-stack.md §4). If one of these fails,
// the mirror no longer matches NCCL: fix the Rust type, not the number.
const _: () = {
    assert!(size_of::<ncclResult_t>() == 4);
    assert!(size_of::<ncclDebugLogger_t>() == 8);
    assert!(size_of::<ncclNetDeviceHandle_v8_t>() == 32);
    assert!(offset_of!(ncclNetDeviceHandle_v8_t, handle) == 8);
    assert!(offset_of!(ncclNetDeviceHandle_v8_t, size) == 16);
    assert!(offset_of!(ncclNetDeviceHandle_v8_t, needsProxyProgress) == 24);
    assert!(size_of::<ncclNetProperties_v8_t>() == 64);
    assert!(offset_of!(ncclNetProperties_v8_t, pciPath) == 8);
    assert!(offset_of!(ncclNetProperties_v8_t, guid) == 16);
    assert!(offset_of!(ncclNetProperties_v8_t, ptrSupport) == 24);
    assert!(offset_of!(ncclNetProperties_v8_t, speed) == 32);
    assert!(offset_of!(ncclNetProperties_v8_t, latency) == 40);
    assert!(offset_of!(ncclNetProperties_v8_t, maxRecvs) == 48);
    assert!(offset_of!(ncclNetProperties_v8_t, netDeviceVersion) == 56);
    assert!(size_of::<ncclNet_v8_t>() == 152);
    assert!(offset_of!(ncclNet_v8_t, init) == 8);
    assert!(offset_of!(ncclNet_v8_t, regMrDmaBuf) == 64);
    assert!(offset_of!(ncclNet_v8_t, isend) == 80);
    assert!(offset_of!(ncclNet_v8_t, test) == 104);
    assert!(offset_of!(ncclNet_v8_t, irecvConsumed) == 144);
};
