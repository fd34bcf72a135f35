//! A client of any ncclNet plugin, v8 to v12, loaded by path and driven the way NCCL drives it:
//! `dlopen(RTLD_NOW | RTLD_LOCAL)`, the highest `ncclNetPlugin_vN` data symbol the library
//! exports (or the one asked for), `init` always with a logger (NCCL always passes one, and
//! plugins call it unconditionally), every entry read through the table pointer at each call
//! (a plugin may rewrite its table inside `init`), `*request` preset to the `0x1` sentinel for
//! single receives from v9 on (NCCL's v8 layer turns it into NULL, so v8 sees NULL).
//!
//! The benchmark, the doctor's pair check and the conformance tests all drive plugins through
//! this module. Every call returns the plugin's `ncclResult_t` on failure ([`UNSUPPORTED`] when
//! the loaded version has no such entry or cannot express the arguments); the waiting helpers
//! take a deadline. The library is never closed.
//!
//! Unsafe code: this module is an FFI client of a plugin, like NCCL's proxy; each call relies on
//! the plugin honouring the ncclNet contract for the version it exports. Its methods take the
//! plugin's handles as raw pointers and hand them back to the plugin without dereferencing
//! them: checking a handle is the plugin's job, and the conformance tests pass foreign ones on
//! purpose to see that it does.
#![allow(unsafe_code)]
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod rendezvous;

pub mod profiler;

pub mod process;

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::ptr;
use std::time::Instant;

use crate::abi::types::{
    NCCL_NET_OPTIONAL_RECV_COMPLETION, NCCL_NET_TRAFFIC_CLASS_UNDEF, ncclDebugLogger_t,
    ncclNet_v8_t, ncclNet_v9_t, ncclNet_v10_t, ncclNet_v11_t, ncclNet_v12_t, ncclNetAttr_v11_t,
    ncclNetCommAttr_v11_t, ncclNetCommConfig_v10_t, ncclNetProperties_v8_t, ncclNetProperties_v9_t,
    ncclNetProperties_v11_t, ncclNetProperties_v12_t, ncclNetVDeviceProps_v9_t,
    ncclNetVDeviceProps_v12_t, ncclProfilerCallback_t, ncclResult_t,
};
pub use crate::abi::types::{NCCL_PTR_CUDA, NCCL_PTR_HOST};

unsafe extern "C" {
    /// `src/driver/logger.c`: prints what NCCL would for `NCCL_DEBUG`.
    fn rsib_driver_logger(
        level: c_int,
        flags: std::ffi::c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

unsafe extern "C" {
    /// `src/driver/logger.c`: copies the last WARN line into `out` (NUL-terminated, truncated
    /// to `len`) and returns its length, 0 when there was none since the last call.
    fn rsib_driver_take_warning(out: *mut c_char, len: usize) -> usize;
    /// `src/driver/logger.c`: 0 = keep WARN lines off stderr (still kept for
    /// [`last_warning`]), 1 = print them (the default).
    fn rsib_driver_echo_warnings(on: c_int);
}

/// The last WARN line any driven plugin logged since the previous call, e.g. the plain-words
/// cause of a failed completion: a failed call returns only a code, its reason is logged.
pub fn last_warning() -> Option<String> {
    let mut buf = [0u8; 4096];
    // SAFETY: `buf` is writable for its length; the C side writes at most `len` bytes.
    let n = unsafe { rsib_driver_take_warning(buf.as_mut_ptr().cast(), buf.len()) };
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n.min(buf.len() - 1)]).into_owned())
}

/// Print plugins' WARN lines on stderr (the default, as NCCL does) or only keep them for
/// [`last_warning`] (a tool that reports them itself).
pub fn echo_warnings(on: bool) {
    // SAFETY: sets a flag; no preconditions.
    unsafe { rsib_driver_echo_warnings(c_int::from(on)) };
}

/// The code returned when the loaded version has no such entry, or cannot express the call.
pub const UNSUPPORTED: i32 = -1;

/// Buffers one `irecv` may group: NCCL passes at most `NCCL_NET_IB_MAX_RECVS` (8).
pub const MAX_RECV_BUFFERS: usize = 8;

/// NCCL's listen handle buffer.
pub type Handle = [u8; 128];
/// A comm, memory handle, context or request pointer.
pub type Ptr = *mut c_void;

/// The versions this driver speaks, newest first (the order NCCL looks them up in).
pub const VERSIONS: [u8; 5] = [12, 11, 10, 9, 8];

#[derive(Debug, Copy, Clone)]
enum Table {
    V8(*const ncclNet_v8_t),
    V9(*const ncclNet_v9_t),
    V10(*const ncclNet_v10_t),
    V11(*const ncclNet_v11_t),
    V12(*const ncclNet_v12_t),
}

fn rc_of(rc: ncclResult_t) -> Result<(), i32> {
    if rc.0 == 0 { Ok(()) } else { Err(rc.0) }
}

/// Call entry `$field` of the table at `$p`, read through the pointer at the moment of the call
/// (a plugin may rewrite its table in `init`); [`UNSUPPORTED`] when the entry is NULL.
macro_rules! entry {
    ($p:expr, $field:ident, |$f:ident| $call:expr) => {{
        // SAFETY: the table pointer came from dlsym of the version's data symbol in a library
        // that is never closed; the plugin may rewrite entries, never move the table.
        let entry = unsafe { (*$p).$field };
        match entry {
            // SAFETY: the plugin's own entry, called with its version's signature; pointers
            // passed are the caller's buffers or handles the plugin returned (module doc).
            Some($f) => rc_of(unsafe { $call }),
            None => Err(UNSUPPORTED),
        }
    }};
}

/// [`entry!`] for an entry whose signature is the same in every version.
macro_rules! call {
    ($self:expr, $field:ident, |$f:ident| $call:expr) => {
        match $self.table {
            Table::V8(p) => entry!(p, $field, |$f| $call),
            Table::V9(p) => entry!(p, $field, |$f| $call),
            Table::V10(p) => entry!(p, $field, |$f| $call),
            Table::V11(p) => entry!(p, $field, |$f| $call),
            Table::V12(p) => entry!(p, $field, |$f| $call),
        }
    };
}

/// Polls between clock reads: in a VM without a fast clock source every read is a system call,
/// which would otherwise dominate the latency being measured.
const POLLS_PER_CLOCK_READ: u32 = 1 << 12;

/// True once `deadline` passed, reading the clock only every `POLLS_PER_CLOCK_READ` calls.
fn expired(deadline: Instant, polls: &mut u32) -> bool {
    *polls += 1;
    (*polls).is_multiple_of(POLLS_PER_CLOCK_READ) && Instant::now() > deadline
}

fn late(what: &str) -> String {
    format!("{what} did not finish before the deadline")
}

/// How to load: which version, and what the communicator asks for (v10's connect config, v11+'s
/// init config).
#[derive(Copy, Clone, Debug)]
pub struct LoadOptions {
    /// Version to use; `None`: the highest the library exports.
    pub version: Option<u8>,
    /// The communicator id passed to a v11+ `init`.
    pub comm_id: u64,
    /// The communicator's traffic class, -1 for none.
    pub traffic_class: i32,
    /// The profiler callback a v10+ `init` passes (NCCL's is never NULL); with one, `isend`
    /// and `irecv` pass each buffer's address as its profiler handle (NCCL passes a handle of
    /// its proxy step), so that the callback can tell the requests apart. None: NULL handles.
    pub profiler: ncclProfilerCallback_t,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            version: None,
            comm_id: 0x5253_4942_0000_0001,
            traffic_class: NCCL_NET_TRAFFIC_CLASS_UNDEF,
            profiler: None,
        }
    }
}

/// What `getProperties` reported, whatever the version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `name`.
    pub name: String,
    /// `pciPath`, when not NULL.
    pub pci_path: Option<String>,
    /// `guid`.
    pub guid: u64,
    /// `speed` in Mbps.
    pub speed_mbps: i32,
    /// `port`.
    pub port: i32,
    /// `ptrSupport` bits.
    pub ptr_support: i32,
    /// `maxComms`.
    pub max_comms: i32,
    /// `maxRecvs`.
    pub max_recvs: i32,
    /// `forceFlush` (v9+).
    pub force_flush: Option<i32>,
    /// `vProps` members (v9+).
    pub members: Option<Vec<i32>>,
    /// `maxP2pBytes` (v9+).
    pub max_p2p_bytes: Option<usize>,
    /// `maxCollBytes` (v9+).
    pub max_coll_bytes: Option<usize>,
    /// `maxMultiRequestSize` (v11+).
    pub max_multi_request: Option<i32>,
    /// `railId` and `planeId` (v12).
    pub rail_plane: Option<(i16, i16)>,
}

/// One direction of [`NetAttr`]: concurrent peers and flows per peer, `-1` = not known.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CommAttr {
    /// Most concurrent peers.
    pub max_peers: i32,
    /// Fewest concurrent peers.
    pub min_peers: i32,
    /// Most flows per peer.
    pub max_flows: i32,
    /// Fewest flows per peer.
    pub min_flows: i32,
}

/// What `setNetAttr` passes (v11+).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NetAttr {
    /// Sending side.
    pub send: CommAttr,
    /// Receiving side.
    pub recv: CommAttr,
    /// Function, algorithm and protocol masks (`u32::MAX` = not known).
    pub op: u32,
    /// See `op`.
    pub algo: u32,
    /// See `op`.
    pub proto: u32,
}

/// A loaded plugin.
#[derive(Debug)]
pub struct Driver {
    table: Table,
    version: u8,
    options: LoadOptions,
    /// The context `init` returned (v11+), NULL before.
    ctx: Ptr,
}

// SAFETY: the driver has no interior mutability (its context is fixed at load); the raw
// pointers are a table in a library never closed and handles it only passes back to the
// plugin. Which entries may be called concurrently is the plugin's contract (NCCL calls
// setNetAttr from any thread, regMr beside isend), not the driver's.
unsafe impl Send for Driver {}
// SAFETY: as above.
unsafe impl Sync for Driver {}

fn dl_error() -> String {
    // SAFETY: no preconditions; after a failed dl call it returns a message or NULL.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown error".into();
    }
    // SAFETY: dlerror's message is NUL-terminated and lives until the next dl call.
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

fn c_string(p: *const c_char) -> Option<String> {
    // SAFETY: plugins return NUL-terminated strings that live for the process lifetime.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// The ncclNet versions NCCL looks a plugin up by, newest first (`src/plugin/net.cc`): v6 and
/// v7 as well, which this driver does not speak.
pub const NCCL_LOOKS_UP: [u8; 7] = [12, 11, 10, 9, 8, 7, 6];

/// A library opened the way NCCL opens a net plugin, `dlopen(name, RTLD_NOW | RTLD_LOCAL)`, and
/// never closed: the dynamic loader resolves a bare name as it would for NCCL (the library path,
/// its cache, the default directories).
#[derive(Debug)]
pub struct Library {
    handle: Ptr,
}

/// What a net plugin library shows NCCL before `init`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exports {
    /// The file the loader found.
    pub path: String,
    /// The `ncclNetPlugin_vN` tables it exports, of [`NCCL_LOOKS_UP`], newest first.
    pub versions: Vec<u8>,
    /// The `name` of the newest (the one NCCL uses), when not NULL.
    pub name: Option<String>,
}

impl Library {
    /// Open `name` (a path, or a file name the loader searches for).
    ///
    /// # Errors
    /// `dlerror()`'s message.
    pub fn open(name: &[u8]) -> Result<Self, String> {
        let c_name = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated name; RTLD_NOW | RTLD_LOCAL as NCCL uses.
        let handle = unsafe { libc::dlopen(c_name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dl_error());
        }
        Ok(Self { handle })
    }

    /// The address of data symbol `ncclNetPlugin_v{version}`, when exported.
    fn table(&self, version: u8) -> Option<Ptr> {
        let name = CString::new(format!("ncclNetPlugin_v{version}")).ok()?;
        // SAFETY: a live handle (never closed) and a NUL-terminated symbol name.
        let sym = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        (!sym.is_null()).then_some(sym)
    }

    /// The file the loader opened (NCCL logs the same, from the same call).
    fn path(&self) -> Option<String> {
        let mut map: *const LinkMapHead = ptr::null();
        // SAFETY: a live handle; RTLD_DI_LINKMAP writes one pointer to `map`.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                libc::RTLD_DI_LINKMAP,
                (&raw mut map).cast::<c_void>(),
            )
        };
        if rc != 0 || map.is_null() {
            return None;
        }
        // SAFETY: the loader's own link map entry for a library never closed.
        c_string(unsafe { (*map).l_name })
    }

    /// The tables NCCL would find, the newest one's name and the file they live in.
    pub fn exports(&self) -> Exports {
        let tables: Vec<(u8, Ptr)> = NCCL_LOOKS_UP
            .iter()
            .filter_map(|&v| self.table(v).map(|t| (v, t)))
            .collect();
        let newest = tables.first().map(|&(_, t)| t);
        // SAFETY: every ncclNet table version starts with `const char* name`, a 'static C
        // string or NULL (nccl-net-abi.md); the table lives in a library never closed.
        let name = newest.and_then(|t| c_string(unsafe { t.cast::<*const c_char>().read() }));
        Exports {
            path: self.path().unwrap_or_default(),
            versions: tables.iter().map(|&(v, _)| v).collect(),
            name,
        }
    }
}

/// The head of glibc's `struct link_map` (`<link.h>`, public and stable): what `dlinfo` points
/// at for `RTLD_DI_LINKMAP`.
#[repr(C)]
struct LinkMapHead {
    l_addr: usize,
    l_name: *const c_char,
}

impl Driver {
    /// `dlopen` the library, pick the version and call `init` (with the driver's logger).
    ///
    /// # Errors
    /// A line naming the library and what is missing or failed.
    pub fn load(path: &Path, options: LoadOptions) -> Result<Self, String> {
        let lib = Library::open(path.as_os_str().as_encoded_bytes())
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        let found = match options.version {
            Some(v) if !VERSIONS.contains(&v) => {
                return Err(format!(
                    "ncclNet v{v} is not one this driver speaks (8 to 12)"
                ));
            }
            Some(v) => lib
                .table(v)
                .map(|t| (v, t))
                .ok_or_else(|| format!("{} exports no ncclNetPlugin_v{v}", path.display()))?,
            None => VERSIONS
                .iter()
                .find_map(|&v| lib.table(v).map(|t| (v, t)))
                .ok_or_else(|| format!("{} exports no ncclNetPlugin_v8 .. v12", path.display()))?,
        };
        let table = match found {
            (8, p) => Table::V8(p.cast()),
            (9, p) => Table::V9(p.cast()),
            (10, p) => Table::V10(p.cast()),
            (11, p) => Table::V11(p.cast()),
            (_, p) => Table::V12(p.cast()),
        };
        Self::start(table, found.0, options)
    }

    /// Drive the plugin linked into this program (the tables of [`crate::abi`]), the same code
    /// NCCL would load from `libnccl-net.so`: what the doctor uses when given no `--plugin`.
    ///
    /// # Errors
    /// An unknown version, or `init` failing.
    pub fn builtin(options: LoadOptions) -> Result<Self, String> {
        use crate::abi::{
            ncclNetPlugin_v8, ncclNetPlugin_v9, ncclNetPlugin_v10, ncclNetPlugin_v11,
            ncclNetPlugin_v12,
        };
        let version = options.version.unwrap_or(VERSIONS[0]);
        let table = match version {
            8 => Table::V8(&raw const ncclNetPlugin_v8),
            9 => Table::V9(&raw const ncclNetPlugin_v9),
            10 => Table::V10(&raw const ncclNetPlugin_v10),
            11 => Table::V11(&raw const ncclNetPlugin_v11),
            12 => Table::V12(&raw const ncclNetPlugin_v12),
            v => {
                return Err(format!(
                    "ncclNet v{v} is not one this driver speaks (8 to 12)"
                ));
            }
        };
        Self::start(table, version, options)
    }

    fn start(table: Table, version: u8, options: LoadOptions) -> Result<Self, String> {
        let mut driver = Self {
            table,
            version,
            options,
            ctx: ptr::null_mut(),
        };
        driver.ctx = driver
            .init_context(options.comm_id, options.traffic_class)
            .map_err(|rc| {
                let why = last_warning().map(|w| format!(": {w}")).unwrap_or_default();
                format!("init failed with ncclResult {rc}{why}")
            })?;
        Ok(driver)
    }

    /// The version in use.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The plugin's `name`.
    pub fn name(&self) -> String {
        let name = match self.table {
            // SAFETY: a live table (see `entry!`); `name` is a 'static C string.
            Table::V8(p) => unsafe { (*p).name },
            // SAFETY: as above.
            Table::V9(p) => unsafe { (*p).name },
            // SAFETY: as above.
            Table::V10(p) => unsafe { (*p).name },
            // SAFETY: as above.
            Table::V11(p) => unsafe { (*p).name },
            // SAFETY: as above.
            Table::V12(p) => unsafe { (*p).name },
        };
        c_string(name).unwrap_or_default()
    }

    /// `init` once more: for v11+ a new context (for another communicator); before v11 NULL.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn init_context(&self, comm_id: u64, traffic_class: i32) -> Result<Ptr, i32> {
        let logger: ncclDebugLogger_t = Some(rsib_driver_logger);
        let profiler = self.options.profiler;
        let mut ctx: Ptr = ptr::null_mut();
        let mut config = ncclNetCommConfig_v10_t {
            trafficClass: traffic_class,
        };
        match self.table {
            Table::V8(p) => entry!(p, init, |f| f(logger)),
            Table::V9(p) => entry!(p, init, |f| f(logger)),
            Table::V10(p) => entry!(p, init, |f| f(logger, profiler)),
            Table::V11(p) => {
                entry!(p, init, |f| f(
                    &mut ctx,
                    comm_id,
                    &mut config,
                    logger,
                    profiler
                ))
            }
            Table::V12(p) => {
                entry!(p, init, |f| f(
                    &mut ctx,
                    comm_id,
                    &mut config,
                    logger,
                    profiler
                ))
            }
        }?;
        Ok(ctx)
    }

    /// `finalize` of a context `init_context` returned (v11+).
    ///
    /// # Errors
    /// The plugin's code; [`UNSUPPORTED`] before v11.
    pub fn finalize_context(&self, ctx: Ptr) -> Result<(), i32> {
        match self.table {
            Table::V11(p) => entry!(p, finalize, |f| f(ctx)),
            Table::V12(p) => entry!(p, finalize, |f| f(ctx)),
            _ => Err(UNSUPPORTED),
        }
    }

    /// The context the load created (NULL before v11).
    pub fn context(&self) -> Ptr {
        self.ctx
    }

    /// `devices`.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn devices(&self) -> Result<i32, i32> {
        let mut n = 0;
        call!(self, devices, |f| f(&mut n))?;
        Ok(n)
    }

    /// `getProperties`, whatever the version.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn device(&self, dev: i32) -> Result<DeviceInfo, i32> {
        fn get<P>(
            props: impl FnOnce(&mut P) -> Result<(), i32>,
            info: fn(&P) -> DeviceInfo,
        ) -> Result<DeviceInfo, i32> {
            // SAFETY: the property structs are plain C data, for which all zeroes is valid.
            let mut p: P = unsafe { std::mem::zeroed() };
            props(&mut p)?;
            Ok(info(&p))
        }
        match self.table {
            Table::V8(p) => get(|o| entry!(p, getProperties, |f| f(dev, o)), info_v8),
            Table::V9(p) => get(|o| entry!(p, getProperties, |f| f(dev, o)), info_v9),
            Table::V10(p) => get(|o| entry!(p, getProperties, |f| f(dev, o)), info_v9),
            Table::V11(p) => get(|o| entry!(p, getProperties, |f| f(dev, o)), info_v11),
            Table::V12(p) => get(|o| entry!(p, getProperties, |f| f(dev, o)), info_v12),
        }
    }

    /// `listen` (under this driver's context from v11).
    ///
    /// # Errors
    /// The plugin's code.
    pub fn listen(&self, dev: i32) -> Result<(Handle, Ptr), i32> {
        self.listen_in(self.ctx, dev)
    }

    /// `listen` under the context `ctx` (v11+; ignored before).
    ///
    /// # Errors
    /// The plugin's code.
    pub fn listen_in(&self, ctx: Ptr, dev: i32) -> Result<(Handle, Ptr), i32> {
        let mut handle = [0u8; 128];
        let mut lc = ptr::null_mut();
        let h = handle.as_mut_ptr().cast();
        match self.table {
            Table::V8(p) => entry!(p, listen, |f| f(dev, h, &mut lc)),
            Table::V9(p) => entry!(p, listen, |f| f(dev, h, &mut lc)),
            Table::V10(p) => entry!(p, listen, |f| f(dev, h, &mut lc)),
            Table::V11(p) => entry!(p, listen, |f| f(ctx, dev, h, &mut lc)),
            Table::V12(p) => entry!(p, listen, |f| f(ctx, dev, h, &mut lc)),
        }?;
        Ok((handle, lc))
    }

    /// One `connect` call (NULL = call again).
    ///
    /// # Errors
    /// The plugin's code.
    pub fn connect_step(&self, dev: i32, handle: &mut Handle) -> Result<Ptr, i32> {
        self.connect_step_in(self.ctx, dev, handle)
    }

    /// One `connect` call under the context `ctx` (v11+; ignored before).
    ///
    /// # Errors
    /// The plugin's code.
    pub fn connect_step_in(&self, ctx: Ptr, dev: i32, handle: &mut Handle) -> Result<Ptr, i32> {
        let mut sc = ptr::null_mut();
        let h = handle.as_mut_ptr().cast();
        let mut config = ncclNetCommConfig_v10_t {
            trafficClass: self.options.traffic_class,
        };
        let none = ptr::null_mut();
        match self.table {
            Table::V8(p) => entry!(p, connect, |f| f(dev, h, &mut sc, none)),
            Table::V9(p) => entry!(p, connect, |f| f(dev, h, &mut sc, none)),
            Table::V10(p) => entry!(p, connect, |f| f(dev, &mut config, h, &mut sc, none)),
            Table::V11(p) => entry!(p, connect, |f| f(ctx, dev, h, &mut sc, none)),
            Table::V12(p) => entry!(p, connect, |f| f(ctx, dev, h, &mut sc, none)),
        }?;
        Ok(sc)
    }

    /// One `accept` call (NULL = call again).
    ///
    /// # Errors
    /// The plugin's code.
    pub fn accept_step(&self, lc: Ptr) -> Result<Ptr, i32> {
        let mut rc = ptr::null_mut();
        let none = ptr::null_mut();
        call!(self, accept, |f| f(lc, &mut rc, none))?;
        Ok(rc)
    }

    /// Connect to `peer` and accept on `lc` at once, as NCCL's non-blocking calls allow.
    ///
    /// # Errors
    /// A line saying which call failed, or that the deadline passed.
    pub fn connect_and_accept(
        &self,
        dev: i32,
        peer: &Handle,
        lc: Ptr,
        deadline: Instant,
    ) -> Result<(Ptr, Ptr), String> {
        let mut peer = *peer;
        let (mut sc, mut rc): (Ptr, Ptr) = (ptr::null_mut(), ptr::null_mut());
        let mut polls = 0;
        while sc.is_null() || rc.is_null() {
            if sc.is_null() {
                sc = self
                    .connect_step(dev, &mut peer)
                    .map_err(|e| format!("connect failed: ncclResult {e}"))?;
            }
            if rc.is_null() {
                rc = self
                    .accept_step(lc)
                    .map_err(|e| format!("accept failed: ncclResult {e}"))?;
            }
            if expired(deadline, &mut polls) {
                return Err(late("connect/accept"));
            }
        }
        Ok((sc, rc))
    }

    /// `regMr` of host memory.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn reg_mr(&self, comm: Ptr, buf: &mut [u8]) -> Result<Ptr, i32> {
        // The caller keeps `buf` alive until `dereg_mr`.
        self.reg_mr_raw(comm, buf.as_mut_ptr().cast(), buf.len(), NCCL_PTR_HOST)
    }

    /// `regMr` of `len` bytes at `data` with NCCL's pointer type (`NCCL_PTR_HOST` 1,
    /// `NCCL_PTR_CUDA` 2): GPU memory, which has no Rust slice.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn reg_mr_raw(&self, comm: Ptr, data: Ptr, len: usize, kind: c_int) -> Result<Ptr, i32> {
        let mut mh = ptr::null_mut();
        // The caller keeps the memory alive until `dereg_mr`.
        call!(self, regMr, |f| f(comm, data, len, kind, &mut mh))?;
        Ok(mh)
    }

    /// `regMrDmaBuf` of `buf` through `fd` at offset 0.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn reg_mr_dmabuf(&self, comm: Ptr, buf: &mut [u8], fd: c_int) -> Result<Ptr, i32> {
        let mut mh = ptr::null_mut();
        let (data, len) = (buf.as_mut_ptr().cast(), buf.len());
        call!(self, regMrDmaBuf, |f| f(comm, data, len, 1, 0, fd, &mut mh))?;
        Ok(mh)
    }

    /// `deregMr`.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn dereg_mr(&self, comm: Ptr, mh: Ptr) -> Result<(), i32> {
        call!(self, deregMr, |f| f(comm, mh))
    }

    /// One `isend` call (NULL = not now). v8 takes an `int` size: larger ones are
    /// [`UNSUPPORTED`].
    ///
    /// # Errors
    /// The plugin's code.
    pub fn isend_step(
        &self,
        sc: Ptr,
        data: *mut u8,
        size: usize,
        tag: c_int,
        mh: Ptr,
    ) -> Result<Ptr, i32> {
        let mut req = ptr::null_mut();
        let d = data.cast();
        let ph = self.phandle(d);
        match self.table {
            Table::V8(p) => {
                let size = c_int::try_from(size).map_err(|_| UNSUPPORTED)?;
                entry!(p, isend, |f| f(sc, d, size, tag, mh, &mut req))
            }
            Table::V9(p) => entry!(p, isend, |f| f(sc, d, size, tag, mh, &mut req)),
            Table::V10(p) => entry!(p, isend, |f| f(sc, d, size, tag, mh, ph, &mut req)),
            Table::V11(p) => entry!(p, isend, |f| f(sc, d, size, tag, mh, ph, &mut req)),
            Table::V12(p) => entry!(p, isend, |f| f(sc, d, size, tag, mh, ph, &mut req)),
        }?;
        Ok(req)
    }

    /// The profiler handle passed with the buffer at `data`: its address with a profiler,
    /// else NULL.
    fn phandle(&self, data: Ptr) -> Ptr {
        if self.options.profiler.is_some() {
            data
        } else {
            ptr::null_mut()
        }
    }

    /// One `irecv` call (NULL = not now), with `*request` preset as NCCL does: the `0x1`
    /// sentinel for a single receive from v9 on, NULL otherwise.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn irecv_step(&self, rc: Ptr, bufs: &[(*mut u8, usize, c_int, Ptr)]) -> Result<Ptr, i32> {
        let preset = if bufs.len() == 1 && self.version >= 9 {
            ptr::without_provenance_mut(NCCL_NET_OPTIONAL_RECV_COMPLETION)
        } else {
            ptr::null_mut()
        };
        self.irecv_step_preset(rc, bufs, preset)
    }

    /// One `irecv` call with `*request` preset to `preset`.
    ///
    /// # Errors
    /// The plugin's code; [`UNSUPPORTED`] for more than [`MAX_RECV_BUFFERS`] buffers.
    pub fn irecv_step_preset(
        &self,
        rc: Ptr,
        bufs: &[(*mut u8, usize, c_int, Ptr)],
        preset: Ptr,
    ) -> Result<Ptr, i32> {
        if bufs.len() > MAX_RECV_BUFFERS {
            return Err(UNSUPPORTED);
        }
        // On the stack, as NCCL's proxy passes its arrays: nothing allocated per call, so the
        // benchmark's own cost per message stays out of the plugin's figures.
        let mut data = [ptr::null_mut(); MAX_RECV_BUFFERS];
        let mut sizes = [0usize; MAX_RECV_BUFFERS];
        let mut tags = [0 as c_int; MAX_RECV_BUFFERS];
        let mut mhs = [ptr::null_mut(); MAX_RECV_BUFFERS];
        let mut phandles = [ptr::null_mut(); MAX_RECV_BUFFERS];
        for (i, b) in bufs.iter().enumerate() {
            (data[i], sizes[i], tags[i], mhs[i]) = (b.0.cast(), b.1, b.2, b.3);
            phandles[i] = self.phandle(data[i]);
        }
        let mut req = preset;
        let n = c_int::try_from(bufs.len()).unwrap_or(c_int::MAX);
        let (d, s, t, m, ph) = (
            data.as_mut_ptr(),
            sizes.as_mut_ptr(),
            tags.as_mut_ptr(),
            mhs.as_mut_ptr(),
            phandles.as_mut_ptr(),
        );
        match self.table {
            Table::V8(p) => {
                let mut small = [0 as c_int; MAX_RECV_BUFFERS];
                for (to, &size) in small.iter_mut().zip(&sizes) {
                    *to = c_int::try_from(size).map_err(|_| UNSUPPORTED)?;
                }
                let s = small.as_mut_ptr();
                entry!(p, irecv, |f| f(rc, n, d, s, t, m, &mut req))
            }
            Table::V9(p) => entry!(p, irecv, |f| f(rc, n, d, s, t, m, &mut req)),
            Table::V10(p) => entry!(p, irecv, |f| f(rc, n, d, s, t, m, ph, &mut req)),
            Table::V11(p) => entry!(p, irecv, |f| f(rc, n, d, s, t, m, ph, &mut req)),
            Table::V12(p) => entry!(p, irecv, |f| f(rc, n, d, s, t, m, ph, &mut req)),
        }?;
        Ok(req)
    }

    /// One `iflush` call (NULL = nothing to flush).
    ///
    /// # Errors
    /// The plugin's code.
    pub fn iflush(&self, rc: Ptr, bufs: &[(*mut u8, c_int, Ptr)]) -> Result<Ptr, i32> {
        let mut data: Vec<Ptr> = bufs.iter().map(|b| b.0.cast()).collect();
        let mut sizes: Vec<c_int> = bufs.iter().map(|b| b.1).collect();
        let mut mhs: Vec<Ptr> = bufs.iter().map(|b| b.2).collect();
        let mut req = ptr::null_mut();
        let n = c_int::try_from(bufs.len()).unwrap_or(c_int::MAX);
        let (d, s, m) = (data.as_mut_ptr(), sizes.as_mut_ptr(), mhs.as_mut_ptr());
        call!(self, iflush, |f| f(rc, n, d, s, m, &mut req))?;
        Ok(req)
    }

    /// One `test` call: the sizes once done.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn test_step(&self, req: Ptr) -> Result<Option<[c_int; MAX_RECV_BUFFERS]>, i32> {
        let mut done = 0;
        let mut sizes = [-1 as c_int; MAX_RECV_BUFFERS];
        let s = sizes.as_mut_ptr();
        call!(self, test, |f| f(req, &mut done, s))?;
        Ok((done == 1).then_some(sizes))
    }

    /// `makeVDevice` of `members` (v9+).
    ///
    /// # Errors
    /// The plugin's code; [`UNSUPPORTED`] for v8 or more members than the version holds.
    pub fn make_vdevice(&self, members: &[i32]) -> Result<i32, i32> {
        let mut d = -1;
        let ndevs = c_int::try_from(members.len()).map_err(|_| UNSUPPORTED)?;
        let mut small = ncclNetVDeviceProps_v9_t {
            ndevs,
            devs: [0; 4],
        };
        let mut large = ncclNetVDeviceProps_v12_t {
            ndevs,
            devs: [0; 8],
        };
        if members.len() > large.devs.len() {
            return Err(UNSUPPORTED);
        }
        large.devs[..members.len()].copy_from_slice(members);
        let fits_small = members.len() <= small.devs.len();
        if fits_small {
            small.devs[..members.len()].copy_from_slice(members);
        }
        match self.table {
            Table::V8(_) => Err(UNSUPPORTED),
            _ if !fits_small && !matches!(self.table, Table::V12(_)) => Err(UNSUPPORTED),
            Table::V9(p) => entry!(p, makeVDevice, |f| f(&mut d, &mut small)),
            Table::V10(p) => entry!(p, makeVDevice, |f| f(&mut d, &mut small)),
            Table::V11(p) => entry!(p, makeVDevice, |f| f(&mut d, &mut small)),
            Table::V12(p) => entry!(p, makeVDevice, |f| f(&mut d, &mut large)),
        }?;
        Ok(d)
    }

    /// `setNetAttr` on `ctx` (v11+); `attr` `None` passes NULL.
    ///
    /// # Errors
    /// The plugin's code; [`UNSUPPORTED`] before v11.
    pub fn set_net_attr(&self, ctx: Ptr, attr: Option<NetAttr>) -> Result<(), i32> {
        let side = |c: CommAttr| ncclNetCommAttr_v11_t {
            maxConcurrentPeers: c.max_peers,
            minConcurrentPeers: c.min_peers,
            maxFlowsPerPeer: c.max_flows,
            minFlowsPerPeer: c.min_flows,
        };
        let mut raw = attr.map(|a| ncclNetAttr_v11_t {
            sendCommAttr: side(a.send),
            recvCommAttr: side(a.recv),
            op: a.op,
            algo: a.algo,
            proto: a.proto,
        });
        let a = raw.as_mut().map_or(ptr::null_mut(), ptr::from_mut);
        match self.table {
            Table::V11(p) => entry!(p, setNetAttr, |f| f(ctx, a)),
            Table::V12(p) => entry!(p, setNetAttr, |f| f(ctx, a)),
            _ => Err(UNSUPPORTED),
        }
    }

    /// Call `step` until it yields a non-NULL pointer.
    ///
    /// # Errors
    /// A line naming `what` and the code, or that the deadline passed.
    pub fn until_started(
        &self,
        what: &str,
        deadline: Instant,
        mut step: impl FnMut() -> Result<Ptr, i32>,
    ) -> Result<Ptr, String> {
        let mut polls = 0;
        loop {
            let p = step().map_err(|rc| format!("{what} failed: ncclResult {rc}"))?;
            if !p.is_null() {
                return Ok(p);
            }
            if expired(deadline, &mut polls) {
                return Err(late(what));
            }
        }
    }

    /// `test` until done.
    ///
    /// # Errors
    /// A line with the code, or that the deadline passed.
    pub fn wait(&self, req: Ptr, deadline: Instant) -> Result<[c_int; MAX_RECV_BUFFERS], String> {
        self.wait_with(deadline, || self.test_step(req))
    }

    /// Call `test` (a [`Self::test_step`], possibly wrapped) until it reports done.
    ///
    /// # Errors
    /// A line with the code, or that the deadline passed.
    pub fn wait_with(
        &self,
        deadline: Instant,
        mut test: impl FnMut() -> Result<Option<[c_int; MAX_RECV_BUFFERS]>, i32>,
    ) -> Result<[c_int; MAX_RECV_BUFFERS], String> {
        let mut polls = 0;
        loop {
            if let Some(sizes) = test().map_err(|rc| format!("test failed: ncclResult {rc}"))? {
                return Ok(sizes);
            }
            if expired(deadline, &mut polls) {
                return Err(late("a request"));
            }
        }
    }

    /// Send `count` messages of `size` bytes with at most `window` in flight, message `i` from
    /// `slots[i % slots.len()]`, completing in order; `before_post(i, slot)` runs before each
    /// post (to write the payload). The caller keeps the slots registered under `mh`.
    ///
    /// # Errors
    /// A line naming the failed call, or that the deadline passed.
    #[allow(clippy::too_many_arguments)] // the stream's whole shape; a struct would only rename them
    pub fn send_stream(
        &self,
        sc: Ptr,
        mh: Ptr,
        slots: &[*mut u8],
        size: usize,
        count: usize,
        window: usize,
        deadline: Instant,
        mut before_post: impl FnMut(usize, usize),
    ) -> Result<(), String> {
        let mut pending = std::collections::VecDeque::with_capacity(window);
        for i in 0..count {
            if pending.len() == window.max(1)
                && let Some(r) = pending.pop_front()
            {
                self.wait(r, deadline)?;
            }
            let slot = i % slots.len().max(1);
            before_post(i, slot);
            let data = slots[slot];
            pending.push_back(
                self.until_started("isend", deadline, || self.isend_step(sc, data, size, 0, mh))?,
            );
        }
        for r in pending {
            self.wait(r, deadline)?;
        }
        Ok(())
    }

    /// Receive `count` messages of up to `size` bytes with at most `window` in flight, message
    /// `i` into `slots[i % slots.len()]`; `on_complete(i, slot, received)` runs as each one
    /// completes, in order (to check the payload, or flush it). Like NCCL's proxy, it refills
    /// the window with back-to-back `irecv`s: once the oldest receive is done, the ones already
    /// done behind it are taken too before receives are posted again.
    ///
    /// # Errors
    /// A line naming the failed call, that the deadline passed, or what `on_complete` returned.
    #[allow(clippy::too_many_arguments)] // as send_stream
    pub fn recv_stream(
        &self,
        rc: Ptr,
        mh: Ptr,
        slots: &[*mut u8],
        size: usize,
        count: usize,
        window: usize,
        deadline: Instant,
        mut on_complete: impl FnMut(usize, usize, usize) -> Result<(), String>,
    ) -> Result<(), String> {
        let nslots = slots.len().max(1);
        let mut pending: std::collections::VecDeque<(usize, Ptr)> =
            std::collections::VecDeque::with_capacity(window);
        let mut report = |i: usize, sizes: [c_int; MAX_RECV_BUFFERS]| {
            on_complete(i, i % nslots, usize::try_from(sizes[0]).unwrap_or(0))
        };
        for i in 0..count {
            if pending.len() == window.max(1)
                && let Some((j, r)) = pending.pop_front()
            {
                report(j, self.wait(r, deadline)?)?;
                // As NCCL's proxy, post every receive the window allows before testing again:
                // take the receives that completed meanwhile too.
                while let Some(&(j, r)) = pending.front() {
                    let Some(sizes) = self
                        .test_step(r)
                        .map_err(|rc| format!("test failed: ncclResult {rc}"))?
                    else {
                        break;
                    };
                    pending.pop_front();
                    report(j, sizes)?;
                }
            }
            let data = slots[i % nslots];
            let r = self.until_started("irecv", deadline, || {
                self.irecv_step(rc, &[(data, size, 0, mh)])
            })?;
            pending.push_back((i, r));
        }
        for (j, r) in pending {
            report(j, self.wait(r, deadline)?)?;
        }
        Ok(())
    }

    /// `closeSend`.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn close_send(&self, c: Ptr) -> Result<(), i32> {
        call!(self, closeSend, |f| f(c))
    }

    /// `closeRecv`.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn close_recv(&self, c: Ptr) -> Result<(), i32> {
        call!(self, closeRecv, |f| f(c))
    }

    /// `closeListen`.
    ///
    /// # Errors
    /// The plugin's code.
    pub fn close_listen(&self, c: Ptr) -> Result<(), i32> {
        call!(self, closeListen, |f| f(c))
    }
}

/// The fields every version's properties share.
macro_rules! common_info {
    ($p:expr) => {
        DeviceInfo {
            name: c_string($p.name).unwrap_or_default(),
            pci_path: c_string($p.pciPath),
            guid: $p.guid,
            speed_mbps: $p.speed,
            port: $p.port,
            ptr_support: $p.ptrSupport,
            max_comms: $p.maxComms,
            max_recvs: $p.maxRecvs,
            force_flush: None,
            members: None,
            max_p2p_bytes: None,
            max_coll_bytes: None,
            max_multi_request: None,
            rail_plane: None,
        }
    };
}

fn members(ndevs: c_int, devs: &[c_int]) -> Option<Vec<i32>> {
    let n = usize::try_from(ndevs).ok()?.min(devs.len());
    Some(devs[..n].to_vec())
}

fn info_v8(p: &ncclNetProperties_v8_t) -> DeviceInfo {
    common_info!(p)
}

/// What v9 added to the properties (v10 to v12 keep it), over [`common_info!`].
macro_rules! v9_info {
    ($p:expr) => {
        DeviceInfo {
            force_flush: Some($p.forceFlush),
            members: members($p.vProps.ndevs, &$p.vProps.devs),
            max_p2p_bytes: Some($p.maxP2pBytes),
            max_coll_bytes: Some($p.maxCollBytes),
            ..common_info!($p)
        }
    };
}

fn info_v9(p: &ncclNetProperties_v9_t) -> DeviceInfo {
    v9_info!(p)
}

fn info_v11(p: &ncclNetProperties_v11_t) -> DeviceInfo {
    DeviceInfo {
        max_multi_request: Some(p.maxMultiRequestSize),
        ..v9_info!(p)
    }
}

fn info_v12(p: &ncclNetProperties_v12_t) -> DeviceInfo {
    DeviceInfo {
        max_multi_request: Some(p.maxMultiRequestSize),
        rail_plane: Some((p.railId, p.planeId)),
        ..v9_info!(p)
    }
}

/// Deterministic payload for message `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fill_pattern(seed, &mut out);
    out
}

/// Fill `out` with the payload of message `seed`. Any slice of it can be checked on its own
/// with [`pattern_at`], without a second copy of the whole message.
pub fn fill_pattern(seed: u64, out: &mut [u8]) {
    fill_pattern_at(seed, 0, out);
}

/// Fill `out` with bytes `offset..offset + out.len()` of message `seed`'s payload (`offset`
/// a multiple of 8).
pub fn fill_pattern_at(seed: u64, offset: usize, out: &mut [u8]) {
    let base = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for (k, chunk) in out.chunks_mut(8).enumerate() {
        let word = (offset / 8 + k) as u64;
        // A counter-based mix (splitmix64), so every 8-byte word is independent of the others.
        let mut x = base.wrapping_add(word.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Whether `got` equals bytes `offset..` of message `seed`'s payload.
pub fn pattern_at(seed: u64, offset: usize, got: &[u8]) -> bool {
    let mut expected = vec![0u8; got.len()];
    fill_pattern_at(seed, offset, &mut expected);
    expected == got
}
