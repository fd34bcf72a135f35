//! The plugin's logic that needs no device, no clock and no environment: configuration, the
//! error model, the wire formats, and the receiver-driven protocol's state machines with the
//! eager path's rules, tested by a two-sided simulation.
//!
//! Everything here is deterministic and unit-tested on the host. It never calls verbs, CUDA,
//! sockets or `std::env`; callers pass values in.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod eager;
pub mod error;
pub mod group;
pub mod links;
pub mod proto;
pub mod queues;
pub mod repair;
pub mod wire;
#[cfg(test)]
mod xorshift;
