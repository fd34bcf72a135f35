//! RoCE GID selection (nccl-net-abi.md §3.7): `NCCL_IB_GID_INDEX` when set; otherwise the GID
//! inside `NCCL_IB_ADDR_RANGE` (when set) with the preferred address family (IPv4-mapped by
//! default) and RoCE version, falling back to the best of the rest, with its shortfalls named,
//! when a port has none (NCCL's transport falls back to index 0).

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use crate::core::config::{AddrFamily, AddrRange, Config};

/// One populated entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// Index in the table.
    pub index: u32,
    /// The GID.
    pub gid: [u8; 16],
    /// RoCE version from `gid_attrs/types/<index>` (`None` when unreadable).
    pub roce_version: Option<u8>,
    /// Network interface from `gid_attrs/ndevs/<index>`.
    pub netdev: Option<String>,
}

impl GidEntry {
    /// The GID as an IP address (IPv4 for IPv4-mapped GIDs).
    pub fn ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.gid);
        v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
    }

    /// Address family of the GID.
    pub fn family(&self) -> AddrFamily {
        match self.ip() {
            IpAddr::V4(_) => AddrFamily::V4,
            IpAddr::V6(_) => AddrFamily::V6,
        }
    }

    fn is_link_local(&self) -> bool {
        self.gid[0] == 0xfe && self.gid[1] & 0xc0 == 0x80
    }
}

impl fmt::Display for GidEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GID index {} {}", self.index, Ipv6Addr::from(self.gid))?;
        if let Some(v) = self.roce_version {
            write!(f, " (RoCE v{v})")?;
        }
        Ok(())
    }
}

/// Parse a `gid_attrs/types/<i>` line: "IB/RoCE v1", "RoCE v1" → 1, "RoCE v2" → 2.
pub fn parse_roce_version(text: &str) -> Option<u8> {
    let t = text.trim();
    if t.ends_with("v2") {
        Some(2)
    } else if t.ends_with("v1") {
        Some(1)
    } else {
        None
    }
}

/// Parse a `gids/<i>` line: eight colon-separated groups of four hex digits.
pub fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        let v = u16::from_str_radix(g, 16).ok()?;
        gid[2 * i..2 * i + 2].copy_from_slice(&v.to_be_bytes());
    }
    Some(gid)
}

/// One entry of a port's GID table as selection saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidCandidate {
    /// The entry.
    pub entry: GidEntry,
    /// Why it was passed over; `None` for the chosen entry.
    pub rejected: Option<String>,
}

/// The outcome of GID selection on one port, with the reasons: what `listen` uses and what the
/// doctor's dry run prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GidChoice {
    /// The chosen entry, or why there is none.
    pub chosen: Result<GidEntry, String>,
    /// Every populated entry, in index order.
    pub candidates: Vec<GidCandidate>,
    /// How the chosen entry falls short of the preferences (link-local, other family, other
    /// RoCE version); empty when it meets them all.
    pub shortfalls: Vec<String>,
}

/// What RoCE GID selection honours, from the configuration.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GidPolicy {
    /// `NCCL_IB_GID_INDEX`: this entry and no other.
    pub fixed_index: Option<u32>,
    /// `NCCL_IB_ADDR_FAMILY`.
    pub family: AddrFamily,
    /// `NCCL_IB_ADDR_RANGE`.
    pub range: Option<AddrRange>,
    /// `NCCL_IB_ROCE_VERSION_NUM`.
    pub roce_version: u32,
}

impl GidPolicy {
    /// The policy the variables in `config` ask for.
    pub fn from_config(config: &Config) -> Self {
        Self {
            fixed_index: config.gid_index,
            family: config.addr_family,
            range: config.addr_range,
            roce_version: config.roce_version,
        }
    }

    /// The range `e` lies outside of, when selection was automatic (a fixed index ignores the
    /// range, as NCCL's transport does): a GID the user's subnet rules out.
    pub fn range_missed_by(&self, e: &GidEntry) -> Option<AddrRange> {
        self.range
            .filter(|r| self.fixed_index.is_none() && !r.contains(e.ip()))
    }

    /// The preferences `e` misses, in the order selection weighs them: outside the range,
    /// link-local, other family, other RoCE version.
    fn shortfalls(&self, e: &GidEntry) -> [Option<String>; 4] {
        [
            self.range_missed_by(e)
                .map(|r| format!("outside NCCL_IB_ADDR_RANGE {r}")),
            e.is_link_local()
                .then(|| "link-local (fe80::/10, not routable beyond the link)".to_owned()),
            (e.family() != self.family).then(|| {
                format!(
                    "{}, NCCL_IB_ADDR_FAMILY prefers {}",
                    e.family().name(),
                    self.family.name()
                )
            }),
            match e.roce_version {
                Some(v) if u32::from(v) == self.roce_version => None,
                Some(v) => Some(format!(
                    "RoCE v{v}, NCCL_IB_ROCE_VERSION_NUM prefers v{}",
                    self.roce_version
                )),
                None => Some(
                    "RoCE version unreadable (gid_attrs/types; in a container: a GID of another \
                     network namespace)"
                        .to_owned(),
                ),
            },
        ]
    }
}

/// Choose the GID for a RoCE port among its populated entries: the policy's fixed index when
/// set, otherwise the best by (inside the range, routable, preferred family, preferred RoCE
/// version, lowest index); a port without an entry that meets every preference falls back to
/// the best of the rest rather than failing, and the choice says what it misses.
pub fn choose_gid(entries: &[GidEntry], policy: &GidPolicy) -> GidChoice {
    let populated: Vec<&GidEntry> = entries.iter().filter(|e| e.gid != [0; 16]).collect();
    let misses = |e: &GidEntry| policy.shortfalls(e);
    let rank = |e: &GidEntry| (misses(e).map(|m| m.is_none()), std::cmp::Reverse(e.index));
    let chosen = match policy.fixed_index {
        Some(index) => populated
            .iter()
            .find(|e| e.index == index)
            .map(|e| (*e).clone())
            .ok_or_else(|| {
                let table: Vec<String> = populated.iter().map(ToString::to_string).collect();
                format!(
                    "NCCL_IB_GID_INDEX={index} is not a populated GID (table: {})",
                    table.join(", ")
                )
            }),
        None => populated
            .iter()
            .max_by_key(|e| rank(e))
            .map(|e| (*e).clone())
            .ok_or_else(|| "the port has no populated GID".to_owned()),
    };
    let candidates = populated
        .iter()
        .map(|e| {
            let rejected = match (&chosen, policy.fixed_index) {
                (Ok(c), _) if c.index == e.index => None,
                (_, Some(index)) => Some(format!("NCCL_IB_GID_INDEX={index} pins another entry")),
                (Ok(c), None) => {
                    let (mine, best) = (misses(e), misses(c));
                    let reason = mine
                        .into_iter()
                        .zip(best)
                        .find_map(|(m, b)| m.filter(|_| b.is_none()));
                    Some(reason.unwrap_or_else(|| {
                        format!("as good as GID index {}, which comes first", c.index)
                    }))
                }
                (Err(_), None) => None,
            };
            GidCandidate {
                entry: (*e).clone(),
                rejected,
            }
        })
        .collect();
    let shortfalls = chosen
        .as_ref()
        .map(|c| misses(c).into_iter().flatten().collect())
        .unwrap_or_default();
    GidChoice {
        chosen,
        candidates,
        shortfalls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(fixed_index: Option<u32>, family: AddrFamily, roce_version: u32) -> GidPolicy {
        GidPolicy {
            fixed_index,
            family,
            range: None,
            roce_version,
        }
    }

    fn pick(
        entries: &[GidEntry],
        fixed_index: Option<u32>,
        family: AddrFamily,
        roce_version: u32,
    ) -> Result<GidEntry, String> {
        choose_gid(entries, &policy(fixed_index, family, roce_version)).chosen
    }

    fn entry(index: u32, gid: &str, version: u8) -> GidEntry {
        GidEntry {
            index,
            gid: parse_gid(gid).unwrap(),
            roce_version: Some(version),
            netdev: Some("eth0".into()),
        }
    }

    fn rxe_table() -> Vec<GidEntry> {
        vec![
            entry(0, "fe80:0000:0000:0000:a866:21ff:fe67:2270", 2),
            entry(1, "0000:0000:0000:0000:0000:ffff:7f00:0101", 2),
        ]
    }

    fn cx7_table() -> Vec<GidEntry> {
        vec![
            entry(0, "fe80:0000:0000:0000:0e42:a1ff:fe00:0001", 1),
            entry(1, "fe80:0000:0000:0000:0e42:a1ff:fe00:0001", 2),
            entry(2, "0000:0000:0000:0000:0000:ffff:0a00:0001", 1),
            entry(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", 2),
            entry(4, "fd00:0000:0000:0000:0000:0000:0000:0001", 1),
            entry(5, "fd00:0000:0000:0000:0000:0000:0000:0001", 2),
        ]
    }

    #[test]
    fn parses_sysfs_text() {
        assert_eq!(parse_roce_version("RoCE v2\n"), Some(2));
        assert_eq!(parse_roce_version("IB/RoCE v1"), Some(1));
        assert_eq!(parse_roce_version("garbage"), None);
        let g = parse_gid("0000:0000:0000:0000:0000:ffff:7f00:0101\n").unwrap();
        assert_eq!(
            GidEntry {
                index: 1,
                gid: g,
                roce_version: None,
                netdev: None
            }
            .ip()
            .to_string(),
            "127.0.1.1"
        );
        assert_eq!(parse_gid("1:2:3"), None);
    }

    #[test]
    fn auto_prefers_ipv4_roce_v2() {
        assert_eq!(
            pick(&cx7_table(), None, AddrFamily::V4, 2).unwrap().index,
            3
        );
        assert_eq!(
            pick(&rxe_table(), None, AddrFamily::V4, 2).unwrap().index,
            1
        );
    }

    #[test]
    fn family_and_version_preferences_are_honoured() {
        assert_eq!(
            pick(&cx7_table(), None, AddrFamily::V4, 1).unwrap().index,
            2
        );
        assert_eq!(
            pick(&cx7_table(), None, AddrFamily::V6, 2).unwrap().index,
            5
        );
    }

    #[test]
    fn falls_back_to_ipv6_without_an_ipv4_gid() {
        let table: Vec<GidEntry> = cx7_table()
            .into_iter()
            .filter(|e| e.family() == AddrFamily::V6)
            .collect();
        assert_eq!(pick(&table, None, AddrFamily::V4, 2).unwrap().index, 5);
        let link_local_only = vec![cx7_table()[1].clone()];
        assert_eq!(
            pick(&link_local_only, None, AddrFamily::V4, 2)
                .unwrap()
                .index,
            1
        );
    }

    #[test]
    fn fixed_index_wins_or_explains() {
        assert_eq!(
            pick(&cx7_table(), Some(0), AddrFamily::V4, 2)
                .unwrap()
                .index,
            0
        );
        let e = pick(&rxe_table(), Some(7), AddrFamily::V4, 2).unwrap_err();
        assert!(
            e.contains("NCCL_IB_GID_INDEX=7") && e.contains("GID index 1"),
            "{e}"
        );
        assert!(pick(&[], None, AddrFamily::V4, 2).is_err());
    }

    #[test]
    fn every_candidate_passed_over_has_a_reason() {
        let choice = choose_gid(&cx7_table(), &policy(None, AddrFamily::V4, 2));
        assert_eq!(choice.chosen.as_ref().unwrap().index, 3);
        assert!(choice.shortfalls.is_empty());
        let reasons: Vec<(u32, Option<&str>)> = choice
            .candidates
            .iter()
            .map(|c| (c.entry.index, c.rejected.as_deref()))
            .collect();
        assert_eq!(
            reasons,
            [
                (
                    0,
                    Some("link-local (fe80::/10, not routable beyond the link)")
                ),
                (
                    1,
                    Some("link-local (fe80::/10, not routable beyond the link)")
                ),
                (2, Some("RoCE v1, NCCL_IB_ROCE_VERSION_NUM prefers v2")),
                (3, None),
                (4, Some("AF_INET6, NCCL_IB_ADDR_FAMILY prefers AF_INET")),
                (5, Some("AF_INET6, NCCL_IB_ADDR_FAMILY prefers AF_INET")),
            ]
        );
    }

    #[test]
    fn a_fallback_or_pinned_choice_reports_its_shortfalls() {
        let v6_only: Vec<GidEntry> = cx7_table()
            .into_iter()
            .filter(|e| e.family() == AddrFamily::V6)
            .collect();
        let choice = choose_gid(&v6_only, &policy(None, AddrFamily::V4, 2));
        assert_eq!(choice.chosen.unwrap().index, 5);
        assert_eq!(
            choice.shortfalls,
            ["AF_INET6, NCCL_IB_ADDR_FAMILY prefers AF_INET"]
        );

        let pinned = choose_gid(&cx7_table(), &policy(Some(0), AddrFamily::V4, 2));
        assert_eq!(pinned.shortfalls.len(), 3, "{:?}", pinned.shortfalls);
        assert_eq!(
            pinned.candidates[3].rejected.as_deref(),
            Some("NCCL_IB_GID_INDEX=0 pins another entry")
        );

        let mut unreadable = rxe_table();
        unreadable[1].roce_version = None;
        let choice = choose_gid(&unreadable, &policy(None, AddrFamily::V4, 2));
        assert_eq!(choice.chosen.unwrap().index, 1);
        assert!(choice.shortfalls[0].contains("another network namespace"));
    }

    #[test]
    fn the_address_range_decides_before_the_other_preferences() {
        let range = |text: &str| {
            Config::from_vars([("NCCL_IB_ADDR_RANGE", text)])
                .unwrap()
                .addr_range
        };
        // The port carries a second IPv4 address, in another subnet, at a higher index.
        let mut table = cx7_table();
        table.push(entry(6, "0000:0000:0000:0000:0000:ffff:0a01:0007", 2));
        let within = GidPolicy {
            range: range("10.1.0.0/16"),
            ..policy(None, AddrFamily::V4, 2)
        };
        let choice = choose_gid(&table, &within);
        assert_eq!(choice.chosen.as_ref().unwrap().index, 6);
        assert!(choice.shortfalls.is_empty());
        assert_eq!(
            choice.candidates[3].rejected.as_deref(),
            Some("outside NCCL_IB_ADDR_RANGE 10.1.0.0/16")
        );
        // Without the range the lower index wins, as before.
        assert_eq!(pick(&table, None, AddrFamily::V4, 2).unwrap().index, 3);

        // No entry inside: the best of the rest, saying what it misses (NCCL keeps index 0).
        let nowhere = GidPolicy {
            range: range("192.168.0.0/16"),
            ..within
        };
        let choice = choose_gid(&table, &nowhere);
        assert_eq!(choice.chosen.unwrap().index, 3);
        assert_eq!(
            choice.shortfalls,
            ["outside NCCL_IB_ADDR_RANGE 192.168.0.0/16"]
        );

        // NCCL_IB_GID_INDEX wins and the range is ignored, as in NCCL's transport.
        let pinned = GidPolicy {
            fixed_index: Some(3),
            ..nowhere
        };
        assert!(choose_gid(&table, &pinned).shortfalls.is_empty());

        let v6 = GidPolicy {
            range: Config::from_vars([
                ("NCCL_IB_ADDR_RANGE", "fd00::/8"),
                ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ])
            .unwrap()
            .addr_range,
            ..policy(None, AddrFamily::V6, 2)
        };
        let choice = choose_gid(&table, &v6);
        assert_eq!(choice.chosen.unwrap().index, 5);
        assert!(choice.shortfalls.is_empty());
    }
}
