//! Protection domains and memory regions: `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_reg_dmabuf_mr`.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use super::Device;
use crate::core::error::{Error, Result};

/// Access rights of a registration or a QP (`IBV_ACCESS_*`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Access(u32);

impl Access {
    /// The NIC may write local memory (required for REMOTE_WRITE and RDMA READ targets).
    pub const LOCAL_WRITE: Self = Self(1);
    /// Peers may RDMA-write this memory.
    pub const REMOTE_WRITE: Self = Self(2);
    /// Peers (and the flush QP) may RDMA-read this memory.
    pub const REMOTE_READ: Self = Self(4);
    /// The NIC may reorder its PCIe writes into this memory (`IBV_ACCESS_RELAXED_ORDERING`, an
    /// optional flag: drivers that cannot honour it ignore it, registration goes through
    /// `ibv_reg_mr_iova2`).
    pub const RELAXED_ORDERING: Self = Self(1 << 20);

    /// Both sets of rights.
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// True when every right of `other` is included.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    pub(super) fn bits(self) -> u32 {
        self.0
    }
}

type RegMrIova2 = unsafe extern "C" fn(
    *mut sys::ibv_pd,
    *mut libc::c_void,
    usize,
    u64,
    libc::c_uint,
) -> *mut sys::ibv_mr;

/// `ibv_reg_mr_iova2` (IBVERBS_1.8), looked up by name so the plugin still loads with an older
/// libibverbs and simply registers without relaxed ordering there.
static REG_MR_IOVA2: once_cell::sync::Lazy<Option<RegMrIova2>> = once_cell::sync::Lazy::new(|| {
    // SAFETY: dlsym with a NUL-terminated name; RTLD_DEFAULT searches the loaded libraries.
    let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ibv_reg_mr_iova2".as_ptr()) };
    // SAFETY: the symbol, when present, is libibverbs' function with this signature.
    (!symbol.is_null())
        .then(|| unsafe { std::mem::transmute::<*mut libc::c_void, RegMrIova2>(symbol) })
});

/// True when the loaded libibverbs has `ibv_reg_mr_iova2`, the entry relaxed ordering needs.
pub fn reg_mr_iova2_available() -> bool {
    REG_MR_IOVA2.is_some()
}

/// A protection domain; memory regions and QPs keep it alive.
#[derive(Debug)]
pub struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    device: Arc<Device>,
}

// SAFETY: verbs objects may be used from any thread; the pointer is freed only in `Drop`.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocate a protection domain on `device`.
    ///
    /// # Errors
    /// `System` when `ibv_alloc_pd` fails.
    pub fn new(device: &Arc<Device>) -> Result<Arc<Self>> {
        // SAFETY: `device` is an open context.
        let raw = unsafe { sys::ibv_alloc_pd(device.raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::system(
                format!("ibv_alloc_pd on {} failed", device.name()),
                io::Error::last_os_error(),
            )
        })?;
        Ok(Arc::new(Self {
            raw,
            device: Arc::clone(device),
        }))
    }

    /// The device it lives on.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub(super) fn raw(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }

    /// Register `len` bytes at `addr` (virtual address = I/O address).
    ///
    /// # Safety
    /// `addr..addr + len` must stay mapped until the returned region is dropped, and the caller
    /// must not let the NIC write memory that Rust code holds references to.
    ///
    /// With [`Access::RELAXED_ORDERING`] the registration goes through `ibv_reg_mr_iova2`
    /// (the only entry that carries optional flags), which must then exist
    /// ([`reg_mr_iova2_available`]).
    ///
    /// # Errors
    /// `System` when the registration fails (e.g. ENOMEM: locked-memory limit; EFAULT: bad
    /// range; EINVAL: flags the driver refuses).
    pub unsafe fn register(
        self: &Arc<Self>,
        addr: u64,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion> {
        if access.contains(Access::RELAXED_ORDERING) {
            let Some(reg_mr_iova2) = *REG_MR_IOVA2 else {
                return Err(Error::system(
                    "relaxed-ordering registration",
                    io::Error::from_raw_os_error(libc::ENOSYS),
                ));
            };
            // SAFETY: the PD is live; the range is the caller's promise (see `# Safety`); the
            // function is libibverbs' ibv_reg_mr_iova2, found by name.
            let raw = unsafe {
                reg_mr_iova2(
                    self.raw(),
                    addr as *mut libc::c_void,
                    len,
                    addr,
                    access.bits(),
                )
            };
            return self.wrap_mr(raw, "ibv_reg_mr_iova2", addr, len);
        }
        let access_bits = i32::try_from(access.bits()).unwrap_or(0);
        // SAFETY: the PD is live; the range is the caller's promise (see `# Safety`).
        let raw =
            unsafe { sys::ibv_reg_mr(self.raw(), addr as *mut libc::c_void, len, access_bits) };
        self.wrap_mr(raw, "ibv_reg_mr", addr, len)
    }

    /// Whether the device can register DMA-BUFs, probed as NCCL does: a registration of fd -1
    /// must fail with EBADF (the driver got as far as the fd), not EOPNOTSUPP/EPROTONOSUPPORT.
    ///
    /// # Errors
    /// The errno that says the driver has no DMA-BUF support.
    pub fn probe_dmabuf(&self) -> std::result::Result<(), io::Error> {
        // SAFETY: the PD is live; fd -1 makes the kernel fail before touching memory.
        let raw = unsafe { sys::ibv_reg_dmabuf_mr(self.raw(), 0, 0, 0, -1, 0) };
        if let Some(mr) = NonNull::new(raw) {
            // SAFETY: an unexpected success is deregistered at once.
            unsafe { sys::ibv_dereg_mr(mr.as_ptr()) };
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT) => Err(e),
            _ => Ok(()),
        }
    }

    /// Register a DMA-BUF: `len` bytes at `offset` of `fd`, addressed by peers as `iova`.
    /// The fd may be closed as soon as this returns (the kernel keeps its own reference).
    ///
    /// # Errors
    /// `System` when `ibv_reg_dmabuf_mr` fails (EOPNOTSUPP when the driver has no DMA-BUF support).
    pub fn register_dmabuf(
        self: &Arc<Self>,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: Access,
    ) -> Result<MemoryRegion> {
        let access_bits = i32::try_from(access.bits()).unwrap_or(0);
        // SAFETY: the PD is live; the kernel validates fd, offset and length.
        let raw = unsafe { sys::ibv_reg_dmabuf_mr(self.raw(), offset, len, iova, fd, access_bits) };
        self.wrap_mr(raw, "ibv_reg_dmabuf_mr", iova, len)
    }

    fn wrap_mr(
        self: &Arc<Self>,
        raw: *mut sys::ibv_mr,
        verb: &str,
        addr: u64,
        len: usize,
    ) -> Result<MemoryRegion> {
        let raw = NonNull::new(raw).ok_or_else(|| {
            let e = io::Error::last_os_error();
            Error::system(
                format!(
                    "{verb} of {len} bytes at {addr:#x} on {} failed",
                    self.device.name()
                ),
                e,
            )
        })?;
        // SAFETY: a registration just returned by libibverbs; lkey/rkey never change.
        let mr = unsafe { raw.as_ref() };
        let (lkey, rkey) = (mr.lkey, mr.rkey);
        Ok(MemoryRegion {
            raw,
            pd: Arc::clone(self),
            lkey,
            rkey,
        })
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, freed once; every MR and QP holds an Arc of it.
        let rc = unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "ibv_dealloc_pd on {} failed: {}",
                self.device.name(),
                io::Error::from_raw_os_error(rc)
            );
        }
    }
}

/// A memory registration; deregistered on drop.
#[derive(Debug)]
pub struct MemoryRegion {
    raw: NonNull<sys::ibv_mr>,
    pd: Arc<ProtectionDomain>,
    lkey: u32,
    rkey: u32,
}

// SAFETY: an `ibv_mr` is immutable after registration; deregistration happens only in `Drop`.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by `wrap_mr`, deregistered once.
        let rc = unsafe { sys::ibv_dereg_mr(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "ibv_dereg_mr on {} failed (registration leaked): {}",
                self.pd.device.name(),
                io::Error::from_raw_os_error(rc)
            );
        }
    }
}
