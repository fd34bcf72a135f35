//! What the machine has and which of it the plugin uses: sysfs reads through an injectable root,
//! the `NCCL_IB_HCA` filter, link speed decoding, and the choice of devices NCCL will see.
//!
//! Verbs query results come in as plain values ([`HcaPort`]); everything here is pure or reads
//! files under a [`SysfsRoot`], so it is tested on the host with fixture trees.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod fusion;
mod gdr;
mod gid;
mod hca_filter;
mod ib_path;
mod link;
mod pci;
mod pkey;
mod select;
mod sysfs;

pub use fusion::{Fusion, FusionPolicy, VirtualDevice, fuse, fuse_listed, physical_then_explicit};
pub use gdr::{
    DmaBuf, GpuExport, MemorySupport, PeerMem, RelaxedOrderingInputs, detect_hypervisor,
    dmabuf_both_sides, gdr_verdict, relaxed_ordering,
};
pub use gid::{
    GidCandidate, GidChoice, GidEntry, GidPolicy, choose_gid, parse_gid, parse_roce_version,
};
pub use hca_filter::HcaFilter;
pub use ib_path::{IbRoute, ib_route, select_ib_gid};
pub use link::{LinkLayer, link_speed_mbps, mtu_bytes};
pub use pci::{BadPciAddress, PciAddress, PciFunction};
pub use pkey::{PKey, configured_pkey, parse_pkey, pkey_at};
pub use select::{
    HcaPort, NetDevice, PORT_ACTIVE, Selection, phys_state_name, port_state_name, select_devices,
};
pub use sysfs::SysfsRoot;
