//! Every node check of `nccl-net-doctor` over fixture trees (sysfs, /proc, /dev and /etc under
//! one root), through the same gathering and the same plugin survey as on a node: for each
//! check, the pass branch and each fail branch, with the words an operator reads.
#![allow(clippy::unwrap_used)] // fixture setup panics with context

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

use nccl_net::core::config::Config;
use nccl_net::core::error::Error;
use nccl_net::core::queues::QueueMemory;
use nccl_net::doctor::{Expected, Finding, NodeFacts, Roots, Severity, node_checks};
use nccl_net::driver::Exports;
use nccl_net::plugin::GpuFacts;
use nccl_net::topology::{GpuExport, HcaPort, LinkLayer, PeerMem, SysfsRoot};
use nccl_net::transport::connection_memory;
use nccl_net::verbs::Discovery;

/// One port as the fixture describes it: verbs' view and what sysfs shows.
#[derive(Clone)]
struct Port {
    state: u32,
    phys_state: u8,
    link_layer: LinkLayer,
    speed: u32,
    width: u8,
    active_mtu: u8,
    max_mtu: u8,
    /// `(gid, type)` entries, index = position.
    gids: Vec<(&'static str, &'static str)>,
    netdev: Option<(&'static str, u32, &'static str)>,
    /// `pkeys/<i>` entries, index = position.
    pkeys: Vec<&'static str>,
}

impl Default for Port {
    fn default() -> Self {
        Self {
            state: 4,
            phys_state: 5,
            link_layer: LinkLayer::Ethernet,
            speed: 128, // NDR
            width: 2,   // 4x: 400 Gb/s
            active_mtu: 5,
            max_mtu: 5,
            gids: vec![
                ("fe80:0000:0000:0000:0e42:a1ff:fe00:0001", "RoCE v2"),
                ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"),
            ],
            netdev: Some(("ens1f0", 9000, "up")),
            pkeys: vec!["0xffff"],
        }
    }
}

/// A net plugin library at `path` named `name`, exporting v12 to v8.
fn plugin(path: &str, name: &str) -> Exports {
    Exports {
        path: path.into(),
        versions: vec![12, 11, 10, 9, 8],
        name: Some(name.into()),
    }
}

/// A node under a temporary root, removed on drop.
struct Node {
    root: PathBuf,
    ports: Vec<HcaPort>,
    env: Vec<(&'static str, String)>,
    cuda: bool,
    /// What the CUDA driver says of the GPUs (with `cuda` only).
    gpu_export: GpuExport,
    hypervisor: Option<String>,
    dmabuf: Result<(), String>,
    discovery_error: Option<i32>,
    open_problems: Vec<String>,
    hidden_from_verbs: bool,
    /// The library names the loader finds, with what each exports; any other is not found.
    libraries: Vec<(&'static str, Exports)>,
    /// The connections the memlock budget is for (`--connections` or `--peers`).
    expected: Expected,
}

const PCI: &str = "sys/devices/pci0000:00/0000:00:02.0";

impl Node {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("doctor-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for dir in [
            "sys/class/infiniband",
            "sys/class/infiniband_verbs",
            "dev/infiniband",
            "etc",
        ] {
            fs::create_dir_all(root.join(dir)).unwrap();
        }
        // A kernel log with nothing in it (a node's /dev/kmsg is read the same way).
        fs::write(root.join("dev/kmsg"), "").unwrap();
        let node = Self {
            root,
            ports: Vec::new(),
            env: Vec::new(),
            cuda: false,
            gpu_export: GpuExport::Gpus {
                exporting: 1,
                total: 1,
            },
            hypervisor: None,
            dmabuf: Err("Operation not supported (os error 95)".into()),
            discovery_error: None,
            open_problems: Vec::new(),
            hidden_from_verbs: false,
            libraries: vec![("libnccl-net.so", plugin("/usr/lib/libnccl-net.so", "RsIB"))],
            expected: Expected::Connections(32),
        };
        node.limits("unlimited", "unlimited", "0000000000000000")
    }

    fn write(&self, rel: &str, text: &str) -> &Self {
        let path = self.root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
        self
    }

    fn limits(self, soft: &str, hard: &str, cap_eff: &str) -> Self {
        self.write(
            "proc/self/limits",
            &format!(
                "Limit                     Soft Limit           Hard Limit           Units\n\
                 Max locked memory         {soft:<20} {hard:<20} bytes\n"
            ),
        );
        self.write(
            "proc/self/status",
            &format!("Name:\tdoctor\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t{cap_eff}\n"),
        );
        self
    }

    /// A PCI function at `sys/devices/.../<bdf>` with its link and NUMA node.
    fn function(&self, bdf: &str, numa: i32, link: (&str, u32, &str, u32)) -> PathBuf {
        let dir = self.root.join(PCI).join(bdf);
        fs::create_dir_all(&dir).unwrap();
        let w = |name: &str, text: String| fs::write(dir.join(name), text).unwrap();
        w("numa_node", format!("{numa}\n"));
        w("current_link_speed", format!("{} GT/s PCIe\n", link.0));
        w("current_link_width", format!("{}\n", link.1));
        w("max_link_speed", format!("{} GT/s PCIe\n", link.2));
        w("max_link_width", format!("{}\n", link.3));
        w("vendor", "0x15b3\n".into());
        // What a user other than root reads: the 64-byte header, no capabilities.
        fs::write(dir.join("config"), [0u8; 64]).unwrap();
        w("class", "0x020700\n".into());
        dir
    }

    /// An NVIDIA GPU (3D controller) at `dir` (under the root), with its NUMA node, listed in
    /// `/sys/bus/pci/devices` as `bdf`.
    fn gpu(&self, dir: &str, bdf: &str, numa: i32) -> &Self {
        let function = self.root.join(dir);
        fs::create_dir_all(&function).unwrap();
        for (f, v) in [("vendor", "0x10de"), ("class", "0x030200")] {
            fs::write(function.join(f), format!("{v}\n")).unwrap();
        }
        fs::write(function.join("numa_node"), format!("{numa}\n")).unwrap();
        let listed = self.root.join("sys/bus/pci/devices");
        fs::create_dir_all(&listed).unwrap();
        symlink(&function, listed.join(bdf)).unwrap();
        self
    }

    /// An RDMA device `name` with one port, on the PCI function `bdf` (None: software device).
    fn nic(&mut self, name: &str, bdf: Option<&str>, port: &Port) -> &mut Self {
        let dev = self.root.join("sys/class/infiniband").join(name);
        let p = dev.join("ports/1");
        fs::create_dir_all(&p).unwrap();
        if let Some(bdf) = bdf {
            let function = self.root.join(PCI).join(bdf);
            if !function.exists() {
                self.function(bdf, 0, ("32.0", 16, "32.0", 16));
            }
            symlink(&function, dev.join("device")).unwrap();
            fs::write(dev.join("fw_ver"), "28.39.1002\n").unwrap();
        }
        let state = ["", "DOWN", "INIT", "ARMED", "ACTIVE"][port.state as usize];
        let phys = ["", "Sleep", "Polling", "Disabled", "", "LinkUp"][usize::from(port.phys_state)];
        fs::write(p.join("state"), format!("{}: {state}\n", port.state)).unwrap();
        fs::write(
            p.join("phys_state"),
            format!("{}: {phys}\n", port.phys_state),
        )
        .unwrap();
        fs::write(p.join("rate"), "400 Gb/sec (4X NDR)\n").unwrap();
        for (i, (gid, kind)) in port.gids.iter().enumerate() {
            for (sub, text) in [("gids", *gid), ("gid_attrs/types", *kind)] {
                fs::create_dir_all(p.join(sub)).unwrap();
                fs::write(p.join(sub).join(i.to_string()), format!("{text}\n")).unwrap();
            }
            if let Some((ifname, ..)) = port.netdev {
                fs::create_dir_all(p.join("gid_attrs/ndevs")).unwrap();
                fs::write(
                    p.join("gid_attrs/ndevs").join(i.to_string()),
                    format!("{ifname}\n"),
                )
                .unwrap();
            }
        }
        for (i, key) in port.pkeys.iter().enumerate() {
            fs::create_dir_all(p.join("pkeys")).unwrap();
            fs::write(p.join("pkeys").join(i.to_string()), format!("{key}\n")).unwrap();
        }
        if let Some((ifname, mtu, oper)) = port.netdev {
            self.write(&format!("sys/class/net/{ifname}/mtu"), &format!("{mtu}\n"));
            self.write(
                &format!("sys/class/net/{ifname}/operstate"),
                &format!("{oper}\n"),
            );
        }
        let index = self.ports.len();
        self.write(
            &format!("sys/class/infiniband_verbs/uverbs{index}/ibdev"),
            &format!("{name}\n"),
        );
        self.write(&format!("dev/infiniband/uverbs{index}"), "");
        self.ports.push(HcaPort {
            device: name.into(),
            port: 1,
            state: port.state,
            link_layer: port.link_layer,
            active_speed: port.speed,
            active_width: port.width,
            phys_state: port.phys_state,
            active_mtu: port.active_mtu,
            max_mtu: port.max_mtu,
            lid: 0,
            sm_lid: 0,
            sys_image_guid: 0x0c42_a1ff_fe00_0000 + index as u64,
            max_qp: 1 << 17,
        });
        self
    }

    fn env(&mut self, name: &'static str, value: &str) -> &mut Self {
        self.env.push((name, value.to_owned()));
        self
    }

    fn facts(&self) -> NodeFacts {
        let roots = Roots {
            fs: self.root.clone(),
        };
        let sysfs = SysfsRoot::new(self.root.join("sys"));
        let env = |name: &str| -> Option<OsString> {
            self.env
                .iter()
                .rev()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.into())
        };
        let discovery = match self.discovery_error {
            Some(errno) => Err(Error::system(
                "ibv_get_device_list failed",
                std::io::Error::from_raw_os_error(errno),
            )),
            None if self.hidden_from_verbs => Ok(Discovery::default()),
            None => Ok(Discovery {
                device_count: self.ports.len() + self.open_problems.len(),
                ports: self.ports.clone(),
                problems: self.open_problems.clone(),
            }),
        };
        let gpu = GpuFacts {
            cuda: if self.cuda {
                Ok(())
            } else {
                Err("libcuda.so not found".into())
            },
            gpu_export: if self.cuda {
                self.gpu_export.clone()
            } else {
                GpuExport::Unknown("libcuda.so not found".into())
            },
            peermem: PeerMem::detect(&sysfs, None),
            hypervisor: self.hypervisor.clone(),
            reg_mr_iova2: true,
        };
        let dmabuf = self.dmabuf.clone();
        let open = |name: &str| -> Result<Exports, String> {
            self.libraries
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, x)| x.clone())
                .ok_or_else(|| {
                    format!("{name}: cannot open shared object file: No such file or directory")
                })
        };
        NodeFacts::gather(
            roots,
            &env,
            discovery,
            gpu,
            &move |_| dmabuf.clone(),
            &open,
            self.expected,
        )
    }

    /// The findings of one check.
    fn check(&self, id: &str) -> Vec<Finding> {
        node_checks(&self.facts())
            .into_iter()
            .filter(|f| f.check == id)
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// The only finding of `id`, asserting its severity and that its text contains `needle`.
#[track_caller]
fn one(findings: &[Finding], severity: Severity, needle: &str) -> Finding {
    assert_eq!(findings.len(), 1, "{findings:#?}");
    let f = &findings[0];
    assert_eq!(f.severity, severity, "{}", f.line());
    assert!(f.line().contains(needle), "'{needle}' not in: {}", f.line());
    f.clone()
}

#[track_caller]
fn has(findings: &[Finding], severity: Severity, entity: &str, needle: &str) {
    assert!(
        findings
            .iter()
            .any(|f| f.severity == severity && f.entity == entity && f.line().contains(needle)),
        "no {severity} for {entity} with '{needle}' in {:#?}",
        findings.iter().map(Finding::line).collect::<Vec<_>>()
    );
}

fn healthy(name: &str) -> Node {
    let mut node = Node::new(name);
    node.nic("mlx5_0", Some("0000:0b:00.0"), &Port::default());
    node
}

#[test]
fn verbs_provider_passes_with_devices_and_fails_with_the_reason() {
    one(
        &healthy("vp-ok").check("verbs.provider"),
        Severity::Pass,
        "libibverbs lists 1 device(s) and opens them: mlx5_0",
    );

    let mut no_kernel = Node::new("vp-enosys");
    no_kernel.discovery_error = Some(libc::ENOSYS);
    let f = one(
        &no_kernel.check("verbs.provider"),
        Severity::Fail,
        "this kernel has no RDMA support",
    );
    assert!(f.evidence[0].source.contains("ibv_get_device_list"));

    let mut no_provider = healthy("vp-provider");
    no_provider.hidden_from_verbs = true;
    one(
        &no_provider.check("verbs.provider"),
        Severity::Fail,
        "sysfs shows mlx5_0 but libibverbs lists no device: no provider library matches them",
    );

    let mut cannot_open = healthy("vp-open");
    cannot_open
        .open_problems
        .push("mlx5_1: ibv_open_device failed: Permission denied (os error 13)".into());
    has(
        &cannot_open.check("verbs.provider"),
        Severity::Fail,
        "mlx5_1",
        "Permission denied",
    );
}

#[test]
fn dev_nodes_pass_when_they_open_and_fail_when_missing_or_without_uverbs() {
    one(
        &healthy("dn-ok").check("dev.nodes"),
        Severity::Pass,
        "/dev/infiniband/uverbs0 opens read-write",
    );

    let missing = healthy("dn-missing");
    fs::remove_file(missing.root.join("dev/infiniband/uverbs0")).unwrap();
    one(
        &missing.check("dev.nodes"),
        Severity::Fail,
        "uverbs0 is missing (the container has no /dev/infiniband); fix: expose the device",
    );

    let no_uverbs = healthy("dn-module");
    fs::remove_dir_all(no_uverbs.root.join("sys/class/infiniband_verbs/uverbs0")).unwrap();
    one(
        &no_uverbs.check("dev.nodes"),
        Severity::Fail,
        "ib_uverbs is not loaded",
    );

    let odd = healthy("dn-odd");
    fs::remove_file(odd.root.join("dev/infiniband/uverbs0")).unwrap();
    fs::create_dir(odd.root.join("dev/infiniband/uverbs0")).unwrap();
    one(&odd.check("dev.nodes"), Severity::Fail, "cannot be opened");

    // Only the devices the plugin would open are required.
    let mut filtered = healthy("dn-filter");
    filtered.nic("mlx5_1", Some("0000:0c:00.0"), &Port::default());
    fs::remove_file(filtered.root.join("dev/infiniband/uverbs1")).unwrap();
    filtered.env("NCCL_IB_HCA", "mlx5_0");
    one(&filtered.check("dev.nodes"), Severity::Pass, "uverbs0");
}

#[test]
fn memlock_against_the_budget() {
    let f = one(
        &healthy("ml-unlimited").check("memlock"),
        Severity::Pass,
        "unlimited",
    );
    assert!(f.what.contains("needed for 32 connections"), "{}", f.what);

    let low = healthy("ml-low").limits("8388608", "8388608", "0000000000000000");
    let f = one(
        &low.check("memlock"),
        Severity::Fail,
        "locked-memory limit 8 MiB <",
    );
    assert!(
        f.what.contains("2 x 4 MiB NCCL_BUFFSIZE in host memory"),
        "{}",
        f.what
    );
    assert!(f.fix.as_ref().unwrap().contains("--ulimit memlock=-1"));
    assert!(f.fix.as_ref().unwrap().contains("the hard limit is 8 MiB"));

    let exempt = healthy("ml-cap").limits("8388608", "8388608", "0000000000004000");
    one(
        &exempt.check("memlock"),
        Severity::Pass,
        "CAP_IPC_LOCK is effective",
    );

    let ample = healthy("ml-ample").limits("17179869184", "unlimited", "0");
    one(
        &ample.check("memlock"),
        Severity::Info,
        "limit 16 GiB covers",
    );

    let mut buffsize = healthy("ml-buffsize").limits("536870912", "unlimited", "0");
    buffsize.env("NCCL_BUFFSIZE", "16777216");
    one(
        &buffsize.check("memlock"),
        Severity::Fail,
        "2 x 16 MiB NCCL_BUFFSIZE",
    );
    // NCCL reads its variables from its configuration files too (before any NCCL_PARAM).
    let from_file = healthy("ml-buffsize-conf").limits("536870912", "unlimited", "0");
    from_file.write("etc/nccl.conf", "NCCL_BUFFSIZE=16777216\n");
    one(
        &from_file.check("memlock"),
        Severity::Fail,
        "2 x 16 MiB NCCL_BUFFSIZE",
    );

    let unreadable = healthy("ml-unreadable");
    fs::write(unreadable.root.join("proc/self/limits"), "").unwrap();
    one(
        &unreadable.check("memlock"),
        Severity::Unknown,
        "limit unreadable",
    );
}

/// The budget for `--peers N` is N x NCCL_NCHANNELS_PER_NET_PEER connections, each costing what
/// the plugin's own sizing says (`connection_memory`, the same sizes the comms are built with):
/// on a hardware provider its rings and its queues, on Soft-RoCE its rings only.
#[test]
fn memlock_for_an_all_to_all_of_n_peers() {
    let mut node = healthy("ml-peers");
    node.expected = Expected::Peers(4096);
    let f = one(&node.check("memlock"), Severity::Pass, "unlimited");
    assert!(
        f.what.contains(
            "needed for 8192 connections (4096 peers x 2 per peer, NCCL_NCHANNELS_PER_NET_PEER)"
        ),
        "{}",
        f.what
    );
    let per_connection = connection_memory(&Config::default(), 1, QueueMemory::Pinned).pinned();
    let nccl = 2 * (4 << 20);
    let budget = |f: &Finding| {
        f.evidence
            .iter()
            .find(|e| e.source == "budget bytes")
            .map(|e| e.value.parse::<u64>().unwrap())
            .unwrap()
    };
    assert_eq!(budget(&f), 8192 * (per_connection + nccl));

    node.env("NCCL_NCHANNELS_PER_NET_PEER", "4");
    let f = one(&node.check("memlock"), Severity::Pass, "16384 connections");
    assert_eq!(budget(&f), 16384 * (per_connection + nccl));

    let mut soft = Node::new("ml-peers-rxe");
    soft.nic("rxe0", None, &Port::default());
    soft.expected = Expected::Peers(100);
    let f = one(&soft.check("memlock"), Severity::Pass, "200 connections");
    let rings = connection_memory(&Config::default(), 1, QueueMemory::Kernel).pinned();
    assert!(rings < per_connection);
    assert_eq!(budget(&f), 200 * (rings + nccl));
}

#[test]
fn port_state_names_the_state_in_words() {
    one(
        &healthy("ps-ok").check("port.state"),
        Severity::Pass,
        "ACTIVE, LinkUp, netdev ens1f0",
    );

    // A spare port down beside an active one: a warning; the same port named in NCCL_IB_HCA: a failure.
    let mut spare = healthy("ps-spare");
    spare.nic(
        "mlx5_1",
        Some("0000:0c:00.0"),
        &Port {
            state: 1,
            phys_state: 2,
            ..Port::default()
        },
    );
    has(
        &spare.check("port.state"),
        Severity::Warn,
        "mlx5_1:1",
        "phys Polling: no cable or no peer on the other end; NCCL will not use it",
    );
    spare.env("NCCL_IB_HCA", "mlx5_1");
    has(
        &spare.check("port.state"),
        Severity::Fail,
        "mlx5_1:1",
        "no cable or no peer",
    );

    let mut init = Node::new("ps-init");
    init.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            state: 2,
            link_layer: LinkLayer::InfiniBand,
            netdev: None,
            ..Port::default()
        },
    );
    let f = one(
        &init.check("port.state"),
        Severity::Fail,
        "INIT: the link is up but no subnet manager has configured the port",
    );
    assert!(f.fix.unwrap().contains("opensm"));

    let mut disabled = Node::new("ps-disabled");
    disabled.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            state: 1,
            phys_state: 3,
            netdev: None,
            ..Port::default()
        },
    );
    one(
        &disabled.check("port.state"),
        Severity::Fail,
        "phys Disabled: administratively down",
    );

    let mut netdev_down = Node::new("ps-netdev");
    netdev_down.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            state: 1,
            phys_state: 3,
            netdev: Some(("ens1f0", 9000, "down")),
            ..Port::default()
        },
    );
    let f = one(
        &netdev_down.check("port.state"),
        Severity::Fail,
        "its netdev ens1f0 is down",
    );
    assert!(f.fix.unwrap().contains("ip link set ens1f0 up"));
}

#[test]
fn link_rate_against_the_fastest_port() {
    let mut node = healthy("lr");
    node.nic(
        "mlx5_1",
        Some("0000:0c:00.0"),
        &Port {
            speed: 64,
            ..Port::default()
        },
    );
    let findings = node.check("link.rate");
    has(&findings, Severity::Pass, "mlx5_0", "400 Gb/s");
    has(
        &findings,
        Severity::Warn,
        "mlx5_1",
        "runs at 200 Gb/s while the fastest RoCE port runs at 400 Gb/s",
    );

    let mut soft = Node::new("lr-soft");
    soft.nic(
        "rxe0",
        None,
        &Port {
            speed: 1,
            width: 1,
            ..Port::default()
        },
    );
    one(
        &soft.check("link.rate"),
        Severity::Info,
        "software device: nominal 2.5 Gb/s, not compared",
    );
}

#[test]
fn mtu_active_against_max_and_netdev() {
    one(
        &healthy("mtu-ok").check("mtu"),
        Severity::Pass,
        "active MTU 4096 (max 4096)",
    );

    let mut small = Node::new("mtu-small");
    small.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            active_mtu: 3,
            netdev: Some(("ens1f0", 1500, "up")),
            ..Port::default()
        },
    );
    let f = one(
        &small.check("mtu"),
        Severity::Warn,
        "active MTU 1024 < max 4096, netdev ens1f0 MTU 1500",
    );
    assert!(f.fix.unwrap().contains("ip link set ens1f0 mtu 9000"));
    assert_eq!(f.evidence[1].source, "/sys/class/net/ens1f0/mtu");

    let mut mixed = healthy("mtu-mixed");
    mixed.nic(
        "mlx5_1",
        Some("0000:0c:00.0"),
        &Port {
            active_mtu: 3,
            netdev: Some(("ens2f0", 1500, "up")),
            ..Port::default()
        },
    );
    has(
        &mixed.check("mtu"),
        Severity::Warn,
        "node",
        "used ports differ in active MTU (mlx5_1 1024 .. mlx5_0 4096)",
    );
}

#[test]
fn roce_gid_dry_run_lists_every_candidate_passed_over() {
    let mut cx7 = Node::new("gid-ok");
    cx7.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            gids: vec![
                ("fe80:0000:0000:0000:0e42:a1ff:fe00:0001", "IB/RoCE v1"),
                ("fe80:0000:0000:0000:0e42:a1ff:fe00:0001", "RoCE v2"),
                ("0000:0000:0000:0000:0000:ffff:0a00:0001", "IB/RoCE v1"),
                ("0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2"),
            ],
            ..Port::default()
        },
    );
    let f = one(
        &cx7.check("roce.gid"),
        Severity::Pass,
        "uses GID index 3 10.0.0.1 (RoCE v2, ens1f0)",
    );
    assert!(
        f.what
            .contains("index 0 fe80::e42:a1ff:fe00:1 (RoCE v1, ens1f0): link-local"),
        "{}",
        f.what
    );
    assert!(
        f.what.contains(
            "index 2 10.0.0.1 (RoCE v1, ens1f0): RoCE v1, NCCL_IB_ROCE_VERSION_NUM prefers v2"
        ),
        "{}",
        f.what
    );
    assert_eq!(f.evidence.len(), 4);

    cx7.env("NCCL_IB_GID_INDEX", "0");
    let f = one(
        &cx7.check("roce.gid"),
        Severity::Warn,
        "uses GID index 0 fe80::e42:a1ff:fe00:1 (RoCE v1, ens1f0), which is link-local",
    );
    assert!(
        f.what.contains("NCCL_IB_GID_INDEX=0 pins another entry"),
        "{}",
        f.what
    );

    cx7.env("NCCL_IB_GID_INDEX", "7");
    one(
        &cx7.check("roce.gid"),
        Severity::Fail,
        "no usable GID: NCCL_IB_GID_INDEX=7 is not a populated GID",
    );

    let mut ranged = healthy("gid-range");
    ranged.env("NCCL_IB_ADDR_RANGE", "10.0.0.0/24");
    one(
        &ranged.check("roce.gid"),
        Severity::Pass,
        "uses GID index 1 10.0.0.1 (RoCE v2, ens1f0)",
    );
    ranged.env("NCCL_IB_ADDR_RANGE", "192.168.0.0/16");
    let f = one(
        &ranged.check("roce.gid"),
        Severity::Warn,
        "uses GID index 1 10.0.0.1 (RoCE v2, ens1f0), which is outside NCCL_IB_ADDR_RANGE 192.168.0.0/16",
    );
    assert!(
        f.fix
            .unwrap()
            .contains("give ens1f0 an address inside 192.168.0.0/16"),
        "{}",
        f.what
    );

    let mut link_local_only = Node::new("gid-ll");
    link_local_only.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            gids: vec![("fe80:0000:0000:0000:0e42:a1ff:fe00:0001", "RoCE v2")],
            ..Port::default()
        },
    );
    let f = one(
        &link_local_only.check("roce.gid"),
        Severity::Warn,
        "which is link-local",
    );
    assert!(f.fix.unwrap().contains("add a routable address to ens1f0"));

    let mut ib = Node::new("gid-ib");
    ib.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            link_layer: LinkLayer::InfiniBand,
            netdev: None,
            ..Port::default()
        },
    );
    one(&ib.check("roce.gid"), Severity::Skip, "addressed by LID");

    let mut mixed = healthy("gid-mixed");
    mixed.nic(
        "mlx5_1",
        Some("0000:0c:00.0"),
        &Port {
            gids: vec![("fd00:0000:0000:0000:0000:0000:0000:0001", "RoCE v2")],
            netdev: Some(("ens2f0", 9000, "up")),
            ..Port::default()
        },
    );
    let findings = mixed.check("roce.gid");
    has(
        &findings,
        Severity::Warn,
        "mlx5_1",
        "AF_INET6, NCCL_IB_ADDR_FAMILY prefers AF_INET",
    );
    has(
        &findings,
        Severity::Warn,
        "node",
        "chose GIDs of different families (IPv4: mlx5_0; IPv6: mlx5_1)",
    );
}

#[test]
fn ib_pkey_names_the_partition_and_refuses_an_empty_index() {
    one(
        &healthy("pkey-ok").check("ib.pkey"),
        Severity::Pass,
        "mlx5_0: QPs join partition 0xffff (full member), P_Key index 0",
    );

    // A port in two partitions (a ConnectX table: mostly empty entries).
    let two = Port {
        link_layer: LinkLayer::InfiniBand,
        netdev: None,
        pkeys: vec!["0xffff", "0x8001", "0x0000", "0x8000"],
        ..Port::default()
    };
    let mut node = Node::new("pkey-index");
    node.nic("mlx5_0", Some("0000:0b:00.0"), &two);
    node.env("NCCL_IB_PKEY", "1");
    one(
        &node.check("ib.pkey"),
        Severity::Pass,
        "QPs join partition 0x8001 (full member), P_Key index 1",
    );
    node.env("NCCL_IB_PKEY", "2");
    let f = one(
        &node.check("ib.pkey"),
        Severity::Fail,
        "NCCL_IB_PKEY=2: P_Key index 2 is an empty entry of the port's table of 4 (its partitions: \
         index 0 = 0xffff (full member), index 1 = 0x8001 (full member)); the plugin refuses to start",
    );
    assert_eq!(f.evidence.len(), 1);
    node.env("NCCL_IB_PKEY", "9");
    one(
        &node.check("ib.pkey"),
        Severity::Fail,
        "P_Key index 9 is past the end",
    );

    let mut empty_default = Node::new("pkey-empty0");
    empty_default.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            pkeys: vec!["0x0000", "0x8001"],
            ..two.clone()
        },
    );
    let f = one(
        &empty_default.check("ib.pkey"),
        Severity::Fail,
        "the QPs would be in no partition and reach no peer",
    );
    assert!(f.fix.unwrap().contains("set NCCL_IB_PKEY"));

    let mut unreadable = Node::new("pkey-none");
    unreadable.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            pkeys: vec![],
            ..Port::default()
        },
    );
    one(
        &unreadable.check("ib.pkey"),
        Severity::Unknown,
        "not readable",
    );

    // Two ports whose entry 1 is in different partitions.
    let mut split = Node::new("pkey-split");
    split.nic("mlx5_0", Some("0000:0b:00.0"), &two);
    split.nic(
        "mlx5_1",
        Some("0000:0c:00.0"),
        &Port {
            pkeys: vec!["0xffff", "0x0002"],
            ..two.clone()
        },
    );
    split.env("NCCL_IB_PKEY", "1");
    let findings = split.check("ib.pkey");
    has(
        &findings,
        Severity::Pass,
        "mlx5_1",
        "0x0002 (limited member)",
    );
    has(
        &findings,
        Severity::Warn,
        "node",
        "different partitions at P_Key index 1 (0x0001: mlx5_0; 0x0002: mlx5_1)",
    );
}

#[test]
fn peer_memory_every_state() {
    one(
        &healthy("pm-nocuda").check("gdr.peermem"),
        Severity::Skip,
        "no CUDA driver (libcuda.so not found)",
    );

    let mut registered = healthy("pm-registered");
    registered.cuda = true;
    registered.write("sys/kernel/mm/memory_peers/nv_mem/version", "1.0\n");
    one(
        &registered.check("gdr.peermem"),
        Severity::Pass,
        "nvidia peer memory registered",
    );

    let mut stuck = healthy("pm-stuck");
    stuck.cuda = true;
    stuck.write("sys/module/nvidia_peermem/version", "550.54\n");
    let f = one(
        &stuck.check("gdr.peermem"),
        Severity::Warn,
        "nvidia_peermem is loaded but not registered, and no device takes DMA-BUF (see gdr.dmabuf)",
    );
    assert!(f.fix.unwrap().contains("modprobe -r nvidia_peermem"));

    let mut absent = healthy("pm-absent");
    absent.cuda = true;
    one(
        &absent.check("gdr.peermem"),
        Severity::Warn,
        "no peer-memory module, and no device takes DMA-BUF (see gdr.dmabuf)",
    );
    absent.dmabuf = Ok(());
    let f = one(
        &absent.check("gdr.peermem"),
        Severity::Info,
        "not needed: GPUDirect RDMA goes through DMA-BUF",
    );
    assert_eq!(f.evidence[1].value, "1 of 1 GPUs export it");
    // NCCL takes DMA-BUF only from a GPU that exports it (init.cc dmaBufSupported).
    absent.gpu_export = GpuExport::Gpus {
        exporting: 0,
        total: 2,
    };
    one(
        &absent.check("gdr.peermem"),
        Severity::Warn,
        "no peer-memory module, and DMA-BUF supported by the NIC; none of the 2 GPUs exports it",
    );
}

/// A GPU node without an RDMA device (seen on an H100 machine): nothing says DMA-BUF is missing,
/// it cannot be probed.
#[test]
fn peer_memory_without_an_rdma_device_is_unknown_not_a_missing_dmabuf() {
    let mut bare = Node::new("pm-nodev");
    bare.cuda = true;
    let f = one(
        &bare.check("gdr.peermem"),
        Severity::Unknown,
        "no peer-memory module, and DMA-BUF cannot be probed without an RDMA device (see plugin.devices)",
    );
    assert_eq!(f.depends_on, Some("plugin.devices"));
}

#[test]
fn dmabuf_verdict_per_device_with_the_plugin_line() {
    one(
        &healthy("db-nocuda").check("gdr.dmabuf"),
        Severity::Skip,
        "GPUDirect RDMA off: no CUDA driver",
    );

    let mut supported = healthy("db-ok");
    supported.cuda = true;
    supported.dmabuf = Ok(());
    let f = one(
        &supported.check("gdr.dmabuf"),
        Severity::Pass,
        "mlx5_0: GPUDirect RDMA on through DMA-BUF",
    );
    assert_eq!(f.evidence[0].value, "DMA-BUF supported");
    supported.gpu_export = GpuExport::Gpus {
        exporting: 0,
        total: 1,
    };
    let f = one(
        &supported.check("gdr.dmabuf"),
        Severity::Warn,
        "DMA-BUF supported by the NIC; none of the 1 GPUs exports it",
    );
    assert!(f.fix.unwrap().contains("open GPU kernel module"));
    supported.write("sys/kernel/mm/memory_peers/nv_mem/version", "1.0\n");
    one(
        &supported.check("gdr.dmabuf"),
        Severity::Info,
        "GPUDirect RDMA on through peer memory",
    );

    let mut unsupported = healthy("db-no");
    unsupported.cuda = true;
    one(
        &unsupported.check("gdr.dmabuf"),
        Severity::Warn,
        "GPUDirect RDMA off",
    );
    unsupported.write("sys/kernel/mm/memory_peers/nv_mem/version", "1.0\n");
    one(
        &unsupported.check("gdr.dmabuf"),
        Severity::Info,
        "GPUDirect RDMA on through peer memory",
    );

    let mut disabled = healthy("db-off");
    disabled.cuda = true;
    disabled.env("NCCL_DMABUF_ENABLE", "0");
    one(
        &disabled.check("gdr.dmabuf"),
        Severity::Info,
        "DMA-BUF disabled by NCCL_DMABUF_ENABLE=0",
    );
}

/// A 256-byte configuration space with the PCI Express capability at 0x40.
fn config_space(relaxed_ordering: bool) -> Vec<u8> {
    let mut c = vec![0u8; 256];
    c[0x06] = 0x10;
    c[0x34] = 0x40;
    c[0x40] = 0x10;
    c[0x48] = if relaxed_ordering { 0x10 } else { 0 };
    c
}

#[test]
fn relaxed_ordering_decision_against_device_control() {
    let mut vf = Node::new("ro-vf");
    let pf = vf.function("0000:0b:00.0", 0, ("16.0", 16, "16.0", 16));
    let vf_dir = vf.function("0000:0b:00.2", 0, ("16.0", 16, "16.0", 16));
    symlink(&pf, vf_dir.join("physfn")).unwrap();
    fs::write(vf_dir.join("config"), config_space(true)).unwrap();
    vf.hypervisor = Some("CPU hypervisor flag".into());
    vf.nic("mlx5_2", Some("0000:0b:00.2"), &Port::default());
    let f = one(
        &vf.check("relaxed.ordering"),
        Severity::Pass,
        "relaxed ordering on",
    );
    assert!(f.what.contains("SR-IOV VF"), "{}", f.what);
    assert_eq!(f.evidence[0].value, "Enable Relaxed Ordering set");

    fs::write(vf_dir.join("config"), config_space(false)).unwrap();
    one(
        &vf.check("relaxed.ordering"),
        Severity::Warn,
        "Enable Relaxed Ordering clear, so the NIC will not use it",
    );

    vf.env("NCCL_IB_PCI_RELAXED_ORDERING", "0");
    one(
        &vf.check("relaxed.ordering"),
        Severity::Warn,
        "relaxed ordering off: turned off",
    );

    let bare = healthy("ro-bare");
    let f = one(
        &bare.check("relaxed.ordering"),
        Severity::Pass,
        "relaxed ordering off: bare-metal PF",
    );
    assert_eq!(
        f.evidence[0].value,
        "only 64 bytes of configuration space readable (needs root)"
    );
}

#[test]
fn pcie_link_against_max_and_port_rate() {
    let f = one(
        &healthy("pcie-ok").check("pcie.link"),
        Severity::Pass,
        "Gen5 x16 (32 GT/s)",
    );
    assert!(f.what.contains("for a 400 Gb/s port"), "{}", f.what);

    let mut narrow = Node::new("pcie-narrow");
    narrow.function("0000:0b:00.0", 0, ("16.0", 8, "16.0", 16));
    narrow.nic(
        "mlx5_0",
        Some("0000:0b:00.0"),
        &Port {
            speed: 32,
            ..Port::default()
        },
    );
    one(
        &narrow.check("pcie.link"),
        Severity::Warn,
        "trained Gen4 x8 (16 GT/s) below its maximum Gen4 x16 (16 GT/s)",
    );

    let mut starved = Node::new("pcie-starved");
    starved.function("0000:0b:00.0", 0, ("8.0", 8, "16.0", 16));
    starved.nic("mlx5_0", Some("0000:0b:00.0"), &Port::default());
    let f = one(
        &starved.check("pcie.link"),
        Severity::Fail,
        "PCIe Gen3 x8 (8 GT/s) carries 63.0 Gb/s < the port's 400 Gb/s",
    );
    assert!(f.fix.unwrap().contains("limited by"));

    let unknown = healthy("pcie-unknown");
    fs::write(
        unknown
            .root
            .join(PCI)
            .join("0000:0b:00.0/current_link_speed"),
        "Unknown\n",
    )
    .unwrap();
    one(
        &unknown.check("pcie.link"),
        Severity::Unknown,
        "link speed/width unreadable",
    );

    let mut soft = Node::new("pcie-soft");
    soft.nic("rxe0", None, &Port::default());
    one(
        &soft.check("pcie.link"),
        Severity::Skip,
        "no PCI function (software device)",
    );
}

/// 4 KiB of a switch port's configuration space (what root reads) whose only extended
/// capability is ACS with `control`.
fn port_config(control: u16) -> Vec<u8> {
    let mut c = vec![0u8; 4096];
    c[0x100..0x104].copy_from_slice(&(0x000d_u32 | (1 << 16)).to_le_bytes());
    c[0x104..0x106].copy_from_slice(&0x005f_u16.to_le_bytes());
    c[0x106..0x108].copy_from_slice(&control.to_le_bytes());
    c
}

/// A node whose NIC (mlx5_0) and GPU sit on downstream ports 0000:02:08.0 and 0000:02:10.0 of
/// one PCIe switch (upstream port 0000:01:00.0) under root port 0000:00:02.0, with these ACS
/// Control values on the two downstream ports.
fn switched(name: &str, nic_port: &[u8], gpu_port: &[u8]) -> Node {
    let mut node = Node::new(name);
    let switch = "0000:01:00.0";
    node.nic(
        "mlx5_0",
        Some(&format!("{switch}/0000:02:08.0/0000:03:00.0")),
        &Port::default(),
    );
    node.gpu(
        &format!("{PCI}/{switch}/0000:02:10.0/0000:04:00.0"),
        "0000:04:00.0",
        0,
    );
    let ports = node.root.join(PCI).join(switch);
    fs::write(ports.join("0000:02:08.0/config"), nic_port).unwrap();
    fs::write(ports.join("0000:02:10.0/config"), gpu_port).unwrap();
    node
}

#[test]
fn acs_redirection_between_a_nic_and_a_gpu_under_one_switch() {
    one(
        &healthy("acs-nogpu").check("pcie.acs"),
        Severity::Skip,
        "mlx5_0: no NVIDIA GPU on the PCI bus: no GPUDirect path to judge",
    );

    let clean = switched("acs-off", &port_config(0x0000), &port_config(0x0001));
    let f = one(
        &clean.check("pcie.acs"),
        Severity::Pass,
        "mlx5_0: no switch port between it and GPUs 0000:04:00.0 redirects peer-to-peer traffic",
    );
    assert_eq!(f.evidence.len(), 2, "{f:#?}");
    assert!(
        f.evidence[0]
            .source
            .ends_with("0000:02:08.0/config ACS Control")
    );
    assert_eq!(f.evidence[0].value, "0x0000");
    // A second GPU on another port of the switch: the NIC's port is read and shown once.
    clean.gpu(
        &format!("{PCI}/0000:01:00.0/0000:02:18.0/0000:05:00.0"),
        "0000:05:00.0",
        0,
    );
    fs::write(
        clean
            .root
            .join(PCI)
            .join("0000:01:00.0/0000:02:18.0/config"),
        port_config(0x0000),
    )
    .unwrap();
    let f = one(
        &clean.check("pcie.acs"),
        Severity::Pass,
        "between it and GPUs 0000:04:00.0 0000:05:00.0 redirects",
    );
    assert_eq!(f.evidence.len(), 3, "{f:#?}");

    let redirected = switched("acs-on", &port_config(0x001d), &port_config(0x0000));
    let f = one(
        &redirected.check("pcie.acs"),
        Severity::Fail,
        "redirect peer-to-peer traffic up to the root complex: 0000:02:08.0 (RequestRedirect+CompletionRedirect+UpstreamForwarding)",
    );
    assert!(f.fix.unwrap().contains("setpci -s <port> ECAP_ACS+6.w=0"));

    let mut guest = switched("acs-vm", &port_config(0x0000), &port_config(0x000c));
    guest.hypervisor = Some("KVM".into());
    one(
        &guest.check("pcie.acs"),
        Severity::Info,
        "0000:02:10.0 (RequestRedirect+CompletionRedirect); expected in a VM",
    );

    // As another user sysfs gives 64 bytes: no extended capability can be seen.
    let user = switched("acs-user", &[0; 64], &[0; 64]);
    one(
        &user.check("pcie.acs"),
        Severity::Unknown,
        "0000:02:08.0: only 64 bytes of configuration space readable (needs root)",
    );

    // A GPU under another root port: its traffic crosses the root complex anyway.
    let apart = healthy("acs-apart");
    apart.gpu(
        "sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0",
        "0000:41:00.0",
        1,
    );
    one(
        &apart.check("pcie.acs"),
        Severity::Pass,
        "no GPU under the same PCIe switch",
    );
}

#[test]
fn numa_locality_of_nics_and_gpus() {
    let node = healthy("numa-ok");
    one(
        &node.check("topo.numa"),
        Severity::Pass,
        "mlx5_0 node 0; no NVIDIA GPU on the PCI bus",
    );

    node.gpu(
        "sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0",
        "0000:41:00.0",
        1,
    );
    let f = one(
        &node.check("topo.numa"),
        Severity::Warn,
        "GPUs 0000:41:00.0 have no used NIC on their NUMA node",
    );
    assert_eq!(f.entity, "node 1");

    let mut unknown = Node::new("numa-unknown");
    unknown.function("0000:0b:00.0", -1, ("16.0", 16, "16.0", 16));
    unknown.nic("mlx5_0", Some("0000:0b:00.0"), &Port::default());
    for n in ["node0", "node1"] {
        fs::create_dir_all(unknown.root.join("sys/devices/system/node").join(n)).unwrap();
    }
    one(
        &unknown.check("topo.numa"),
        Severity::Warn,
        "no NUMA node reported on a 2-node machine",
    );

    let mut soft = Node::new("numa-soft");
    soft.nic("rxe0", None, &Port::default());
    one(
        &soft.check("topo.numa"),
        Severity::Skip,
        "software devices only",
    );
}

fn iommu_group(node: &Node, kind: &str) {
    let group = node.root.join("sys/kernel/iommu_groups/17");
    fs::create_dir_all(&group).unwrap();
    fs::write(group.join("type"), format!("{kind}\n")).unwrap();
    symlink(&group, node.root.join(PCI).join("0000:0b:00.0/iommu_group")).unwrap();
}

#[test]
fn iommu_translation_or_passthrough() {
    one(
        &healthy("iommu-none").check("iommu"),
        Severity::Pass,
        "no IOMMU group: DMA is not translated",
    );

    let identity = healthy("iommu-pt");
    iommu_group(&identity, "identity");
    one(
        &identity.check("iommu"),
        Severity::Pass,
        "IOMMU passthrough (identity)",
    );

    let mut dma = healthy("iommu-dma");
    iommu_group(&dma, "DMA-FQ");
    dma.write("proc/cmdline", "BOOT_IMAGE=/vmlinuz intel_iommu=on\n");
    let f = one(
        &dma.check("iommu"),
        Severity::Warn,
        "IOMMU translates DMA (DMA-FQ)",
    );
    assert!(f.fix.unwrap().contains("iommu=pt"));
    assert_eq!(f.evidence[1].value, "BOOT_IMAGE=/vmlinuz intel_iommu=on");
    dma.hypervisor = Some("DMI sys_vendor = QEMU".into());
    one(&dma.check("iommu"), Severity::Info, "expected in a VM");
}

#[test]
fn firmware_must_match_across_devices() {
    let mut node = healthy("fw");
    node.nic("mlx5_1", Some("0000:0c:00.0"), &Port::default());
    one(
        &node.check("versions.firmware"),
        Severity::Pass,
        "28.39.1002 on mlx5_0 mlx5_1",
    );
    fs::write(
        node.root.join("sys/class/infiniband/mlx5_1/fw_ver"),
        "28.41.1000\n",
    )
    .unwrap();
    one(
        &node.check("versions.firmware"),
        Severity::Warn,
        "used devices run different firmware: 28.39.1002 on mlx5_0; 28.41.1000 on mlx5_1",
    );

    let mut soft = Node::new("fw-soft");
    soft.nic("rxe0", None, &Port::default());
    one(
        &soft.check("versions.firmware"),
        Severity::Skip,
        "no device reports a firmware version",
    );
}

#[test]
fn configuration_with_origins_as_nccl_builds_it() {
    let mut node = healthy("env");
    node.write(
        "etc/nccl.conf",
        "# site defaults\nNCCL_IB_GID_INDEX=1\nNCCL_IB_TC=106\nNCCL_IB_SL =3\n",
    );
    node.write("home/u/.nccl.conf", "NCCL_IB_TC=41\n");
    node.env("HOME", "/home/u").env("NCCL_IB_TIMEOUT", "22");
    let findings = node.check("env.config");
    let info = findings
        .iter()
        .find(|f| f.severity == Severity::Info)
        .unwrap();
    assert!(
        info.what.contains("NCCL_IB_GID_INDEX=1 (/etc/nccl.conf:2)")
            && info.what.contains("NCCL_IB_TC=41 (/home/u/.nccl.conf:1)")
            && info.what.contains("NCCL_IB_TIMEOUT=22 (environment)"),
        "{}",
        info.what
    );
    let hca = info
        .evidence
        .iter()
        .find(|e| e.source == "NCCL_IB_HCA")
        .unwrap();
    assert_eq!(hca.value, "unset (default unset)");
    has(
        &findings,
        Severity::Warn,
        "/etc/nccl.conf",
        "line 4: 'NCCL_IB_SL ' has spaces around the name",
    );

    // NCCL_CONF_FILE replaces ~/.nccl.conf; the environment still wins over files.
    node.write("site/nccl.conf", "NCCL_IB_TC=8\nNCCL_IB_TIMEOUT=30\n");
    node.env("NCCL_CONF_FILE", "/site/nccl.conf");
    let info = node
        .check("env.config")
        .into_iter()
        .find(|f| f.severity == Severity::Info)
        .unwrap();
    assert!(
        info.what.contains("NCCL_IB_TC=8 (/site/nccl.conf:1)"),
        "{}",
        info.what
    );
    assert!(
        info.what.contains("NCCL_IB_TIMEOUT=22 (environment)"),
        "{}",
        info.what
    );

    let mut bad = healthy("env-bad");
    bad.env("NCCL_IB_QPS_PER_CONNECTION", "99");
    has(
        &bad.check("env.config"),
        Severity::Fail,
        "plugin",
        "init would refuse: NCCL_IB_QPS_PER_CONNECTION='99' is not valid",
    );

    let mut nothing = healthy("env-hca");
    nothing.env("NCCL_IB_HCA", "mlx5_7");
    has(
        &nothing.check("env.config"),
        Severity::Fail,
        "NCCL_IB_HCA",
        "NCCL_IB_HCA='mlx5_7' matches no active port",
    );
}

/// A site tuned for NCCL's internal IB transport may set its options; with this plugin they
/// change nothing, and each one set is a WARN with where it came from (NCCL 2.30's net_ib
/// reads them: `NCCL_PARAM`s of `src/transport/net_ib/` and `src/misc/ibvwrap.cc`).
#[test]
fn options_of_nccls_ib_transport_that_do_nothing_here_are_named() {
    let mut node = healthy("env-nccl-ib");
    node.write("etc/nccl.conf", "NCCL_IB_OOO_RQ=1\nNCCL_IB_USE_INLINE=\n");
    node.env("NCCL_IB_SUBNET_AWARE_ROUTING", "1");
    let findings = node.check("env.config");
    has(
        &findings,
        Severity::Warn,
        "NCCL_IB_OOO_RQ",
        "NCCL_IB_OOO_RQ=1 (/etc/nccl.conf:1) has no effect: this plugin does not implement it; \
         in NCCL's internal IB transport (default 0) it is for: mlx5 out-of-order receive queues",
    );
    has(
        &findings,
        Severity::Warn,
        "NCCL_IB_SUBNET_AWARE_ROUTING",
        "NCCL_IB_SUBNET_AWARE_ROUTING=1 (environment) has no effect",
    );
    has(
        &findings,
        Severity::Warn,
        "NCCL_IB_SUBNET_AWARE_ROUTING",
        "fix: unset NCCL_IB_SUBNET_AWARE_ROUTING where this plugin carries the traffic",
    );
    let warned: Vec<&str> = findings
        .iter()
        .filter(|f| f.severity == Severity::Warn)
        .map(|f| f.entity.as_str())
        .collect();
    assert_eq!(
        warned,
        ["NCCL_IB_OOO_RQ", "NCCL_IB_SUBNET_AWARE_ROUTING"],
        "an empty value is unset, as the plugin reads it"
    );
    assert!(
        healthy("env-plain")
            .check("env.config")
            .iter()
            .all(|f| f.severity != Severity::Warn),
        "nothing set, nothing said"
    );
}

#[test]
fn plugin_load_follows_nccls_search_and_its_choice() {
    // The default: libnccl-net.so on the library path is this plugin.
    let mut node = healthy("load");
    let pass = one(
        &node.check("plugin.load"),
        Severity::Pass,
        "NCCL_NET_PLUGIN unset: NCCL opens libnccl-net.so = /usr/lib/libnccl-net.so (RsIB, ncclNet v12, v11, v10, v9, v8)",
    );
    assert_eq!(pass.evidence[0].source, "dlopen(libnccl-net.so)");

    // Another plugin listed first (found as libnccl-net-ofi.so, NCCL's second try for a bare
    // name) wins whenever its init finds a device: NCCL 2.30 assigns the first that starts.
    node.libraries = vec![
        (
            "libnccl-net-ofi.so",
            plugin("/opt/ofi/libnccl-net-ofi.so", "AWS Libfabric"),
        ),
        (
            "libnccl-net-rsib.so",
            plugin("/opt/rsib/libnccl-net-rsib.so", "RsIB"),
        ),
    ];
    node.write("etc/nccl.conf", "NCCL_NET_PLUGIN=ofi,rsib\n");
    let warn = one(
        &node.check("plugin.load"),
        Severity::Warn,
        "NCCL_NET_PLUGIN=ofi,rsib (/etc/nccl.conf:1): NCCL opens libnccl-net-rsib.so = /opt/rsib/libnccl-net-rsib.so (RsIB, ncclNet v12, v11, v10, v9, v8); but NCCL_NET_PLUGIN lists libnccl-net-ofi.so (AWS Libfabric) before it",
    );
    assert!(
        warn.fix.as_deref().unwrap().contains("NCCL_NET=RsIB"),
        "{}",
        warn.line()
    );
    let tried: Vec<&str> = warn.evidence.iter().map(|e| e.source.as_str()).collect();
    assert_eq!(
        tried,
        [
            "dlopen(ofi)",
            "dlopen(libnccl-net-ofi.so)",
            "dlopen(rsib)",
            "dlopen(libnccl-net-rsib.so)"
        ]
    );
    // NCCL_NET picks this one by name (case-insensitively, as NCCL compares).
    node.env("NCCL_NET", "rsib");
    one(
        &node.check("plugin.load"),
        Severity::Pass,
        "which NCCL_NET selects",
    );

    // NCCL_NET naming another network: loaded, never used.
    node.env("NCCL_NET", "IB");
    let findings = node.check("plugin.load");
    has(
        &findings,
        Severity::Fail,
        "NCCL_NET",
        "NCCL_NET=IB: NCCL uses only the network named 'IB', never this plugin (RsIB)",
    );

    // Only another plugin: NCCL uses it.
    let mut other = healthy("load-other");
    other.libraries = vec![(
        "libnccl-net.so",
        plugin("/usr/lib/libnccl-net.so", "IBext_v11"),
    )];
    let fail = one(
        &other.check("plugin.load"),
        Severity::Fail,
        "NCCL_NET_PLUGIN unset: NCCL does not load this plugin: libnccl-net.so = /usr/lib/libnccl-net.so (IBext_v11, ncclNet v12, v11, v10, v9, v8): another plugin; NCCL uses IBext_v11 instead",
    );
    assert!(
        fail.fix.as_deref().unwrap().contains("scripts/install.sh"),
        "{}",
        fail.line()
    );

    // Nothing on the path, and NCCL_IB_DISABLE: sockets.
    let mut absent = healthy("load-absent");
    absent.libraries.clear();
    absent
        .env("LD_LIBRARY_PATH", "/opt/none")
        .env("NCCL_IB_DISABLE", "1");
    let fail = one(
        &absent.check("plugin.load"),
        Severity::Fail,
        "libnccl-net.so not found on the library path; NCCL falls back to sockets (NCCL_IB_DISABLE=1)",
    );
    assert!(
        fail.evidence
            .iter()
            .any(|e| e.source == "LD_LIBRARY_PATH" && e.value == "/opt/none"),
        "{}",
        fail.line()
    );
    // With NCCL_NET naming this plugin, NCCL does not start at all.
    absent.env("NCCL_NET", "RsIB");
    one(
        &absent.check("plugin.load"),
        Severity::Fail,
        "NCCL then fails to start (\"Failed to initialize any NET plugin\")",
    );

    // NCCL_IB_DISABLE does not turn this plugin off.
    let mut disabled = healthy("load-ibdisable");
    disabled.env("NCCL_IB_DISABLE", "1");
    let findings = disabled.check("plugin.load");
    has(
        &findings,
        Severity::Pass,
        "plugin",
        "NCCL opens libnccl-net.so",
    );
    has(
        &findings,
        Severity::Info,
        "NCCL_IB_DISABLE",
        "turns off NCCL's internal IB transport only",
    );

    // none; a library without tables; the application's own symbols.
    let mut none = healthy("load-none");
    none.env("NCCL_NET_PLUGIN", "none");
    one(
        &none.check("plugin.load"),
        Severity::Fail,
        "NCCL_NET_PLUGIN=none (environment): NCCL does not load this plugin: it opens no external plugin",
    );
    none.libraries = vec![(
        "/usr/lib/libibverbs.so.1",
        Exports {
            path: "/usr/lib/libibverbs.so.1".into(),
            versions: Vec::new(),
            name: None,
        },
    )];
    none.env("NCCL_NET_PLUGIN", "/usr/lib/libibverbs.so.1");
    one(
        &none.check("plugin.load"),
        Severity::Fail,
        "exports no ncclNetPlugin_v6 .. v12 (NCCL skips it as unsupported)",
    );
    none.env("NCCL_NET_PLUGIN", "STATIC_PLUGIN");
    one(
        &none.check("plugin.load"),
        Severity::Unknown,
        "cannot tell whether NCCL loads this plugin",
    );
}

#[test]
fn plugin_devices_lists_what_nccl_gets() {
    let mut node = Node::new("devs");
    let (f0, f1) = ("0000:0b:00.0", "0000:0b:00.1");
    node.nic("mlx5_0", Some(f0), &Port::default())
        .nic("mlx5_1", Some(f1), &Port::default());
    node.nic(
        "mlx5_2",
        Some("0000:0c:00.0"),
        &Port {
            state: 1,
            phys_state: 2,
            ..Port::default()
        },
    );
    let f = one(
        &node.check("plugin.devices"),
        Severity::Pass,
        "NCCL gets 1 device(s): [0] mlx5_0+mlx5_1 (RoCE 800 Gb/s); not used: mlx5_2:1 is DOWN (not ACTIVE)",
    );
    assert!(
        f.evidence
            .iter()
            .any(|e| e.source == "fusion" && e.value.starts_with("fused mlx5_0+mlx5_1"))
    );

    let mut none = Node::new("devs-none");
    none.nic(
        "mlx5_0",
        Some(f0),
        &Port {
            state: 1,
            phys_state: 2,
            ..Port::default()
        },
    );
    one(
        &none.check("plugin.devices"),
        Severity::Fail,
        "NCCL would get 0 devices and fall back to sockets: no active IB/RoCE port (mlx5_0:1 is DOWN (not ACTIVE))",
    );
    // Port checks still judge the one port there is; device checks say why they cannot.
    one(
        &none.check("mtu"),
        Severity::Skip,
        "no device to check (see plugin.devices)",
    );
}

/// NCCL 2.24 to 2.29 (ncclNet v9 to v11) list at most 4 ports per device, and the plugin
/// refuses a larger `NCCL_NET_RS_FUSE` group at their init: the doctor, which cannot know the
/// job's NCCL, warns about such a group and passes one of 4.
#[test]
fn plugin_devices_warns_of_a_fuse_group_older_tables_refuse() {
    let mut node = Node::new("devs-five");
    let names = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"];
    for (i, name) in names.iter().enumerate() {
        node.nic(
            name,
            Some(&format!("0000:{:02x}:00.0", 0x10 + i)),
            &Port::default(),
        );
    }
    node.env("NCCL_NET_RS_FUSE", &names.join("+"));
    let findings = node.check("plugin.devices");
    has(
        &findings,
        Severity::Pass,
        "plugin",
        "NCCL gets 1 device(s): [0] mlx5_0+mlx5_1+mlx5_2+mlx5_3+mlx5_4",
    );
    has(
        &findings,
        Severity::Warn,
        "mlx5_0+mlx5_1+mlx5_2+mlx5_3+mlx5_4",
        "NCCL_NET_RS_FUSE group of 5 ports: ncclNet v9 to v11 (NCCL 2.24 to 2.29) describe at most \
         4 ports per device, so under those NCCL versions the plugin refuses the group at init",
    );
    let mut four = Node::new("devs-four");
    for (i, name) in names[..4].iter().enumerate() {
        four.nic(
            name,
            Some(&format!("0000:{:02x}:00.0", 0x10 + i)),
            &Port::default(),
        );
    }
    four.env("NCCL_NET_RS_FUSE", &names[..4].join("+"));
    one(
        &four.check("plugin.devices"),
        Severity::Pass,
        "NCCL gets 1 device(s): [0] mlx5_0+mlx5_1+mlx5_2+mlx5_3",
    );
}

#[test]
fn a_fused_device_with_a_member_down_is_degraded_not_failed() {
    let down = Port {
        state: 1,
        phys_state: 2,
        ..Port::default()
    };
    // The two ports of one NIC (functions .0 and .1): fused while both are up.
    let node = |name: &str, second: &Port| {
        let mut node = Node::new(name);
        node.nic("mlx5_0", Some("0000:0b:00.0"), &Port::default())
            .nic("mlx5_1", Some("0000:0b:00.1"), second);
        node
    };
    let half = node("degraded", &down);
    let findings = half.check("plugin.devices");
    assert_eq!(findings.len(), 2, "{findings:#?}");
    has(
        &findings,
        Severity::Pass,
        "plugin",
        "NCCL gets 1 device(s): [0] mlx5_0 (RoCE 400 Gb/s); not used: mlx5_1:1 is DOWN (not ACTIVE)",
    );
    has(
        &findings,
        Severity::Warn,
        "mlx5_0+mlx5_1",
        "degraded: mlx5_1:1 is DOWN (phys Polling); NCCL gets 1 of its 2 members (mlx5_0:1, 400 Gb/s)",
    );
    let warn = findings
        .iter()
        .find(|f| f.severity == Severity::Warn)
        .unwrap();
    assert!(
        warn.fix
            .as_deref()
            .unwrap()
            .starts_with("bring mlx5_1:1 back")
    );
    // No failure anywhere: the spare port itself is a warning, the node still works.
    assert!(
        node_checks(&half.facts())
            .iter()
            .all(|f| f.severity != Severity::Fail)
    );

    // The port itself: a warning that names the device carrying on, even when NCCL_IB_HCA names
    // it (a named port down is otherwise a failure).
    let mut named = node("degraded-named", &down);
    named.env("NCCL_IB_HCA", "mlx5_0,mlx5_1");
    for n in [&half, &named] {
        has(
            &n.check("port.state"),
            Severity::Warn,
            "mlx5_1:1",
            "; mlx5_0+mlx5_1 carries on without it (degraded, see plugin.devices)",
        );
        assert!(
            node_checks(&n.facts())
                .iter()
                .all(|f| f.severity != Severity::Fail)
        );
    }

    // Not degraded: both up; fusion turned off; every member down (gone, not degraded).
    let whole = node("degraded-whole", &Port::default());
    one(
        &whole.check("plugin.devices"),
        Severity::Pass,
        "[0] mlx5_0+mlx5_1",
    );
    let mut unfused = node("degraded-unfused", &down);
    unfused.env("NCCL_IB_MERGE_NICS", "0");
    one(
        &unfused.check("plugin.devices"),
        Severity::Pass,
        "[0] mlx5_0 ",
    );
    let mut gone = Node::new("degraded-gone");
    gone.nic("mlx5_0", Some("0000:0b:00.0"), &down)
        .nic("mlx5_1", Some("0000:0b:00.1"), &down);
    one(
        &gone.check("plugin.devices"),
        Severity::Fail,
        "NCCL would get 0 devices",
    );
}

/// `/dev/kmsg` records as the kernel hands them out: `PRI,SEQ,MICROS,FLAGS;TEXT`, a dictionary
/// continuation line after some. Priority 3 = facility 0 (the kernel), level 3; 11 = facility 1
/// (user space: `echo > /dev/kmsg`), level 3.
const KMSG: &str = "\
6,1,0,-;Linux version 6.1.0-28-amd64
6,2,1500000,-;mlx5_core 0000:0b:00.0: firmware version: 28.39.1002
 SUBSYSTEM=pci
 DEVICE=+pci:0000:0b:00.0
3,3,7200000000,-;mlx5_core 0000:0b:00.0: wait_func:1162:(pid 812): ACCESS_REG(0x805) timeout. Will cause a leak of a command resource
3,4,7260500000,-;mlx5_core 0000:0b:00.0: wait_func:1162:(pid 812): QUERY_VPORT_COUNTER(0x770) timeout. Will cause a leak of a command resource
4,5,8000000000,-;mlx5_core 0000:3b:00.0: mlx5_pcie_event:301:(pid 0): Detected insufficient power on the PCIe slot (27W).
3,6,8100000000,-;nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing
11,7,8200000000,-;mlx5_core 0000:0b:00.0: health compromised - reached miss count
";

#[test]
fn kernel_log_reports_nic_and_peermem_lines_per_device_and_ignores_user_space() {
    let clean = healthy("klog-ok");
    let f = one(
        &clean.check("kernel.log"),
        Severity::Pass,
        "no NIC or GPUDirect error among 0 kernel records (empty)",
    );
    assert_eq!(f.evidence[0].source, "/dev/kmsg");

    let node = healthy("klog");
    node.write("dev/kmsg", KMSG);
    let findings = node.check("kernel.log");
    assert_eq!(
        findings.len(),
        3,
        "{:#?}",
        findings.iter().map(Finding::line).collect::<Vec<_>>()
    );
    // Both timeouts (the first names ACCESS_REG too: first sign wins) on the used device.
    has(
        &findings,
        Severity::Fail,
        "mlx5_0",
        "the NIC's firmware stopped answering a command: 2 time(s) in the log, last at 7260.5 s after boot: \"mlx5_core 0000:0b:00.0: wait_func:1162:(pid 812): QUERY_VPORT_COUNTER(0x770) timeout.",
    );
    has(
        &findings,
        Severity::Warn,
        "0000:3b:00.0",
        "the NIC reports too little power from its PCIe slot (a PCI function NCCL does not use here): 1 time(s) in the log",
    );
    has(
        &findings,
        Severity::Warn,
        "node",
        "nvidia-peermem saw GPU memory released while the NIC still had it registered",
    );
    let timeout = findings
        .iter()
        .find(|f| f.severity == Severity::Fail)
        .unwrap();
    assert!(timeout.fix.as_deref().unwrap().contains("reboot the node"));
    assert_eq!(timeout.evidence[0].source, "/dev/kmsg record 4");
    // The user-space "health compromised" line is not the kernel's word.
    assert!(findings.iter().all(|f| !f.line().contains("compromised")));

    // Only user-space lines: a pass that says it left them alone. A record cut at the end of the
    // file (a read that stopped mid-line) is not taken.
    let user = healthy("klog-user");
    user.write(
        "dev/kmsg",
        "6,1,0,-;Linux version 6.1.0\n12,2,5,-;health compromised (typed by hand)\n3,3,9,-;mlx5_core health comp",
    );
    one(
        &user.check("kernel.log"),
        Severity::Pass,
        "no NIC or GPUDirect error among 1 kernel records (from 0.0 s after boot); 1 record(s) written from user space not judged",
    );

    let container = healthy("klog-none");
    fs::remove_file(container.root.join("dev/kmsg")).unwrap();
    let f = one(
        &container.check("kernel.log"),
        Severity::Unknown,
        "no /dev/kmsg (containers usually have none: run the doctor on the host)",
    );
    assert_eq!(f.fix.as_deref(), Some("run the doctor as root on the host"));
}

#[test]
fn a_healthy_node_has_no_failure_and_every_check_speaks() {
    let findings = node_checks(&healthy("all").facts());
    assert!(
        findings.iter().all(|f| f.severity != Severity::Fail),
        "{:#?}",
        findings.iter().map(Finding::line).collect::<Vec<_>>()
    );
    for (id, _) in nccl_net::doctor::CHECKS {
        assert!(findings.iter().any(|f| f.check == *id), "{id} said nothing");
    }
}

#[test]
fn software_only_node_is_never_called_a_pass_where_nothing_was_measured() {
    let mut node = Node::new("soft");
    node.nic("rxe0", None, &Port::default());
    let findings = node_checks(&node.facts());
    for id in [
        "pcie.link",
        "pcie.acs",
        "iommu",
        "versions.firmware",
        "topo.numa",
        "relaxed.ordering",
        "link.rate",
    ] {
        assert!(
            findings
                .iter()
                .filter(|f| f.check == id)
                .all(|f| matches!(f.severity, Severity::Skip | Severity::Info)),
            "{id}: {:#?}",
            findings.iter().map(Finding::line).collect::<Vec<_>>()
        );
    }
}
