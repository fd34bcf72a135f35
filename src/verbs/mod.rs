//! Safe owners of libibverbs objects. The only module that names `rdma_sys`.
//!
//! Every verbs object is an RAII value whose `Drop` releases it and never panics (a failed
//! release is logged and leaked). No `rdma_sys` type appears in a public signature: callers get
//! plain values such as [`crate::topology::HcaPort`].
#![allow(unsafe_code)]

mod device;

pub use device::{Discovery, discover_ports};
