//! The C boundary: the exported `ncclNetPlugin_v8` table, its trampolines, and the mirror types.
//!
//! Calling contract (what every trampoline assumes and checks):
//! - **Panics** never cross the boundary: each entry point runs inside `entry::entry`, which
//!   catches them and returns `ncclInternalError` after logging `panic in <op>`.
//! - **Errors** are mapped to `ncclResult_t` in one place, `to_nccl`, and logged once there.
//! - **Out-parameters** are written only on success, exactly once (`out::Out`); a NULL
//!   out-pointer is NCCL misusing the ABI and yields `ncclInternalError`.
//! - **Threads:** `init`, `devices` and `getProperties` may come from any thread, concurrently;
//!   the device table is immutable after the first `init`.
//! - **Strings** returned in properties point into the process-lifetime device table.
#![allow(unsafe_code)]

mod entry;
mod handles;
pub(crate) mod logger;
mod out;
pub mod types;
mod v8;

pub use v8::ncclNetPlugin_v8;

use crate::core::error::Kind;
use types::{
    ncclInternalError, ncclInvalidUsage, ncclRemoteError, ncclResult_t, ncclSystemError,
    ncclUnhandledCudaError,
};

/// The only mapping from the plugin's error kinds to NCCL's result codes (NCCL's
/// `plugins/net/README.md` "Error codes"; house-style.md §2.5).
pub(crate) fn to_nccl(kind: Kind) -> ncclResult_t {
    match kind {
        Kind::System => ncclSystemError,
        Kind::Remote => ncclRemoteError,
        Kind::Misuse => ncclInternalError,
        Kind::Config => ncclInvalidUsage,
        Kind::Cuda => ncclUnhandledCudaError,
    }
}
