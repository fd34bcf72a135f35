//! Loads any ncclNet v8 plugin by path and drives its vtable the way NCCL does: `dlopen` with
//! RTLD_NOW | RTLD_LOCAL, the `ncclNetPlugin_v8` data symbol, `init` with no logger. Every call
//! returns the plugin's `ncclResult_t` on failure; the waiting helpers take a deadline.
//!
//! Shared by the benchmark and the conformance tests (`tests/support/net.rs`).
#![allow(unsafe_code)]
// an FFI client of the plugin, like NCCL's proxy
// Compiled into the benchmark and into the tests; each uses part of it.
#![allow(dead_code, unreachable_pub)]

use std::ffi::{CStr, CString, c_int, c_void};
use std::path::Path;
use std::ptr;
use std::time::Instant;

use nccl_net::abi::types::{ncclNet_v8_t, ncclNetProperties_v8_t};

/// NCCL's listen handle buffer.
pub type Handle = [u8; 128];
/// A comm, memory handle or request pointer.
pub type Ptr = *mut c_void;

/// A loaded plugin.
#[derive(Debug)]
pub struct Plugin {
    v: &'static ncclNet_v8_t,
}

fn rc_of(rc: nccl_net::abi::types::ncclResult_t) -> Result<(), i32> {
    if rc.0 == 0 { Ok(()) } else { Err(rc.0) }
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

impl Plugin {
    /// `dlopen` the library and call `init`. The library stays loaded for the process lifetime.
    pub fn load(path: &Path) -> Result<Self, String> {
        let c_path =
            CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: a NUL-terminated path; RTLD_NOW | RTLD_LOCAL as NCCL uses.
        let lib = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            // SAFETY: no preconditions; after a failed dlopen it returns a message.
            let msg = unsafe { libc::dlerror() };
            // SAFETY: dlerror's message is NUL-terminated and lives until the next dl call.
            let why = unsafe { CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned();
            return Err(format!("cannot load {}: {why}", path.display()));
        }
        // SAFETY: a live handle and a NUL-terminated symbol name.
        let sym = unsafe { libc::dlsym(lib, c"ncclNetPlugin_v8".as_ptr()) };
        if sym.is_null() {
            return Err(format!("{} exports no ncclNetPlugin_v8", path.display()));
        }
        // SAFETY: NCCL's ABI: the symbol is a static ncclNet_v8_t, alive while the library is
        // loaded, which is forever (never dlclosed here).
        let v: &'static ncclNet_v8_t = unsafe { &*sym.cast::<ncclNet_v8_t>() };
        let init = v.init.ok_or("the plugin's init entry is NULL")?;
        // SAFETY: a NULL logger is allowed by the ABI.
        rc_of(unsafe { init(None) }).map_err(|rc| format!("init failed with ncclResult {rc}"))?;
        Ok(Self { v })
    }

    /// The plugin's `name`.
    pub fn name(&self) -> String {
        // SAFETY: a 'static NUL-terminated string per the ABI.
        unsafe { CStr::from_ptr(self.v.name) }
            .to_string_lossy()
            .into_owned()
    }

    /// `devices`.
    pub fn devices(&self) -> Result<i32, i32> {
        let mut n = 0;
        // SAFETY: valid out-pointer.
        rc_of(unsafe { (self.v.devices.ok_or(3)?)(&mut n) })?;
        Ok(n)
    }

    /// `getProperties`: the device name and its speed in Mbps.
    pub fn device(&self, dev: i32) -> Result<(String, i32), i32> {
        // SAFETY: all-zero properties are a valid out-buffer.
        let mut p: ncclNetProperties_v8_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer.
        rc_of(unsafe { (self.v.getProperties.ok_or(3)?)(dev, &mut p) })?;
        // SAFETY: the plugin's name string lives for the process lifetime.
        let name = unsafe { CStr::from_ptr(p.name) }
            .to_string_lossy()
            .into_owned();
        Ok((name, p.speed))
    }

    /// `listen`.
    pub fn listen(&self, dev: i32) -> Result<(Handle, Ptr), i32> {
        let mut handle = [0u8; 128];
        let mut lc = ptr::null_mut();
        // SAFETY: a 128-byte handle buffer and a valid out-pointer.
        rc_of(unsafe { (self.v.listen.ok_or(3)?)(dev, handle.as_mut_ptr().cast(), &mut lc) })?;
        Ok((handle, lc))
    }

    /// One `connect` call (NULL = call again).
    pub fn connect_step(&self, dev: i32, handle: &mut Handle) -> Result<Ptr, i32> {
        let mut sc = ptr::null_mut();
        // SAFETY: the same handle buffer on every call; NULL device-handle pointer is allowed.
        rc_of(unsafe {
            (self.v.connect.ok_or(3)?)(dev, handle.as_mut_ptr().cast(), &mut sc, ptr::null_mut())
        })?;
        Ok(sc)
    }

    /// One `accept` call (NULL = call again).
    pub fn accept_step(&self, lc: Ptr) -> Result<Ptr, i32> {
        let mut rc = ptr::null_mut();
        // SAFETY: a listen comm from `listen` and valid out-pointers.
        rc_of(unsafe { (self.v.accept.ok_or(3)?)(lc, &mut rc, ptr::null_mut()) })?;
        Ok(rc)
    }

    /// Connect to `peer` and accept on `lc` at once, as NCCL's non-blocking calls allow.
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
    pub fn reg_mr(&self, comm: Ptr, buf: &mut [u8]) -> Result<Ptr, i32> {
        let mut mh = ptr::null_mut();
        // SAFETY: the caller keeps `buf` alive until `dereg_mr`.
        rc_of(unsafe {
            (self.v.regMr.ok_or(3)?)(comm, buf.as_mut_ptr().cast(), buf.len(), 1, &mut mh)
        })?;
        Ok(mh)
    }

    /// `regMrDmaBuf` of `buf` through `fd` at offset 0.
    pub fn reg_mr_dmabuf(&self, comm: Ptr, buf: &mut [u8], fd: c_int) -> Result<Ptr, i32> {
        let mut mh = ptr::null_mut();
        // SAFETY: valid buffer and out-pointer; the plugin validates the fd.
        rc_of(unsafe {
            (self.v.regMrDmaBuf.ok_or(3)?)(
                comm,
                buf.as_mut_ptr().cast(),
                buf.len(),
                1,
                0,
                fd,
                &mut mh,
            )
        })?;
        Ok(mh)
    }

    /// `deregMr`.
    pub fn dereg_mr(&self, comm: Ptr, mh: Ptr) -> Result<(), i32> {
        // SAFETY: a handle from reg_mr, or NULL.
        rc_of(unsafe { (self.v.deregMr.ok_or(3)?)(comm, mh) })
    }

    /// One `isend` call (NULL = receiver not ready).
    pub fn isend_step(
        &self,
        sc: Ptr,
        data: *mut u8,
        size: c_int,
        tag: c_int,
        mh: Ptr,
    ) -> Result<Ptr, i32> {
        let mut req = ptr::null_mut();
        // SAFETY: the caller keeps `data` alive until the request completes.
        rc_of(unsafe { (self.v.isend.ok_or(3)?)(sc, data.cast(), size, tag, mh, &mut req) })?;
        Ok(req)
    }

    /// One `irecv` call with `*request` preset to `preset` (NCCL may preset 0x1).
    pub fn irecv_step(
        &self,
        rc: Ptr,
        bufs: &[(*mut u8, c_int, c_int, Ptr)],
        preset: Ptr,
    ) -> Result<Ptr, i32> {
        let mut data: Vec<Ptr> = bufs.iter().map(|b| b.0.cast()).collect();
        let mut sizes: Vec<c_int> = bufs.iter().map(|b| b.1).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.2).collect();
        let mut mhs: Vec<Ptr> = bufs.iter().map(|b| b.3).collect();
        let mut req = preset;
        let n = c_int::try_from(bufs.len()).unwrap_or(c_int::MAX);
        let f = self.v.irecv.ok_or(3)?;
        // SAFETY: arrays of `n` elements; the caller keeps the buffers alive until completion.
        rc_of(unsafe {
            f(
                rc,
                n,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                tags.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok(req)
    }

    /// One `iflush` call (NULL = nothing to flush).
    pub fn iflush(&self, rc: Ptr, bufs: &[(*mut u8, c_int, Ptr)]) -> Result<Ptr, i32> {
        let mut data: Vec<Ptr> = bufs.iter().map(|b| b.0.cast()).collect();
        let mut sizes: Vec<c_int> = bufs.iter().map(|b| b.1).collect();
        let mut mhs: Vec<Ptr> = bufs.iter().map(|b| b.2).collect();
        let mut req = ptr::null_mut();
        let n = c_int::try_from(bufs.len()).unwrap_or(c_int::MAX);
        let f = self.v.iflush.ok_or(3)?;
        // SAFETY: arrays of `n` elements.
        rc_of(unsafe {
            f(
                rc,
                n,
                data.as_mut_ptr(),
                sizes.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        })?;
        Ok(req)
    }

    /// One `test` call: the sizes once done.
    pub fn test_step(&self, req: Ptr) -> Result<Option<[c_int; 8]>, i32> {
        let mut done = 0;
        let mut sizes = [-1 as c_int; 8];
        // SAFETY: a live request; room for 8 sizes.
        rc_of(unsafe { (self.v.test.ok_or(3)?)(req, &mut done, sizes.as_mut_ptr()) })?;
        Ok((done == 1).then_some(sizes))
    }

    /// Call `step` until it yields a non-NULL pointer.
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
    pub fn wait(&self, req: Ptr, deadline: Instant) -> Result<[c_int; 8], String> {
        let mut polls = 0;
        loop {
            if let Some(sizes) = self
                .test_step(req)
                .map_err(|rc| format!("test failed: ncclResult {rc}"))?
            {
                return Ok(sizes);
            }
            if expired(deadline, &mut polls) {
                return Err(late("a request"));
            }
        }
    }

    /// `closeSend`.
    pub fn close_send(&self, c: Ptr) -> Result<(), i32> {
        // SAFETY: a comm from connect().
        rc_of(unsafe { (self.v.closeSend.ok_or(3)?)(c) })
    }

    /// `closeRecv`.
    pub fn close_recv(&self, c: Ptr) -> Result<(), i32> {
        // SAFETY: a comm from accept().
        rc_of(unsafe { (self.v.closeRecv.ok_or(3)?)(c) })
    }

    /// `closeListen`.
    pub fn close_listen(&self, c: Ptr) -> Result<(), i32> {
        // SAFETY: a comm from listen().
        rc_of(unsafe { (self.v.closeListen.ok_or(3)?)(c) })
    }
}

/// Deterministic payload for message `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fill_pattern(seed, &mut out);
    out
}

/// Fill `out` with the payload of message `seed`.
pub fn fill_pattern(seed: u64, out: &mut [u8]) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}
