//! Glue between NCCL's calls, the sans-IO protocol core and the verbs objects: device contexts,
//! the registration cache, the out-of-band handshake over non-blocking TCP, and the send and
//! receive comms. Everything with a deadline reads the clock here, never in `core`.
//!
//! Unsafe code: only `mr.rs`, `send/mod.rs`, `recv.rs` and `failover.rs` opt in, for one reason: they hand NCCL's
//! buffers to the NIC (registration and posting). Their `unsafe fn`s carry NCCL's contract
//! (buffers stay valid until `test` says done, registrations until `deregMr`) up to the C
//! boundary, where `abi` discharges it.

mod conn;
mod context;
mod door;
mod failover;
mod flush;
mod health;
mod held;
mod listen;
mod mr;
mod oob;
mod peer_link;
mod profile;
mod qp_set;
mod quiet_wait;
mod recv;
mod recv_writes;
mod send;
mod shared_cq;
mod watch;
mod wire_io;

pub use conn::{ConnectionMemory, connection_memory, random_u64};
pub use context::{DeviceContext, PortContext, oob_settings};
pub use health::DeviceHealth;
pub use held::flush_all as post_held;
pub use listen::ListenComm;
pub use mr::{MrCache, MrHandle};
pub use oob::{OobChoice, OobSettings, choose_oob_address};
pub use profile::{EventHandle, Parent, QpEvent, Sink, install as install_profiler};
pub use recv::{RECV_REQUESTS, RecvComm, Sizes};
pub use send::{Connecting, SEND_REQUESTS, SendComm};
pub use watch::Tended;
