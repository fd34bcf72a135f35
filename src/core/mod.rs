//! The plugin's logic that needs no device, no clock and no environment: configuration and the
//! error model (and, as the data path lands, the wire formats and protocol state machines).
//!
//! Everything here is deterministic and unit-tested on the host. It never calls verbs, CUDA,
//! sockets or `std::env`; callers pass values in.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod eager;
pub mod error;
pub mod group;
pub mod proto;
pub mod wire;
