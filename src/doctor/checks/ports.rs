//! The ports NCCL will use: state, rate and MTU, the RoCE GID the plugin chooses, and the
//! InfiniBand partition its QPs join.

use super::*;

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

pub(super) fn port_state(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "port.state";
    let Ok(discovery) = &facts.survey.discovery else {
        return nothing_to_check(CHECK, facts).unwrap_or_default();
    };
    let filter = hca_filter(&facts.config);
    let usable = facts.survey.selection.is_ok();
    let degraded = degraded_devices(facts);
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
            // A member of a fused device whose other members are up is a warning (the device
            // is degraded); so is an unused spare port. A port the operator named, or the last
            // hope for any device, is a failure.
            let fused_into = degraded.iter().find(|d| {
                d.down
                    .iter()
                    .any(|m| m.device == p.device && m.port == p.port)
            });
            let (severity, note) = match fused_into {
                Some(d) => (
                    Severity::Warn,
                    format!(
                        "; {} carries on without it (degraded, see plugin.devices)",
                        d.name
                    ),
                ),
                None if filter.is_some() || !usable => (Severity::Fail, String::new()),
                None => (Severity::Warn, "; NCCL will not use it".to_owned()),
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

pub(super) fn link_rate(facts: &NodeFacts) -> Vec<Finding> {
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

pub(super) fn mtu(facts: &NodeFacts) -> Vec<Finding> {
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

pub(super) fn roce_gid(facts: &NodeFacts) -> Vec<Finding> {
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

pub(super) fn ib_pkey(facts: &NodeFacts) -> Vec<Finding> {
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
