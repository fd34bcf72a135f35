//! Protection domains and memory regions: `ibv_alloc_pd`, `ibv_reg_mr`, `ibv_reg_dmabuf_mr`.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

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

/// Page-aligned zeroed heap memory, freed on drop.
#[derive(Debug)]
struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), 4096)
            .map_err(|_| Error::misuse(format!("control region of {len} bytes")))?;
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or_else(|| {
            Error::system(
                "allocating a control region",
                io::Error::from_raw_os_error(libc::ENOMEM),
            )
        })?;
        Ok(Self { ptr, layout })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Zeroed host memory owned by the plugin and registered on one PD per member port of a device:
/// the control rings. The NIC may write it at any time, so Rust never forms references into it:
/// the words that say a write landed are read volatilely ([`Self::read_u64_acquire`]), and
/// whole entries are copied in or out only while the protocol holds the NIC off them.
#[derive(Debug)]
pub struct HostRegion {
    // Field order matters: the registrations are dropped before the memory they cover.
    mrs: Vec<MemoryRegion>,
    buf: AlignedBuf,
}

// SAFETY: the buffer is only accessed through raw-pointer copies, volatile reads and the NIC;
// no references.
unsafe impl Send for HostRegion {}
// SAFETY: as above.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// Allocate `len` zeroed bytes and register them with `access` on every PD in `pds`.
    ///
    /// # Errors
    /// `System` when allocation or a registration fails.
    pub fn new(pds: &[Arc<ProtectionDomain>], len: usize, access: Access) -> Result<Self> {
        let buf = AlignedBuf::new(len)?;
        let mrs = pds
            .iter()
            .map(|pd| {
                // SAFETY: `buf` outlives the registrations (field order); Rust code only touches
                // it through raw pointers.
                unsafe { pd.register(buf.ptr.as_ptr() as u64, buf.layout.size(), access) }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { mrs, buf })
    }

    /// The registration on the `member`-th PD.
    ///
    /// # Panics
    /// When `member` is not below the number of PDs given to `new` (a caller bug).
    pub fn mr(&self, member: usize) -> &MemoryRegion {
        &self.mrs[member]
    }

    /// Address of byte `offset`.
    pub fn addr(&self, offset: usize) -> u64 {
        self.buf.ptr.as_ptr() as u64 + offset as u64
    }

    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset + len <= self.buf.layout.size(),
            "control region access out of bounds"
        );
        // SAFETY: in bounds of the allocation (checked above).
        unsafe { self.buf.ptr.as_ptr().add(offset) }
    }

    /// Copy `bytes` into the region at `offset` (memory the NIC reads after a later post). A
    /// fixed size: the copy is a few moves, not a `memcpy` call (a CTS entry per `irecv`).
    pub fn write<const N: usize>(&self, offset: usize, bytes: &[u8; N]) {
        let base = self.at(offset, N).cast::<[u8; N]>();
        // SAFETY: in bounds (checked by `at`), alignment 1; the NIC reads this memory only
        // after a later post, which is an opaque call the compiler cannot move this copy across.
        unsafe { base.write_unaligned(*bytes) };
    }

    /// Read the little-endian u64 at `offset` (8-aligned); later reads see at least what the NIC
    /// wrote before it (acquire).
    pub fn read_u64_acquire(&self, offset: usize) -> u64 {
        assert_eq!(offset % 8, 0, "unaligned control word");
        let word = self.at(offset, 8).cast::<u64>();
        // SAFETY: in bounds and aligned (checked); volatile: the NIC writes it concurrently.
        let v = unsafe { word.read_volatile() };
        fence(Ordering::Acquire);
        u64::from_le(v)
    }

    /// The little-endian u64 at `offset` (any alignment) as it is now, while the NIC may be
    /// writing it: a hint, never a value to act on without a completion that covers it.
    pub fn peek_u64(&self, offset: usize) -> u64 {
        let at = self.at(offset, 8);
        if at.addr().is_multiple_of(8) {
            // SAFETY: in bounds (checked by `at`) and aligned; volatile: the NIC writes it
            // concurrently. One load where the word is aligned (the default eager threshold):
            // a volatile [u8; 8] is read a byte at a time.
            return u64::from_le(unsafe { at.cast::<u64>().read_volatile() });
        }
        // SAFETY: in bounds (checked by `at`), alignment 1; volatile as above (a torn value is
        // only ever compared, and a mismatch is harmless).
        u64::from_le_bytes(unsafe { at.cast::<[u8; 8]>().read_volatile() })
    }

    /// Copy `len` bytes at `offset` to `dst`.
    ///
    /// # Safety
    /// `dst..dst + len` must be valid for writes and must not overlap the region; the NIC must
    /// not be writing the copied bytes (the protocol holds the peer off them).
    pub unsafe fn copy_to(&self, offset: usize, dst: *mut u8, len: usize) {
        let src = self.at(offset, len);
        // SAFETY: the source is in bounds (checked by `at`); the rest is the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }

    /// Copy `len` bytes from `src` into the region at `offset` (memory the NIC reads after a
    /// later post).
    ///
    /// # Safety
    /// `src..src + len` must be valid for reads and must not overlap the region; the NIC must
    /// not be reading the bytes replaced (the protocol holds it off them).
    pub unsafe fn copy_from(&self, offset: usize, src: *const u8, len: usize) {
        let dst = self.at(offset, len);
        // SAFETY: the destination is in bounds (checked by `at`); the rest is the caller's
        // contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }

    /// Copy `N` bytes out of the region at `offset`, once the NIC finished writing them: after
    /// the completion of the write that carried them, or after [`Self::read_u64_acquire`]
    /// saw the word the peer writes with them. (A plain copy: a volatile `[u8; N]` read is
    /// lowered to `N` single-byte loads, and this runs once per message.)
    pub fn read<const N: usize>(&self, offset: usize) -> [u8; N] {
        let at = self.at(offset, N).cast::<[u8; N]>();
        // SAFETY: in bounds (checked by `at`), alignment 1; the protocol keeps the NIC off
        // these bytes until the message they belong to is answered (see above), and the acquire
        // read or completion before this call orders the copy after the NIC's write.
        unsafe { at.read_unaligned() }
    }
}
