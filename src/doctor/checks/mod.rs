//! The node checks: each judges [`NodeFacts`] and returns findings, never touching hardware
//! itself (the facts carry verbs' answers and the plugin's decisions), so every branch is
//! tested on fixture trees. One file per family of checks, in report order (`access`, `ports`,
//! `gpudirect`, `pci`, `node`, `plugin`); the helpers they share are here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::facts::{
    KernelRecord, NodeFacts, Opened, Origin, PluginEntry, Setting, candidate_devices, hca_filter,
};
use super::finding::{Finding, Severity};
use super::pcie::{PcieLink, acs_control, acs_redirects, relaxed_ordering_enabled};
use super::rows::{hca_port, pcie_function_dir, port_netdev};
use crate::core::config::{AddrFamily, NOT_IMPLEMENTED};
use crate::driver::Exports;
use crate::plugin::{
    DeviceModel, PLUGIN_NAME, SMALL_VDEVICE_LIMIT, SMALL_VDEVICE_TABLES, fusion_policy,
};
use crate::topology::{
    DmaBuf, GidEntry, GidPolicy, HcaPort, LinkLayer, NetDevice, PORT_ACTIVE, PciAddress, PeerMem,
    choose_gid, dmabuf_both_sides, fuse, mtu_bytes, phys_state_name, pkey_at, port_state_name,
    select_devices,
};

mod access;
mod gpudirect;
mod node;
mod pci;
mod plugin;
mod ports;

use access::{dev_nodes, memlock, verbs_provider};
use gpudirect::{gdr_dmabuf, gdr_peermem, relaxed_ordering};
use node::{firmware, kernel_log};
use pci::{iommu, pcie_acs, pcie_link, topo_numa};
use plugin::{env_config, plugin_devices, plugin_load};
use ports::{ib_pkey, link_rate, mtu, port_state, roce_gid};

/// Every node check: id and what it looks at, in report order (docs/doctor.md lists them).
pub const CHECKS: &[(&str, &str)] = &[
    (
        "verbs.provider",
        "libibverbs lists the RDMA devices sysfs shows, and opens them",
    ),
    (
        "dev.nodes",
        "the /dev/infiniband/uverbsN of each device the plugin would open opens read-write",
    ),
    (
        "memlock",
        "the locked-memory limit covers what the plugin and NCCL pin for the expected connections",
    ),
    (
        "port.state",
        "each port NCCL_IB_HCA allows is ACTIVE (INIT/ARMED: no subnet manager; Polling: no cable or peer)",
    ),
    (
        "link.rate",
        "each used port runs at the rate of the fastest used port of its link layer",
    ),
    (
        "mtu",
        "active MTU against the port's maximum and, for RoCE, the netdev MTU",
    ),
    (
        "roce.gid",
        "the plugin's GID selection per RoCE port, with every candidate passed over and why",
    ),
    (
        "ib.pkey",
        "the partition (P_Key) each used port's QPs join, at index NCCL_IB_PKEY, and whether the ports share one",
    ),
    (
        "gdr.peermem",
        "the peer-memory module: registered, loaded but not registered, or absent",
    ),
    (
        "gdr.dmabuf",
        "DMA-BUF registration per device, and the plugin's GPUDirect verdict line",
    ),
    (
        "relaxed.ordering",
        "the plugin's relaxed-ordering decision and its inputs, against the NIC's PCIe Device Control",
    ),
    (
        "pcie.link",
        "the NIC's trained PCIe link against its maximum and the port rate",
    ),
    (
        "pcie.acs",
        "ACS peer-to-peer redirection on the PCIe switch ports between each NIC and the GPUs under its switch",
    ),
    (
        "topo.numa",
        "NUMA node of each NIC, and GPUs without a NIC on their node",
    ),
    (
        "iommu",
        "IOMMU translation (DMA) or passthrough (identity) for each NIC",
    ),
    (
        "versions.firmware",
        "the same firmware on every used device",
    ),
    (
        "kernel.log",
        "the kernel's log (what its ring still holds): NIC firmware timeouts and health, power, temperature, peer-memory errors",
    ),
    (
        "env.config",
        "every variable the plugin reads: value, origin, and the plugin's parse",
    ),
    (
        "plugin.load",
        "the library NCCL opens as its net plugin (NCCL_NET_PLUGIN, else libnccl-net.so), resolved as NCCL does, and whether NCCL_NET lets NCCL use it",
    ),
    (
        "plugin.devices",
        "the devices NCCL will get from the plugin, the ports left out, the fusions made, and fused devices running on fewer members than they have (degraded)",
    ),
];

/// Run every node check.
pub fn node_checks(facts: &NodeFacts) -> Vec<Finding> {
    let checks: [fn(&NodeFacts) -> Vec<Finding>; 20] = [
        verbs_provider,
        dev_nodes,
        memlock,
        port_state,
        link_rate,
        mtu,
        roce_gid,
        ib_pkey,
        gdr_peermem,
        gdr_dmabuf,
        relaxed_ordering,
        pcie_link,
        pcie_acs,
        topo_numa,
        iommu,
        firmware,
        kernel_log,
        env_config,
        plugin_load,
        plugin_devices,
    ];
    checks.iter().flat_map(|check| check(facts)).collect()
}

/// A fused device short of members: the fusion made as if every port were up, with its
/// members down now (as verbs reports them) and its members up.
struct DegradedDevice {
    /// The device's name with every member (`a+b`).
    name: String,
    down: Vec<HcaPort>,
    up: Vec<NetDevice>,
}

/// The fused devices that run on fewer members than they have: the fusion made with every port
/// up, against the ports up now. A device with no member up is not degraded but gone.
fn degraded_devices(facts: &NodeFacts) -> Vec<DegradedDevice> {
    let Ok(discovery) = &facts.survey.discovery else {
        return Vec::new();
    };
    let down_port = |m: &NetDevice| {
        discovery
            .ports
            .iter()
            .find(|p| p.device == m.device && p.port == m.port && p.state != PORT_ACTIVE)
    };
    let all_up: Vec<HcaPort> = discovery
        .ports
        .iter()
        .map(|p| HcaPort {
            state: PORT_ACTIVE,
            ..p.clone()
        })
        .collect();
    let selection = select_devices(
        &all_up,
        hca_filter(&facts.config).as_ref(),
        &facts.roots.sysfs(),
    );
    let policy = fusion_policy(&facts.config, DeviceModel::Fused);
    fuse(selection.devices, &policy)
        .devices
        .into_iter()
        .filter_map(|virt| {
            let name = virt.name();
            let down: Vec<HcaPort> = virt
                .members
                .iter()
                .filter_map(|m| down_port(m).cloned())
                .collect();
            let up: Vec<NetDevice> = virt
                .members
                .into_iter()
                .filter(|m| down_port(m).is_none())
                .collect();
            (!down.is_empty() && !up.is_empty()).then_some(DegradedDevice { name, down, up })
        })
        .collect()
}

/// Human-readable bytes: `8 MiB`, `263 MiB`, `1.5 GiB`.
fn bytes(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    match n {
        n if n >= 16 << 30 => format!("{} GiB", n >> 30),
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= MIB => format!("{} MiB", n.div_ceil(MIB)),
        n => format!("{} KiB", n.div_ceil(1024)),
    }
}

fn gbps(mbps: u64) -> String {
    if mbps.is_multiple_of(1000) {
        format!("{} Gb/s", mbps / 1000)
    } else {
        format!("{:.1} Gb/s", mbps as f64 / 1000.0)
    }
}

/// `a: port port; b: port`: the used ports grouped by what they differ in.
fn grouped<K: std::fmt::Display>(groups: &BTreeMap<K, Vec<String>>) -> String {
    let parts: Vec<String> = groups
        .iter()
        .map(|(key, ports)| format!("{key}: {}", ports.join(" ")))
        .collect();
    parts.join("; ")
}

/// Path of a port attribute, as on the node.
fn port_path(device: &str, port: u32, name: &str) -> String {
    format!("/sys/class/infiniband/{device}/ports/{port}/{name}")
}

/// The used member ports (every member of every device), with verbs' view of each.
fn used_ports(facts: &NodeFacts) -> Vec<(&NetDevice, Option<&HcaPort>)> {
    facts
        .survey
        .devices
        .iter()
        .flat_map(|d| &d.virt.members)
        .map(|m| (m, hca_port(facts, m)))
        .collect()
}

/// The SKIP of a port-level PCIe check for a device without a PCI function (Soft-RoCE).
fn software_device(check: &'static str, m: &NetDevice) -> Finding {
    Finding::new(
        Severity::Skip,
        check,
        &m.name,
        "no PCI function (software device)",
    )
}

/// A port-level PCIe check's findings: for each used member, `judge` of its PCI function's
/// directory (the one `function_dir` picks), or the SKIP of a software device.
fn per_pci_function(
    facts: &NodeFacts,
    check: &'static str,
    function_dir: fn(&NetDevice) -> Option<PathBuf>,
    judge: impl Fn(&NetDevice, &Path) -> Finding,
) -> Vec<Finding> {
    used_ports(facts)
        .into_iter()
        .map(|(m, _)| match function_dir(m) {
            Some(dir) => judge(m, &dir),
            None => software_device(check, m),
        })
        .collect()
}

/// The directory of a member's own PCI function; `None` for a software device.
fn own_function_dir(m: &NetDevice) -> Option<PathBuf> {
    m.pci_path.clone().filter(|_| m.pci.is_some())
}

/// One SKIP when nothing was discovered, so port checks say why they have nothing to judge.
fn nothing_to_check(check: &'static str, facts: &NodeFacts) -> Option<Vec<Finding>> {
    if !facts.survey.devices.is_empty() {
        return None;
    }
    let cause = no_device_cause(facts);
    Some(vec![
        Finding::new(
            Severity::Skip,
            check,
            "node",
            format!("no device to check (see {cause})"),
        )
        .depends_on(cause),
    ])
}

/// The check that explains why no device was surveyed.
fn no_device_cause(facts: &NodeFacts) -> &'static str {
    if facts.survey.discovery.is_err() {
        "verbs.provider"
    } else {
        "plugin.devices"
    }
}
