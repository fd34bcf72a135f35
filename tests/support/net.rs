//! The conformance tests' view of the plugin: the benchmark's vtable driver
//! (`src/bin/nccl-net-bench/plugin.rs`), with calls that must succeed turned into assertions.

use std::ffi::c_void;
use std::path::Path;
use std::time::{Duration, Instant};

#[path = "../../src/bin/nccl-net-bench/plugin.rs"]
mod plugin;

use plugin::Plugin;
pub use plugin::{Handle, pattern};

pub const DEADLINE: Duration = Duration::from_secs(60);

fn deadline() -> Instant {
    Instant::now() + DEADLINE
}

fn ok<T>(r: Result<T, i32>, what: &str) -> T {
    r.unwrap_or_else(|rc| panic!("{what} returned ncclResult {rc}"))
}

pub struct Net(Plugin);

impl Net {
    pub fn load(path: &Path) -> Self {
        Self(Plugin::load(path).unwrap())
    }
    pub fn devices(&self) -> i32 {
        ok(self.0.devices(), "devices")
    }
    pub fn device_name(&self, dev: i32) -> String {
        ok(self.0.device(dev), "getProperties").0
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
        size: i32,
        tag: i32,
        mh: *mut c_void,
    ) -> Result<*mut c_void, i32> {
        self.0.isend_step(sc, data, size, tag, mh)
    }
    pub fn isend(
        &self,
        sc: *mut c_void,
        data: *mut u8,
        size: i32,
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
        bufs: &[(*mut u8, i32, i32, *mut c_void)],
        preset: *mut c_void,
    ) -> Result<*mut c_void, i32> {
        self.0.irecv_step(rc, bufs, preset)
    }
    pub fn irecv(&self, rc: *mut c_void, bufs: &[(*mut u8, i32, i32, *mut c_void)]) -> *mut c_void {
        self.0
            .until_started("irecv", deadline(), || {
                self.0.irecv_step(rc, bufs, std::ptr::null_mut())
            })
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
