//! Every environment variable the plugin reads, declared once ([`KNOBS`], in `knobs.rs`) and
//! parsed once (here).
//!
//! `plugin::init` hands the process environment to [`Config::from_vars`]; the result is passed
//! down immutable. Nothing else reads the environment, so tests build a `Config` from a list of
//! pairs instead of mutating the process environment. NCCL copies `/etc/nccl.conf` entries into
//! the environment before it calls `init`, so those are seen too.

use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use super::eager::MAX_EAGER_BYTES;
use super::error::{Error, Result};
use super::proto::SLOTS;

mod knobs;

pub use knobs::{KNOBS, Knob, NOT_IMPLEMENTED, not_implemented_set};

/// Traffic class (RoCE GRH) and service level (InfiniBand) of a connection's QPs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub struct Traffic {
    /// RoCE traffic class.
    pub class: u8,
    /// InfiniBand service level.
    pub level: u8,
}

/// Default of `NCCL_NET_RS_EAGER_BYTES`.
pub const DEFAULT_EAGER_BYTES: u64 = 4096;
/// Default slots of a receive comm's eager bounce ring (`NCCL_NET_RS_EAGER_SLOTS`): NCCL's
/// proxy keeps at most `NCCL_STEPS` (8) sends in flight per comm.
pub const DEFAULT_EAGER_SLOTS: u8 = 8;

/// Most QPs one connection may use.
pub const MAX_QPS_PER_CONNECTION: u32 = 16;

/// Most ports one fused device may have (NCCL's limit for ncclNet v12,
/// `NCCL_NET_MAX_DEVS_PER_NIC_V12`; v9 to v11 pass at most 4 to `makeVDevice`).
pub const MAX_FUSED_MEMBERS: usize = 8;

/// `NCCL_IB_PCI_RELAXED_ORDERING`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RelaxedOrdering {
    /// 0: never.
    Off,
    /// 1: whenever the verbs library can register with it.
    On,
    /// 2: for SR-IOV VFs and under a hypervisor, where it matters.
    Auto,
}

/// Preferred address family of the RoCE GID.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum AddrFamily {
    /// IPv4 (IPv4-mapped GIDs).
    V4,
    /// IPv6.
    V6,
}

/// `NCCL_IB_ADDR_RANGE`: a subnet in CIDR notation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AddrRange {
    /// The subnet's address (bits beyond the prefix are ignored, as NCCL's transport does).
    pub network: IpAddr,
    /// Leading bits that must match.
    pub prefix_len: u8,
}

impl AddrRange {
    /// Whether `ip` lies in the subnet (never for an address of the other family).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let differing = match (self.network, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => u128::from(u32::from(n) ^ u32::from(a)) << 96,
            (IpAddr::V6(n), IpAddr::V6(a)) => u128::from(n) ^ u128::from(a),
            _ => return false,
        };
        // A shift by the whole width (prefix 0) is None: every address matches.
        differing
            .checked_shr(128 - u32::from(self.prefix_len))
            .unwrap_or(0)
            == 0
    }

    /// The subnet's address family.
    pub fn family(&self) -> AddrFamily {
        match self.network {
            IpAddr::V4(_) => AddrFamily::V4,
            IpAddr::V6(_) => AddrFamily::V6,
        }
    }

    fn parse(value: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::config(format!(
                "NCCL_IB_ADDR_RANGE='{value}' is not valid: {why}, e.g. 10.1.0.0/16 or fd00:1::/64"
            ))
        };
        let (address, prefix) = value
            .split_once('/')
            .ok_or_else(|| bad("expected address/prefix-length"))?;
        let network: IpAddr = address
            .trim()
            .parse()
            .map_err(|_| bad("the address is not an IPv4 or IPv6 address"))?;
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix_len = prefix
            .trim()
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= width)
            .ok_or_else(|| bad(&format!("the prefix length must be 0..={width}")))?;
        Ok(Self {
            network,
            prefix_len,
        })
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix_len)
    }
}

impl AddrFamily {
    /// Whether `ip` is of this family.
    pub fn matches(self, ip: &IpAddr) -> bool {
        ip.is_ipv4() == (self == Self::V4)
    }

    /// NCCL's spelling: `AF_INET` or `AF_INET6`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V4 => "AF_INET",
            Self::V6 => "AF_INET6",
        }
    }
}

/// The parsed configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Raw `NCCL_IB_HCA`, parsed by `topology::HcaFilter`; `None` when unset or empty.
    pub ib_hca: Option<String>,
    /// `tracing` filter directive for the plugin's own log events.
    pub log_directive: String,
    /// Fixed GID index, or `None` for automatic selection.
    pub gid_index: Option<u32>,
    /// InfiniBand: the GID index a port offers when that GID carries a routable FLID (else 0).
    pub routable_flid_gid_index: u32,
    /// Preferred GID address family.
    pub addr_family: AddrFamily,
    /// `NCCL_IB_ADDR_RANGE`: the subnet an automatically chosen RoCE GID must lie in.
    pub addr_range: Option<AddrRange>,
    /// Preferred RoCE version (1 or 2).
    pub roce_version: u32,
    /// QP ack timeout exponent.
    pub ib_timeout: u8,
    /// QP retry count.
    pub retry_cnt: u8,
    /// `NCCL_IB_SL`, when set.
    pub service_level: Option<u8>,
    /// `NCCL_IB_TC`, when set.
    pub traffic_class: Option<u8>,
    /// `NCCL_IB_FIFO_TC`, when set: the receiver's RoCE traffic class.
    pub fifo_traffic_class: Option<u8>,
    /// `NCCL_IB_PKEY`, when set: the P_Key index of every QP (else 0, unchecked).
    pub pkey_index: Option<u16>,
    /// QPs per connection.
    pub qps_per_connection: u32,
    /// Split each message over all QPs.
    pub split_data_on_qps: bool,
    /// Create a flush QP per receive comm.
    pub flush_enabled: bool,
    /// `NCCL_IB_ADAPTIVE_ROUTING` when set (else on for InfiniBand ports, off for RoCE).
    pub adaptive_routing: Option<bool>,
    /// `NCCL_IB_AR_THRESHOLD`: with adaptive routing, data writes above this many bytes split.
    pub ar_threshold: u64,
    /// Interface for the out-of-band exchange.
    pub socket_ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`: the out-of-band address's family, when NCCL's rule chooses it
    /// (`AF_INET`, `AF_INET6`; any other value forces nothing, as in NCCL).
    pub socket_family: Option<AddrFamily>,
    /// `NCCL_COMM_ID` (`host:port`): NCCL's rule prefers the interface in its subnet.
    pub comm_id: Option<String>,
    /// Deadline for connect/accept.
    pub connect_timeout: Duration,
    /// Fuse ports and functions of one NIC (`NCCL_IB_MERGE_NICS`).
    pub merge_nics: bool,
    /// Fuse the VFs of one PF (`NCCL_IB_MERGE_VFS`).
    pub merge_vfs: bool,
    /// Explicit fusions: groups of device names (`NCCL_NET_RS_FUSE`).
    pub fuse: Vec<Vec<String>>,
    /// Relaxed-ordering policy.
    pub relaxed_ordering: RelaxedOrdering,
    /// Probe and advertise DMA-BUF.
    pub dmabuf_enabled: bool,
    /// Fail comms after a fatal asynchronous device event (`NCCL_IB_RETURN_ASYNC_EVENTS`).
    pub return_async_events: bool,
    /// Largest message of the eager path (`NCCL_NET_RS_EAGER_BYTES`); 0 = off.
    pub eager_bytes: u64,
    /// Slots of a receive comm's eager bounce ring (`NCCL_NET_RS_EAGER_SLOTS`): a power of two
    /// up to `core::proto::SLOTS`; what the peer offers and quiet receives may raise it (see
    /// `core::eager::agreed_bounce_slots`).
    pub eager_slots: u8,
    /// Offer quiet receives (`NCCL_NET_RS_QUIET`, see `core::proto`); off by default: a
    /// truncated quiet eager send reports the size it was given (docs/design.md).
    pub quiet: bool,
    /// How long a quiet receive waits for an eager message before it writes its CTS.
    pub quiet_wait: Duration,
    /// Hold the answers of back-to-back receives for one write (`NCCL_NET_RS_BATCH`); off by
    /// default: it measures even on rxe, and a held answer may wait a watcher tick
    /// (docs/design.md).
    pub batch: bool,
    /// Move a failed member's lanes to the members left (`NCCL_IB_RESILIENCY_PORT_FAILOVER`),
    /// when the peer agrees; on by default.
    pub port_failover: bool,
    /// Move lanes back once their home members are up again
    /// (`NCCL_IB_RESILIENCY_PORT_RECOVERY`); on by default.
    pub port_recovery: bool,
    /// Carry the out-of-band messages of every comm between two processes on one shared TCP
    /// connection (`NCCL_NET_RS_SHARE_LINKS`, see `core::links`); on by default.
    pub share_links: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            ib_hca: None,
            log_directive: "nccl_net=warn".into(),
            gid_index: None,
            routable_flid_gid_index: 1,
            addr_family: AddrFamily::V4,
            addr_range: None,
            roce_version: 2,
            ib_timeout: 20,
            retry_cnt: 7,
            service_level: None,
            traffic_class: None,
            fifo_traffic_class: None,
            pkey_index: None,
            qps_per_connection: 1,
            split_data_on_qps: false,
            flush_enabled: true,
            adaptive_routing: None,
            ar_threshold: 8192,
            socket_ifname: None,
            socket_family: None,
            comm_id: None,
            connect_timeout: Duration::from_secs(120),
            merge_nics: true,
            merge_vfs: false,
            fuse: Vec::new(),
            relaxed_ordering: RelaxedOrdering::Auto,
            dmabuf_enabled: true,
            return_async_events: true,
            eager_bytes: DEFAULT_EAGER_BYTES,
            eager_slots: DEFAULT_EAGER_SLOTS,
            quiet: false,
            quiet_wait: Duration::from_micros(200),
            batch: false,
            port_failover: true,
            port_recovery: true,
            share_links: true,
        }
    }
}

fn number(name: &str, value: &str, min: i64, max: i64) -> Result<i64> {
    match value.parse::<i64>() {
        Ok(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(Error::config(format!(
            "{name}='{value}' is not valid: expected an integer in {min}..={max}"
        ))),
    }
}

/// A bounce ring's slot count: a power of two in `1..=SLOTS`, so that a sequence number's low
/// bits name its slot on both sides.
fn eager_slots(name: &str, value: &str) -> Result<u8> {
    let v: u8 = narrow(number(name, value, 1, SLOTS as i64)?);
    if !v.is_power_of_two() {
        return Err(Error::config(format!(
            "{name}='{value}' is not valid: expected a power of two in 1..={SLOTS}"
        )));
    }
    Ok(v)
}

/// `-1` (NCCL's "unset") or a value in `0..=max`.
fn optional(name: &str, value: &str, max: i64) -> Result<Option<i64>> {
    let v = number(name, value, -1, max)?;
    Ok((v >= 0).then_some(v))
}

/// `a+b,c+d` (`;` also separates groups): every group names at least two distinct devices.
fn fuse_groups(value: &str) -> Result<Vec<Vec<String>>> {
    value
        .split([',', ';'])
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(|group| {
            let names: Vec<String> = group.split('+').map(|n| n.trim().to_owned()).collect();
            let distinct = names
                .iter()
                .enumerate()
                .all(|(i, n)| !names[..i].contains(n));
            if names.len() < 2 || names.len() > MAX_FUSED_MEMBERS || !distinct || names.iter().any(String::is_empty) {
                return Err(Error::config(format!(
                    "NCCL_NET_RS_FUSE='{value}' is not valid: '{group}' must name 2..={MAX_FUSED_MEMBERS} \
                     distinct devices joined by '+', e.g. rxe0+rxe1"
                )));
            }
            Ok(names)
        })
        .collect()
}

fn narrow<T: TryFrom<i64>>(v: i64) -> T {
    // INVARIANT: every caller bounds `v` to T's range with `number`/`optional` first.
    T::try_from(v).unwrap_or_else(|_| unreachable!("range checked"))
}

impl Config {
    /// Above how many bytes a connection's data write-with-immediate goes as a plain write and
    /// a zero-byte write-with-immediate, as NCCL's transport does with adaptive routing (on by
    /// default when every port of the connection is InfiniBand: `init.cc`, `p2p.cc`), so that
    /// the bulk travels as a plain write; `None` when it does not split.
    pub fn adaptive_routing_split(&self, all_infiniband: bool) -> Option<u64> {
        self.adaptive_routing
            .unwrap_or(all_infiniband)
            .then_some(self.ar_threshold)
    }

    /// The traffic class and service level of a connection whose communicator asked for
    /// `comm_class` (v10's connect config, v11+'s init config): `NCCL_IB_TC` and `NCCL_IB_SL`
    /// win when set, else the communicator's class serves as both, else 0, as NCCL's transport
    /// decides (net_ib/connect.cc, `meta.sl`/`meta.tc`).
    pub fn traffic(&self, comm_class: Option<u8>) -> Traffic {
        Traffic {
            class: self.traffic_class.or(comm_class).unwrap_or(0),
            level: self.service_level.or(comm_class).unwrap_or(0),
        }
    }

    /// The traffic class and service level of a receiver's QPs, whose sender chose `sender`:
    /// on RoCE `NCCL_IB_FIFO_TC` replaces the class when set, so that the clear-to-sends (the
    /// receiver's only writes) can travel in a class of their own, as NCCL's transport decides
    /// (net_ib/connect.cc, the receiver's `rtrAttr->tc`); otherwise the sender's choice.
    pub fn receiver_traffic(&self, sender: Traffic, roce: bool) -> Traffic {
        Traffic {
            class: self
                .fifo_traffic_class
                .filter(|_| roce)
                .unwrap_or(sender.class),
            level: sender.level,
        }
    }

    /// Build the configuration from the variables [`KNOBS`] names, looked up one by one with
    /// `lookup` (the plugin passes the process environment's): nothing else in the environment is read,
    /// so an unrelated variable holding any bytes cannot matter.
    ///
    /// # Errors
    /// `Config` naming the variable when one of ours is not UTF-8 or not valid.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self> {
        let mut vars = Vec::new();
        for knob in KNOBS {
            let Some(raw) = lookup(knob.name) else {
                continue;
            };
            let value = raw.into_string().map_err(|raw| {
                Error::config(format!(
                    "{}={} is not valid: the value is not UTF-8",
                    knob.name,
                    raw.to_string_lossy()
                ))
            })?;
            vars.push((knob.name, value));
        }
        Self::from_vars(vars)
    }

    /// Build the configuration from `(name, value)` pairs (the caller passes the process
    /// environment). Empty values count as unset.
    ///
    /// # Errors
    /// `Config` naming the variable when a value is out of range or not a number.
    pub fn from_vars<I, K, V>(vars: I) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut c = Self::default();
        let mut nccl_debug = None;
        let mut own_filter = None;
        for (name, value) in vars {
            let (name, value) = (name.as_ref(), value.as_ref().trim());
            if value.is_empty() {
                continue;
            }
            match name {
                "NCCL_IB_HCA" => c.ib_hca = Some(value.to_owned()),
                "NCCL_DEBUG" => nccl_debug = Some(value.to_ascii_uppercase()),
                "NCCL_NET_RS_LOG" => own_filter = Some(value.to_owned()),
                "NCCL_IB_GID_INDEX" => c.gid_index = optional(name, value, 65535)?.map(narrow),
                "NCCL_IB_ROUTABLE_FLID_GID_INDEX" => {
                    c.routable_flid_gid_index = narrow(number(name, value, 0, 65535)?);
                }
                "NCCL_IB_ADDR_FAMILY" => {
                    c.addr_family = match value {
                        "AF_INET" => AddrFamily::V4,
                        "AF_INET6" => AddrFamily::V6,
                        _ => {
                            return Err(Error::config(format!(
                                "NCCL_IB_ADDR_FAMILY='{value}' is not valid: expected AF_INET or AF_INET6"
                            )));
                        }
                    }
                }
                "NCCL_IB_ADDR_RANGE" => c.addr_range = Some(AddrRange::parse(value)?),
                "NCCL_IB_ROCE_VERSION_NUM" => c.roce_version = narrow(number(name, value, 1, 2)?),
                "NCCL_IB_TIMEOUT" => c.ib_timeout = narrow(number(name, value, 1, 31)?),
                "NCCL_IB_RETRY_CNT" => c.retry_cnt = narrow(number(name, value, 0, 7)?),
                "NCCL_IB_SL" => c.service_level = optional(name, value, 15)?.map(narrow),
                "NCCL_IB_TC" => c.traffic_class = optional(name, value, 255)?.map(narrow),
                "NCCL_IB_FIFO_TC" => {
                    c.fifo_traffic_class = optional(name, value, 255)?.map(narrow);
                }
                "NCCL_IB_PKEY" => c.pkey_index = Some(narrow(number(name, value, 0, 65535)?)),
                "NCCL_IB_QPS_PER_CONNECTION" => {
                    c.qps_per_connection =
                        narrow(number(name, value, 1, MAX_QPS_PER_CONNECTION.into())?);
                }
                "NCCL_IB_SPLIT_DATA_ON_QPS" => {
                    c.split_data_on_qps = number(name, value, 0, 1)? == 1
                }
                "NCCL_GDR_FLUSH_DISABLE" => c.flush_enabled = number(name, value, 0, 1)? == 0,
                "NCCL_IB_ADAPTIVE_ROUTING" => {
                    c.adaptive_routing = Some(number(name, value, 0, 1)? == 1)
                }
                "NCCL_IB_AR_THRESHOLD" => {
                    c.ar_threshold = narrow(number(name, value, 0, u32::MAX.into())?);
                }
                "NCCL_IB_MERGE_NICS" => c.merge_nics = number(name, value, 0, 1)? == 1,
                "NCCL_IB_MERGE_VFS" => c.merge_vfs = number(name, value, 0, 1)? == 1,
                "NCCL_NET_RS_FUSE" => c.fuse = fuse_groups(value)?,
                "NCCL_IB_PCI_RELAXED_ORDERING" => {
                    c.relaxed_ordering = match number(name, value, 0, 2)? {
                        0 => RelaxedOrdering::Off,
                        1 => RelaxedOrdering::On,
                        _ => RelaxedOrdering::Auto,
                    }
                }
                "NCCL_DMABUF_ENABLE" => c.dmabuf_enabled = number(name, value, 0, 1)? == 1,
                "NCCL_IB_RETURN_ASYNC_EVENTS" => {
                    c.return_async_events = number(name, value, 0, 1)? == 1;
                }
                "NCCL_SOCKET_IFNAME" => c.socket_ifname = Some(value.to_owned()),
                "NCCL_SOCKET_FAMILY" => {
                    c.socket_family = match value {
                        "AF_INET" => Some(AddrFamily::V4),
                        "AF_INET6" => Some(AddrFamily::V6),
                        _ => None,
                    }
                }
                "NCCL_COMM_ID" => c.comm_id = Some(value.to_owned()),
                "NCCL_NET_RS_EAGER_BYTES" => {
                    c.eager_bytes = narrow(number(name, value, 0, MAX_EAGER_BYTES as i64)?);
                }
                "NCCL_NET_RS_EAGER_SLOTS" => c.eager_slots = eager_slots(name, value)?,
                "NCCL_NET_RS_QUIET" => c.quiet = number(name, value, 0, 1)? == 1,
                "NCCL_NET_RS_QUIET_WAIT_US" => {
                    c.quiet_wait =
                        Duration::from_micros(narrow(number(name, value, 1, 1_000_000)?));
                }
                "NCCL_NET_RS_BATCH" => c.batch = number(name, value, 0, 1)? == 1,
                "NCCL_IB_RESILIENCY_PORT_FAILOVER" => {
                    c.port_failover = number(name, value, 0, 1)? == 1;
                }
                "NCCL_IB_RESILIENCY_PORT_RECOVERY" => {
                    c.port_recovery = number(name, value, 0, 1)? == 1;
                }
                "NCCL_NET_RS_SHARE_LINKS" => c.share_links = number(name, value, 0, 1)? == 1,
                "NCCL_NET_RS_CONNECT_TIMEOUT" => {
                    c.connect_timeout =
                        Duration::from_secs(narrow(number(name, value, 1, 86_400)?));
                }
                _ => {}
            }
        }
        if let Some(range) = c.addr_range.filter(|r| r.family() != c.addr_family) {
            // NCCL's transport reads the range in NCCL_IB_ADDR_FAMILY and drops one of the
            // other family without a word; say so instead of choosing a GID the user did not want.
            return Err(Error::config(format!(
                "NCCL_IB_ADDR_RANGE='{range}' is an {} range but the GID family is {} \
                 (NCCL_IB_ADDR_FAMILY): set NCCL_IB_ADDR_FAMILY={} too",
                range.family().name(),
                c.addr_family.name(),
                range.family().name()
            )));
        }
        c.log_directive = own_filter.unwrap_or_else(|| {
            // NCCL filters by level after we format; matching its level avoids formatting lines
            // it would drop.
            let level = match nccl_debug.as_deref() {
                Some("TRACE") => "trace",
                Some("INFO") => "info",
                _ => "warn",
            };
            format!("nccl_net={level}")
        });
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Config> {
        Config::from_vars(vars.iter().copied())
    }

    #[test]
    fn defaults_match_nccl() {
        let c = parse(&[]).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(
            (c.ib_timeout, c.retry_cnt, c.qps_per_connection),
            (20, 7, 1)
        );
        assert_eq!(c.log_directive, "nccl_net=warn");
    }

    #[test]
    fn nccl_debug_sets_the_level_case_insensitively() {
        assert_eq!(
            parse(&[("NCCL_DEBUG", "info")]).unwrap().log_directive,
            "nccl_net=info"
        );
        assert_eq!(
            parse(&[("NCCL_DEBUG", "TRACE")]).unwrap().log_directive,
            "nccl_net=trace"
        );
    }

    #[test]
    fn own_filter_wins_over_nccl_debug() {
        let c = parse(&[
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_NET_RS_LOG", "nccl_net=debug"),
        ])
        .unwrap();
        assert_eq!(c.log_directive, "nccl_net=debug");
    }

    #[test]
    fn empty_values_are_unset() {
        assert_eq!(parse(&[("NCCL_IB_HCA", "  ")]).unwrap().ib_hca, None);
        assert_eq!(
            parse(&[("NCCL_IB_HCA", "^rxe0")])
                .unwrap()
                .ib_hca
                .as_deref(),
            Some("^rxe0")
        );
    }

    /// NCCL's transport: adaptive routing on for InfiniBand ports and off for RoCE unless
    /// `NCCL_IB_ADAPTIVE_ROUTING` says otherwise (`init.cc`), splitting above the threshold.
    #[test]
    fn adaptive_routing_follows_the_link_layer_unless_set() {
        let d = Config::default();
        assert_eq!(
            (
                d.adaptive_routing_split(true),
                d.adaptive_routing_split(false)
            ),
            (Some(8192), None)
        );
        let off = parse(&[("NCCL_IB_ADAPTIVE_ROUTING", "0")]).unwrap();
        assert_eq!(off.adaptive_routing_split(true), None);
        let on = parse(&[
            ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
            ("NCCL_IB_AR_THRESHOLD", "4096"),
        ])
        .unwrap();
        assert_eq!(on.adaptive_routing_split(false), Some(4096));
        assert!(parse(&[("NCCL_IB_ADAPTIVE_ROUTING", "2")]).is_err());
    }

    #[test]
    fn ib_knobs_parse_with_nccl_meanings() {
        let c = parse(&[
            ("NCCL_IB_GID_INDEX", "3"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ("NCCL_IB_TIMEOUT", "14"),
            ("NCCL_IB_SL", "-1"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_QPS_PER_CONNECTION", "4"),
            ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
            ("NCCL_GDR_FLUSH_DISABLE", "1"),
            ("NCCL_NET_RS_CONNECT_TIMEOUT", "5"),
            ("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "2"),
            ("NCCL_IB_PKEY", "1"),
        ])
        .unwrap();
        assert_eq!(c.pkey_index, Some(1));
        assert_eq!(Config::default().pkey_index, None);
        assert_eq!(c.gid_index, Some(3));
        assert_eq!(c.routable_flid_gid_index, 2);
        assert_eq!(Config::default().routable_flid_gid_index, 1);
        assert!(parse(&[("NCCL_IB_ROUTABLE_FLID_GID_INDEX", "-1")]).is_err());
        assert_eq!(c.addr_family, AddrFamily::V6);
        assert_eq!(
            (c.ib_timeout, c.service_level, c.traffic_class),
            (14, None, Some(106))
        );
        assert_eq!(
            (c.qps_per_connection, c.split_data_on_qps, c.flush_enabled),
            (4, true, false)
        );
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(
            parse(&[("NCCL_IB_GID_INDEX", "-1")]).unwrap().gid_index,
            None
        );
    }

    #[test]
    fn fusion_and_gdr_knobs_parse() {
        let c = parse(&[
            ("NCCL_IB_MERGE_NICS", "0"),
            ("NCCL_IB_MERGE_VFS", "1"),
            ("NCCL_NET_RS_FUSE", " rxe0+rxe1 ; mlx5_0 + mlx5_3,"),
            ("NCCL_IB_PCI_RELAXED_ORDERING", "0"),
            ("NCCL_DMABUF_ENABLE", "0"),
        ])
        .unwrap();
        assert!(!c.merge_nics && c.merge_vfs && !c.dmabuf_enabled);
        assert_eq!(c.fuse, [vec!["rxe0", "rxe1"], vec!["mlx5_0", "mlx5_3"]]);
        assert_eq!(c.relaxed_ordering, RelaxedOrdering::Off);
        let d = parse(&[]).unwrap();
        assert!(d.merge_nics && !d.merge_vfs && d.dmabuf_enabled && d.fuse.is_empty());
        assert!(
            !d.batch,
            "answers are written inside their irecv unless asked otherwise"
        );
        assert!(parse(&[("NCCL_NET_RS_BATCH", "1")]).unwrap().batch);
        assert_eq!(d.relaxed_ordering, RelaxedOrdering::Auto);
    }

    #[test]
    fn traffic_follows_the_variables_then_the_communicator() {
        let unset = parse(&[]).unwrap();
        assert_eq!(unset.traffic(None), Traffic { class: 0, level: 0 });
        assert_eq!(unset.traffic(Some(5)), Traffic { class: 5, level: 5 });
        let tc = parse(&[("NCCL_IB_TC", "106")]).unwrap();
        assert_eq!(
            tc.traffic(Some(5)),
            Traffic {
                class: 106,
                level: 5
            }
        );
        let both = parse(&[("NCCL_IB_TC", "106"), ("NCCL_IB_SL", "3")]).unwrap();
        assert_eq!(
            both.traffic(Some(5)),
            Traffic {
                class: 106,
                level: 3
            }
        );
    }

    #[test]
    fn options_of_nccls_transport_are_named_when_set_and_never_parsed() {
        let env = |name: &str| match name {
            "NCCL_IB_ECE_ENABLE" => Some(OsString::from(" 0 ")),
            "NCCL_IB_OOO_RQ" => Some(OsString::from("")),
            "NCCL_IBVERBS_LIB" => Some(OsString::from("libibverbs.so.1")),
            _ => None,
        };
        assert_eq!(
            not_implemented_set(env),
            ["NCCL_IB_ECE_ENABLE=0", "NCCL_IBVERBS_LIB=libibverbs.so.1"]
        );
        assert_eq!(Config::from_lookup(env).unwrap(), Config::default());
        // None of them is a variable the plugin honours.
        assert!(
            NOT_IMPLEMENTED
                .iter()
                .all(|n| KNOBS.iter().all(|k| k.name != n.name))
        );
    }

    #[test]
    fn the_receivers_class_is_nccl_ib_fifo_tc_on_roce_only() {
        let sender = Traffic {
            class: 106,
            level: 3,
        };
        let unset = parse(&[("NCCL_IB_FIFO_TC", "-1")]).unwrap();
        assert_eq!(unset.receiver_traffic(sender, true), sender);
        let fifo = parse(&[("NCCL_IB_FIFO_TC", "46")]).unwrap();
        assert_eq!(
            fifo.receiver_traffic(sender, true),
            Traffic {
                class: 46,
                level: 3
            }
        );
        assert_eq!(fifo.receiver_traffic(sender, false), sender, "InfiniBand");
        assert!(parse(&[("NCCL_IB_FIFO_TC", "256")]).is_err());
    }

    #[test]
    fn only_our_variables_are_read_and_must_be_utf8() {
        use std::os::unix::ffi::OsStringExt;
        let non_utf8 = || OsString::from_vec(vec![0xff, 0xfe]);
        let c = Config::from_lookup(|name| match name {
            "NCCL_IB_TIMEOUT" => Some("12".into()),
            "SOMETHING_ELSE" => Some(non_utf8()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.ib_timeout, 12);
        let e = Config::from_lookup(|name| (name == "NCCL_IB_HCA").then(non_utf8)).unwrap_err();
        assert!(
            e.to_string().starts_with("NCCL_IB_HCA=") && e.to_string().contains("not UTF-8"),
            "{e}"
        );
        assert!(
            !Config::from_lookup(|n| (n == "NCCL_IB_RETURN_ASYNC_EVENTS").then(|| "0".into()))
                .unwrap()
                .return_async_events
        );
    }

    #[test]
    fn addr_range_parses_as_cidr_and_matches_its_family_only() {
        let range = |text: &str| {
            parse(&[("NCCL_IB_ADDR_RANGE", text)])
                .unwrap()
                .addr_range
                .unwrap()
        };
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let r = range("10.1.2.3/16");
        assert_eq!(r.to_string(), "10.1.2.3/16");
        assert!(r.contains(ip("10.1.255.1")) && r.contains(ip("10.1.0.0")));
        assert!(!r.contains(ip("10.2.0.1")) && !r.contains(ip("::ffff:10.1.0.1")));
        assert!(range("0.0.0.0/0").contains(ip("192.168.1.1")));
        assert!(range("10.0.0.7/32").contains(ip("10.0.0.7")));
        assert!(!range("10.0.0.7/32").contains(ip("10.0.0.6")));

        let v6 = |text: &str| {
            parse(&[
                ("NCCL_IB_ADDR_RANGE", text),
                ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ])
            .unwrap()
            .addr_range
            .unwrap()
        };
        let r = v6("fd00:1::/64");
        assert!(r.contains(ip("fd00:1::5")) && !r.contains(ip("fd00:2::5")));
        assert!(!r.contains(ip("10.0.0.1")));
        assert!(v6("::/0").contains(ip("fe80::1")));
        assert!(v6("fd00::1/128").contains(ip("fd00::1")));
        assert!(!v6("fd00::1/128").contains(ip("fd00::2")));

        for (value, says) in [
            ("10.0.0.0", "expected address/prefix-length"),
            ("10.0.0/8", "not an IPv4 or IPv6 address"),
            ("10.0.0.0/33", "0..=32"),
            ("10.0.0.0/-1", "0..=32"),
        ] {
            let e = parse(&[("NCCL_IB_ADDR_RANGE", value)])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("NCCL_IB_ADDR_RANGE") && e.contains(says),
                "{value}: {e}"
            );
        }
        // A range of the other family is refused rather than dropped silently, as NCCL would.
        let e = parse(&[("NCCL_IB_ADDR_RANGE", "fd00::/8")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("NCCL_IB_ADDR_FAMILY=AF_INET6"), "{e}");
        let e = parse(&[
            ("NCCL_IB_ADDR_RANGE", "10.0.0.0/8"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("NCCL_IB_ADDR_FAMILY=AF_INET "), "{e}");
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("NCCL_IB_TIMEOUT", "forty"),
            ("NCCL_IB_QPS_PER_CONNECTION", "0"),
            ("NCCL_IB_QPS_PER_CONNECTION", "99"),
            ("NCCL_IB_ADDR_FAMILY", "inet"),
            ("NCCL_IB_GID_INDEX", "-2"),
            ("NCCL_IB_MERGE_NICS", "yes"),
            ("NCCL_IB_PCI_RELAXED_ORDERING", "3"),
            ("NCCL_NET_RS_FUSE", "rxe0"),
            ("NCCL_NET_RS_FUSE", "rxe0+rxe0"),
            ("NCCL_NET_RS_FUSE", "a+b+c+d+e+f+g+h+i"),
            ("NCCL_NET_RS_FUSE", "rxe0+"),
            ("NCCL_NET_RS_BATCH", "2"),
            ("NCCL_NET_RS_EAGER_BYTES", "65537"),
            ("NCCL_IB_PKEY", "-1"),
            ("NCCL_IB_PKEY", "65536"),
        ] {
            let e = parse(&[(name, value)]).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("{name}='{value}' is not valid")),
                "{e}"
            );
        }
    }
}
