//! Fusion policy over fixture sysfs trees: each test builds the PCI layout of a real machine
//! shape, runs device selection and fusion exactly as `init` does, and checks the grouping and
//! the reason line an operator reads.
#![allow(clippy::unwrap_used)] // fixture setup panics with context

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use nccl_net::topology::{
    Fusion, FusionPolicy, HcaPort, LinkLayer, SysfsRoot, fuse, fuse_listed, physical_then_explicit,
    select_devices,
};

/// A sysfs tree under a temporary directory, removed on drop.
struct Fixture {
    root: PathBuf,
    ports: Vec<HcaPort>,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("fusion-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("class/infiniband")).unwrap();
        Self {
            root,
            ports: Vec::new(),
        }
    }

    /// A PCI function at `path` (below `devices/`), optionally a VF of `physfn`.
    fn function(&self, path: &str, physfn: Option<&str>) -> PathBuf {
        let dir = self.root.join("devices").join(path);
        fs::create_dir_all(dir.join("net")).unwrap();
        fs::write(dir.join("numa_node"), "0\n").unwrap();
        if let Some(pf) = physfn {
            let pf_dir = self.root.join("devices").join(pf);
            fs::create_dir_all(&pf_dir).unwrap();
            symlink(&pf_dir, dir.join("physfn")).unwrap();
        }
        dir
    }

    /// An RDMA device `name` with one active port, on the function at `path` (None: no parent).
    fn rdma(&mut self, name: &str, path: Option<&str>, physfn: Option<&str>) -> &mut Self {
        let dev = self.root.join("class/infiniband").join(name);
        fs::create_dir_all(&dev).unwrap();
        if let Some(path) = path {
            symlink(self.function(path, physfn), dev.join("device")).unwrap();
        }
        self.ports.push(HcaPort {
            device: name.into(),
            port: 1,
            state: 4,
            link_layer: LinkLayer::Ethernet,
            active_speed: 128, // NDR
            active_width: 2,   // 4x
            phys_state: 5,
            active_mtu: 5,
            max_mtu: 5,
            lid: 0,
            sm_lid: 0,
            sys_image_guid: 1,
            max_qp: 1 << 17,
        });
        self
    }

    /// Put the function at `path` on NUMA node `numa` with the network interface `netdev`.
    fn place(&self, path: &str, numa: &str, netdev: &str) -> &Self {
        let dir = self.root.join("devices").join(path);
        fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
        fs::create_dir_all(dir.join("net").join(netdev)).unwrap();
        self
    }

    fn fuse(&self, policy: &FusionPolicy) -> Fusion {
        let selection = select_devices(&self.ports, None, &SysfsRoot::new(&self.root));
        fuse(selection.devices, policy)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn defaults() -> FusionPolicy {
    FusionPolicy {
        merge_nics: true,
        merge_vfs: false,
        explicit: Vec::new(),
        max_members: 4,
        limit_holder: "ncclNet v9 to v11",
    }
}

fn explicit(groups: &[&[&str]]) -> FusionPolicy {
    FusionPolicy {
        explicit: groups
            .iter()
            .map(|g| g.iter().map(|n| (*n).to_owned()).collect())
            .collect(),
        ..defaults()
    }
}

fn names(f: &Fusion) -> Vec<String> {
    f.devices.iter().map(|d| d.name()).collect()
}

const BRIDGE: &str = "pci0000:00/0000:00:02.0";

#[test]
fn dual_port_cx7_pfs_fuse_into_one_device_with_summed_speed() {
    let mut fx = Fixture::new("cx7");
    let (f0, f1) = (
        format!("{BRIDGE}/0000:0b:00.0"),
        format!("{BRIDGE}/0000:0b:00.1"),
    );
    fx.rdma("mlx5_1", Some(&f1), None)
        .rdma("mlx5_0", Some(&f0), None);
    fx.place(&f0, "1", "ens1f0np0").place(&f1, "1", "ens1f1np1");
    let f = fx.fuse(&defaults());
    assert_eq!(names(&f), ["mlx5_0+mlx5_1"]);
    let d = &f.devices[0];
    assert_eq!(d.speed_mbps(), 2 * d.members[0].speed_mbps);
    assert_eq!(d.speed_mbps(), 800_000);
    assert!(d.pci_path().unwrap().ends_with("0000:0b:00.0"));
    assert_eq!(
        f.decisions,
        [
            "fused mlx5_0+mlx5_1 (800000 Mbps): ports of one NIC (PCI device 0000:0b:00, NUMA node \
          1, netdevs ens1f0np0 ens1f1np1)"
        ]
    );

    let off = fx.fuse(&FusionPolicy {
        merge_nics: false,
        ..defaults()
    });
    assert_eq!(names(&off), ["mlx5_0", "mlx5_1"]);
    assert_eq!(
        off.decisions[1],
        "mlx5_1 not fused with mlx5_0+mlx5_1: NCCL_IB_MERGE_NICS=0 turns fusion off"
    );
}

#[test]
fn a_vf_never_fuses_with_its_own_pf() {
    let mut fx = Fixture::new("pf-vf");
    let pf = format!("{BRIDGE}/0000:0b:00.0");
    fx.rdma("mlx5_0", Some(&pf), None).rdma(
        "mlx5_2",
        Some(&format!("{BRIDGE}/0000:0b:00.2")),
        Some(&pf),
    );
    let f = fx.fuse(&FusionPolicy {
        merge_vfs: true,
        ..defaults()
    });
    assert_eq!(names(&f), ["mlx5_0", "mlx5_2"]);
    assert_eq!(
        f.decisions[1],
        "mlx5_2 not fused: VF of 0000:0b:00.0, which is mlx5_0; a VF never fuses with its own PF \
         (they share one port)"
    );
    // Not even when an operator asks for it.
    let asked = fx.fuse(&explicit(&[&["mlx5_0", "mlx5_2"]]));
    assert_eq!(names(&asked), ["mlx5_0", "mlx5_2"]);
    assert_eq!(
        asked.decisions[0],
        "fusion mlx5_0+mlx5_2 refused: mlx5_2 is a VF of 0000:0b:00.0, which is mlx5_0; a VF \
         never fuses with its own PF (they share one port)"
    );
}

#[test]
fn vfs_of_one_pf_fuse_only_when_asked() {
    let mut fx = Fixture::new("vfs");
    let pf = format!("{BRIDGE}/0000:0b:00.0");
    fx.rdma("mlx5_2", Some(&format!("{BRIDGE}/0000:0b:00.2")), Some(&pf))
        .rdma("mlx5_3", Some(&format!("{BRIDGE}/0000:0b:00.3")), Some(&pf));
    let f = fx.fuse(&defaults());
    assert_eq!(names(&f), ["mlx5_2", "mlx5_3"]);
    assert_eq!(
        f.decisions,
        [
            "mlx5_2 not fused: VFs of 0000:0b:00.0 fuse only with NCCL_IB_MERGE_VFS=1",
            "mlx5_3 not fused: VFs of 0000:0b:00.0 fuse only with NCCL_IB_MERGE_VFS=1"
        ]
    );
    let merged = fx.fuse(&FusionPolicy {
        merge_vfs: true,
        ..defaults()
    });
    assert_eq!(names(&merged), ["mlx5_2+mlx5_3"]);
    assert_eq!(
        merged.decisions,
        ["fused mlx5_2+mlx5_3 (800000 Mbps): VFs of 0000:0b:00.0, NCCL_IB_MERGE_VFS=1"]
    );
}

#[test]
fn vfs_exposed_as_root_complex_endpoints_are_separate_devices() {
    // cloud-hypervisor passes VFs through as endpoints directly on the root bus, without a
    // bridge above them and without a visible PF.
    let mut fx = Fixture::new("rciep");
    fx.rdma("mlx5_0", Some("pci0000:00/0000:00:04.0"), None)
        .rdma("mlx5_1", Some("pci0000:00/0000:00:05.0"), None);
    let f = fx.fuse(&defaults());
    assert_eq!(names(&f), ["mlx5_0", "mlx5_1"]);
    assert_eq!(
        f.decisions[0],
        "mlx5_0 not fused: the only port of PCI device 0000:00:04 (separate NICs fuse only when \
         listed in NCCL_NET_RS_FUSE)"
    );
    let pci = f.devices[0].first().pci.as_ref().unwrap();
    assert_eq!(
        (pci.address.to_string(), pci.physfn),
        ("0000:00:04.0".into(), None)
    );
}

#[test]
fn nics_on_different_buses_fuse_only_when_listed() {
    let mut fx = Fixture::new("buses");
    fx.rdma("mlx5_0", Some(&format!("{BRIDGE}/0000:0b:00.0")), None)
        .rdma("mlx5_1", Some("pci0000:00/0000:00:03.0/0000:0c:00.0"), None);
    let f = fx.fuse(&defaults());
    assert_eq!(names(&f), ["mlx5_0", "mlx5_1"]);
    assert!(f.decisions[1].starts_with("mlx5_1 not fused: the only port of PCI device 0000:0c:00"));
    let listed = fx.fuse(&explicit(&[&["mlx5_1", "mlx5_0"]]));
    assert_eq!(names(&listed), ["mlx5_1+mlx5_0"]);
    assert_eq!(
        listed.decisions,
        ["fused mlx5_1+mlx5_0 (800000 Mbps): listed in NCCL_NET_RS_FUSE"]
    );
}

#[test]
fn devices_without_a_pci_parent_fuse_only_when_listed() {
    let mut fx = Fixture::new("rxe");
    fx.rdma("rxe0", None, None).rdma("rxe1", None, None);
    let f = fx.fuse(&defaults());
    assert_eq!(names(&f), ["rxe0", "rxe1"]);
    assert_eq!(
        f.decisions[0],
        "rxe0 not fused: no PCI parent (Soft-RoCE or a virtual device); fuse it by listing it in \
         NCCL_NET_RS_FUSE"
    );
    assert_eq!(
        names(&fx.fuse(&explicit(&[&["rxe0", "rxe1"]]))),
        ["rxe0+rxe1"]
    );
    let typo = fx.fuse(&explicit(&[&["rxe0", "rxe7"]]));
    assert_eq!(names(&typo), ["rxe0", "rxe1"]);
    assert_eq!(
        typo.decisions[0],
        "fusion rxe0+rxe7 refused: rxe7 is not an active port selected by NCCL_IB_HCA"
    );
    let off = fx.fuse(&FusionPolicy {
        merge_nics: false,
        ..explicit(&[&["rxe0", "rxe1"]])
    });
    assert_eq!(names(&off), ["rxe0", "rxe1"]);
    assert_eq!(
        off.decisions[0],
        "fusion rxe0+rxe1 refused: NCCL_IB_MERGE_NICS=0 turns fusion off"
    );
}

impl Fixture {
    /// The selected ports, in NCCL's order, as `makeVDevice` sees them (ncclNet v9+).
    fn ports(&self) -> Vec<nccl_net::topology::NetDevice> {
        select_devices(&self.ports, None, &SysfsRoot::new(&self.root)).devices
    }
}

/// ncclNet v9+: every port stays a device of its own; `NCCL_NET_RS_FUSE` groups come after them.
#[test]
fn from_v9_ports_stay_alone_and_listed_groups_are_appended() {
    let mut fx = Fixture::new("v9-ports");
    let (f0, f1) = (
        format!("{BRIDGE}/0000:0b:00.0"),
        format!("{BRIDGE}/0000:0b:00.1"),
    );
    fx.rdma("mlx5_0", Some(&f0), None)
        .rdma("mlx5_1", Some(&f1), None)
        .rdma("rxe0", None, None);
    let f = physical_then_explicit(fx.ports(), &explicit(&[&["mlx5_1", "rxe0"]]));
    assert_eq!(names(&f), ["mlx5_0", "mlx5_1", "rxe0", "mlx5_1+rxe0"]);
    assert_eq!(
        f.decisions,
        ["fused mlx5_1+rxe0 (800000 Mbps): listed in NCCL_NET_RS_FUSE"]
    );
}

/// An `NCCL_NET_RS_FUSE` group larger than one device may be is refused with a WARN line of its
/// own (not a decision), at v8's init and v9+'s alike; every port stays usable, and the other
/// groups are made.
#[test]
fn a_listed_group_above_the_member_limit_is_a_warning_and_its_ports_stay_devices() {
    let mut fx = Fixture::new("oversized");
    for name in ["rxe0", "rxe1", "rxe2", "rxe3", "rxe4", "rxe5", "rxe6"] {
        fx.rdma(name, None, None);
    }
    let policy = explicit(&[&["rxe0", "rxe1", "rxe2", "rxe3", "rxe4"], &["rxe5", "rxe6"]]);
    let warning = "NCCL_NET_RS_FUSE group rxe0+rxe1+rxe2+rxe3+rxe4 refused: 5 ports, more than \
                   the 4 one device of ncclNet v9 to v11 may have; its ports stay separate \
                   devices (split it into groups of at most 4)";
    let v9 = physical_then_explicit(fx.ports(), &policy);
    assert_eq!(
        names(&v9),
        [
            "rxe0",
            "rxe1",
            "rxe2",
            "rxe3",
            "rxe4",
            "rxe5",
            "rxe6",
            "rxe5+rxe6"
        ]
    );
    assert_eq!(v9.warnings, [warning]);
    assert!(
        !v9.decisions.iter().any(|d| d.contains("rxe4")),
        "{:?}",
        v9.decisions
    );
    let v8 = fuse(fx.ports(), &policy);
    assert_eq!(
        names(&v8),
        ["rxe0", "rxe1", "rxe2", "rxe3", "rxe4", "rxe5+rxe6"]
    );
    assert_eq!(v8.warnings, [warning]);
}

/// `makeVDevice` goes through the same rules as every fusion.
#[test]
fn make_vdevice_fuses_ports_of_one_nic_and_refuses_a_vf_with_its_own_pf() {
    let mut fx = Fixture::new("vdev");
    let (pf, vf, other) = (
        format!("{BRIDGE}/0000:0b:00.0"),
        format!("{BRIDGE}/0000:0b:00.2"),
        format!("{BRIDGE}/0000:0b:00.1"),
    );
    fx.rdma("mlx5_0", Some(&pf), None)
        .rdma("mlx5_1", Some(&other), None)
        .rdma("mlx5_2", Some(&vf), Some(&pf));
    let ports = fx.ports();
    let fused = fuse_listed(&[&ports[0], &ports[1]], &defaults()).unwrap();
    assert_eq!(fused.name(), "mlx5_0+mlx5_1");
    let why = fuse_listed(&[&ports[0], &ports[2]], &defaults()).unwrap_err();
    assert!(
        why.contains("mlx5_2 is a VF of 0000:0b:00.0, which is mlx5_0"),
        "{why}"
    );
    let off = FusionPolicy {
        merge_nics: false,
        ..defaults()
    };
    assert_eq!(
        fuse_listed(&[&ports[0], &ports[1]], &off).unwrap_err(),
        "NCCL_IB_MERGE_NICS=0 turns fusion off"
    );
    let two = FusionPolicy {
        max_members: 2,
        ..defaults()
    };
    assert!(
        fuse_listed(&[&ports[0], &ports[1], &ports[2]], &two)
            .unwrap_err()
            .contains("3 ports, more than the 2 one device of ncclNet v9 to v11 may have")
    );
}
