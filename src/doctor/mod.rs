//! The engine of `nccl-net-doctor`: facts about a node read under an injectable filesystem
//! root, the plugin's own [`Survey`](crate::plugin::Survey) of them, and the node checks as
//! functions of those facts. Every decision the doctor reports is the plugin's (discovery,
//! `NCCL_IB_HCA`, port filtering, fusion, GID selection, GPUDirect, relaxed ordering,
//! configuration parsing); the checks only judge and explain them. The binary
//! (`src/bin/nccl-net-doctor`) adds the command line, the output formats and the pair check.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod checks;
mod facts;
mod finding;
mod pcie;
mod rows;

pub use checks::{CHECKS, node_checks};
pub use facts::{
    ConfFile, DevNode, EffectiveConfig, Expected, KernelLog, KernelRecord, Memlock, MemoryBudget,
    NCCL_VARIABLES, NodeFacts, Opened, Origin, PluginEntry, Roots, RunContext, Setting,
};
pub use finding::{Evidence, Finding, Severity, worst_first};
pub use pcie::{PcieLink, relaxed_ordering_enabled};
pub use rows::{DeviceRow, MemberRow, device_rows};
