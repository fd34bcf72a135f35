//! nccl-net-rsib: an NCCL network plugin (`ncclNet` v8 to v12) over InfiniBand/RoCE verbs.
//!
//! Layers, outermost first:
//! - [`abi`]: the exported `ncclNetPlugin_v8` .. `_v12` tables and their trampolines; the only
//!   place raw NCCL pointers are touched, panics are caught and errors become `ncclResult_t`.
//! - [`plugin`]: process state built by the first `init` (configuration, device table).
//! - [`topology`]: sysfs and device selection (`NCCL_IB_HCA`, speeds, names), pure and testable
//!   with fixture trees.
//! - [`verbs`]: RAII owners of libibverbs objects; the only module that names `rdma_sys`.
//! - [`core`]: configuration and errors; no I/O.
//! - [`cuda`]: the CUDA driver loaded at run time (pointer kinds, DMA-BUF export), never required.
//! - [`log`]: `tracing` events delivered to NCCL's logger (or stderr).
//! - [`doctor`]: the node checks of `nccl-net-doctor`, judging the plugin's own decisions.
//! - [`driver`]: the other side of the ABI: a client that loads any ncclNet plugin (v8 to v12)
//!   and drives it as NCCL does; used by the benchmark, the doctor and the tests.

pub mod abi;
pub mod core;
pub mod cuda;
pub mod doctor;
pub mod driver;
pub mod log;
pub mod plugin;
pub mod topology;
pub mod transport;
pub mod verbs;
