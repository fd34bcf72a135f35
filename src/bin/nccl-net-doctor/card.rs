//! The node card two doctors exchange before a pair check, and the rules the two cards must
//! agree on. The card is also the `devices` part of `--json`.

use nccl_net::doctor::{DeviceRow, Finding, MemberRow, NodeFacts, Severity};
use nccl_net::topology::LinkLayer;
use serde::{Deserialize, Serialize};

/// Bumped whenever a field changes meaning; peers refuse a card of another version.
pub(crate) const CARD_VERSION: u32 = 1;

/// What one node tells the other.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeCard {
    /// [`CARD_VERSION`].
    pub(crate) card_version: u32,
    /// The doctor's version.
    pub(crate) tool_version: String,
    /// Host name.
    pub(crate) host: String,
    /// `host`, `container`, `vm`, `vm+container`.
    pub(crate) context: String,
    /// `NCCL_IB_TC`, when set.
    pub(crate) traffic_class: Option<u8>,
    /// `NCCL_IB_FIFO_TC`, when set (absent from an older doctor's card: unset).
    #[serde(default)]
    pub(crate) fifo_traffic_class: Option<u8>,
    /// `NCCL_IB_SL`, when set.
    pub(crate) service_level: Option<u8>,
    /// `NCCL_IB_QPS_PER_CONNECTION`.
    pub(crate) qps_per_connection: u32,
    /// The devices NCCL will see.
    pub(crate) devices: Vec<CardDevice>,
}

/// One NCCL device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct CardDevice {
    /// NCCL device index.
    pub(crate) index: usize,
    /// Name NCCL sees.
    pub(crate) name: String,
    /// Sum of the members' speeds.
    pub(crate) speed_mbps: u32,
    /// `host`, `host+cuda`, `host+cuda+dmabuf`.
    pub(crate) memory: String,
    /// Member ports.
    pub(crate) members: Vec<CardPort>,
}

/// One member port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct CardPort {
    /// `mlx5_0` or `mlx5_0:1`.
    pub(crate) name: String,
    /// RDMA device.
    pub(crate) device: String,
    /// Port number.
    pub(crate) port: u32,
    /// `IB` or `RoCE`.
    pub(crate) link_layer: String,
    /// `ACTIVE`...
    pub(crate) state: String,
    /// `LinkUp`...
    pub(crate) phys_state: String,
    /// Link speed.
    pub(crate) speed_mbps: u32,
    /// Active MTU in bytes.
    pub(crate) active_mtu: u32,
    /// Largest MTU in bytes.
    pub(crate) max_mtu: u32,
    /// RoCE netdev.
    pub(crate) netdev: Option<String>,
    /// Its MTU.
    pub(crate) netdev_mtu: Option<u32>,
    /// The GID the plugin uses (RoCE).
    pub(crate) gid: Option<CardGid>,
    /// Why there is no GID (RoCE).
    pub(crate) gid_error: Option<String>,
    /// InfiniBand LID.
    pub(crate) lid: u16,
    /// Subnet manager LID.
    pub(crate) sm_lid: u16,
    /// The P_Key the QPs use (`pkeys/<NCCL_IB_PKEY>`).
    pub(crate) pkey: Option<String>,
    /// PCI address.
    pub(crate) pci: Option<String>,
    /// SR-IOV virtual function.
    pub(crate) vf: bool,
    /// NUMA node.
    pub(crate) numa: Option<u32>,
    /// Trained PCIe link, `Gen4 x16 (16 GT/s)`.
    pub(crate) pcie: Option<String>,
    /// Its bandwidth in Mbps.
    pub(crate) pcie_mbps: Option<u64>,
    /// Firmware.
    pub(crate) fw_ver: Option<String>,
    /// Relaxed ordering on.
    pub(crate) relaxed_ordering: bool,
}

/// A RoCE GID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CardGid {
    /// Table index.
    pub(crate) index: u32,
    /// As an IP address (IPv4 for IPv4-mapped GIDs).
    pub(crate) address: String,
    /// `IPv4` or `IPv6`.
    pub(crate) family: String,
    /// RoCE version, `None` when unreadable.
    pub(crate) roce_version: Option<u8>,
}

fn port(m: &MemberRow) -> CardPort {
    let (gid, gid_error) = match &m.gid {
        None => (None, None),
        Some(Err(why)) => (None, Some(why.clone())),
        Some(Ok(g)) => {
            let address = g.ip();
            (
                Some(CardGid {
                    index: g.index,
                    address: address.to_string(),
                    family: if address.is_ipv4() { "IPv4" } else { "IPv6" }.to_owned(),
                    roce_version: g.roce_version,
                }),
                None,
            )
        }
    };
    CardPort {
        name: m.name.clone(),
        device: m.device.clone(),
        port: m.port,
        link_layer: m.link_layer.to_string(),
        state: m.state.to_owned(),
        phys_state: m.phys_state.to_owned(),
        speed_mbps: m.speed_mbps,
        active_mtu: m.active_mtu,
        max_mtu: m.max_mtu,
        netdev: m.netdev.clone(),
        netdev_mtu: m.netdev_mtu,
        gid,
        gid_error,
        lid: m.lid,
        sm_lid: m.sm_lid,
        pkey: m.pkey.clone(),
        pci: m.pci.clone(),
        vf: m.vf,
        numa: m.numa,
        pcie: m.pcie.as_ref().map(|l| l.describe()),
        pcie_mbps: m.pcie.as_ref().map(|l| l.mbps()),
        fw_ver: m.fw_ver.clone(),
        relaxed_ordering: m.relaxed_ordering,
    }
}

/// The card of this node.
pub(crate) fn node_card(facts: &NodeFacts, rows: &[DeviceRow], host: &str) -> NodeCard {
    NodeCard {
        card_version: CARD_VERSION,
        tool_version: env!("CARGO_PKG_VERSION").to_owned(),
        host: host.to_owned(),
        context: facts.context.kind().to_owned(),
        traffic_class: facts.config.traffic_class,
        fifo_traffic_class: facts.config.fifo_traffic_class,
        service_level: facts.config.service_level,
        qps_per_connection: facts.config.qps_per_connection,
        devices: rows
            .iter()
            .map(|d| CardDevice {
                index: d.index,
                name: d.name.clone(),
                speed_mbps: d.speed_mbps,
                memory: d.memory.clone(),
                members: d.members.iter().map(port).collect(),
            })
            .collect(),
    }
}

/// The IPv4 /24 or IPv6 /64 a GID address falls in (the common fabric subnet sizes; the doctor
/// only reports a difference, the route decides).
fn subnet(address: &str) -> String {
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => {
            let o = a.octets();
            format!("{}.{}.{}.0/24", o[0], o[1], o[2])
        }
        Ok(std::net::IpAddr::V6(a)) => {
            let s = a.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        Err(_) => address.to_owned(),
    }
}

/// One rule's finding: `here` and `there` side by side.
fn rule(
    check: &'static str,
    entity: &str,
    severity: Severity,
    what: &str,
    here: impl std::fmt::Display,
    there: impl std::fmt::Display,
) -> Finding {
    Finding::new(
        severity,
        check,
        entity,
        format!("{what}: {here} here, {there} on the peer"),
    )
    .evidence("local", here.to_string())
    .evidence("peer", there.to_string())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "unset".to_owned(), |v| v.to_string())
}

/// The agreement rules between this node's device `local` and the peer's device `remote`
/// (rail to rail): what would make the connection fail or run slower, each finding with both
/// values.
pub(crate) fn agreement(
    local: &NodeCard,
    remote: &NodeCard,
    l: &CardDevice,
    r: &CardDevice,
) -> Vec<Finding> {
    let entity = format!("{} <-> {}:{}", l.name, remote.host, r.name);
    let e = entity.as_str();
    let mut out = Vec::new();
    let (lp, rp) = (&l.members[0], &r.members[0]);
    let same = |check, what: &str, a: String, b: String, bad: Severity| {
        if a == b {
            Finding::new(Severity::Pass, check, e, format!("{what}: {a} on both"))
                .evidence("local", a)
                .evidence("peer", b)
        } else {
            rule(check, e, bad, what, a, b)
        }
    };
    out.push(same(
        "pair.link_layer",
        "link layer",
        lp.link_layer.clone(),
        rp.link_layer.clone(),
        Severity::Fail,
    ));
    if lp.link_layer == LinkLayer::Ethernet.to_string() && rp.link_layer == lp.link_layer {
        match (&lp.gid, &rp.gid) {
            (Some(a), Some(b)) => {
                out.push(same(
                    "pair.roce_version",
                    "RoCE version",
                    opt(a.roce_version.map(|v| format!("v{v}"))),
                    opt(b.roce_version.map(|v| format!("v{v}"))),
                    Severity::Fail,
                ));
                let (fa, fb) = (
                    format!("{} ({})", a.family, a.address),
                    format!("{} ({})", b.family, b.address),
                );
                // The addresses differ by nature; only the families must match.
                out.push(if a.family == b.family {
                    Finding::new(Severity::Pass, "pair.gid_family", e, format!("GID family {}: {fa} here, {fb} on the peer", a.family))
                        .evidence("local", fa)
                        .evidence("peer", fb)
                } else {
                    rule("pair.gid_family", e, Severity::Fail, "GID family differs (RoCE cannot connect IPv4 to IPv6)", fa, fb)
                        .fix("give both netdevs an address of one family, or set the same NCCL_IB_ADDR_FAMILY on both nodes")
                });
                let (sa, sb) = (subnet(&a.address), subnet(&b.address));
                out.push(if sa == sb {
                    Finding::new(Severity::Pass, "pair.gid_subnet", e, format!("both GIDs in {sa}"))
                } else {
                    rule("pair.gid_subnet", e, Severity::Info, "GIDs in different subnets (RoCE v2 is routed: the fabric must route between them)", sa, sb)
                });
            }
            (a, b) => out.push(rule(
                "pair.gid_family",
                e,
                Severity::Fail,
                "no usable GID",
                a.as_ref().map_or_else(
                    || lp.gid_error.clone().unwrap_or_default(),
                    |g| g.address.clone(),
                ),
                b.as_ref().map_or_else(
                    || rp.gid_error.clone().unwrap_or_default(),
                    |g| g.address.clone(),
                ),
            )),
        }
    }
    out.push(match lp.active_mtu.cmp(&rp.active_mtu) {
        std::cmp::Ordering::Equal => Finding::new(
            Severity::Pass,
            "pair.mtu",
            e,
            format!("active MTU {} on both", lp.active_mtu),
        ),
        _ => rule(
            "pair.mtu",
            e,
            Severity::Warn,
            &format!(
                "active MTU differs (the connection uses {}, the smaller)",
                lp.active_mtu.min(rp.active_mtu)
            ),
            lp.active_mtu,
            rp.active_mtu,
        )
        .fix("set the same MTU on both netdevs and the switch ports between them"),
    });
    if lp.link_layer == LinkLayer::InfiniBand.to_string() {
        out.push(same(
            "pair.pkey",
            "partition key",
            opt(lp.pkey.clone()),
            opt(rp.pkey.clone()),
            Severity::Warn,
        ));
    }
    let traffic = |c: &NodeCard| {
        format!(
            "TC {} FIFO_TC {} SL {}",
            opt(c.traffic_class),
            opt(c.fifo_traffic_class),
            opt(c.service_level)
        )
    };
    out.push(same(
        "pair.traffic_class",
        "NCCL_IB_TC/NCCL_IB_FIFO_TC/NCCL_IB_SL",
        traffic(local),
        traffic(remote),
        Severity::Warn,
    ));
    out.push(same(
        "pair.qps",
        "NCCL_IB_QPS_PER_CONNECTION",
        local.qps_per_connection.to_string(),
        remote.qps_per_connection.to_string(),
        Severity::Fail,
    ));
    out.push(same(
        "pair.members",
        "fused ports",
        l.members.len().to_string(),
        r.members.len().to_string(),
        Severity::Warn,
    ));
    out.push(same(
        "pair.rate",
        "device speed (Mbps)",
        l.speed_mbps.to_string(),
        r.speed_mbps.to_string(),
        Severity::Warn,
    ));
    let fw = |d: &CardDevice| opt(d.members[0].fw_ver.clone());
    out.push(same(
        "pair.firmware",
        "firmware",
        fw(l),
        fw(r),
        Severity::Info,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(host: &str, mtu: u32, address: &str, family: &str) -> (NodeCard, CardDevice) {
        let port = CardPort {
            name: "rxe1".into(),
            device: "rxe1".into(),
            port: 1,
            link_layer: "RoCE".into(),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            speed_mbps: 10_000,
            active_mtu: mtu,
            max_mtu: 4096,
            netdev: Some("veth0".into()),
            netdev_mtu: Some(1500),
            gid: Some(CardGid {
                index: 1,
                address: address.into(),
                family: family.into(),
                roce_version: Some(2),
            }),
            gid_error: None,
            lid: 0,
            sm_lid: 0,
            pkey: None,
            pci: None,
            vf: false,
            numa: None,
            pcie: None,
            pcie_mbps: None,
            fw_ver: None,
            relaxed_ordering: true,
        };
        let device = CardDevice {
            index: 0,
            name: "rxe1".into(),
            speed_mbps: 10_000,
            memory: "host".into(),
            members: vec![port],
        };
        let card = NodeCard {
            card_version: CARD_VERSION,
            tool_version: "0".into(),
            host: host.into(),
            context: "vm".into(),
            traffic_class: None,
            fifo_traffic_class: None,
            service_level: None,
            qps_per_connection: 1,
            devices: vec![device.clone()],
        };
        (card, device)
    }

    fn severity_of(findings: &[Finding], check: &str) -> Severity {
        findings.iter().find(|f| f.check == check).unwrap().severity
    }

    #[test]
    fn matching_cards_pass_every_rule() {
        let (a, da) = card("a", 1024, "127.0.1.1", "IPv4");
        let (b, db) = card("b", 1024, "127.0.1.2", "IPv4");
        let findings = agreement(&a, &b, &da, &db);
        assert!(
            findings.iter().all(|f| f.severity == Severity::Pass),
            "{findings:#?}"
        );
        assert_eq!(findings.len(), 10);
    }

    #[test]
    fn family_mismatch_fails_and_mtu_mismatch_warns_with_both_values() {
        let (a, da) = card("a", 4096, "fd00::1", "IPv6");
        let (b, db) = card("b", 1024, "127.0.1.2", "IPv4");
        let findings = agreement(&a, &b, &da, &db);
        assert_eq!(severity_of(&findings, "pair.gid_family"), Severity::Fail);
        assert_eq!(severity_of(&findings, "pair.gid_subnet"), Severity::Info);
        let mtu = findings.iter().find(|f| f.check == "pair.mtu").unwrap();
        assert_eq!(mtu.severity, Severity::Warn);
        assert!(
            mtu.what.contains("4096 here, 1024 on the peer") && mtu.what.contains("uses 1024"),
            "{}",
            mtu.what
        );
    }

    #[test]
    fn qps_and_link_layer_mismatches_fail() {
        let (a, da) = card("a", 1024, "127.0.1.1", "IPv4");
        let (mut b, mut db) = card("b", 1024, "127.0.1.2", "IPv4");
        b.qps_per_connection = 4;
        db.members[0].link_layer = "IB".into();
        let findings = agreement(&a, &b, &da, &db);
        assert_eq!(severity_of(&findings, "pair.qps"), Severity::Fail);
        assert_eq!(severity_of(&findings, "pair.link_layer"), Severity::Fail);
        assert!(findings.iter().all(|f| f.check != "pair.gid_family"));
    }

    #[test]
    fn cards_round_trip_through_json() {
        let (a, _) = card("a", 1024, "127.0.1.1", "IPv4");
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<NodeCard>(&text).unwrap(), a);
    }

    #[test]
    fn a_fifo_class_set_on_one_side_warns_and_an_older_card_has_none() {
        let (a, da) = card("a", 1024, "127.0.1.1", "IPv4");
        let (mut b, db) = card("b", 1024, "127.0.1.2", "IPv4");
        b.fifo_traffic_class = Some(46);
        let findings = agreement(&a, &b, &da, &db);
        let tc = findings
            .iter()
            .find(|f| f.check == "pair.traffic_class")
            .unwrap();
        assert_eq!(tc.severity, Severity::Warn);
        assert!(tc.what.contains("FIFO_TC unset"), "{}", tc.what);
        assert!(tc.what.contains("FIFO_TC 46"), "{}", tc.what);
        // A doctor from before NCCL_IB_FIFO_TC sends no such field.
        let mut old = serde_json::to_value(&b).unwrap();
        old.as_object_mut().unwrap().remove("fifo_traffic_class");
        let read: NodeCard = serde_json::from_value(old).unwrap();
        assert_eq!(read.fifo_traffic_class, None);
    }
}
