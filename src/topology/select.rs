//! Which ports become NCCL devices, in which order, under which names.

use std::path::PathBuf;

use super::{HcaFilter, LinkLayer, PciFunction, SysfsRoot, link_speed_mbps};

/// One port of one RDMA device, as verbs reported it at discovery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaPort {
    /// RDMA device name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Port number, from 1.
    pub port: u32,
    /// `ibv_port_attr.state` (`IBV_PORT_*`; 4 = ACTIVE).
    pub state: u32,
    /// Link layer of the port.
    pub link_layer: LinkLayer,
    /// `ibv_port_attr.active_speed` code.
    pub active_speed: u32,
    /// `ibv_port_attr.active_width` code.
    pub active_width: u8,
    /// `ibv_port_attr.phys_state` (5 = LinkUp, 2 = Polling).
    pub phys_state: u8,
    /// `ibv_port_attr.active_mtu` (`ibv_mtu` code: 1 = 256 .. 5 = 4096).
    pub active_mtu: u8,
    /// `ibv_port_attr.max_mtu` (`ibv_mtu` code).
    pub max_mtu: u8,
    /// `ibv_port_attr.lid` (InfiniBand; 0 until a subnet manager assigns one).
    pub lid: u16,
    /// `ibv_port_attr.sm_lid` (InfiniBand; 0 without a subnet manager).
    pub sm_lid: u16,
    /// `ibv_device_attr.sys_image_guid`, in host byte order.
    pub sys_image_guid: u64,
    /// `ibv_device_attr.max_qp`.
    pub max_qp: u32,
}

/// A port chosen to be an NCCL device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetDevice {
    /// Name NCCL sees; unique: the device name, or `device:port` when several ports of one
    /// device are used (NCCL keys its topology on the name).
    pub name: String,
    /// RDMA device name.
    pub device: String,
    /// Port number.
    pub port: u32,
    /// Realpath of the parent PCI device, `None` for virtual devices.
    pub pci_path: Option<PathBuf>,
    /// The PCI function behind the device, `None` for virtual devices.
    pub pci: Option<PciFunction>,
    /// NIC identity (`sys_image_guid`).
    pub guid: u64,
    /// Link speed in Mbps.
    pub speed_mbps: u32,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Connections the device can hold (`max_qp`).
    pub max_comms: u32,
}

/// The outcome of device selection: the devices in NCCL index order, and one reason per port
/// that was left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// Chosen devices; index = NCCL device number.
    pub devices: Vec<NetDevice>,
    /// `"<device>:<port> <reason>"` for every port not chosen.
    pub skipped: Vec<String>,
}

/// `ibv_port_state` of a usable port.
pub const PORT_ACTIVE: u32 = 4;

/// An `ibv_port_state` by its verbs name.
pub fn port_state_name(state: u32) -> &'static str {
    match state {
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "NOP",
    }
}

/// An `ibv_port_attr.phys_state` by its IBTA name.
pub fn phys_state_name(state: u8) -> &'static str {
    match state {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "PhyTest",
        _ => "NoStateChange",
    }
}

/// Keep the active IB/RoCE ports that pass `filter`, order them by PCI path then name (so
/// indices agree across identical nodes, like NCCL's `NCCL_IB_DEVICE_PCI_ORDER`), and name them.
pub fn select_devices(
    ports: &[HcaPort],
    filter: Option<&HcaFilter>,
    sysfs: &SysfsRoot,
) -> Selection {
    let mut selection = Selection::default();
    let mut chosen: Vec<&HcaPort> = Vec::new();
    for p in ports {
        let reason = if p.state != PORT_ACTIVE {
            Some(format!("is {} (not ACTIVE)", port_state_name(p.state)))
        } else if let LinkLayer::Other(_) = p.link_layer {
            Some(format!("has an unsupported {}", p.link_layer))
        } else if filter.is_some_and(|f| !f.allows(&p.device, p.port)) {
            Some("is not selected by NCCL_IB_HCA".to_owned())
        } else {
            None
        };
        match reason {
            Some(r) => selection
                .skipped
                .push(format!("{}:{} {r}", p.device, p.port)),
            None => chosen.push(p),
        }
    }
    let mut devices: Vec<NetDevice> = chosen
        .iter()
        .map(|p| {
            let shares_device = chosen.iter().filter(|q| q.device == p.device).count() > 1;
            NetDevice {
                name: if shares_device {
                    format!("{}:{}", p.device, p.port)
                } else {
                    p.device.clone()
                },
                device: p.device.clone(),
                port: p.port,
                pci_path: sysfs.ib_device_pci_path(&p.device),
                pci: sysfs.pci_function(&p.device),
                guid: p.sys_image_guid,
                speed_mbps: link_speed_mbps(p.active_speed, p.active_width),
                link_layer: p.link_layer,
                max_comms: p.max_qp,
            }
        })
        .collect();
    devices.sort_by(|a, b| {
        (a.pci_path.is_none(), &a.pci_path, &a.device, a.port).cmp(&(
            b.pci_path.is_none(),
            &b.pci_path,
            &b.device,
            b.port,
        ))
    });
    selection.devices = devices;
    selection
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, port: u32, state: u32) -> HcaPort {
        HcaPort {
            device: device.into(),
            port,
            state,
            link_layer: LinkLayer::Ethernet,
            active_speed: 1,
            active_width: 1,
            phys_state: 5,
            active_mtu: 3,
            max_mtu: 5,
            lid: 0,
            sm_lid: 0,
            sys_image_guid: 0x0200_00ff_fe00_0000,
            max_qp: 1024,
        }
    }

    fn no_sysfs() -> SysfsRoot {
        SysfsRoot::new("/nonexistent-sysfs-root")
    }

    fn names(s: &Selection) -> Vec<&str> {
        s.devices.iter().map(|d| d.name.as_str()).collect()
    }

    #[test]
    fn active_ports_are_chosen_and_described() {
        let s = select_devices(&[port("rxe1", 1, 4), port("rxe0", 1, 4)], None, &no_sysfs());
        assert_eq!(names(&s), ["rxe0", "rxe1"]);
        let d = &s.devices[0];
        assert_eq!(
            (d.port, d.speed_mbps, d.max_comms, d.pci_path.as_ref()),
            (1, 2500, 1024, None)
        );
        assert!(s.skipped.is_empty());
    }

    #[test]
    fn inactive_and_filtered_ports_are_skipped_with_reasons() {
        let filter = HcaFilter::parse("^rxe1").unwrap();
        let ports = [port("rxe0", 1, 4), port("rxe1", 1, 4), port("mlx5_0", 1, 1)];
        let s = select_devices(&ports, Some(&filter), &no_sysfs());
        assert_eq!(names(&s), ["rxe0"]);
        assert_eq!(
            s.skipped,
            [
                "rxe1:1 is not selected by NCCL_IB_HCA",
                "mlx5_0:1 is DOWN (not ACTIVE)"
            ]
        );
    }

    #[test]
    fn unknown_link_layer_is_skipped() {
        let mut p = port("odd0", 1, 4);
        p.link_layer = LinkLayer::Other(7);
        let s = select_devices(&[p], None, &no_sysfs());
        assert!(s.devices.is_empty());
        assert_eq!(s.skipped, ["odd0:1 has an unsupported link layer 7"]);
    }

    #[test]
    fn two_ports_of_one_device_get_distinct_names() {
        let s = select_devices(
            &[port("mlx5_0", 2, 4), port("mlx5_0", 1, 4)],
            None,
            &no_sysfs(),
        );
        assert_eq!(names(&s), ["mlx5_0:1", "mlx5_0:2"]);
    }
}
