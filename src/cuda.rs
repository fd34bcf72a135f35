//! The CUDA driver, loaded at run time through cudarc: is there a driver, is a pointer host or
//! device memory, and a DMA-BUF fd for device memory. Nothing here links CUDA; without
//! `libcuda.so` every function returns an error saying so (cudarc itself panics on a missing
//! library or symbol, so every call is guarded and runs under `catch_unwind`).
#![allow(unsafe_code)] // calls into the CUDA driver API

use std::ffi::c_void;
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};

use cudarc::driver::sys;
use once_cell::sync::OnceCell;

use crate::core::error::{Error, Kind, Result};
use crate::topology::GpuExport;

/// Where a pointer's memory lives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum MemoryKind {
    /// Host memory (including memory CUDA does not know).
    Host,
    /// GPU memory.
    Device,
}

/// Run one driver call and return its result code; a panic (a symbol missing from an old
/// driver) becomes an error.
fn raw_call(what: &str, f: impl FnOnce() -> sys::CUresult) -> Result<sys::CUresult> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| {
        Error::new(
            Kind::Cuda,
            format!("{what}: the CUDA driver lacks this entry point (driver too old)"),
        )
    })
}

/// Run one driver call; anything but success is an error naming the call.
fn call(what: &str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    match raw_call(what, f)? {
        sys::CUresult::CUDA_SUCCESS => Ok(()),
        rc => Err(Error::new(Kind::Cuda, format!("{what} failed: {rc:?}"))),
    }
}

/// `Ok` once `libcuda.so` is loaded and initialised; the error says why not. Checked once.
///
/// # Errors
/// `Cuda` when the library is missing or `cuInit` fails.
pub fn driver() -> Result<()> {
    static STATE: OnceCell<std::result::Result<(), String>> = OnceCell::new();
    STATE
        .get_or_init(|| {
            // SAFETY: only dlopens candidate library names and closes them again.
            if !unsafe { sys::is_culib_present() } {
                return Err(
                    "libcuda.so not found (no NVIDIA driver, or its directory is not in \
                            the library path)"
                        .to_owned(),
                );
            }
            // SAFETY: cuInit has no preconditions.
            call("cuInit", || unsafe { sys::cuInit(0) }).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|why| Error::new(Kind::Cuda, why))
}

/// Whether `ptr` is GPU or host memory.
///
/// # Errors
/// `Cuda` without a driver or when the driver fails otherwise.
pub fn memory_kind(ptr: *const c_void) -> Result<MemoryKind> {
    driver()?;
    let mut kind: u32 = 0;
    let attribute = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let rc = raw_call("cuPointerGetAttribute", || {
        // SAFETY: `kind` is a valid out-parameter of the attribute's size (an unsigned int).
        unsafe {
            sys::cuPointerGetAttribute(
                (&raw mut kind).cast::<c_void>(),
                attribute,
                ptr as sys::CUdeviceptr,
            )
        }
    })?;
    match rc {
        sys::CUresult::CUDA_SUCCESS if kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => {
            Ok(MemoryKind::Device)
        }
        // Memory CUDA never saw (plain malloc) is reported as an invalid value: host memory.
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
            Ok(MemoryKind::Host)
        }
        rc => Err(Error::new(
            Kind::Cuda,
            format!("cuPointerGetAttribute failed: {rc:?}"),
        )),
    }
}

/// How many of the GPUs the driver sees can export their memory as DMA-BUF
/// (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`, what NCCL asks before using DMA-BUF).
///
/// # Errors
/// `Cuda` without a driver, or when the driver cannot count its GPUs or answer the attribute.
pub fn dmabuf_exporting_gpus() -> Result<GpuExport> {
    driver()?;
    let mut total: i32 = 0;
    // SAFETY: out-parameter of the right type.
    match raw_call("cuDeviceGetCount", || unsafe {
        sys::cuDeviceGetCount(&raw mut total)
    })? {
        sys::CUresult::CUDA_SUCCESS => {}
        sys::CUresult::CUDA_ERROR_NO_DEVICE => total = 0,
        rc => {
            return Err(Error::new(
                Kind::Cuda,
                format!("cuDeviceGetCount failed: {rc:?}"),
            ));
        }
    }
    let mut exporting = 0;
    for ordinal in 0..total {
        let mut device: sys::CUdevice = 0;
        // SAFETY: out-parameter of the right type; `ordinal` is below the count.
        call("cuDeviceGet", || unsafe {
            sys::cuDeviceGet(&raw mut device, ordinal)
        })?;
        let mut flag: i32 = 0;
        let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED;
        // SAFETY: out-parameter of the right type for an integer attribute.
        call("cuDeviceGetAttribute(DMA_BUF_SUPPORTED)", || unsafe {
            sys::cuDeviceGetAttribute(&raw mut flag, attribute, device)
        })?;
        exporting += u32::from(flag != 0);
    }
    Ok(GpuExport::Gpus {
        exporting,
        total: total.unsigned_abs(),
    })
}

/// A DMA-BUF fd for `len` bytes of GPU memory at `dptr` (page-aligned, as the driver requires).
///
/// # Errors
/// `Cuda` without a driver, or when the driver cannot export the range (no DMA-BUF support in
/// the kernel or the GPU driver).
pub fn export_dmabuf(dptr: u64, len: usize) -> Result<OwnedFd> {
    driver()?;
    let mut fd: i32 = -1;
    let handle_type = sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD;
    call("cuMemGetHandleForAddressRange", || {
        // SAFETY: `fd` is a valid out-parameter for a DMA-BUF handle (an int).
        unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&raw mut fd).cast::<c_void>(),
                dptr,
                len,
                handle_type,
                0,
            )
        }
    })?;
    // SAFETY: the driver returned a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// GPU memory on device 0 (through its primary context), freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl DeviceBuffer {
    /// Allocate `len` bytes with `cuMemAlloc` on GPU 0.
    ///
    /// # Errors
    /// `Cuda` without a driver or a GPU, or when allocation fails.
    pub fn alloc(len: usize) -> Result<Self> {
        driver()?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: out-parameter of the right type.
        call("cuDeviceGet(0)", || unsafe {
            sys::cuDeviceGet(&raw mut device, 0)
        })?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: out-parameter of the right type; the primary context lives as long as the
        // process (it is never released here).
        call("cuDevicePrimaryCtxRetain", || unsafe {
            sys::cuDevicePrimaryCtxRetain(&raw mut context, device)
        })?;
        // SAFETY: a context the driver just returned.
        call("cuCtxSetCurrent", || unsafe {
            sys::cuCtxSetCurrent(context)
        })?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: out-parameter of the right type.
        call("cuMemAlloc", || unsafe {
            sys::cuMemAlloc_v2(&raw mut ptr, len)
        })?;
        Ok(Self { ptr, len })
    }

    /// Device address.
    pub fn addr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-byte buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copy `data` to the start of the buffer.
    ///
    /// # Errors
    /// `Cuda` when `data` is longer than the buffer or the copy fails.
    pub fn write(&self, data: &[u8]) -> Result<()> {
        if data.len() > self.len {
            return Err(Error::new(Kind::Cuda, "copy larger than the GPU buffer"));
        }
        // SAFETY: `data` is readable for its length and fits the allocation (checked above).
        call("cuMemcpyHtoD", || unsafe {
            sys::cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), data.len())
        })
    }

    /// Copy the start of the buffer into `out`.
    ///
    /// # Errors
    /// `Cuda` when `out` is longer than the buffer or the copy fails.
    pub fn read(&self, out: &mut [u8]) -> Result<()> {
        if out.len() > self.len {
            return Err(Error::new(Kind::Cuda, "copy larger than the GPU buffer"));
        }
        // SAFETY: `out` is writable for its length and the source range fits the allocation.
        call("cuMemcpyDtoH", || unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr, out.len())
        })
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in `alloc`, freed once.
        if let Err(e) = call("cuMemFree", || unsafe { sys::cuMemFree_v2(self.ptr) }) {
            tracing::warn!("{e}");
        }
    }
}
