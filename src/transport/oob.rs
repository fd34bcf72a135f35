//! Which address the out-of-band TCP exchange (handles, hellos, repairs) binds, and which rule
//! chose it. Pure: the interface list, the variables and the port's GID come in as arguments.
//!
//! Without `NCCL_SOCKET_IFNAME`, a RoCE port whose GID carries an IPv4 address uses that
//! address (the NIC's own, reachable wherever its RDMA traffic is); any other port (InfiniBand,
//! whose GID is no IP address) uses the interface NCCL's own sockets use, by NCCL's rule
//! (`ncclFindInterfaces`, src/misc/socket.cc): an `ib*` interface, else the one in
//! `NCCL_COMM_ID`'s subnet, else the first that is not `docker*`, `lo*` or `virbr*`, else
//! `docker*`, `lo*`, `virbr*` in that order; only running interfaces, of the family
//! `NCCL_SOCKET_FAMILY` forces, IPv6 loopback never, the first in `getifaddrs` order. So the
//! plugin's connections go where NCCL's bootstrap already goes.

use std::net::{IpAddr, SocketAddr};

use crate::core::config::AddrFamily;
use crate::topology::GidEntry;
use crate::verbs::InterfaceAddr;

/// The chosen address, its interface, and the rule that chose it (for the port's INFO line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OobChoice {
    pub addr: IpAddr,
    pub interface: String,
    pub rule: String,
}

impl std::fmt::Display for OobChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on {} ({})", self.addr, self.interface, self.rule)
    }
}

/// What decides the out-of-band interface besides the interfaces themselves.
#[derive(Clone, Copy, Debug, Default)]
pub struct OobSettings<'a> {
    /// `NCCL_SOCKET_IFNAME`.
    pub ifname: Option<&'a str>,
    /// `NCCL_SOCKET_FAMILY` (`AF_INET` or `AF_INET6`; anything else forces nothing, as NCCL).
    pub family: Option<AddrFamily>,
    /// `NCCL_COMM_ID`'s address, resolved.
    pub comm_id: Option<SocketAddr>,
}

/// The out-of-band address for a port whose GID is `gid` (see the module doc).
///
/// # Errors
/// A line naming what matched nothing (`NCCL_SOCKET_IFNAME`, or every rule).
pub fn choose_oob_address(
    interfaces: &[InterfaceAddr],
    settings: &OobSettings<'_>,
    gid: &GidEntry,
) -> Result<OobChoice, String> {
    let family = settings.family;
    // NCCL ignores a value of one character.
    if let Some(spec) = settings.ifname.filter(|s| s.len() > 1) {
        return first_matching(interfaces, spec, family)
            .map(|i| choice(i, format!("NCCL_SOCKET_IFNAME={spec}")))
            .ok_or_else(|| {
                format!(
                    "NCCL_SOCKET_IFNAME='{spec}' matches no running interface with an {} address",
                    family_name(family)
                )
            });
    }
    if gid.gid != [0; 16] && gid.ip().is_ipv4() {
        let interface = gid
            .netdev
            .clone()
            .unwrap_or_else(|| "its netdev".to_owned());
        return Ok(OobChoice {
            addr: gid.ip(),
            interface,
            rule: "the RoCE GID's address".to_owned(),
        });
    }
    if let Some(i) = gid
        .netdev
        .as_ref()
        .and_then(|dev| interfaces.iter().find(|i| &i.name == dev))
    {
        return Ok(choice(i, "the RoCE GID's interface".to_owned()));
    }
    nccl_rule(interfaces, family, settings.comm_id).ok_or_else(|| {
        format!(
            "no running interface has an {} address (NCCL's rule: ib*, NCCL_COMM_ID's subnet, \
             any but docker*/lo*/virbr*, then those); set NCCL_SOCKET_IFNAME",
            family_name(family)
        )
    })
}

/// NCCL's automatic choice, step by step, each with the words the INFO line gives it.
fn nccl_rule(
    interfaces: &[InterfaceAddr],
    family: Option<AddrFamily>,
    comm_id: Option<SocketAddr>,
) -> Option<OobChoice> {
    let by = |spec: &str, rule: &str| {
        first_matching(interfaces, spec, family).map(|i| choice(i, format!("NCCL's rule: {rule}")))
    };
    by("ib", "an ib* interface")
        .or_else(|| {
            let remote = comm_id?.ip();
            interfaces
                .iter()
                .find(|i| same_subnet(i, remote))
                .map(|i| choice(i, "NCCL's rule: in NCCL_COMM_ID's subnet".to_owned()))
        })
        .or_else(|| {
            by(
                "^docker,lo,virbr",
                "the first interface not docker*, lo* or virbr*",
            )
        })
        .or_else(|| by("docker", "docker*, no other interface has an address"))
        .or_else(|| by("lo", "lo*, no other interface has an address"))
        .or_else(|| by("virbr", "virbr*, no other interface has an address"))
}

fn choice(i: &InterfaceAddr, rule: String) -> OobChoice {
    OobChoice {
        addr: i.addr,
        interface: i.name.clone(),
        rule,
    }
}

/// The first interface `spec` selects, NCCL's way: comma-separated name prefixes (a `:port`
/// after a name is ignored), `=` for exact names, `^` to exclude; running interfaces of the
/// forced family only, never IPv6 loopback; in `getifaddrs` order.
fn first_matching<'a>(
    interfaces: &'a [InterfaceAddr],
    spec: &str,
    family: Option<AddrFamily>,
) -> Option<&'a InterfaceAddr> {
    let (exclude, rest) = spec.strip_prefix('^').map_or((false, spec), |r| (true, r));
    let (exact, rest) = rest.strip_prefix('=').map_or((false, rest), |r| (true, r));
    let names: Vec<&str> = rest
        .split(',')
        .filter_map(|entry| entry.split(':').next())
        .filter(|name| !name.is_empty())
        .collect();
    // An empty list matches every interface (and, excluded, none).
    let listed = |iface: &str| {
        names.is_empty()
            || names.iter().any(|n| {
                if exact {
                    iface == *n
                } else {
                    iface.starts_with(n)
                }
            })
    };
    interfaces.iter().find(|i| {
        i.running
            && family.is_none_or(|f| f.matches(&i.addr))
            && !(i.addr.is_ipv6() && i.addr.is_loopback())
            && listed(&i.name) != exclude
    })
}

/// Whether `remote` lies in `i`'s subnet (its address under its netmask).
fn same_subnet(i: &InterfaceAddr, remote: IpAddr) -> bool {
    match (i.addr, remote) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let mask = u32::MAX
                .checked_shl(32 - u32::from(i.prefix_len))
                .unwrap_or(0);
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let mask = u128::MAX
                .checked_shl(128 - u32::from(i.prefix_len))
                .unwrap_or(0);
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

fn family_name(family: Option<AddrFamily>) -> &'static str {
    match family {
        Some(AddrFamily::V4) => "IPv4 (NCCL_SOCKET_FAMILY=AF_INET)",
        Some(AddrFamily::V6) => "IPv6 (NCCL_SOCKET_FAMILY=AF_INET6)",
        None => "IP",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: &str, prefix_len: u8) -> InterfaceAddr {
        InterfaceAddr {
            name: name.into(),
            addr: addr.parse().unwrap(),
            prefix_len,
            running: true,
        }
    }

    fn down(mut i: InterfaceAddr) -> InterfaceAddr {
        i.running = false;
        i
    }

    /// An InfiniBand port: the GID is no IP address and has no netdev.
    fn ib_gid() -> GidEntry {
        GidEntry {
            index: 0,
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x0c, 0x42, 0xa1, 0x03, 0, 0x6d, 0x1e, 0x30,
            ],
            roce_version: None,
            netdev: None,
        }
    }

    fn roce_gid(ip: &str, netdev: &str) -> GidEntry {
        let gid = match ip.parse::<IpAddr>().unwrap() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        GidEntry {
            index: 3,
            gid,
            roce_version: Some(2),
            netdev: Some(netdev.into()),
        }
    }

    fn pick(ifs: &[InterfaceAddr], settings: OobSettings<'_>, gid: &GidEntry) -> String {
        choose_oob_address(ifs, &settings, gid).unwrap().to_string()
    }

    /// getifaddrs order on a DGX-like InfiniBand node: docker0 and a BMC bridge come before
    /// the IPoIB interfaces (the first non-loopback address, the old fallback, was docker0's).
    fn ib_node() -> Vec<InterfaceAddr> {
        vec![
            iface("lo", "127.0.0.1", 8),
            iface("docker0", "172.17.0.1", 16),
            iface("enp0s31f6", "10.10.0.12", 24),
            iface("ibp12s0", "192.168.12.12", 24),
            iface("ibp75s0", "192.168.75.12", 24),
            iface("lo", "::1", 128),
            iface("enp0s31f6", "fe80::1", 64),
        ]
    }

    #[test]
    fn infiniband_node_takes_the_first_ib_interface_as_nccl_does() {
        let ifs = ib_node();
        assert_eq!(
            pick(&ifs, OobSettings::default(), &ib_gid()),
            "192.168.12.12 on ibp12s0 (NCCL's rule: an ib* interface)"
        );
        // A down IPoIB interface is passed over, as NCCL passes over what is not running.
        let mut first_down = ifs.clone();
        first_down[3] = down(first_down[3].clone());
        assert_eq!(
            pick(&first_down, OobSettings::default(), &ib_gid()),
            "192.168.75.12 on ibp75s0 (NCCL's rule: an ib* interface)"
        );
        // Without IPoIB: the management network, never docker0 or lo.
        let no_ipoib: Vec<_> = ifs
            .iter()
            .filter(|i| !i.name.starts_with("ib"))
            .cloned()
            .collect();
        assert_eq!(
            pick(&no_ipoib, OobSettings::default(), &ib_gid()),
            "10.10.0.12 on enp0s31f6 (NCCL's rule: the first interface not docker*, lo* or virbr*)"
        );
        // NCCL_COMM_ID's subnet comes before that.
        let comm_id = Some("10.20.0.1:5000".parse().unwrap());
        let mut routed = no_ipoib.clone();
        routed.push(iface("ens2", "10.20.0.12", 16));
        assert_eq!(
            pick(
                &routed,
                OobSettings {
                    comm_id,
                    ..OobSettings::default()
                },
                &ib_gid()
            ),
            "10.20.0.12 on ens2 (NCCL's rule: in NCCL_COMM_ID's subnet)"
        );
    }

    #[test]
    fn nccl_socket_ifname_and_family_decide_first() {
        let ifs = ib_node();
        let with = |ifname, family| OobSettings {
            ifname: Some(ifname),
            family,
            comm_id: None,
        };
        assert_eq!(
            pick(&ifs, with("=ibp75s0", None), &ib_gid()),
            "192.168.75.12 on ibp75s0 (NCCL_SOCKET_IFNAME==ibp75s0)"
        );
        assert_eq!(
            pick(&ifs, with("^docker,lo,ib", None), &ib_gid()),
            "10.10.0.12 on enp0s31f6 (NCCL_SOCKET_IFNAME=^docker,lo,ib)"
        );
        // A port suffix is NCCL's syntax too; it names no interface.
        assert_eq!(
            pick(&ifs, with("enp0s31f6:1", None), &ib_gid()),
            "10.10.0.12 on enp0s31f6 (NCCL_SOCKET_IFNAME=enp0s31f6:1)"
        );
        assert_eq!(
            pick(&ifs, with("enp", Some(AddrFamily::V6)), &ib_gid()),
            "fe80::1 on enp0s31f6 (NCCL_SOCKET_IFNAME=enp)"
        );
        // It also wins over a RoCE GID's own address.
        assert_eq!(
            pick(
                &ifs,
                with("enp", None),
                &roce_gid("192.168.12.12", "ibp12s0")
            ),
            "10.10.0.12 on enp0s31f6 (NCCL_SOCKET_IFNAME=enp)"
        );
        let e = choose_oob_address(&ifs, &with("bond", None), &ib_gid()).unwrap_err();
        assert_eq!(
            e,
            "NCCL_SOCKET_IFNAME='bond' matches no running interface with an IP address"
        );
        // One character: ignored, as NCCL ignores it.
        assert_eq!(
            pick(&ifs, with("x", None), &ib_gid()),
            "192.168.12.12 on ibp12s0 (NCCL's rule: an ib* interface)"
        );
    }

    #[test]
    fn roce_node_uses_the_nics_own_address() {
        let ifs = vec![
            iface("lo", "127.0.0.1", 8),
            iface("eno1", "10.0.0.5", 24),
            iface("ens1f0np0", "172.16.1.5", 24),
            iface("ens1f1np1", "172.16.2.5", 24),
            iface("docker0", "172.17.0.1", 16),
        ];
        assert_eq!(
            pick(
                &ifs,
                OobSettings::default(),
                &roce_gid("172.16.2.5", "ens1f1np1")
            ),
            "172.16.2.5 on ens1f1np1 (the RoCE GID's address)"
        );
        // An IPv6 GID: an address of its interface.
        let v6 = roce_gid("fd00::5", "ens1f0np0");
        assert_eq!(
            pick(&ifs, OobSettings::default(), &v6),
            "172.16.1.5 on ens1f0np0 (the RoCE GID's interface)"
        );
        // Its own rule for InfiniBand ports on the same node: the management interface.
        assert_eq!(
            pick(&ifs, OobSettings::default(), &ib_gid()),
            "10.0.0.5 on eno1 (NCCL's rule: the first interface not docker*, lo* or virbr*)"
        );
    }

    #[test]
    fn container_with_one_overlay_interface() {
        // A Kubernetes pod: loopback and the CNI's eth0 (an overlay), nothing else.
        let ifs = vec![
            iface("lo", "127.0.0.1", 8),
            iface("eth0", "10.244.3.17", 24),
        ];
        assert_eq!(
            pick(&ifs, OobSettings::default(), &ib_gid()),
            "10.244.3.17 on eth0 (NCCL's rule: the first interface not docker*, lo* or virbr*)"
        );
        // Only loopback: lo, as NCCL (a single-node job).
        let lonely = vec![iface("lo", "127.0.0.1", 8), iface("lo", "::1", 128)];
        assert_eq!(
            pick(&lonely, OobSettings::default(), &ib_gid()),
            "127.0.0.1 on lo (NCCL's rule: lo*, no other interface has an address)"
        );
        let e = choose_oob_address(
            &[iface("lo", "::1", 128)],
            &OobSettings::default(),
            &ib_gid(),
        )
        .unwrap_err();
        assert!(e.contains("no running interface has an IP address"), "{e}");
    }
}
