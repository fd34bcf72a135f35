//! The conformance tests' view of a plugin: `nccl_net::driver` (the driver the benchmark and the
//! doctor use too), with calls that must succeed turned into assertions. The ncclNet version
//! comes from `RSIB_TEST_ABI` (8 to 12; the highest exported when unset).

use std::ffi::c_void;
use std::path::Path;
use std::time::{Duration, Instant};

pub use nccl_net::driver::{Driver, Handle, LoadOptions, fill_pattern_at, pattern, pattern_at};

pub const DEADLINE: Duration = Duration::from_secs(60);

fn deadline() -> Instant {
    Instant::now() + DEADLINE
}

fn ok<T>(r: Result<T, i32>, what: &str) -> T {
    r.unwrap_or_else(|rc| panic!("{what} returned ncclResult {rc}"))
}

/// The version `RSIB_TEST_ABI` asks for.
pub fn test_abi() -> Option<u8> {
    std::env::var("RSIB_TEST_ABI")
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("RSIB_TEST_ABI={v}")))
}

pub struct Net(pub Driver);

impl Net {
    /// Load through `RSIB_TEST_ABI`, with the communicator traffic class `RSIB_TEST_TC` (-1 when
    /// unset): v10 passes it to connect, v11+ to init; with `RSIB_TEST_PROFILER` set, v10+
    /// `init` gets the recording profiler callback (`nccl_net::driver::profiler`).
    pub fn load(path: &Path) -> Self {
        let traffic_class = std::env::var("RSIB_TEST_TC").map_or(-1, |v| v.parse().unwrap());
        let profiler =
            std::env::var_os("RSIB_TEST_PROFILER").map(|_| nccl_net::driver::profiler::record as _);
        Self::load_with(
            path,
            LoadOptions {
                version: test_abi(),
                traffic_class,
                profiler,
                ..LoadOptions::default()
            },
        )
    }
    pub fn load_with(path: &Path, options: LoadOptions) -> Self {
        Self(Driver::load(path, options).unwrap())
    }
    pub fn devices(&self) -> i32 {
        ok(self.0.devices(), "devices")
    }
    pub fn device_name(&self, dev: i32) -> String {
        ok(self.0.device(dev), "getProperties").name
    }
    /// The index of the device called `name`.
    pub fn device_named(&self, name: &str) -> i32 {
        (0..self.devices())
            .find(|&d| self.device_name(d) == name)
            .unwrap_or_else(|| panic!("no device {name}"))
    }
    pub fn listen(&self, dev: i32) -> (Handle, *mut c_void) {
        let (h, lc) = ok(self.0.listen(dev), "listen");
        assert!(!lc.is_null(), "listen returned a NULL listen comm");
        (h, lc)
    }
    pub fn connect_step(&self, dev: i32, handle: &mut Handle) -> Result<*mut c_void, i32> {
        self.0.connect_step(dev, handle)
    }
    pub fn accept_step(&self, lc: *mut c_void) -> Result<*mut c_void, i32> {
        self.0.accept_step(lc)
    }
    pub fn connect(&self, dev: i32, handle: &Handle) -> *mut c_void {
        let mut h = *handle;
        self.0
            .until_started("connect", deadline(), || self.0.connect_step(dev, &mut h))
            .unwrap()
    }
    pub fn connect_and_accept(
        &self,
        dev: i32,
        peer: &Handle,
        lc: *mut c_void,
    ) -> (*mut c_void, *mut c_void) {
        self.0
            .connect_and_accept(dev, peer, lc, deadline())
            .unwrap()
    }
    pub fn accept(&self, lc: *mut c_void) -> *mut c_void {
        self.0
            .until_started("accept", deadline(), || self.0.accept_step(lc))
            .unwrap()
    }
    pub fn reg_mr(&self, comm: *mut c_void, buf: &mut [u8]) -> *mut c_void {
        ok(self.0.reg_mr(comm, buf), "regMr")
    }
    pub fn reg_mr_dmabuf_step(
        &self,
        comm: *mut c_void,
        buf: &mut [u8],
        fd: i32,
    ) -> Result<*mut c_void, i32> {
        self.0.reg_mr_dmabuf(comm, buf, fd)
    }
    pub fn dereg_mr(&self, comm: *mut c_void, mh: *mut c_void) {
        ok(self.0.dereg_mr(comm, mh), "deregMr");
    }
    pub fn isend_step(
        &self,
        sc: *mut c_void,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: *mut c_void,
    ) -> Result<*mut c_void, i32> {
        self.0.isend_step(sc, data, size, tag, mh)
    }
    pub fn isend(
        &self,
        sc: *mut c_void,
        data: *mut u8,
        size: usize,
        tag: i32,
        mh: *mut c_void,
    ) -> *mut c_void {
        self.0
            .until_started("isend", deadline(), || {
                self.0.isend_step(sc, data, size, tag, mh)
            })
            .unwrap()
    }
    pub fn irecv_step(
        &self,
        rc: *mut c_void,
        bufs: &[(*mut u8, usize, i32, *mut c_void)],
        preset: *mut c_void,
    ) -> Result<*mut c_void, i32> {
        self.0.irecv_step_preset(rc, bufs, preset)
    }
    /// Post a receive until it starts, `*request` preset as NCCL presets it.
    pub fn irecv(
        &self,
        rc: *mut c_void,
        bufs: &[(*mut u8, usize, i32, *mut c_void)],
    ) -> *mut c_void {
        self.0
            .until_started("irecv", deadline(), || self.0.irecv_step(rc, bufs))
            .unwrap()
    }
    pub fn iflush(&self, rc: *mut c_void, bufs: &[(*mut u8, i32, *mut c_void)]) -> *mut c_void {
        ok(self.0.iflush(rc, bufs), "iflush")
    }
    pub fn test_step(&self, req: *mut c_void) -> Result<Option<[i32; 8]>, i32> {
        self.0.test_step(req)
    }
    pub fn wait(&self, req: *mut c_void) -> [i32; 8] {
        self.0.wait(req, deadline()).unwrap()
    }
    pub fn close_send(&self, c: *mut c_void) {
        ok(self.0.close_send(c), "closeSend");
    }
    pub fn close_recv(&self, c: *mut c_void) {
        ok(self.0.close_recv(c), "closeRecv");
    }
    pub fn close_listen(&self, c: *mut c_void) {
        ok(self.0.close_listen(c), "closeListen");
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Handle {
    let mut h = [0u8; 128];
    for (i, b) in h.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    h
}
