//! Safe owners of libibverbs objects. The only module that names `rdma_sys` (and the one that
//! makes the few other system calls the plugin needs, such as `getifaddrs`).
//!
//! Every verbs object is an RAII value whose `Drop` releases it and never panics (a failed
//! release is logged and leaked). Children hold an `Arc` of their parents (MR → PD → device,
//! QP → PD and CQ), so objects are always destroyed before what they depend on. No `rdma_sys`
//! type appears in a public signature: callers get plain values.
#![allow(unsafe_code)]

mod cq;
mod device;
mod events;
mod netif;
mod pd;
mod qp;
mod region;

pub use cq::{Completion, CompletionQueue, OPCODE_RECV_RDMA_WITH_IMM};
pub use device::{Device, Discovery, PortState, discover_ports};
pub use events::{AsyncEvent, Epoll, EventFd};
pub use netif::{InterfaceAddr, interface_addrs, peer_hung_up, set_listen_backlog};
pub use pd::{Access, MemoryRegion, ProtectionDomain, reg_mr_iova2_available};
pub use qp::{
    Op, PathParams, PostRefused, QpCaps, QueuePair, RemoteEndpoint, SendChain, Sge, WorkRequest,
};
pub use region::{HostRegion, RegionPool};
