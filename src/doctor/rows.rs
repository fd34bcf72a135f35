//! The devices NCCL will see, one row per member port with what an operator compares first:
//! the device table of the report, the `devices` of the JSON and of the pair check's node card.

use super::facts::NodeFacts;
use super::pcie::PcieLink;
use crate::topology::{
    GidEntry, GidPolicy, HcaPort, LinkLayer, NetDevice, choose_gid, mtu_bytes, phys_state_name,
    port_state_name,
};

/// One member port of an NCCL device.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberRow {
    /// `mlx5_0` or `mlx5_0:1`.
    pub name: String,
    /// RDMA device.
    pub device: String,
    /// Port number.
    pub port: u32,
    /// `IB` or `RoCE`.
    pub link_layer: LinkLayer,
    /// `ACTIVE`, `DOWN`...
    pub state: &'static str,
    /// `LinkUp`, `Polling`...
    pub phys_state: &'static str,
    /// Link speed in Mbps.
    pub speed_mbps: u32,
    /// Active MTU in bytes.
    pub active_mtu: u32,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu: u32,
    /// The network interface (RoCE).
    pub netdev: Option<String>,
    /// Its MTU.
    pub netdev_mtu: Option<u32>,
    /// The GID the plugin uses (RoCE), or why there is none.
    pub gid: Option<Result<GidEntry, String>>,
    /// InfiniBand LID and subnet manager LID.
    pub lid: u16,
    /// See `lid`.
    pub sm_lid: u16,
    /// The P_Key the plugin's QPs use (`pkeys/<NCCL_IB_PKEY>`, index 0 when unset).
    pub pkey: Option<String>,
    /// PCI address of the function, `None` for software devices.
    pub pci: Option<String>,
    /// An SR-IOV virtual function.
    pub vf: bool,
    /// NUMA node of the function.
    pub numa: Option<u32>,
    /// Trained PCIe link (the PF's for a VF).
    pub pcie: Option<PcieLink>,
    /// `fw_ver`.
    pub fw_ver: Option<String>,
    /// Relaxed ordering on for data registrations.
    pub relaxed_ordering: bool,
}

/// One NCCL device.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceRow {
    /// NCCL device index.
    pub index: usize,
    /// Name NCCL sees.
    pub name: String,
    /// Sum of the members' speeds.
    pub speed_mbps: u32,
    /// Memory it registers: `host`, `host+cuda`, `host+dmabuf`...
    pub memory: String,
    /// Member ports.
    pub members: Vec<MemberRow>,
}

/// The port verbs reported for a member.
pub(super) fn hca_port<'a>(facts: &'a NodeFacts, member: &NetDevice) -> Option<&'a HcaPort> {
    facts
        .survey
        .discovery
        .as_ref()
        .ok()?
        .ports
        .iter()
        .find(|p| p.device == member.device && p.port == member.port)
}

/// The network interface behind a port: the netdev of its first GID (what RoCE traffic uses).
pub(super) fn port_netdev(facts: &NodeFacts, device: &str, port: u32) -> Option<String> {
    facts.roots.sysfs().read_value(&format!(
        "class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/0"
    ))
}

/// The function whose PCIe link carries a member's traffic: its own, or its PF's for a VF.
pub(super) fn pcie_function_dir(member: &NetDevice) -> Option<std::path::PathBuf> {
    let function = member.pci.as_ref()?;
    let dir = member.pci_path.clone()?;
    Some(match &function.physfn {
        Some(_) => dir.join("physfn").canonicalize().unwrap_or(dir),
        None => dir,
    })
}

/// The rows of every device in the survey.
pub fn device_rows(facts: &NodeFacts) -> Vec<DeviceRow> {
    let sysfs = facts.roots.sysfs();
    let config = &facts.config;
    facts
        .survey
        .devices
        .iter()
        .enumerate()
        .map(|(index, d)| {
            let members = d
                .virt
                .members
                .iter()
                .zip(&d.relaxed_ordering)
                .map(|(m, (ro, _))| {
                    let port = hca_port(facts, m);
                    let netdev = (m.link_layer == LinkLayer::Ethernet)
                        .then(|| port_netdev(facts, &m.device, m.port))
                        .flatten();
                    let gid = (m.link_layer == LinkLayer::Ethernet).then(|| {
                        choose_gid(
                            &sysfs.port_gids(&m.device, m.port),
                            &GidPolicy::from_config(config),
                        )
                        .chosen
                    });
                    MemberRow {
                        name: m.name.clone(),
                        device: m.device.clone(),
                        port: m.port,
                        link_layer: m.link_layer,
                        state: port.map_or("?", |p| port_state_name(p.state)),
                        phys_state: port.map_or("?", |p| phys_state_name(p.phys_state)),
                        speed_mbps: m.speed_mbps,
                        active_mtu: port.map_or(0, |p| mtu_bytes(p.active_mtu)),
                        max_mtu: port.map_or(0, |p| mtu_bytes(p.max_mtu)),
                        netdev_mtu: netdev.as_ref().and_then(|n| {
                            sysfs
                                .read_value(&format!("class/net/{n}/mtu"))?
                                .parse()
                                .ok()
                        }),
                        netdev,
                        gid,
                        lid: port.map_or(0, |p| p.lid),
                        sm_lid: port.map_or(0, |p| p.sm_lid),
                        pkey: sysfs.read_value(&format!(
                            "class/infiniband/{}/ports/{}/pkeys/{}",
                            m.device,
                            m.port,
                            config.pkey_index.unwrap_or(0)
                        )),
                        pci: m.pci.as_ref().map(|f| f.address.to_string()),
                        vf: m.pci.as_ref().is_some_and(|f| f.is_vf()),
                        numa: m.pci.as_ref().and_then(|f| f.numa_node),
                        pcie: pcie_function_dir(m).and_then(|dir| PcieLink::read(&dir, "current")),
                        fw_ver: sysfs.read_value(&format!("class/infiniband/{}/fw_ver", m.device)),
                        relaxed_ordering: *ro,
                    }
                })
                .collect();
            DeviceRow {
                index,
                name: d.virt.name(),
                speed_mbps: d.virt.speed_mbps(),
                memory: d.memory.kinds(),
                members,
            }
        })
        .collect()
}
