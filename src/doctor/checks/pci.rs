//! The PCIe path between NICs and GPUs: trained links, ACS on the switch ports between them,
//! NUMA placement, and IOMMU translation.

use super::*;

pub(super) fn pcie_link(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "pcie.link";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    per_pci_function(facts, CHECK, pcie_function_dir, |m, dir| {
        let shown = crate::doctor::facts::shown(dir, &facts.roots);
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

pub(super) fn pcie_acs(facts: &NodeFacts) -> Vec<Finding> {
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
            let shown = crate::doctor::facts::shown(port, &facts.roots);
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

pub(super) fn topo_numa(facts: &NodeFacts) -> Vec<Finding> {
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

pub(super) fn iommu(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "iommu";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let cmdline = facts.roots.read("/proc/cmdline").unwrap_or_default();
    let in_vm = facts.context.vm.is_some();
    per_pci_function(facts, CHECK, own_function_dir, |m, dir| {
        let shown = crate::doctor::facts::shown(dir, &facts.roots);
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
