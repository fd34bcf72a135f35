//! GPUDirect RDMA verdicts over fixture sysfs trees: every peer-memory variant, PF against VF,
//! hypervisor against bare metal, and the three values of `NCCL_IB_PCI_RELAXED_ORDERING`; each
//! checks the verdict and the reason an operator reads.
#![allow(clippy::unwrap_used)] // fixture setup panics with context

use std::fs;
use std::path::{Path, PathBuf};

use nccl_net::core::config::RelaxedOrdering;
use nccl_net::topology::{
    PeerMem, RelaxedOrderingInputs, SysfsRoot, detect_hypervisor, relaxed_ordering,
};

/// A sysfs tree under a temporary directory, removed on drop.
struct Tree(PathBuf);

impl Tree {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("gdr-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        Self(root)
    }

    fn file(&self, rel: &str, text: &str) -> &Self {
        let path = self.0.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
        self
    }

    fn dir(&self, rel: &str) -> &Self {
        fs::create_dir_all(self.0.join(rel)).unwrap();
        self
    }

    fn root(&self) -> SysfsRoot {
        SysfsRoot::new(&self.0)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn each_registered_path_alone_enables_peer_memory_and_is_named() {
    for path in [
        "kernel/mm/memory_peers/nv_mem/version",
        "kernel/mm/memory_peers/nv_mem_nc/version",
        "kernel/mm/memory_peers/nvidia-peermem/version",
    ] {
        let tree = Tree::new(&path.replace('/', "_"));
        tree.file(path, "1.3\n");
        let verdict = PeerMem::detect(&tree.root(), None);
        assert!(matches!(verdict, PeerMem::Registered { path: p } if p == path));
        assert!(verdict.usable());
        assert_eq!(
            verdict.to_string(),
            format!("nvidia peer memory registered (/sys/{path})")
        );
    }
}

#[test]
fn module_loaded_without_registration_is_named_with_the_fix() {
    // NVIDIA/nccl#1939: nvidia_peermem in lsmod, /sys/kernel/mm/memory_peers absent.
    let tree = Tree::new("loaded-sys");
    tree.file("module/nvidia_peermem/version", "550.54\n");
    let verdict = PeerMem::detect(&tree.root(), None);
    assert_eq!(
        verdict,
        PeerMem::LoadedNotRegistered {
            evidence: "seen in /sys/module",
            interface_present: false
        }
    );
    assert!(!verdict.usable());
    let text = verdict.to_string();
    assert!(
        text.starts_with(
            "nvidia_peermem is loaded (seen in /sys/module) but not registered with the \
             peer-memory interface (no /sys/kernel/mm/memory_peers at all); fix: load it \
             after the MOFED/DOCA-OFED RDMA stack"
        ),
        "{text}"
    );

    // Seen only in /proc/modules, with the interface present but empty.
    let tree = Tree::new("loaded-proc");
    tree.dir("kernel/mm/memory_peers");
    let modules = "nvidia_uvm 1 0 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\n";
    let verdict = PeerMem::detect(&tree.root(), Some(modules));
    assert_eq!(
        verdict,
        PeerMem::LoadedNotRegistered {
            evidence: "seen in /proc/modules",
            interface_present: true
        }
    );
    assert!(
        verdict
            .to_string()
            .contains("(no nv_mem entry in /sys/kernel/mm/memory_peers)")
    );
}

#[test]
fn nothing_loaded_says_so_and_how_to_fix_it() {
    let tree = Tree::new("none");
    let modules = "nvidia 1 0 - Live 0x0\nnvidia_peermem_helper 1 0 - Live 0x0\n";
    let verdict = PeerMem::detect(&tree.root(), Some(modules));
    assert_eq!(
        verdict,
        PeerMem::Absent,
        "a module name prefix is not the module"
    );
    assert_eq!(
        verdict.to_string(),
        "no peer-memory module (nvidia_peermem not loaded, no /sys/kernel/mm/memory_peers/nv_mem); \
         fix: `modprobe nvidia_peermem` (needs MOFED/DOCA-OFED), or use DMA-BUF"
    );
}

#[test]
fn hypervisor_is_recognised_from_sysfs_and_dmi() {
    let bare = Tree::new("bare");
    bare.file("class/dmi/id/sys_vendor", "Dell Inc.\n")
        .file("class/dmi/id/product_name", "PowerEdge XE9680\n");
    assert_eq!(detect_hypervisor(&bare.root(), None), None);

    let xen = Tree::new("xen");
    xen.file("hypervisor/type", "xen\n");
    assert_eq!(
        detect_hypervisor(&xen.root(), None).as_deref(),
        Some("sysfs hypervisor/type = xen")
    );

    let kvm = Tree::new("kvm");
    kvm.file("class/dmi/id/sys_vendor", "QEMU\n").file(
        "class/dmi/id/product_name",
        "Standard PC (Q35 + ICH9, 2009)\n",
    );
    assert_eq!(
        detect_hypervisor(&kvm.root(), None).as_deref(),
        Some("DMI sys_vendor = QEMU")
    );

    let hyperv = Tree::new("hyperv");
    hyperv
        .file("class/dmi/id/sys_vendor", "Microsoft Corporation\n")
        .file("class/dmi/id/product_name", "Virtual Machine\n");
    assert_eq!(
        detect_hypervisor(&hyperv.root(), None).as_deref(),
        Some("DMI product_name = Virtual Machine")
    );
}

/// A VF's `physfn` link, read through the same sysfs code the plugin uses.
fn vf_tree() -> Tree {
    let tree = Tree::new("vf");
    let pf = tree
        .path()
        .join("devices/pci0000:00/0000:00:02.0/0000:0b:00.0");
    let vf = tree
        .path()
        .join("devices/pci0000:00/0000:00:02.0/0000:0b:00.2");
    fs::create_dir_all(&pf).unwrap();
    fs::create_dir_all(&vf).unwrap();
    std::os::unix::fs::symlink(&pf, vf.join("physfn")).unwrap();
    for (dev, function) in [("mlx5_0", &pf), ("mlx5_2", &vf)] {
        let dir = tree.path().join("class/infiniband").join(dev);
        fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(function, dir.join("device")).unwrap();
    }
    tree
}

#[test]
fn relaxed_ordering_follows_vf_hypervisor_and_the_variable() {
    let tree = vf_tree();
    let is_vf = |dev: &str| tree.root().pci_function(dev).unwrap().is_vf();
    assert!(!is_vf("mlx5_0") && is_vf("mlx5_2"));

    let decide = |setting, dev: &str, hypervisor: Option<&str>| {
        relaxed_ordering(&RelaxedOrderingInputs {
            setting,
            is_vf: is_vf(dev),
            hypervisor: hypervisor.map(str::to_owned),
            reg_mr_iova2: true,
        })
    };
    use RelaxedOrdering::{Auto, Off, On};

    let (on, line) = decide(Auto, "mlx5_2", None);
    assert!(on, "auto: a VF gets relaxed ordering");
    assert_eq!(
        line,
        "relaxed ordering on: a VF's DMA goes through the IOMMU/ATS path where strict ordering \
         costs bandwidth [SR-IOV VF; bare metal; ibv_reg_mr_iova2 available; \
         NCCL_IB_PCI_RELAXED_ORDERING=2 (auto)]"
    );
    let (on, line) = decide(Auto, "mlx5_0", Some("CPU hypervisor flag"));
    assert!(on, "auto: a PF inside a VM gets relaxed ordering");
    assert!(
        line.contains("under a hypervisor")
            && line.contains("[PF or no PCI parent; hypervisor (CPU hypervisor flag);"),
        "{line}"
    );
    let (on, line) = decide(Auto, "mlx5_0", None);
    assert!(!on, "auto: bare-metal PF stays strict");
    assert!(
        line.starts_with("relaxed ordering off: bare-metal PF"),
        "{line}"
    );
    let (on, line) = decide(On, "mlx5_0", None);
    assert!(on);
    assert!(line.ends_with("NCCL_IB_PCI_RELAXED_ORDERING=1]"), "{line}");
    let (on, line) = decide(Off, "mlx5_2", Some("CPU hypervisor flag"));
    assert!(!on, "0 wins over a VF in a VM");
    assert!(
        line.starts_with("relaxed ordering off: turned off"),
        "{line}"
    );

    let (on, line) = relaxed_ordering(&RelaxedOrderingInputs {
        setting: On,
        is_vf: true,
        hypervisor: None,
        reg_mr_iova2: false,
    });
    assert!(!on, "no ibv_reg_mr_iova2, no relaxed ordering");
    assert!(line.contains("verbs cannot register with it"), "{line}");
    assert!(line.contains("ibv_reg_mr_iova2 missing"), "{line}");
}
