//! CUDA through cudarc, loaded at run time. Tests whose names start with `gpu_` need a GPU and
//! say "skipped: no GPU" (with the reason) when the driver is missing; the `cuda_absent_` test
//! checks the opposite case and says "skipped: CUDA present" on a GPU machine.
#![allow(clippy::unwrap_used)] // test code panics with context

use std::io::{Seek, SeekFrom};

use nccl_net::core::error::Kind;
use nccl_net::cuda::{self, DeviceBuffer, MemoryKind};
use nccl_net::topology::GpuExport;

/// True when there is no usable GPU; the test then prints why it skipped.
fn no_gpu(test: &str) -> bool {
    match cuda::driver().and_then(|()| DeviceBuffer::alloc(4096).map(drop)) {
        Ok(()) => false,
        Err(why) => {
            println!("{test}: skipped: no GPU ({why})");
            true
        }
    }
}

#[test]
fn gpu_device_pointer_is_classified_as_device_and_host_memory_as_host() {
    if no_gpu("gpu_device_pointer_is_classified_as_device_and_host_memory_as_host") {
        return;
    }
    let buffer = DeviceBuffer::alloc(1 << 20).unwrap();
    assert_eq!(
        cuda::memory_kind(buffer.addr() as *const _).unwrap(),
        MemoryKind::Device
    );
    let host = vec![0u8; 4096];
    assert_eq!(
        cuda::memory_kind(host.as_ptr().cast()).unwrap(),
        MemoryKind::Host
    );
}

#[test]
fn gpu_dmabuf_fd_is_exported_for_a_cumemalloc_buffer() {
    if no_gpu("gpu_dmabuf_fd_is_exported_for_a_cumemalloc_buffer") {
        return;
    }
    let len = 2 << 20;
    let buffer = DeviceBuffer::alloc(len).unwrap();
    let fd = cuda::export_dmabuf(buffer.addr(), len).unwrap();
    // lseek(SEEK_END) on a DMA-BUF fd gives the size of the exported buffer.
    let size = std::fs::File::from(fd).seek(SeekFrom::End(0)).unwrap();
    assert!(size >= len as u64, "DMA-BUF of {size} bytes for {len}");
}

/// The attribute NCCL asks before it uses DMA-BUF (init.cc `dmaBufSupported`): read for every
/// GPU, and consistent with an actual export from GPU 0.
#[test]
fn gpu_dmabuf_export_support_is_read_for_every_gpu() {
    if no_gpu("gpu_dmabuf_export_support_is_read_for_every_gpu") {
        return;
    }
    let GpuExport::Gpus { exporting, total } = cuda::dmabuf_exporting_gpus().unwrap() else {
        panic!("the driver answered no count");
    };
    assert!(total >= 1 && exporting <= total, "{exporting} of {total}");
    let buffer = DeviceBuffer::alloc(2 << 20).unwrap();
    let exported = cuda::export_dmabuf(buffer.addr(), buffer.len()).is_ok();
    assert_eq!(
        exported,
        exporting > 0,
        "export from GPU 0 {} but {exporting} of {total} GPUs report the attribute",
        if exported { "works" } else { "fails" }
    );
    println!("{}", GpuExport::Gpus { exporting, total });
}

#[test]
fn cuda_absent_means_errors_not_panics() {
    if cuda::driver().is_ok() {
        println!("cuda_absent_means_errors_not_panics: skipped: CUDA present");
        return;
    }
    let e = cuda::driver().unwrap_err();
    assert_eq!(e.kind(), Kind::Cuda);
    assert!(e.to_string().contains("libcuda.so not found"), "{e}");
    let host = [0u8; 16];
    assert_eq!(
        cuda::memory_kind(host.as_ptr().cast()).unwrap_err().kind(),
        Kind::Cuda
    );
    assert_eq!(
        cuda::export_dmabuf(0x7000_0000, 4096).unwrap_err().kind(),
        Kind::Cuda
    );
    assert_eq!(
        cuda::dmabuf_exporting_gpus().unwrap_err().kind(),
        Kind::Cuda
    );
    assert_eq!(DeviceBuffer::alloc(4096).unwrap_err().kind(), Kind::Cuda);
}
