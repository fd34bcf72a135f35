//! A small driver for any ncclNet v8 plugin, loaded with dlopen the way NCCL loads it: the
//! `ncclNetPlugin_v8` data symbol, `init` with no logger (lines go to stderr), then the vtable.
//! Loops that wait for NULL-returning calls have deadlines.
#![allow(unsafe_code)] // an FFI client of the plugin, like NCCL
use std::ffi::{CStr, c_int, c_void};
use std::path::Path;
use std::ptr;
use std::time::{Duration, Instant};

use nccl_net::abi::types::{ncclNet_v8_t, ncclNetProperties_v8_t};

pub const DEADLINE: Duration = Duration::from_secs(60);
pub type Handle = [u8; 128];

pub struct Net {
    _lib: libloading::Library,
    pub v: &'static ncclNet_v8_t,
}

fn ok(rc: i32, what: &str) {
    assert_eq!(rc, 0, "{what} returned ncclResult {rc}");
}

impl Net {
    pub fn load(path: &Path) -> Self {
        // SAFETY: loading the plugin runs no constructors beyond Rust's own.
        let lib = unsafe { libloading::Library::new(path) }
            .unwrap_or_else(|e| panic!("dlopen {}: {e}", path.display()));
        // SAFETY: the plugin exports ncclNetPlugin_v8 as a static ncclNet_v8_t.
        let sym = unsafe { lib.get::<*const ncclNet_v8_t>(b"ncclNetPlugin_v8\0") }.unwrap();
        // SAFETY: the static lives as long as the library, which `Net` keeps loaded.
        let v: &'static ncclNet_v8_t = unsafe { &**sym };
        // SAFETY: NULL logger is allowed (logs go to stderr).
        ok(unsafe { (v.init.unwrap())(None) }.0, "init");
        Self { _lib: lib, v }
    }

    pub fn devices(&self) -> i32 {
        let mut n = -1;
        // SAFETY: valid out-pointer.
        ok(unsafe { (self.v.devices.unwrap())(&mut n) }.0, "devices");
        n
    }

    pub fn device_name(&self, dev: i32) -> String {
        // SAFETY: all-zero props is a valid out-buffer.
        let mut p: ncclNetProperties_v8_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        ok(
            unsafe { (self.v.getProperties.unwrap())(dev, &mut p) }.0,
            "getProperties",
        );
        // SAFETY: the plugin returns a NUL-terminated name valid for the process lifetime.
        unsafe { CStr::from_ptr(p.name) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn listen(&self, dev: i32) -> (Handle, *mut c_void) {
        let mut handle = [0u8; 128];
        let mut lc = ptr::null_mut();
        // SAFETY: 128-byte handle buffer and a valid out-pointer.
        ok(
            unsafe { (self.v.listen.unwrap())(dev, handle.as_mut_ptr().cast(), &mut lc) }.0,
            "listen",
        );
        assert!(!lc.is_null(), "listen returned a NULL listen comm");
        (handle, lc)
    }

    /// One connect call: `Ok(comm or NULL)`, `Err(rc)`.
    pub fn connect_step(&self, dev: i32, handle: &mut Handle) -> Result<*mut c_void, i32> {
        let mut sc = ptr::null_mut();
        // SAFETY: the handle buffer and out-pointers are valid; NULL devComm is allowed.
        let rc = unsafe {
            (self.v.connect.unwrap())(dev, handle.as_mut_ptr().cast(), &mut sc, ptr::null_mut())
        }
        .0;
        if rc == 0 { Ok(sc) } else { Err(rc) }
    }

    pub fn accept_step(&self, lc: *mut c_void) -> Result<*mut c_void, i32> {
        let mut rc_comm = ptr::null_mut();
        // SAFETY: a listen comm from listen() and valid out-pointers.
        let rc = unsafe { (self.v.accept.unwrap())(lc, &mut rc_comm, ptr::null_mut()) }.0;
        if rc == 0 { Ok(rc_comm) } else { Err(rc) }
    }

    pub fn connect(&self, dev: i32, handle: &Handle) -> *mut c_void {
        let mut h = *handle;
        let start = Instant::now();
        loop {
            let c = self
                .connect_step(dev, &mut h)
                .unwrap_or_else(|rc| panic!("connect returned {rc}"));
            if !c.is_null() {
                return c;
            }
            assert!(start.elapsed() < DEADLINE, "connect did not finish");
        }
    }

    pub fn accept(&self, lc: *mut c_void) -> *mut c_void {
        let start = Instant::now();
        loop {
            let c = self
                .accept_step(lc)
                .unwrap_or_else(|rc| panic!("accept returned {rc}"));
            if !c.is_null() {
                return c;
            }
            assert!(start.elapsed() < DEADLINE, "accept did not finish");
        }
    }

    pub fn reg_mr(&self, comm: *mut c_void, buf: &mut [u8]) -> *mut c_void {
        let mut mh = ptr::null_mut();
        // SAFETY: `buf` outlives the registration in every test (deregistered before drop).
        let rc = unsafe {
            (self.v.regMr.unwrap())(comm, buf.as_mut_ptr().cast(), buf.len(), 1, &mut mh)
        }
        .0;
        ok(rc, "regMr");
        mh
    }

    /// One regMrDmaBuf call on `buf` with `fd` (offset 0).
    pub fn reg_mr_dmabuf_step(
        &self,
        comm: *mut c_void,
        buf: &mut [u8],
        fd: i32,
    ) -> Result<*mut c_void, i32> {
        let mut mh = ptr::null_mut();
        let f = self.v.regMrDmaBuf.expect("regMrDmaBuf is in the table");
        // SAFETY: valid buffer and out-pointer; the plugin validates the fd.
        let rc = unsafe { f(comm, buf.as_mut_ptr().cast(), buf.len(), 1, 0, fd, &mut mh) }.0;
        if rc == 0 { Ok(mh) } else { Err(rc) }
    }

    pub fn dereg_mr(&self, comm: *mut c_void, mh: *mut c_void) {
        // SAFETY: a handle from reg_mr (or NULL).
        ok(unsafe { (self.v.deregMr.unwrap())(comm, mh) }.0, "deregMr");
    }

    /// One isend call: `Ok(request or NULL)`, `Err(rc)`.
    pub fn isend_step(
        &self,
        sc: *mut c_void,
        data: *mut u8,
        size: i32,
        tag: i32,
        mh: *mut c_void,
    ) -> Result<*mut c_void, i32> {
        let mut req = ptr::null_mut();
        // SAFETY: the caller keeps `data` alive until the request completes.
        let rc = unsafe { (self.v.isend.unwrap())(sc, data.cast(), size, tag, mh, &mut req) }.0;
        if rc == 0 { Ok(req) } else { Err(rc) }
    }

    pub fn isend(
        &self,
        sc: *mut c_void,
        data: *mut u8,
        size: i32,
        tag: i32,
        mh: *mut c_void,
    ) -> *mut c_void {
        let start = Instant::now();
        loop {
            let r = self
                .isend_step(sc, data, size, tag, mh)
                .unwrap_or_else(|rc| panic!("isend returned {rc}"));
            if !r.is_null() {
                return r;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "isend never found the receiver's buffer"
            );
        }
    }

    /// One irecv call with `*request` preset to `preset`.
    pub fn irecv_step(
        &self,
        rc_comm: *mut c_void,
        bufs: &[(*mut u8, i32, i32, *mut c_void)],
        preset: *mut c_void,
    ) -> Result<*mut c_void, i32> {
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.0.cast()).collect();
        let mut sizes: Vec<c_int> = bufs.iter().map(|b| b.1).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.2).collect();
        let mut mhs: Vec<*mut c_void> = bufs.iter().map(|b| b.3).collect();
        let mut req = preset;
        let n = bufs.len() as c_int;
        // SAFETY: arrays of n elements; buffers outlive the request.
        let rc = unsafe {
            (self.v.irecv.unwrap())(
                rc_comm,
                n,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        }
        .0;
        if rc == 0 { Ok(req) } else { Err(rc) }
    }

    pub fn irecv(
        &self,
        rc_comm: *mut c_void,
        bufs: &[(*mut u8, i32, i32, *mut c_void)],
    ) -> *mut c_void {
        let start = Instant::now();
        loop {
            let r = self
                .irecv_step(rc_comm, bufs, ptr::null_mut())
                .unwrap_or_else(|rc| panic!("irecv returned {rc}"));
            if !r.is_null() {
                return r;
            }
            assert!(start.elapsed() < DEADLINE, "irecv never got a slot");
        }
    }

    pub fn iflush(
        &self,
        rc_comm: *mut c_void,
        bufs: &[(*mut u8, i32, *mut c_void)],
    ) -> *mut c_void {
        let mut data: Vec<*mut c_void> = bufs.iter().map(|b| b.0.cast()).collect();
        let mut sizes: Vec<c_int> = bufs.iter().map(|b| b.1).collect();
        let mut mhs: Vec<*mut c_void> = bufs.iter().map(|b| b.2).collect();
        let mut req = ptr::null_mut();
        // SAFETY: arrays of n elements.
        let rc = unsafe {
            (self.v.iflush.unwrap())(
                rc_comm,
                bufs.len() as c_int,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        }
        .0;
        ok(rc, "iflush");
        req
    }

    /// One test call: `Ok(Some(sizes))` when done.
    pub fn test_step(&self, req: *mut c_void) -> Result<Option<[c_int; 8]>, i32> {
        let mut done = 0;
        let mut sizes = [-1 as c_int; 8];
        // SAFETY: a live request; sizes has room for 8 entries.
        let rc = unsafe { (self.v.test.unwrap())(req, &mut done, sizes.as_mut_ptr()) }.0;
        if rc != 0 {
            return Err(rc);
        }
        Ok((done == 1).then_some(sizes))
    }

    pub fn wait(&self, req: *mut c_void) -> [c_int; 8] {
        let start = Instant::now();
        loop {
            if let Some(s) = self
                .test_step(req)
                .unwrap_or_else(|rc| panic!("test returned {rc}"))
            {
                return s;
            }
            assert!(start.elapsed() < DEADLINE, "request never completed");
        }
    }

    pub fn close_send(&self, c: *mut c_void) {
        // SAFETY: a comm from connect().
        ok(unsafe { (self.v.closeSend.unwrap())(c) }.0, "closeSend");
    }
    pub fn close_recv(&self, c: *mut c_void) {
        // SAFETY: a comm from accept().
        ok(unsafe { (self.v.closeRecv.unwrap())(c) }.0, "closeRecv");
    }
    pub fn close_listen(&self, c: *mut c_void) {
        // SAFETY: a comm from listen().
        ok(unsafe { (self.v.closeListen.unwrap())(c) }.0, "closeListen");
    }
}

/// Deterministic payload: byte i of message `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
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
