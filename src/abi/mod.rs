//! The C boundary: the exported tables `ncclNetPlugin_v8` .. `ncclNetPlugin_v12`, their
//! trampolines, and the mirror types.
//!
//! Five tables, one engine: each `vN.rs` holds its table and only the shims whose signature that
//! version introduced (named after it, as in aws-ofi-nccl); a shim converts arguments and calls
//! the version-independent code in `entry.rs`, so a fix there reaches every version.
//!
//! Calling contract (what every trampoline assumes and checks):
//! - **Panics** never cross the boundary: each entry point runs inside `entry::entry`, which
//!   catches them and returns `ncclInternalError` after logging `panic in <op>`.
//! - **Errors** are mapped to `ncclResult_t` in one place, `to_nccl`, and logged once there.
//! - **Out-parameters** are written only on success, exactly once (`out::Out`); a NULL
//!   out-pointer is NCCL misusing the ABI and yields `ncclInternalError`.
//! - **Threads:** `init`, `devices`, `getProperties`, `makeVDevice` and `setNetAttr` may come
//!   from any thread, concurrently; the device table only grows (`makeVDevice`).
//! - **Strings** returned in properties are interned for the life of the process.
//! - **Contexts** (v11+) are tagged objects like comms: a stale or foreign one is an error.
#![allow(unsafe_code)]

mod entry;
mod handles;
pub(crate) mod logger;
mod out;
mod profiler;
pub mod types;
mod v10;
mod v11;
mod v12;
mod v8;
mod v9;

pub use v8::ncclNetPlugin_v8;
pub use v9::ncclNetPlugin_v9;
pub use v10::ncclNetPlugin_v10;
pub use v11::ncclNetPlugin_v11;
pub use v12::ncclNetPlugin_v12;

/// The name every table carries: what NCCL logs and matches against `NCCL_NET`.
const NAME: &std::ffi::CStr = c"RsIB";

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

#[cfg(test)]
mod tests {
    //! Each exported table holds the shims of its own version: a slot wired to another
    //! version's shim would read NCCL's arguments with the wrong types.
    use super::entry::*;
    use super::*;

    /// Function pointers as addresses, to compare entries of differently typed tables.
    macro_rules! addr {
        ($f:expr) => {
            $f.map(|f| f as usize)
        };
    }

    #[test]
    fn every_table_wires_the_shims_of_its_version() {
        let (v8, v9, v10, v11, v12) = (
            &ncclNetPlugin_v8,
            &ncclNetPlugin_v9,
            &ncclNetPlugin_v10,
            &ncclNetPlugin_v11,
            &ncclNetPlugin_v12,
        );
        // Signatures every version shares go to the same trampolines.
        for (devices, accept, test) in [
            (addr!(v8.devices), addr!(v8.accept), addr!(v8.test)),
            (addr!(v9.devices), addr!(v9.accept), addr!(v9.test)),
            (addr!(v10.devices), addr!(v10.accept), addr!(v10.test)),
            (addr!(v11.devices), addr!(v11.accept), addr!(v11.test)),
            (addr!(v12.devices), addr!(v12.accept), addr!(v12.test)),
        ] {
            assert_eq!(devices, Some(net_devices as *const () as usize));
            assert_eq!(accept, Some(net_accept as *const () as usize));
            assert_eq!(test, Some(net_test as *const () as usize));
        }
        // Each signature change has its own shim, shared from the version that introduced it.
        assert_eq!(
            addr!(v8.isend),
            Some(v8::net_isend_v8 as *const () as usize)
        );
        assert_eq!(
            addr!(v9.isend),
            Some(v9::net_isend_v9 as *const () as usize)
        );
        for isend in [addr!(v10.isend), addr!(v11.isend), addr!(v12.isend)] {
            assert_eq!(isend, Some(v10::net_isend_v10 as *const () as usize));
        }
        assert_eq!(
            addr!(v9.irecv),
            Some(v9::net_irecv_v9 as *const () as usize)
        );
        for irecv in [addr!(v10.irecv), addr!(v11.irecv), addr!(v12.irecv)] {
            assert_eq!(irecv, Some(v10::net_irecv_v10 as *const () as usize));
        }
        assert_eq!(addr!(v8.init), Some(v8::net_init_v8 as *const () as usize));
        assert_eq!(addr!(v9.init), Some(v9::net_init_v9 as *const () as usize));
        assert_eq!(
            addr!(v10.init),
            Some(v10::net_init_v10 as *const () as usize)
        );
        assert_eq!(
            addr!(v11.init),
            Some(v11::net_init_v11 as *const () as usize)
        );
        // v12's own: its virtual devices list 8 ports, v11's 4.
        assert_eq!(
            addr!(v12.init),
            Some(v12::net_init_v12 as *const () as usize)
        );
        assert_eq!(
            addr!(v10.connect),
            Some(v10::net_connect_v10 as *const () as usize)
        );
        assert_eq!(
            addr!(v12.connect),
            Some(v11::net_connect_v11 as *const () as usize)
        );
        assert_eq!(
            addr!(v9.makeVDevice),
            Some(v9::net_make_vdevice_v9 as *const () as usize)
        );
        assert_eq!(
            addr!(v11.makeVDevice),
            Some(v9::net_make_vdevice_v9 as *const () as usize)
        );
        assert_eq!(
            addr!(v12.makeVDevice),
            Some(v12::net_make_vdevice_v12 as *const () as usize)
        );
        assert_eq!(
            addr!(v12.finalize),
            Some(v11::net_finalize_v11 as *const () as usize)
        );
        assert_eq!(
            addr!(v12.setNetAttr),
            Some(v11::net_set_net_attr_v11 as *const () as usize)
        );
        assert_eq!(
            addr!(v9.getProperties),
            addr!(v10.getProperties),
            "v10 reports v9's properties"
        );
        for t in [v8.name, v9.name, v10.name, v11.name, v12.name] {
            assert_eq!(t, NAME.as_ptr());
        }
        // Host plugins offload nothing to the device.
        assert!(v12.getDeviceMr.is_none() && v12.irecvConsumed.is_none());
    }
}
