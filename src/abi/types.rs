//! Rust mirrors of the ncclNet v8 to v12 C types, with NCCL's exact names.
//!
//! This is the only file that uses C spellings. `nccl-headers/nccl_net_v*.h` declare the same
//! types for C; the const blocks pin every size and offset at compile time and
//! `tests/abi_layout.rs` checks them against what a C compiler makes of the headers.
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

/// Most physical devices one virtual device lists in v9 to v11 (`NCCL_NET_MAX_DEVS_PER_NIC_V11`).
pub const NCCL_NET_MAX_DEVS_PER_NIC_V11: usize = 4;
/// Most physical devices one virtual device lists in v12 (`NCCL_NET_MAX_DEVS_PER_NIC_V12`).
pub const NCCL_NET_MAX_DEVS_PER_NIC_V12: usize = 8;
/// A communicator without a traffic class.
pub const NCCL_NET_TRAFFIC_CLASS_UNDEF: c_int = -1;
/// Rail or plane not known (v12 properties).
pub const NCCL_NET_ID_UNDEF: i16 = -1;
/// Largest `maxP2pBytes`/`maxCollBytes` NCCL accepts (1 TiB).
pub const NCCL_MAX_NET_SIZE_BYTES: usize = 1 << 40;

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

/// NCCL's profiler callback (v10+): `(eHandle, type, pHandle, pluginId, extData)`. The plugin
/// reports its QP events through it (`abi::profiler`).
pub type ncclProfilerCallback_t = Option<
    unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> ncclResult_t,
>;

/// Profiler callback `type`: an event starts (`eHandle` receives its handle).
pub const NCCL_PROFILER_NET_EVENT_START: c_int = 0;
/// Profiler callback `type`: the event in `*eHandle` stops.
pub const NCCL_PROFILER_NET_EVENT_STOP: c_int = 1;
/// `pluginId` bits of a network plugin whose events are IB-style descriptors.
pub const NCCL_PROFILER_NET_TYPE_IB: i64 = 1 << 16;
/// The version of [`ncclProfilerNetIbDescr_v1_t`], in the low bits of `pluginId`.
pub const NCCL_PROFILER_NET_IB_VER: i64 = 1;
/// [`ncclProfilerNetIbDescr_v1_t::type_`] of a QP event.
pub const NCCL_PROFILE_QP: u8 = 1;

/// One work request on a QP, as an IB-style plugin describes it to the profiler.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ncclProfilerNetIbQp_v1_t {
    /// The plugin's device (here: the member port of the connection's device).
    pub device: c_int,
    /// The work request's id.
    pub wr_id: u64,
    /// Its `ibv_wr_opcode`.
    pub opcode: c_int,
    /// The QP's number.
    pub qpNum: c_int,
    /// Bytes it moves.
    pub length: usize,
}

/// The `extData` of a started event (`pluginId` = IB type | version 1). In C the QP record is
/// the only member of a union; a struct holding it has the same layout.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ncclProfilerNetIbDescr_v1_t {
    /// [`NCCL_PROFILE_QP`].
    pub type_: u8,
    /// The work request.
    pub qp: ncclProfilerNetIbQp_v1_t,
}

/// The device handle of v9 to v12 (the same layout as v8's).
pub type ncclNetDeviceHandle_v9_t = ncclNetDeviceHandle_v8_t;
/// The device handle of v10.
pub type ncclNetDeviceHandle_v10_t = ncclNetDeviceHandle_v8_t;
/// The device handle of v11.
pub type ncclNetDeviceHandle_v11_t = ncclNetDeviceHandle_v8_t;
/// The device handle of v12.
pub type ncclNetDeviceHandle_v12_t = ncclNetDeviceHandle_v8_t;

/// The physical devices a (virtual) device is made of, v9 to v11.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct ncclNetVDeviceProps_v9_t {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V11],
}
/// v10's virtual-device list (same as v9's).
pub type ncclNetVDeviceProps_v10_t = ncclNetVDeviceProps_v9_t;
/// v11's virtual-device list (same as v9's).
pub type ncclNetVDeviceProps_v11_t = ncclNetVDeviceProps_v9_t;

/// The physical devices a (virtual) device is made of, v12.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct ncclNetVDeviceProps_v12_t {
    pub ndevs: c_int,
    pub devs: [c_int; NCCL_NET_MAX_DEVS_PER_NIC_V12],
}

/// A communicator's configuration: v10's `connect` and v11+'s `init` take it.
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct ncclNetCommConfig_v10_t {
    pub trafficClass: c_int,
}
/// v11's communicator configuration.
pub type ncclNetCommConfig_v11_t = ncclNetCommConfig_v10_t;
/// v12's communicator configuration.
pub type ncclNetCommConfig_v12_t = ncclNetCommConfig_v10_t;

/// One direction's traffic hint (v11+ `setNetAttr`).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct ncclNetCommAttr_v11_t {
    pub maxConcurrentPeers: i32,
    pub minConcurrentPeers: i32,
    pub maxFlowsPerPeer: i32,
    pub minFlowsPerPeer: i32,
}
/// v12's per-direction hint (same as v11's).
pub type ncclNetCommAttr_v12_t = ncclNetCommAttr_v11_t;

/// What `setNetAttr` passes (v11+).
#[repr(C)]
#[derive(Copy, Clone, Debug)]
pub struct ncclNetAttr_v11_t {
    pub sendCommAttr: ncclNetCommAttr_v11_t,
    pub recvCommAttr: ncclNetCommAttr_v11_t,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}
/// v12's traffic hints (same as v11's).
pub type ncclNetAttr_v12_t = ncclNetAttr_v11_t;

/// What `getProperties` reports in v9 (and v10): v8 plus `forceFlush`, `vProps` and sizes.
#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v9_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v9_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
}
/// v10's properties (same as v9's).
pub type ncclNetProperties_v10_t = ncclNetProperties_v9_t;

/// v11's properties: v10 plus `maxMultiRequestSize`.
#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v11_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v11_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
}

/// v12's properties: v11 with eight `vProps` members, plus rail and plane.
#[repr(C)]
#[derive(Debug)]
pub struct ncclNetProperties_v12_t {
    pub name: *mut c_char,
    pub pciPath: *mut c_char,
    pub guid: u64,
    pub ptrSupport: c_int,
    pub regIsGlobal: c_int,
    pub forceFlush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: c_float,
    pub maxComms: c_int,
    pub maxRecvs: c_int,
    pub netDeviceType: c_int,
    pub netDeviceVersion: c_int,
    pub vProps: ncclNetVDeviceProps_v12_t,
    pub maxP2pBytes: usize,
    pub maxCollBytes: usize,
    pub maxMultiRequestSize: c_int,
    pub railId: i16,
    pub planeId: i16,
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

/// Entry points v9 added or changed, shared by the tables that have them.
type GetPropertiesV9 = Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v9_t) -> R>;
type IsendV9 = Option<
    unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        c_int,
        *mut c_void,
        *mut *mut c_void,
    ) -> R,
>;
type IrecvV9 = Option<
    unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut usize,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
>;
type IsendV10 = Option<
    unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        usize,
        c_int,
        *mut c_void,
        *mut c_void,
        *mut *mut c_void,
    ) -> R,
>;
type IrecvV10 = Option<
    unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut usize,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
>;
type MakeVDeviceV9 = Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v9_t) -> R>;
type AcceptV8 = Option<
    unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut *mut ncclNetDeviceHandle_v8_t) -> R,
>;
type RegMr =
    Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, *mut *mut c_void) -> R>;
type RegMrDmaBuf = Option<
    unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, u64, c_int, *mut *mut c_void) -> R,
>;
type DeregMr = Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> R>;
type Iflush = Option<
    unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut *mut c_void,
        *mut c_int,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> R,
>;
type Test = Option<unsafe extern "C" fn(*mut c_void, *mut c_int, *mut c_int) -> R>;
type Close = Option<unsafe extern "C" fn(*mut c_void) -> R>;
type GetDeviceMr = Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> R>;
type IrecvConsumed = Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> R>;
type Devices = Option<unsafe extern "C" fn(*mut c_int) -> R>;
type ListenV8 = Option<unsafe extern "C" fn(c_int, *mut c_void, *mut *mut c_void) -> R>;
type ConnectV8 = Option<
    unsafe extern "C" fn(
        c_int,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut ncclNetDeviceHandle_v8_t,
    ) -> R,
>;
type ListenV11 =
    Option<unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut *mut c_void) -> R>;
type ConnectV11 = Option<
    unsafe extern "C" fn(
        *mut c_void,
        c_int,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut ncclNetDeviceHandle_v8_t,
    ) -> R,
>;
type InitV11 = Option<
    unsafe extern "C" fn(
        *mut *mut c_void,
        u64,
        *mut ncclNetCommConfig_v11_t,
        ncclDebugLogger_t,
        ncclProfilerCallback_t,
    ) -> R,
>;
type Finalize = Option<unsafe extern "C" fn(*mut c_void) -> R>;
type SetNetAttr = Option<unsafe extern "C" fn(*mut c_void, *mut ncclNetAttr_v11_t) -> R>;

/// The v9 function table, exported as `ncclNetPlugin_v9` (NCCL 2.24+).
#[repr(C)]
#[derive(Debug)]
pub struct ncclNet_v9_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t) -> R>,
    pub devices: Devices,
    pub getProperties: GetPropertiesV9,
    pub listen: ListenV8,
    pub connect: ConnectV8,
    pub accept: AcceptV8,
    pub regMr: RegMr,
    pub regMrDmaBuf: RegMrDmaBuf,
    pub deregMr: DeregMr,
    pub isend: IsendV9,
    pub irecv: IrecvV9,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: GetDeviceMr,
    pub irecvConsumed: IrecvConsumed,
    pub makeVDevice: MakeVDeviceV9,
}

/// The v10 function table, exported as `ncclNetPlugin_v10` (NCCL 2.26+).
#[repr(C)]
#[derive(Debug)]
pub struct ncclNet_v10_t {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(ncclDebugLogger_t, ncclProfilerCallback_t) -> R>,
    pub devices: Devices,
    pub getProperties: GetPropertiesV9,
    pub listen: ListenV8,
    pub connect: Option<
        unsafe extern "C" fn(
            c_int,
            *mut ncclNetCommConfig_v10_t,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut ncclNetDeviceHandle_v8_t,
        ) -> R,
    >,
    pub accept: AcceptV8,
    pub regMr: RegMr,
    pub regMrDmaBuf: RegMrDmaBuf,
    pub deregMr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: GetDeviceMr,
    pub irecvConsumed: IrecvConsumed,
    pub makeVDevice: MakeVDeviceV9,
}

/// The v11 function table, exported as `ncclNetPlugin_v11` (NCCL 2.28+).
#[repr(C)]
#[derive(Debug)]
pub struct ncclNet_v11_t {
    pub name: *const c_char,
    pub init: InitV11,
    pub devices: Devices,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v11_t) -> R>,
    pub listen: ListenV11,
    pub connect: ConnectV11,
    pub accept: AcceptV8,
    pub regMr: RegMr,
    pub regMrDmaBuf: RegMrDmaBuf,
    pub deregMr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: GetDeviceMr,
    pub irecvConsumed: IrecvConsumed,
    pub makeVDevice: MakeVDeviceV9,
    pub finalize: Finalize,
    pub setNetAttr: SetNetAttr,
}

/// The v12 function table, exported as `ncclNetPlugin_v12` (NCCL 2.30+).
#[repr(C)]
#[derive(Debug)]
pub struct ncclNet_v12_t {
    pub name: *const c_char,
    pub init: InitV11,
    pub devices: Devices,
    pub getProperties: Option<unsafe extern "C" fn(c_int, *mut ncclNetProperties_v12_t) -> R>,
    pub listen: ListenV11,
    pub connect: ConnectV11,
    pub accept: AcceptV8,
    pub regMr: RegMr,
    pub regMrDmaBuf: RegMrDmaBuf,
    pub deregMr: DeregMr,
    pub isend: IsendV10,
    pub irecv: IrecvV10,
    pub iflush: Iflush,
    pub test: Test,
    pub closeSend: Close,
    pub closeRecv: Close,
    pub closeListen: Close,
    pub getDeviceMr: GetDeviceMr,
    pub irecvConsumed: IrecvConsumed,
    pub makeVDevice: Option<unsafe extern "C" fn(*mut c_int, *mut ncclNetVDeviceProps_v12_t) -> R>,
    pub finalize: Finalize,
    pub setNetAttr: SetNetAttr,
}

// SAFETY: as for ncclNet_v8_t: immutable tables of a 'static name and function pointers.
unsafe impl Sync for ncclNet_v9_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v10_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v11_t {}
// SAFETY: as above.
unsafe impl Sync for ncclNet_v12_t {}

// LP64 layouts of NCCL's net_v9.h .. net_v12.h (nccl-net-abi.md §1.4-1.6).
const _: () = {
    assert!(size_of::<ncclNetVDeviceProps_v9_t>() == 20);
    assert!(size_of::<ncclNetVDeviceProps_v12_t>() == 36);
    assert!(size_of::<ncclNetCommConfig_v10_t>() == 4);
    assert!(size_of::<ncclNetAttr_v11_t>() == 44);
    assert!(size_of::<ncclNetProperties_v9_t>() == 104);
    assert!(offset_of!(ncclNetProperties_v9_t, forceFlush) == 32);
    assert!(offset_of!(ncclNetProperties_v9_t, vProps) == 64);
    assert!(offset_of!(ncclNetProperties_v9_t, maxP2pBytes) == 88);
    assert!(size_of::<ncclNetProperties_v11_t>() == 112);
    assert!(offset_of!(ncclNetProperties_v11_t, maxMultiRequestSize) == 104);
    assert!(size_of::<ncclNetProperties_v12_t>() == 128);
    assert!(offset_of!(ncclNetProperties_v12_t, maxP2pBytes) == 104);
    assert!(offset_of!(ncclNetProperties_v12_t, maxMultiRequestSize) == 120);
    assert!(offset_of!(ncclNetProperties_v12_t, railId) == 124);
    assert!(offset_of!(ncclNetProperties_v12_t, planeId) == 126);
    assert!(size_of::<ncclNet_v9_t>() == 160);
    assert!(size_of::<ncclNet_v10_t>() == 160);
    assert!(size_of::<ncclNet_v11_t>() == 176);
    assert!(size_of::<ncclNet_v12_t>() == 176);
    assert!(offset_of!(ncclNet_v12_t, makeVDevice) == 152);
    assert!(offset_of!(ncclNet_v12_t, finalize) == 160);
    assert!(offset_of!(ncclNet_v12_t, setNetAttr) == 168);
};
