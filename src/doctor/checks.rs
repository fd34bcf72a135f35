//! The node checks: each judges [`NodeFacts`] and returns findings, never touching hardware
//! itself (the facts carry verbs' answers and the plugin's decisions), so every branch is
//! tested on fixture trees.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::facts::{
    KernelRecord, NodeFacts, Opened, Origin, PluginEntry, Setting, candidate_devices,
};
use super::finding::{Finding, Severity};
use super::pcie::{PcieLink, acs_control, acs_redirects, relaxed_ordering_enabled};
use super::rows::{hca_port, pcie_function_dir, port_netdev};
use crate::core::config::{AddrFamily, NOT_IMPLEMENTED};
use crate::driver::Exports;
use crate::plugin::PLUGIN_NAME;
use crate::topology::{
    DmaBuf, GidEntry, GidPolicy, HcaFilter, HcaPort, LinkLayer, NetDevice, PORT_ACTIVE, PciAddress,
    PeerMem, choose_gid, dmabuf_both_sides, mtu_bytes, phys_state_name, pkey_at, port_state_name,
};

/// Every node check: id and what it looks at, in report order (README lists them).
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
        "the devices NCCL will get from the plugin, the ports left out and the fusions made",
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

fn verbs_provider(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "verbs.provider";
    let in_sysfs: Vec<String> = candidate_devices(&facts.roots, None)
        .into_iter()
        .map(|(d, _)| d)
        .collect();
    let discovery = match &facts.survey.discovery {
        Err(why) => {
            return vec![
                Finding::new(Severity::Fail, CHECK, "node", why.clone())
                    .fix("`ibv_devices` must list the NIC: check `lsmod | grep ib_` and `dmesg` for its RDMA driver")
                    .evidence("ibv_get_device_list()", why.clone()),
            ];
        }
        Ok(d) => d,
    };
    if discovery.device_count == 0 {
        let what = if in_sysfs.is_empty() {
            "no RDMA device: /sys/class/infiniband is empty and libibverbs lists none".to_owned()
        } else {
            format!(
                "sysfs shows {} but libibverbs lists no device: no provider library matches them",
                in_sysfs.join(", ")
            )
        };
        let fix = if in_sysfs.is_empty() {
            "load the NIC's RDMA driver (mlx5_ib), or rdma_rxe for Soft-RoCE"
        } else {
            "install the rdma-core provider for the driver (ibverbs-providers, libmlx5) matching the \
             host's kernel; in a container use the same rdma-core generation as the host"
        };
        return vec![
            Finding::new(Severity::Fail, CHECK, "node", what)
                .fix(fix)
                .evidence("/sys/class/infiniband", in_sysfs.join(" "))
                .evidence("ibv_get_device_list()", "0 devices"),
        ];
    }
    let mut findings: Vec<Finding> = discovery
        .problems
        .iter()
        .map(|problem| {
            let device = problem.split(':').next().unwrap_or("node").to_owned();
            Finding::new(Severity::Fail, CHECK, device, problem.clone())
                .fix("see dev.nodes for the device node; check that the provider matches the kernel driver")
                .evidence("ibv_open_device / ibv_query_device / ibv_query_port", problem.clone())
        })
        .collect();
    if findings.is_empty() {
        let mut names: Vec<&str> = discovery.ports.iter().map(|p| p.device.as_str()).collect();
        names.dedup();
        findings.push(
            Finding::new(
                Severity::Pass,
                CHECK,
                "node",
                format!(
                    "libibverbs lists {} device(s) and opens them: {}",
                    discovery.device_count,
                    names.join(", ")
                ),
            )
            .evidence("/sys/class/infiniband", in_sysfs.join(" "))
            .evidence(
                "ibv_get_device_list()",
                format!("{} devices", discovery.device_count),
            ),
        );
    }
    findings
}

/// The effective user id, from `/proc/self/status`.
fn uid(facts: &NodeFacts) -> String {
    facts
        .roots
        .read("/proc/self/status")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_else(|| "?".to_owned())
}

fn dev_nodes(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "dev.nodes";
    if facts.dev_nodes.is_empty() {
        return vec![
            Finding::new(
                Severity::Skip,
                CHECK,
                "node",
                "no RDMA device the plugin would open (none in sysfs, or NCCL_IB_HCA selects none)",
            )
            .depends_on("verbs.provider"),
        ];
    }
    facts
        .dev_nodes
        .iter()
        .map(|n| {
            let f = match &n.open {
                Ok(()) => Finding::new(
                    Severity::Pass,
                    CHECK,
                    &n.device,
                    format!("{} opens read-write", n.path),
                ),
                Err((errno, msg)) => {
                    let (what, fix) = match *errno {
                        libc::ENOENT => (
                            format!("{} is missing (the container has no /dev/infiniband)", n.path),
                            "expose the device: docker/podman `--device=/dev/infiniband`, Kubernetes \
                             the RDMA device plugin's resource (e.g. rdma/rdma_shared_device_a), or \
                             `--privileged` for a test"
                                .to_owned(),
                        ),
                        libc::EACCES | libc::EPERM => (
                            format!(
                                "{} cannot be opened read-write by uid {} ({msg})",
                                n.path,
                                uid(facts)
                            ),
                            format!(
                                "give the user access: `chmod 666 {}` or rdma-core's udev rule \
                                 (MODE=\"0666\" for uverbs), or a group the node belongs to",
                                n.path
                            ),
                        ),
                        libc::ENODEV => (
                            "no verbs node: ib_uverbs is not loaded".to_owned(),
                            "modprobe ib_uverbs".to_owned(),
                        ),
                        _ => (format!("{} cannot be opened: {msg}", n.path), "check the device node".to_owned()),
                    };
                    Finding::new(Severity::Fail, CHECK, &n.device, what).fix(fix)
                }
            };
            f.evidence(
                format!("open({}, O_RDWR)", n.path),
                match &n.open {
                    Ok(()) => "ok".to_owned(),
                    Err((_, m)) => m.clone(),
                },
            )
        })
        .collect()
}

fn memlock(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "memlock";
    let m = &facts.memlock;
    let b = facts.budget;
    let need = b.total();
    let nccl_part = if b.nccl_bytes == 0 {
        "NCCL's buffers are in GPU memory".to_owned()
    } else {
        format!(
            "NCCL 2 x {} NCCL_BUFFSIZE in host memory",
            bytes(b.nccl_bytes / 2)
        )
    };
    let need_text = format!(
        "{} needed for {} connections (plugin {} + {nccl_part}, each)",
        bytes(need),
        b.connections,
        bytes(b.plugin_bytes)
    );
    let f = if m.cap_ipc_lock {
        Finding::new(
            Severity::Pass,
            CHECK,
            "process",
            format!("CAP_IPC_LOCK is effective, so the limit does not apply; {need_text}"),
        )
    } else {
        match &m.soft {
            Err(why) => Finding::new(
                Severity::Unknown,
                CHECK,
                "process",
                format!("limit unreadable: {why}"),
            ),
            Ok(None) => Finding::new(
                Severity::Pass,
                CHECK,
                "process",
                format!("unlimited; {need_text}"),
            ),
            Ok(Some(limit)) if *limit >= need => Finding::new(
                Severity::Info,
                CHECK,
                "process",
                format!(
                    "limit {} covers {need_text}; more ranks per process need more",
                    bytes(*limit)
                ),
            ),
            Ok(Some(limit)) => {
                let hard = match m.hard {
                    None => "the hard limit is unlimited, so `ulimit -l unlimited` in the job script works".to_owned(),
                    Some(h) => format!("the hard limit is {}", bytes(h)),
                };
                Finding::new(
                    Severity::Fail,
                    CHECK,
                    "process",
                    format!(
                        "locked-memory limit {} < {need_text}: registrations fail with ENOMEM",
                        bytes(*limit)
                    ),
                )
                .fix(format!(
                    "raise it where the job starts: docker `--ulimit memlock=-1`, Kubernetes via \
                     the container runtime's LimitMEMLOCK=infinity, Slurm `PropagateResourceLimits` \
                     and slurmd's LimitMEMLOCK=infinity, /etc/security/limits.conf `* - memlock \
                     unlimited`; {hard}"
                ))
            }
        }
    };
    vec![
        f.evidence("/proc/self/limits", m.evidence.clone())
            .evidence(
                "/proc/self/status CapEff CAP_IPC_LOCK",
                m.cap_ipc_lock.to_string(),
            )
            .evidence("budget bytes", need.to_string()),
    ]
}

/// What a port's state means, in words, and what to do about it.
fn explain_state(p: &HcaPort, netdev: Option<(&str, Option<String>)>) -> (String, String) {
    let state = port_state_name(p.state);
    let phys = phys_state_name(p.phys_state);
    match (p.state, p.phys_state, netdev) {
        (2 | 3, ..) => (
            format!(
                "{state}: the link is up but no subnet manager has configured the port (phys {phys})"
            ),
            "start or check the subnet manager (opensm, UFM) on this fabric".to_owned(),
        ),
        (_, _, Some((ifname, Some(oper)))) if oper != "up" && oper != "unknown" => (
            format!("{state}: its netdev {ifname} is {oper} (phys {phys})"),
            format!("`ip link set {ifname} up`; then check the cable and the switch port"),
        ),
        (_, 2, _) => (
            format!("{state}, phys Polling: no cable or no peer on the other end"),
            "check the cable or transceiver and that the switch port is enabled".to_owned(),
        ),
        (_, 3, _) => (
            format!("{state}, phys Disabled: administratively down"),
            "enable the port (switch or `ibportstate`)".to_owned(),
        ),
        _ => (
            format!("{state} (phys {phys})"),
            "check the cable, the switch port and `dmesg` for the NIC driver".to_owned(),
        ),
    }
}

fn port_state(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "port.state";
    let Ok(discovery) = &facts.survey.discovery else {
        return nothing_to_check(CHECK, facts).unwrap_or_default();
    };
    let filter = facts
        .config
        .ib_hca
        .as_deref()
        .and_then(|v| HcaFilter::parse(v).ok());
    let usable = facts.survey.selection.is_ok();
    let sysfs = facts.roots.sysfs();
    let findings: Vec<Finding> = discovery
        .ports
        .iter()
        .filter(|p| filter.as_ref().is_none_or(|f| f.allows(&p.device, p.port)))
        .map(|p| {
            let entity = format!("{}:{}", p.device, p.port);
            let netdev = (p.link_layer == LinkLayer::Ethernet)
                .then(|| port_netdev(facts, &p.device, p.port))
                .flatten()
                .map(|n| {
                    let oper = sysfs.read_value(&format!("class/net/{n}/operstate"));
                    (n, oper)
                });
            let evidence = |f: Finding| {
                let f = ["state", "phys_state"].iter().fold(f, |f, name| {
                    f.evidence(
                        port_path(&p.device, p.port, name),
                        sysfs
                            .read_value(&format!(
                                "class/infiniband/{}/ports/{}/{name}",
                                p.device, p.port
                            ))
                            .unwrap_or_default(),
                    )
                });
                match &netdev {
                    Some((n, oper)) => f.evidence(
                        format!("/sys/class/net/{n}/operstate"),
                        oper.clone().unwrap_or_default(),
                    ),
                    None => f,
                }
            };
            if p.state == PORT_ACTIVE {
                let what = match p.link_layer {
                    LinkLayer::InfiniBand => {
                        format!("ACTIVE, LinkUp, LID {}, SM LID {}", p.lid, p.sm_lid)
                    }
                    _ => format!(
                        "ACTIVE, {}{}",
                        phys_state_name(p.phys_state),
                        netdev
                            .as_ref()
                            .map(|(n, _)| format!(", netdev {n}"))
                            .unwrap_or_default()
                    ),
                };
                return evidence(Finding::new(Severity::Pass, CHECK, entity, what));
            }
            let (what, fix) =
                explain_state(p, netdev.as_ref().map(|(n, o)| (n.as_str(), o.clone())));
            // A port the operator named, or the last hope for any device, is a failure; an
            // unused spare port is only worth a warning.
            let (severity, note) = if filter.is_some() || !usable {
                (Severity::Fail, "")
            } else {
                (Severity::Warn, "; NCCL will not use it")
            };
            evidence(Finding::new(severity, CHECK, entity, format!("{what}{note}")).fix(fix))
        })
        .collect();
    if findings.is_empty() {
        return vec![
            Finding::new(
                Severity::Skip,
                CHECK,
                "node",
                "no port to check (NCCL_IB_HCA allows none)",
            )
            .depends_on("env.config"),
        ];
    }
    findings
}

fn link_rate(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "link.rate";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let sysfs = facts.roots.sysfs();
    let ports = used_ports(facts);
    ports
        .iter()
        .map(|(m, _)| {
            let fastest = ports
                .iter()
                .filter(|(o, _)| o.link_layer == m.link_layer && o.pci.is_some())
                .map(|(o, _)| o.speed_mbps)
                .max()
                .unwrap_or(m.speed_mbps);
            let rate_text = sysfs
                .read_value(&format!("class/infiniband/{}/ports/{}/rate", m.device, m.port))
                .unwrap_or_default();
            let f = if m.pci.is_none() {
                Finding::new(
                    Severity::Info,
                    CHECK,
                    &m.name,
                    format!("software device: nominal {}, not compared", gbps(m.speed_mbps.into())),
                )
            } else if m.speed_mbps < fastest {
                Finding::new(
                    Severity::Warn,
                    CHECK,
                    &m.name,
                    format!(
                        "runs at {} while the fastest {} port runs at {}",
                        gbps(m.speed_mbps.into()),
                        m.link_layer,
                        gbps(fastest.into())
                    ),
                )
                .fix("check the cable and the switch port speed (`ibdiagnet --ls`, `ethtool`), reseat or replace the cable")
            } else {
                Finding::new(Severity::Pass, CHECK, &m.name, gbps(m.speed_mbps.into()))
            };
            f.evidence(port_path(&m.device, m.port, "rate"), rate_text)
        })
        .collect()
}

fn mtu(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "mtu";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let sysfs = facts.roots.sysfs();
    let ports = used_ports(facts);
    let mut findings: Vec<Finding> = ports
        .iter()
        .map(|(m, p)| {
            let Some(p) = p else {
                return Finding::new(Severity::Unknown, CHECK, &m.name, "port not queried");
            };
            let (active, max) = (mtu_bytes(p.active_mtu), mtu_bytes(p.max_mtu));
            let netdev = port_netdev(facts, &m.device, m.port)
                .filter(|_| m.link_layer == LinkLayer::Ethernet)
                .map(|n| {
                    let mtu = sysfs.read_value(&format!("class/net/{n}/mtu"));
                    (n, mtu)
                });
            let mut f = if active < max {
                let (why, fix) = match &netdev {
                    Some((n, mtu)) => (
                        format!(", netdev {n} MTU {}", mtu.as_deref().unwrap_or("?")),
                        format!(
                            "set the MTU of {n} (and of the switch ports) to at least {} for an \
                             active MTU of {max}: `ip link set {n} mtu 9000`",
                            max + 104
                        ),
                    ),
                    None => (
                        String::new(),
                        "raise the MTU of the subnet (the SM's partition config) or check the peer port".to_owned(),
                    ),
                };
                Finding::new(
                    Severity::Warn,
                    CHECK,
                    &m.name,
                    format!("active MTU {active} < max {max}{why}: more packets per message, lower bandwidth"),
                )
                .fix(fix)
            } else {
                Finding::new(Severity::Pass, CHECK, &m.name, format!("active MTU {active} (max {max})"))
            };
            f = f.evidence(format!("ibv_query_port({}, {}) active_mtu/max_mtu", m.device, m.port), format!("{active}/{max}"));
            if let Some((n, mtu)) = netdev {
                f = f.evidence(format!("/sys/class/net/{n}/mtu"), mtu.unwrap_or_default());
            }
            f
        })
        .collect();
    let mut actives: Vec<(u32, &str)> = ports
        .iter()
        .filter_map(|(m, p)| Some((mtu_bytes(p.as_ref()?.active_mtu), m.name.as_str())))
        .collect();
    actives.sort_unstable();
    if let (Some(low), Some(high)) = (actives.first(), actives.last())
        && low.0 != high.0
    {
        findings.push(
            Finding::new(
                Severity::Warn,
                CHECK,
                "node",
                format!(
                    "used ports differ in active MTU ({} {} .. {} {}): connections between them use the smaller",
                    low.1, low.0, high.1, high.0
                ),
            )
            .fix("use one MTU on every RoCE netdev and switch port of the job"),
        );
    }
    findings
}

/// `index 1 ::ffff:127.0.1.1 (RoCE v2, veth0)`.
fn describe_gid(e: &GidEntry) -> String {
    let mut s = format!("index {} {}", e.index, e.ip());
    let version = e.roce_version.map_or("?".to_owned(), |v| format!("v{v}"));
    s.push_str(&format!(" (RoCE {version}"));
    if let Some(n) = &e.netdev {
        s.push_str(&format!(", {n}"));
    }
    s.push(')');
    s
}

fn roce_gid(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "roce.gid";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let sysfs = facts.roots.sysfs();
    let c = &facts.config;
    let mut families: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut findings: Vec<Finding> = used_ports(facts)
        .into_iter()
        .map(|(m, _)| {
            if m.link_layer != LinkLayer::Ethernet {
                return Finding::new(
                    Severity::Skip,
                    CHECK,
                    &m.name,
                    "InfiniBand port: addressed by LID, no GID selection",
                );
            }
            let table = sysfs.port_gids(&m.device, m.port);
            let policy = GidPolicy::from_config(c);
            let choice = choose_gid(&table, &policy);
            let passed_over: Vec<String> = choice
                .candidates
                .iter()
                .filter_map(|cand| {
                    let why = cand.rejected.as_ref()?;
                    Some(format!("{}: {why}", describe_gid(&cand.entry)))
                })
                .collect();
            let passed_over = if passed_over.is_empty() {
                String::new()
            } else {
                format!("; passed over: {}", passed_over.join("; "))
            };
            let netdev = port_netdev(facts, &m.device, m.port).unwrap_or_else(|| "its netdev".to_owned());
            let mut f = match &choice.chosen {
                Err(why) => Finding::new(Severity::Fail, CHECK, &m.name, format!("no usable GID: {why}"))
                    .fix(if c.gid_index.is_some() {
                        "unset NCCL_IB_GID_INDEX (automatic selection) or set it to a populated index".to_owned()
                    } else {
                        format!("add an IP address to {netdev}")
                    }),
                Ok(gid) if choice.shortfalls.is_empty() => Finding::new(
                    Severity::Pass,
                    CHECK,
                    &m.name,
                    format!("uses GID {}{passed_over}", describe_gid(gid)),
                ),
                Ok(gid) => {
                    let outside = policy.range_missed_by(gid);
                    let fix = if let Some(range) = outside {
                        format!(
                            "give {netdev} an address inside {range}, or set NCCL_IB_ADDR_RANGE to the subnet the \
                             port is on, the same on every node"
                        )
                    } else if gid.gid[0] == 0xfe {
                        format!("add a routable address to {netdev} (link-local GIDs do not cross a router)")
                    } else if c.gid_index.is_some() {
                        "unset NCCL_IB_GID_INDEX to let the plugin pick, or pin an index that meets the preferences".to_owned()
                    } else {
                        format!(
                            "give {netdev} an address of the preferred family, or set NCCL_IB_ADDR_FAMILY/NCCL_IB_ROCE_VERSION_NUM \
                             to what the port has, the same on every node"
                        )
                    };
                    Finding::new(
                        Severity::Warn,
                        CHECK,
                        &m.name,
                        format!(
                            "uses GID {}, which is {}{passed_over}",
                            describe_gid(gid),
                            choice.shortfalls.join(", ")
                        ),
                    )
                    .fix(fix)
                }
            };
            if let Ok(gid) = &choice.chosen {
                let family = match gid.family() {
                    AddrFamily::V4 => "IPv4",
                    AddrFamily::V6 => "IPv6",
                };
                families.entry(family).or_default().push(m.name.clone());
            }
            for cand in &choice.candidates {
                let e = &cand.entry;
                f = f.evidence(
                    port_path(&m.device, m.port, &format!("gids/{}", e.index)),
                    format!(
                        "{} {}",
                        std::net::Ipv6Addr::from(e.gid),
                        e.roce_version.map_or("type unreadable".to_owned(), |v| format!("RoCE v{v}"))
                    ),
                );
            }
            f
        })
        .collect();
    if families.len() > 1 {
        findings.push(
            Finding::new(
                Severity::Warn,
                CHECK,
                "node",
                format!(
                    "used ports chose GIDs of different families ({}): a peer must match each",
                    grouped(&families)
                ),
            )
            .fix("give every RoCE netdev an address of one family, or pin NCCL_IB_ADDR_FAMILY"),
        );
    }
    findings
}

fn ib_pkey(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "ib.pkey";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let sysfs = facts.roots.sysfs();
    let pinned = facts.config.pkey_index;
    let index = pinned.unwrap_or(0);
    // Partition (the key without its membership bit, in hex) -> the ports in it.
    let mut partitions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut findings: Vec<Finding> = used_ports(facts)
        .into_iter()
        .map(|(m, _)| {
            let table = sysfs.port_pkeys(&m.device, m.port);
            let f = match pkey_at(&table, index) {
                Ok(key) => {
                    partitions
                        .entry(format!("{:#06x}", key.partition()))
                        .or_default()
                        .push(m.name.clone());
                    Finding::new(
                        Severity::Pass,
                        CHECK,
                        &m.name,
                        format!("QPs join partition {key}, P_Key index {index}"),
                    )
                }
                Err(_) if table.is_empty() && pinned.is_none() => Finding::new(
                    Severity::Unknown,
                    CHECK,
                    &m.name,
                    "the P_Key table is not readable in sysfs",
                ),
                Err(why) => {
                    let (what, fix) = match pinned {
                        Some(_) => (
                            format!("NCCL_IB_PKEY={index}: {why}; the plugin refuses to start"),
                            "set NCCL_IB_PKEY to the index of a partition listed, the one the job's peers are in",
                        ),
                        None => (
                            format!("{why}: the QPs would be in no partition and reach no peer"),
                            "set NCCL_IB_PKEY to the index of a partition listed, or have the subnet manager \
                             put the port in the default partition",
                        ),
                    };
                    Finding::new(Severity::Fail, CHECK, &m.name, what).fix(fix)
                }
            };
            f.evidence(
                port_path(&m.device, m.port, &format!("pkeys/{index}")),
                table
                    .iter()
                    .find(|(i, _)| *i == u32::from(index))
                    .map_or_else(|| "absent".to_owned(), |(_, key)| format!("{:#06x}", key.0)),
            )
        })
        .collect();
    if partitions.len() > 1 {
        findings.push(
            Finding::new(
                Severity::Warn,
                CHECK,
                "node",
                format!(
                    "used ports join different partitions at P_Key index {index} ({}): a QP reaches only peers of its own",
                    grouped(&partitions)
                ),
            )
            .fix("put every port of the job in one partition at the same index (the subnet manager's partition config), or set NCCL_IB_PKEY to the index where they share one"),
        );
    }
    findings
}

fn gdr_peermem(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "gdr.peermem";
    let g = &facts.gpu;
    let devices = &facts.survey.devices;
    let dmabuf_anywhere = devices.iter().any(|d| d.memory.dmabuf);
    // Why DMA-BUF cannot stand in for peer memory: nothing to probe, the GPUs, or the NICs.
    let no_dmabuf = if devices.is_empty() {
        format!(
            "DMA-BUF cannot be probed without an RDMA device (see {})",
            no_device_cause(facts)
        )
    } else if devices.iter().any(|d| d.dmabuf == DmaBuf::Supported) {
        dmabuf_both_sides(&DmaBuf::Supported, &g.gpu_export)
    } else {
        "no device takes DMA-BUF (see gdr.dmabuf)".to_owned()
    };
    let evidence = |f: Finding| {
        let f = f.evidence(
            "/sys/kernel/mm/memory_peers, /sys/module/nvidia_peermem, /proc/modules",
            g.peermem.to_string(),
        );
        if g.cuda.is_ok() {
            f.evidence(
                "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)",
                g.gpu_export.to_string(),
            )
        } else {
            f
        }
    };
    let f = match (&g.cuda, &g.peermem) {
        (Err(why), _) => Finding::new(
            Severity::Skip,
            CHECK,
            "node",
            format!("no CUDA driver ({why}): GPU memory is never registered"),
        ),
        (Ok(()), PeerMem::Registered { .. }) => Finding::new(Severity::Pass, CHECK, "node", g.peermem.to_string()),
        (Ok(()), PeerMem::LoadedNotRegistered { .. }) => Finding::new(
            Severity::Warn,
            CHECK,
            "node",
            if dmabuf_anywhere {
                "nvidia_peermem is loaded but not registered; GPUDirect RDMA goes through DMA-BUF instead".to_owned()
            } else {
                format!("nvidia_peermem is loaded but not registered, and {no_dmabuf}: GPUDirect RDMA is off (NCCL prints \"GPU Direct RDMA Disabled\")")
            },
        )
        .fix("reload it after the RDMA stack (`modprobe -r nvidia_peermem && modprobe nvidia_peermem`), or use DMA-BUF (kernel >= 5.12, NVIDIA open kernel module)"),
        (Ok(()), PeerMem::Absent) if dmabuf_anywhere => Finding::new(
            Severity::Info,
            CHECK,
            "node",
            "no peer-memory module; not needed: GPUDirect RDMA goes through DMA-BUF",
        ),
        (Ok(()), PeerMem::Absent) if devices.is_empty() => Finding::new(
            Severity::Unknown,
            CHECK,
            "node",
            format!("no peer-memory module, and {no_dmabuf}: whether GPUDirect RDMA would work is unknown"),
        )
        .depends_on(no_device_cause(facts)),
        (Ok(()), PeerMem::Absent) => Finding::new(
            Severity::Warn,
            CHECK,
            "node",
            format!("no peer-memory module, and {no_dmabuf}: GPUDirect RDMA is off, NCCL stages through host memory"),
        )
        .fix("`modprobe nvidia_peermem` (needs MOFED/DOCA-OFED), or use DMA-BUF (kernel >= 5.12, NVIDIA open kernel module)"),
    };
    vec![evidence(f)]
}

fn gdr_dmabuf(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "gdr.dmabuf";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let peermem = facts.gpu.peermem.usable();
    facts
        .survey
        .devices
        .iter()
        .map(|d| {
            let name = d.virt.name();
            // The plugin's own line, without the device name the entity already shows.
            let line = d.gdr_line.strip_prefix(&format!("{name}: ")).unwrap_or(&d.gdr_line);
            let f = match (&facts.gpu.cuda, &d.dmabuf) {
                (Err(_), _) => Finding::new(Severity::Skip, CHECK, &name, line),
                (Ok(()), _) if d.memory.dmabuf => Finding::new(Severity::Pass, CHECK, &name, line),
                // Off by choice, or not needed: peer memory carries GPUDirect.
                (Ok(()), DmaBuf::Disabled) => Finding::new(Severity::Info, CHECK, &name, line),
                (Ok(()), _) if peermem => Finding::new(Severity::Info, CHECK, &name, line),
                // The NIC takes DMA-BUF but no GPU exports it (see `GpuExport`).
                (Ok(()), DmaBuf::Supported) => Finding::new(Severity::Warn, CHECK, &name, line)
                    .fix("NVIDIA's open GPU kernel module (the proprietary one exports no DMA-BUF), or load nvidia_peermem"),
                (Ok(()), DmaBuf::Unsupported(_)) => Finding::new(Severity::Warn, CHECK, &name, line)
                    .fix("DMA-BUF needs kernel >= 5.12, rdma-core >= 34 and NVIDIA's open kernel module; or load nvidia_peermem"),
            };
            f.evidence("ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd=-1, 0)", d.dmabuf.to_string())
        })
        .collect()
}

fn relaxed_ordering(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "relaxed.ordering";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let virtualised = facts.gpu.hypervisor.is_some();
    facts
        .survey
        .devices
        .iter()
        .flat_map(|d| d.virt.members.iter().zip(&d.relaxed_ordering))
        .map(|(m, (on, line))| {
            let line = line.strip_prefix(&format!("{}: ", m.name)).unwrap_or(line);
            let vf = m.pci.as_ref().is_some_and(|f| f.is_vf());
            let control = m.pci_path.as_ref().map(|dir| {
                std::fs::read(dir.join("config"))
                    .map_err(|e| e.to_string())
                    .and_then(|c| relaxed_ordering_enabled(&c))
            });
            let f = match (on, &control) {
                // No PCIe between the device and memory: the decision stands but means nothing.
                (_, None) => Finding::new(
                    Severity::Info,
                    CHECK,
                    &m.name,
                    format!("software device, no PCIe to order: {line}"),
                ),
                (true, Some(Ok(false))) => Finding::new(
                    Severity::Warn,
                    CHECK,
                    &m.name,
                    format!("{line}; but the function's PCIe Device Control has Enable Relaxed Ordering clear, so the NIC will not use it"),
                )
                .fix("enable relaxed ordering in the NIC (mlxconfig PCI_WR_ORDERING=per_mkey, the default) and, in a VM, let the hypervisor pass it through"),
                (false, _) if vf || virtualised => Finding::new(
                    Severity::Warn,
                    CHECK,
                    &m.name,
                    format!("{line}; a VF or VM without relaxed ordering can run GPUDirect writes at a fraction of line rate"),
                )
                .fix("NCCL_IB_PCI_RELAXED_ORDERING=1 (or 2, the default) with an rdma-core that has ibv_reg_mr_iova2 (>= 22)"),
                _ => Finding::new(Severity::Pass, CHECK, &m.name, line),
            };
            let control_text = match control {
                None => "no PCI function (software device)".to_owned(),
                Some(Ok(bit)) => format!("Enable Relaxed Ordering {}", if bit { "set" } else { "clear" }),
                Some(Err(why)) => why,
            };
            f.evidence(
                m.pci_path.as_ref().map_or("PCI config space".to_owned(), |p| {
                    format!("{}/config Device Control", super::facts::shown(p, &facts.roots))
                }),
                control_text,
            )
        })
        .collect()
}

fn pcie_link(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "pcie.link";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    per_pci_function(facts, CHECK, pcie_function_dir, |m, dir| {
        let shown = super::facts::shown(dir, &facts.roots);
        let (current, max) = (PcieLink::read(dir, "current"), PcieLink::read(dir, "max"));
        let (Some(current), Some(max)) = (current, max) else {
            return Finding::new(
                Severity::Unknown,
                CHECK,
                &m.name,
                "link speed/width unreadable",
            )
            .evidence(format!("{shown}/current_link_speed"), "unreadable");
        };
        let port = u64::from(m.speed_mbps);
        let f = if current.mbps() < port {
            Finding::new(
                    Severity::Fail,
                    CHECK,
                    &m.name,
                    format!(
                        "PCIe {} carries {} < the port's {}",
                        current.describe(),
                        gbps(current.mbps()),
                        gbps(port)
                    ),
                )
                .fix("reseat the card or move it to a full-width slot; check BIOS bifurcation and `dmesg | grep -i 'limited by'`")
        } else if current.mbps() < max.mbps() {
            Finding::new(
                Severity::Warn,
                CHECK,
                &m.name,
                format!(
                    "trained {} below its maximum {}",
                    current.describe(),
                    max.describe()
                ),
            )
            .fix("reseat the card; check the slot's width and BIOS PCIe settings")
        } else {
            Finding::new(
                Severity::Pass,
                CHECK,
                &m.name,
                format!(
                    "{} ({}) for a {} port",
                    current.describe(),
                    gbps(current.mbps()),
                    gbps(port)
                ),
            )
        };
        f.evidence(
            format!("{shown}/current_link_speed,_width"),
            current.describe(),
        )
        .evidence(format!("{shown}/max_link_speed,_width"), max.describe())
    })
}

/// The PCI functions on the way from the host bridge (`pci0000:00`) down to `function`'s
/// directory, root port first, `function` last.
fn pci_chain(function: &Path) -> Vec<PathBuf> {
    let mut chain: Vec<PathBuf> = function
        .ancestors()
        .take_while(|dir| {
            dir.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.parse::<PciAddress>().is_ok())
        })
        .map(Path::to_path_buf)
        .collect();
    chain.reverse();
    chain
}

/// The switch ports whose ACS controls decide a GPU's peer-to-peer path to a NIC: below their
/// common ancestor, on either side. Empty when they share no switch (the path then crosses the
/// root complex whatever ACS says).
fn p2p_ports(nic: &[PathBuf], gpu: &[PathBuf]) -> Vec<PathBuf> {
    let shared = nic.iter().zip(gpu).take_while(|(a, b)| a == b).count();
    // Under different root ports: the path crosses the root complex.
    if shared == 0 {
        return Vec::new();
    }
    let below = |chain: &[PathBuf]| {
        chain
            .get(shared..chain.len().saturating_sub(1))
            .unwrap_or_default()
            .to_vec()
    };
    let mut ports = below(nic);
    ports.extend(below(gpu));
    ports
}

fn pcie_acs(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "pcie.acs";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let gpus: Vec<(String, Vec<PathBuf>)> = gpus(facts)
        .into_iter()
        .filter_map(|(bdf, _)| {
            let dir = facts.roots.at(&format!("/sys/bus/pci/devices/{bdf}"));
            Some((bdf, pci_chain(&dir.canonicalize().ok()?)))
        })
        .collect();
    let in_vm = facts.context.vm.is_some();
    per_pci_function(facts, CHECK, own_function_dir, |m, dir| {
        let nic = pci_chain(dir);
        let sharing: Vec<(&str, Vec<PathBuf>)> = gpus
            .iter()
            .map(|(bdf, chain)| (bdf.as_str(), p2p_ports(&nic, chain)))
            .filter(|(_, ports)| !ports.is_empty())
            .collect();
        if gpus.is_empty() {
            return Finding::new(
                Severity::Skip,
                CHECK,
                &m.name,
                "no NVIDIA GPU on the PCI bus: no GPUDirect path to judge",
            );
        }
        if sharing.is_empty() {
            return Finding::new(
                Severity::Pass,
                CHECK,
                &m.name,
                "no GPU under the same PCIe switch: GPUDirect traffic to it crosses the root complex, where ACS redirection changes nothing",
            );
        }
        let mut evidence = Vec::new();
        let mut redirecting = BTreeMap::new();
        let mut unreadable = Vec::new();
        // The NIC's own ports lie on the way to every GPU of its switch: read each once.
        let ports: BTreeSet<&PathBuf> = sharing.iter().flat_map(|(_, ports)| ports).collect();
        for port in ports {
            let name = port
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let shown = super::facts::shown(port, &facts.roots);
            match std::fs::read(port.join("config"))
                .map_err(|e| e.to_string())
                .and_then(|c| acs_control(&c))
            {
                Ok(control) => {
                    let value =
                        control.map_or("no ACS capability".to_owned(), |c| format!("{c:#06x}"));
                    evidence.push((format!("{shown}/config ACS Control"), value));
                    if let Some(bits) = control.map(acs_redirects).filter(|b| !b.is_empty()) {
                        redirecting.insert(name, bits.join("+"));
                    }
                }
                Err(why) => {
                    evidence.push((format!("{shown}/config ACS Control"), why.clone()));
                    unreadable.push(format!("{name}: {why}"));
                }
            }
        }
        let gpu_list = sharing
            .iter()
            .map(|(bdf, _)| *bdf)
            .collect::<Vec<_>>()
            .join(" ");
        let f = if !redirecting.is_empty() {
            let ports = redirecting
                .iter()
                .map(|(p, bits)| format!("{p} ({bits})"))
                .collect::<Vec<_>>()
                .join(", ");
            if in_vm {
                Finding::new(
                    Severity::Info,
                    CHECK,
                    &m.name,
                    format!(
                        "switch ports between it and GPUs {gpu_list} redirect peer-to-peer traffic: {ports}; expected in a VM (GPUDirect needs ATS and relaxed ordering there)"
                    ),
                )
            } else {
                Finding::new(
                        Severity::Fail,
                        CHECK,
                        &m.name,
                        format!("switch ports between it and GPUs {gpu_list} redirect peer-to-peer traffic up to the root complex: {ports}; GPUDirect RDMA through them runs far below line rate or stalls"),
                    )
                    .fix("disable ACS on the PCIe switch ports in the BIOS (or for a test: `setpci -s <port> ECAP_ACS+6.w=0`, lost at reboot)")
            }
        } else if !unreadable.is_empty() {
            Finding::new(
                Severity::Unknown,
                CHECK,
                &m.name,
                format!(
                    "ACS of the switch ports between it and GPUs {gpu_list} unreadable: {}",
                    unreadable.join("; ")
                ),
            )
            .fix("run the doctor as root")
        } else {
            Finding::new(
                Severity::Pass,
                CHECK,
                &m.name,
                format!(
                    "no switch port between it and GPUs {gpu_list} redirects peer-to-peer traffic"
                ),
            )
        };
        evidence
            .into_iter()
            .fold(f, |f, (source, value)| f.evidence(source, value))
    })
}

/// NVIDIA GPUs on the PCI bus (vendor 0x10de, display class), with their NUMA nodes.
fn gpus(facts: &NodeFacts) -> Vec<(String, Option<u32>)> {
    let dir = facts.roots.at("/sys/bus/pci/devices");
    let mut found: Vec<(String, Option<u32>)> = std::fs::read_dir(dir)
        .map(|listing| {
            listing
                .filter_map(|e| {
                    let e = e.ok()?;
                    let read = |name: &str| std::fs::read_to_string(e.path().join(name)).ok();
                    let vendor = read("vendor")?;
                    let class = read("class")?;
                    (vendor.trim() == "0x10de" && class.trim().starts_with("0x03")).then(|| {
                        let numa = read("numa_node").and_then(|n| n.trim().parse().ok());
                        (e.file_name().to_string_lossy().into_owned(), numa)
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

fn topo_numa(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "topo.numa";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let nics: Vec<(&NetDevice, Option<u32>)> = used_ports(facts)
        .into_iter()
        .filter_map(|(m, _)| Some((m, m.pci.as_ref()?.numa_node)).filter(|_| m.pci.is_some()))
        .collect();
    if nics.is_empty() {
        return vec![Finding::new(
            Severity::Skip,
            CHECK,
            "node",
            "no PCI NIC used (software devices only)",
        )];
    }
    let nodes = std::fs::read_dir(facts.roots.at("/sys/devices/system/node"))
        .map(|l| {
            l.filter(|e| {
                e.as_ref().is_ok_and(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .strip_prefix("node")
                        .is_some_and(|n| n.parse::<u32>().is_ok())
                })
            })
            .count()
        })
        .unwrap_or(1);
    let placement: Vec<String> = nics
        .iter()
        .map(|(m, n)| {
            format!(
                "{} node {}",
                m.name,
                n.map_or("?".to_owned(), |n| n.to_string())
            )
        })
        .collect();
    let mut findings = Vec::new();
    let unknown: Vec<&str> = nics
        .iter()
        .filter(|(_, n)| n.is_none())
        .map(|(m, _)| m.name.as_str())
        .collect();
    if !unknown.is_empty() && nodes > 1 {
        findings.push(
            Finding::new(
                Severity::Warn,
                CHECK,
                unknown.join(" "),
                format!("no NUMA node reported on a {nodes}-node machine: NCCL cannot pair GPUs with their nearest NIC"),
            )
            .fix("enable NUMA/SRAT reporting in the BIOS (or the VM's NUMA topology)"),
        );
    }
    let gpus = gpus(facts);
    let nic_nodes: Vec<u32> = nics.iter().filter_map(|(_, n)| *n).collect();
    let mut lonely: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for (gpu, node) in &gpus {
        if let Some(n) = node
            && !nic_nodes.contains(n)
        {
            lonely.entry(*n).or_default().push(gpu.clone());
        }
    }
    for (node, list) in &lonely {
        findings.push(
            Finding::new(
                Severity::Warn,
                CHECK,
                format!("node {node}"),
                format!(
                    "GPUs {} have no used NIC on their NUMA node ({}): their traffic crosses the socket link",
                    list.join(" "),
                    placement.join(", ")
                ),
            )
            .fix("use a NIC on that node (NCCL_IB_HCA) or move the card; check `nvidia-smi topo -m`"),
        );
    }
    if findings.is_empty() {
        let gpu_text = if gpus.is_empty() {
            "no NVIDIA GPU on the PCI bus".to_owned()
        } else {
            format!("{} GPUs, each with a NIC on its node", gpus.len())
        };
        findings.push(Finding::new(
            Severity::Pass,
            CHECK,
            "node",
            format!("{}; {gpu_text}", placement.join(", ")),
        ));
    }
    findings
}

fn iommu(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "iommu";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let cmdline = facts.roots.read("/proc/cmdline").unwrap_or_default();
    let in_vm = facts.context.vm.is_some();
    per_pci_function(facts, CHECK, own_function_dir, |m, dir| {
        let shown = super::facts::shown(dir, &facts.roots);
        let kind = std::fs::read_to_string(dir.join("iommu_group/type")).ok();
        let f = match kind.as_deref().map(str::trim) {
                None if dir.join("iommu_group").exists() => {
                    Finding::new(Severity::Unknown, CHECK, &m.name, "IOMMU group type unreadable")
                }
                None => Finding::new(Severity::Pass, CHECK, &m.name, "no IOMMU group: DMA is not translated"),
                Some("identity") => Finding::new(Severity::Pass, CHECK, &m.name, "IOMMU passthrough (identity)"),
                Some(t) if in_vm => Finding::new(
                    Severity::Info,
                    CHECK,
                    &m.name,
                    format!("IOMMU translates ({t}); expected in a VM (GPUDirect needs ATS and relaxed ordering there)"),
                ),
                Some(t) => Finding::new(
                    Severity::Warn,
                    CHECK,
                    &m.name,
                    format!("IOMMU translates DMA ({t}): every RDMA access pays an IOTLB lookup and peer-to-peer may be redirected"),
                )
                .fix("boot with `iommu=pt` (intel_iommu=on iommu=pt / amd_iommu=pt)"),
            };
        f.evidence(
            format!("{shown}/iommu_group/type"),
            kind.unwrap_or_else(|| "absent".to_owned())
                .trim()
                .to_owned(),
        )
        .evidence("/proc/cmdline", cmdline.clone())
    })
}

fn firmware(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "versions.firmware";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let sysfs = facts.roots.sysfs();
    let mut devices: Vec<&str> = used_ports(facts)
        .iter()
        .map(|(m, _)| m.device.as_str())
        .collect();
    devices.sort_unstable();
    devices.dedup();
    let versions: Vec<(&str, Option<String>)> = devices
        .iter()
        .map(|d| {
            (
                *d,
                sysfs.read_value(&format!("class/infiniband/{d}/fw_ver")),
            )
        })
        .collect();
    let mut by_version: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (d, v) in &versions {
        if let Some(v) = v {
            by_version.entry(v.as_str()).or_default().push(d);
        }
    }
    let listing: Vec<String> = by_version
        .iter()
        .map(|(v, ds)| format!("{v} on {}", ds.join(" ")))
        .collect();
    let f = if by_version.is_empty() {
        Finding::new(
            Severity::Skip,
            CHECK,
            "node",
            "no device reports a firmware version (software devices)",
        )
    } else if by_version.len() > 1 {
        Finding::new(
            Severity::Warn,
            CHECK,
            "node",
            format!("used devices run different firmware: {}", listing.join("; ")),
        )
        .fix("update every NIC to one firmware release (mlxfwmanager / mstflint), then reboot or reset the NICs")
    } else {
        Finding::new(Severity::Pass, CHECK, "node", listing.join("; "))
    };
    vec![versions.iter().fold(f, |f, (d, v)| {
        f.evidence(
            format!("/sys/class/infiniband/{d}/fw_ver"),
            v.clone().unwrap_or_default(),
        )
    })]
}

/// A kind of kernel line that says something is wrong with a NIC or with GPUDirect: every
/// needle (lower case) in the line, what it means, and what to do.
struct KernelSign {
    needles: &'static [&'static str],
    severity: Severity,
    what: &'static str,
    fix: &'static str,
}

/// The lines node-health tools key on (doctor.md: gpud's kmsg matcher, NVSentinel's NIC
/// monitor), first match wins: a timed-out `ACCESS_REG` is a firmware timeout.
const KERNEL_SIGNS: &[KernelSign] = &[
    KernelSign {
        needles: &["will cause a leak of a command resource"],
        severity: Severity::Fail,
        what: "the NIC's firmware stopped answering a command",
        fix: "reboot the node; if it happens again, update the NIC firmware or replace the NIC",
    },
    KernelSign {
        needles: &["health compromised"],
        severity: Severity::Fail,
        what: "the NIC's firmware health monitor declared it compromised",
        fix: "reboot the node (the NIC needs a reset); if it happens again, replace the NIC",
    },
    KernelSign {
        needles: &["insufficient power"],
        severity: Severity::Warn,
        what: "the NIC reports too little power from its PCIe slot",
        fix: "move the NIC to a slot that supplies its rated power, or check the riser and the power supply",
    },
    KernelSign {
        needles: &["high temperature"],
        severity: Severity::Warn,
        what: "the NIC or its cable module reports a high temperature",
        fix: "check the airflow and fans around the NIC and its transceivers",
    },
    KernelSign {
        needles: &["access_reg", "failed"],
        severity: Severity::Warn,
        what: "the NIC's firmware refused a register access",
        fix: "harmless alone on restricted functions (VFs, restricted PFs); with other NIC errors, update the firmware",
    },
    KernelSign {
        needles: &["nvidia-peermem", "invalid context"],
        severity: Severity::Warn,
        what: "nvidia-peermem saw GPU memory released while the NIC still had it registered",
        fix: "usually a job killed during GPUDirect transfers; if it repeats while jobs run, update the NVIDIA driver and nvidia-peermem together, or use DMA-BUF",
    },
];

/// What a kernel line is about: a used device whose PCI function (or its PF) or netdev it
/// names, else a PCI function it names (`false`: not one NCCL uses here), else the node.
fn kernel_line_entity(facts: &NodeFacts, text: &str) -> (String, bool) {
    let mut named_pci = None;
    for word in text.split_whitespace().map(|w| w.trim_end_matches(':')) {
        let address = word.parse::<PciAddress>().ok();
        let used = used_ports(facts).into_iter().find(|(m, _)| {
            m.pci.as_ref().is_some_and(|pci| {
                address.is_some_and(|a| a == pci.address || Some(a) == pci.physfn)
                    || pci.netdevs.iter().any(|n| n == word)
            })
        });
        if let Some((m, _)) = used {
            return (m.device.clone(), true);
        }
        named_pci = named_pci.or(address);
    }
    match named_pci {
        Some(a) => (a.to_string(), false),
        None => ("node".to_owned(), true),
    }
}

fn kernel_log(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "kernel.log";
    let log = &facts.kernel_log;
    let records = match &log.records {
        Ok(records) => records,
        Err(why) => {
            return vec![
                Finding::new(Severity::Unknown, CHECK, "node", why.clone())
                    .fix("run the doctor as root on the host")
                    .evidence("/dev/kmsg", why.clone()),
            ];
        }
    };
    // (sign, entity) -> (times, whether NCCL uses the entity, the latest such record)
    let mut seen: BTreeMap<(usize, String), (usize, bool, &KernelRecord)> = BTreeMap::new();
    for record in records {
        let lower = record.text.to_lowercase();
        let Some(sign) = KERNEL_SIGNS
            .iter()
            .position(|s| s.needles.iter().all(|n| lower.contains(n)))
        else {
            continue;
        };
        let (entity, used) = kernel_line_entity(facts, &record.text);
        let entry = seen.entry((sign, entity)).or_insert((0, used, record));
        entry.0 += 1;
        entry.2 = record;
    }
    let user_note = match log.from_user_space {
        0 => String::new(),
        n => format!("; {n} record(s) written from user space not judged"),
    };
    if seen.is_empty() {
        let since = records.first().map_or_else(
            || "empty".to_owned(),
            |r| format!("from {:.1} s after boot", r.micros as f64 / 1e6),
        );
        return vec![
            Finding::new(
                Severity::Pass,
                CHECK,
                "node",
                format!(
                    "no NIC or GPUDirect error among {} kernel records ({since}){user_note}",
                    records.len()
                ),
            )
            .evidence(
                "/dev/kmsg",
                format!(
                    "{} kernel records, {} lost while reading",
                    records.len(),
                    log.lost
                ),
            ),
        ];
    }
    seen.into_iter()
        .map(|((sign, entity), (times, used, last))| {
            let sign = &KERNEL_SIGNS[sign];
            let elsewhere = if used {
                ""
            } else {
                " (a PCI function NCCL does not use here)"
            };
            let shown: String = last.text.chars().take(200).collect();
            Finding::new(
                sign.severity,
                CHECK,
                entity,
                format!(
                    "{}{elsewhere}: {times} time(s) in the log, last at {:.1} s after boot: \"{shown}\"",
                    sign.what,
                    last.micros as f64 / 1e6
                ),
            )
            .fix(sign.fix)
            .evidence(format!("/dev/kmsg record {}", last.seq), last.text.clone())
        })
        .collect()
}

fn env_config(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "env.config";
    let e = &facts.effective;
    let mut findings = Vec::new();
    if let Err(err) = &e.parsed {
        findings.push(
            Finding::new(
                Severity::Fail,
                CHECK,
                "plugin",
                format!("init would refuse: {err}"),
            )
            .fix("correct or unset the variable; the plugin's defaults are in the README"),
        );
    }
    if let (Some(hca), Err(why)) = (&facts.config.ib_hca, &facts.survey.selection)
        && facts.survey.discovery.is_ok()
    {
        findings.push(
            Finding::new(Severity::Fail, CHECK, "NCCL_IB_HCA", why.clone())
                .fix(format!("list the active ports (`ibv_devinfo`) and set NCCL_IB_HCA to match them, or unset it (was '{hca}')")),
        );
    }
    for file in &e.files {
        for note in &file.notes {
            findings.push(
                Finding::new(Severity::Warn, CHECK, file.path.clone(), note.clone())
                    .fix("write NAME=value with no spaces around '='"),
            );
        }
    }
    for knob in NOT_IMPLEMENTED {
        let Some(s) = e.not_implemented.iter().find(|s| s.name == knob.name) else {
            continue;
        };
        findings.push(
            Finding::new(
                Severity::Warn,
                CHECK,
                knob.name,
                format!(
                    "{}={} ({}) has no effect: this plugin does not implement it; in NCCL's \
                     internal IB transport (default {}) it is for: {}",
                    s.name,
                    s.value.as_deref().unwrap_or(""),
                    s.origin,
                    knob.default,
                    knob.meaning
                ),
            )
            .fix(format!(
                "unset {} where this plugin carries the traffic (it only matters to NCCL's internal IB transport)",
                knob.name
            )),
        );
    }
    let set: Vec<String> = e
        .settings
        .iter()
        .filter(|s| s.origin != Origin::Default)
        .map(|s| {
            format!(
                "{}={} ({})",
                s.name,
                s.value.as_deref().unwrap_or(""),
                s.origin
            )
        })
        .collect();
    let files: Vec<String> = e
        .files
        .iter()
        .map(|f| format!("{}{}", f.path, if f.present { "" } else { " (absent)" }))
        .collect();
    let what = if set.is_empty() {
        format!(
            "all {} variables at their defaults; read {}",
            e.settings.len(),
            files.join(", ")
        )
    } else {
        format!(
            "{}; {} others at their defaults; read {}",
            set.join(", "),
            e.settings.len() - set.len(),
            files.join(", ")
        )
    };
    let info = e.settings.iter().fold(
        Finding::new(Severity::Info, CHECK, "plugin", what),
        |f, s| {
            f.evidence(
                s.name,
                match &s.value {
                    Some(v) => format!("{v} ({})", s.origin),
                    None => format!("unset (default {})", s.default),
                },
            )
        },
    );
    findings.push(info);
    findings
}

/// `v12, v11, ...`: the ncclNet tables a library exports.
fn versions(x: &Exports) -> String {
    let listed: Vec<String> = x.versions.iter().map(|v| format!("v{v}")).collect();
    listed.join(", ")
}

/// What an opened library is to NCCL, in the words of the evidence and the FAIL line.
fn describe_opened(opened: &Opened) -> String {
    match opened {
        Opened::Loaded(x) if x.versions.is_empty() => format!(
            "{} exports no ncclNetPlugin_v6 .. v12 (NCCL skips it as unsupported)",
            x.path
        ),
        Opened::Loaded(x) => format!(
            "{} ({}, ncclNet {})",
            x.path,
            x.name.as_deref().unwrap_or("no name"),
            versions(x)
        ),
        Opened::NotFound(e) | Opened::Failed(e) => e.clone(),
        Opened::InApplication => {
            "STATIC_PLUGIN: looked up in the application itself, which the doctor cannot see".into()
        }
    }
}

const PLUGIN_LOAD: &str = "plugin.load";

/// NCCL's variables as `plugin.load` words and weighs them.
struct NcclChoice<'a> {
    /// `NCCL_NET_PLUGIN=... (origin)`, or that it is unset.
    asked: String,
    /// `NCCL_NET`.
    net: Option<&'a str>,
    /// `NCCL_IB_DISABLE`, when it turns NCCL's internal IB transport off.
    ib_disable: Option<&'a str>,
}

impl NcclChoice<'_> {
    /// Whether `NCCL_NET` names this plugin.
    fn names_us(&self) -> bool {
        self.net
            .is_some_and(|n| n.eq_ignore_ascii_case(PLUGIN_NAME))
    }

    /// Whether NCCL may use plugin `x`: a ncclNet table, and the name `NCCL_NET` asks for
    /// (compared as NCCL does, ignoring case).
    fn may_use(&self, x: &Exports) -> bool {
        !x.versions.is_empty()
            && self
                .net
                .is_none_or(|n| x.name.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(n)))
    }
}

/// The library an entry loaded, under the name that loaded it.
fn loaded(entry: &PluginEntry) -> Option<(&str, &Exports)> {
    match entry.outcome() {
        Some((name, Opened::Loaded(x))) => Some((name.as_str(), x)),
        _ => None,
    }
}

/// `f` with every name NCCL would open and what it gave.
fn with_route_evidence(facts: &NodeFacts, f: Finding) -> Finding {
    facts
        .plugin_route
        .iter()
        .flat_map(|entry| &entry.tried)
        .fold(f, |f, (name, opened)| {
            f.evidence(format!("dlopen({name})"), describe_opened(opened))
        })
}

/// Whether NCCL would find this plugin: the library it opens (`NCCL_NET_PLUGIN`'s entries in
/// order, else `libnccl-net.so`, through the dynamic loader as NCCL calls it), and whether
/// `NCCL_NET` lets NCCL use it. NCCL says none of this above its INFO level: a plugin that
/// does not load leaves the job on NCCL's internal transport without a warning.
fn plugin_load(facts: &NodeFacts) -> Vec<Finding> {
    let e = &facts.effective;
    let choice = NcclChoice {
        asked: match e.nccl.iter().find(|s| s.name == "NCCL_NET_PLUGIN") {
            Some(Setting {
                value: Some(v),
                origin,
                ..
            }) => format!("NCCL_NET_PLUGIN={v} ({origin})"),
            _ => "NCCL_NET_PLUGIN unset".to_owned(),
        },
        net: e.value("NCCL_NET"),
        ib_disable: e
            .value("NCCL_IB_DISABLE")
            .filter(|v| v.trim().parse::<i64>().is_ok_and(|n| n != 0)),
    };
    let mut findings = Vec::new();
    if let Some(n) = choice.net
        && !choice.names_us()
    {
        findings.push(
            Finding::new(
                Severity::Fail,
                PLUGIN_LOAD,
                "NCCL_NET",
                format!("NCCL_NET={n}: NCCL uses only the network named '{n}', never this plugin ({PLUGIN_NAME})"),
            )
            .fix(format!("unset NCCL_NET, or set NCCL_NET={PLUGIN_NAME}")),
        );
    }
    let ours = facts
        .plugin_route
        .iter()
        .enumerate()
        .find_map(|(i, entry)| {
            loaded(entry)
                .filter(|(_, x)| x.name.as_deref() == Some(PLUGIN_NAME) && !x.versions.is_empty())
                .map(|(name, x)| (i, name, x))
        });
    match ours {
        Some((i, name, x)) => findings.extend(plugin_found(facts, &choice, i, name, x)),
        None => findings.push(plugin_missing(facts, &choice)),
    }
    findings
}

/// `plugin.load` when NCCL opens this plugin from entry `at` (as `name`): PASS, or WARN when an
/// earlier entry is a plugin NCCL would try first; INFO on `NCCL_IB_DISABLE`.
fn plugin_found(
    facts: &NodeFacts,
    choice: &NcclChoice<'_>,
    at: usize,
    name: &str,
    ours: &Exports,
) -> Vec<Finding> {
    let ahead: Vec<String> = facts.plugin_route[..at]
        .iter()
        .filter_map(loaded)
        .filter(|(_, x)| choice.may_use(x))
        .map(|(name, x)| format!("{name} ({})", x.name.as_deref().unwrap_or("no name")))
        .collect();
    let opens = if ours.path == name {
        name.to_owned()
    } else {
        format!("{name} = {}", ours.path)
    };
    let line = format!(
        "{}: NCCL opens {opens} ({PLUGIN_NAME}, ncclNet {}){}",
        choice.asked,
        versions(ours),
        if choice.names_us() {
            ", which NCCL_NET selects"
        } else {
            ""
        }
    );
    let verdict = if ahead.is_empty() {
        Finding::new(Severity::Pass, PLUGIN_LOAD, "plugin", line)
    } else {
        Finding::new(
            Severity::Warn,
            PLUGIN_LOAD,
            "plugin",
            format!(
                "{line}; but NCCL_NET_PLUGIN lists {} before it, which NCCL uses whenever its init finds a device",
                ahead.join(", ")
            ),
        )
        .fix(format!(
            "list this plugin first in NCCL_NET_PLUGIN, or set NCCL_NET={PLUGIN_NAME}"
        ))
    };
    let mut findings = vec![with_route_evidence(facts, verdict)];
    if let Some(v) = choice.ib_disable {
        findings.push(
            Finding::new(
                Severity::Info,
                PLUGIN_LOAD,
                "NCCL_IB_DISABLE",
                format!("NCCL_IB_DISABLE={v} turns off NCCL's internal IB transport only: this plugin is external and still carries the traffic"),
            )
            .fix("to run on sockets instead, set NCCL_NET=Socket"),
        );
    }
    findings
}

/// `plugin.load` when no entry is this plugin: FAIL with each entry's outcome and what NCCL
/// does instead; UNKNOWN when NCCL looks in the application itself.
fn plugin_missing(facts: &NodeFacts, choice: &NcclChoice<'_>) -> Finding {
    let route = &facts.plugin_route;
    let why = if route.is_empty() {
        "it opens no external plugin".to_owned()
    } else {
        let outcomes: Vec<String> = route
            .iter()
            .filter_map(|entry| {
                let (name, opened) = entry.outcome()?;
                Some(match opened {
                    Opened::NotFound(_) if name.contains('/') => format!("{name} not found"),
                    Opened::NotFound(_) => format!("{name} not found on the library path"),
                    Opened::Loaded(x) if !x.versions.is_empty() => {
                        format!("{name} = {}: another plugin", describe_opened(opened))
                    }
                    _ => format!("{name}: {}", describe_opened(opened)),
                })
            })
            .collect();
        outcomes.join("; ")
    };
    let other = route
        .iter()
        .filter_map(loaded)
        .find(|(_, x)| choice.may_use(x));
    let then = if choice.names_us() {
        "with NCCL_NET selecting this plugin, NCCL then fails to start (\"Failed to initialize any NET plugin\")".to_owned()
    } else if let Some((_, x)) = other {
        format!(
            "NCCL uses {} instead when its init finds a device",
            x.name.as_deref().unwrap_or("that plugin")
        )
    } else if let Some(v) = choice.ib_disable {
        format!("NCCL falls back to sockets (NCCL_IB_DISABLE={v})")
    } else {
        "NCCL falls back to its internal IB transport, then to sockets".to_owned()
    };
    let any_outcome = |kind: fn(&Opened) -> bool| {
        route
            .iter()
            .any(|entry| entry.outcome().is_some_and(|(_, o)| kind(o)))
    };
    let asked = &choice.asked;
    // The application's own symbols may be this plugin: only NCCL's log can tell.
    let finding = if any_outcome(|o| matches!(o, Opened::InApplication)) {
        Finding::new(
            Severity::Unknown,
            PLUGIN_LOAD,
            "plugin",
            format!("{asked}: cannot tell whether NCCL loads this plugin: {why}"),
        )
        .fix(format!("run the application with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and look for \"Initialized NET plugin {PLUGIN_NAME}\""))
    } else {
        Finding::new(
            Severity::Fail,
            PLUGIN_LOAD,
            "plugin",
            format!("{asked}: NCCL does not load this plugin: {why}; {then}"),
        )
        .fix(if any_outcome(|o| matches!(o, Opened::Failed(_))) {
            "install what the loader names as missing (or put its directory on LD_LIBRARY_PATH)"
        } else {
            "install this plugin as libnccl-net.so in a directory on the library path (scripts/install.sh PREFIX puts it in PREFIX/lib), or set NCCL_NET_PLUGIN to the full path of its library"
        })
    };
    with_route_evidence(facts, finding).evidence(
        "LD_LIBRARY_PATH",
        facts.library_path.as_deref().unwrap_or("unset"),
    )
}

fn plugin_devices(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "plugin.devices";
    let s = &facts.survey;
    match &s.selection {
        Err(_) if s.discovery.is_err() => vec![
            Finding::new(
                Severity::Fail,
                CHECK,
                "plugin",
                "NCCL would get 0 devices and fall back to sockets (see verbs.provider)",
            )
            .depends_on("verbs.provider"),
        ],
        Err(why) => vec![
            Finding::new(
                Severity::Fail,
                CHECK,
                "plugin",
                format!("NCCL would get 0 devices and fall back to sockets: {why}"),
            )
            .fix("see the port.state, verbs.provider and env.config lines above"),
        ],
        Ok(selection) => {
            let list: Vec<String> = s
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    format!(
                        "[{i}] {} ({} {})",
                        d.virt.name(),
                        d.virt.first().link_layer,
                        gbps(d.virt.speed_mbps().into())
                    )
                })
                .collect();
            let mut what = format!(
                "NCCL gets {} device(s): {}",
                s.devices.len(),
                list.join(", ")
            );
            if !selection.skipped.is_empty() {
                what.push_str(&format!("; not used: {}", selection.skipped.join("; ")));
            }
            let f = Finding::new(Severity::Pass, CHECK, "plugin", what);
            let f = s
                .fusion_decisions
                .iter()
                .fold(f, |f, d| f.evidence("fusion", d.clone()));
            vec![s.devices.iter().fold(f, |f, d| {
                f.evidence(
                    format!("device {}", d.virt.name()),
                    format!(
                        "speed {} Mbps, pciPath {}, guid {:#x}, maxComms {}, memory {}",
                        d.virt.speed_mbps(),
                        d.virt
                            .pci_path()
                            .map_or("NULL".to_owned(), |p| super::facts::shown(p, &facts.roots)),
                        d.virt.first().guid,
                        d.virt.max_comms(),
                        d.memory.kinds()
                    ),
                )
            })]
        }
    }
}
