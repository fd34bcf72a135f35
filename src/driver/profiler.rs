//! A profiler callback that records what a plugin reports through it (ncclNet v10+), as a
//! profiler plugin behind NCCL's callback would see it: each start with its parent, plugin id
//! and descriptor, each stop. Pass [`record`] as [`super::LoadOptions::profiler`].

use std::ffi::{c_int, c_void};

use parking_lot::Mutex;

use crate::abi::types::{
    NCCL_PROFILER_NET_EVENT_START, NCCL_PROFILER_NET_EVENT_STOP, ncclProfilerNetIbDescr_v1_t,
    ncclResult_t, ncclSuccess,
};

/// One call of the callback.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// An event started under `parent`, given handle `handle`.
    Start {
        handle: usize,
        parent: usize,
        plugin_id: i64,
        descr: ncclProfilerNetIbDescr_v1_t,
    },
    /// The event with `handle` stopped.
    Stop { handle: usize },
    /// A call of another type.
    Other(c_int),
}

static CALLS: Mutex<Vec<Call>> = Mutex::new(Vec::new());

/// The calls so far, in order; the record starts over.
pub fn take() -> Vec<Call> {
    std::mem::take(&mut *CALLS.lock())
}

/// The callback: hands out handles 1, 2, 3, ... (as addresses).
///
/// # Safety
/// As NCCL's: `handle` points at a handle slot; `ext` is NULL or a descriptor of the plugin id's
/// type, valid during the call.
pub unsafe extern "C" fn record(
    handle: *mut *mut c_void,
    kind: c_int,
    parent: *mut c_void,
    plugin_id: i64,
    ext: *mut c_void,
) -> ncclResult_t {
    let mut calls = CALLS.lock();
    let call = match kind {
        NCCL_PROFILER_NET_EVENT_START => {
            let given = calls.len() + 1;
            // SAFETY: the plugin passes a handle slot and its descriptor (this contract).
            unsafe { *handle = std::ptr::without_provenance_mut(given) };
            Call::Start {
                handle: given,
                parent: parent.addr(),
                plugin_id,
                // SAFETY: as above.
                descr: unsafe { *ext.cast::<ncclProfilerNetIbDescr_v1_t>() },
            }
        }
        NCCL_PROFILER_NET_EVENT_STOP => Call::Stop {
            // SAFETY: as above.
            handle: unsafe { *handle }.addr(),
        },
        other => Call::Other(other),
    };
    calls.push(call);
    ncclSuccess
}
