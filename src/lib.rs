//! nccl-net-rsib: an NCCL network plugin (`ncclNet` v8) over InfiniBand/RoCE verbs.
//!
//! Layers, outermost first:
//! - [`abi`]: the exported `ncclNetPlugin_v8` table and its `extern "C"` trampolines; the only
//!   place raw NCCL pointers are touched, panics are caught and errors become `ncclResult_t`.
//! - [`plugin`]: process state built by the first `init` (configuration, device table).
//! - [`topology`]: sysfs and device selection (`NCCL_IB_HCA`, speeds, names), pure and testable
//!   with fixture trees.
//! - [`verbs`]: RAII owners of libibverbs objects; the only module that names `rdma_sys`.
//! - [`core`]: configuration and errors; no I/O.
//! - [`cuda`]: the CUDA driver loaded at run time (pointer kinds, DMA-BUF export), never required.
//! - [`log`]: `tracing` events delivered to NCCL's logger (or stderr).

pub mod abi;
pub mod core;
pub mod cuda;
pub mod log;
pub mod plugin;
pub mod topology;
pub mod transport;
pub mod verbs;
