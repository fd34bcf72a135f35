//! Per-device state shared by every comm on that device. A [`DeviceContext`] is one NCCL device:
//! one port, or the member ports of a fused device. Each member is a [`PortContext`]: the open
//! device, one protection domain, the chosen GID, the out-of-band address and the registration
//! cache.

use std::net::{IpAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::door::Door;
use super::flush::PortFlush;
use super::health::DeviceHealth;
use super::mr::MrCache;
use super::oob::{OobSettings, choose_oob_address};
use super::shared_cq::CqPool;
use crate::core::config::Config;
use crate::core::error::{Error, Result};
use crate::core::repair::Cause;
use crate::plugin::PLUGIN_NAME;
use crate::topology::{
    GidEntry, GidPolicy, LinkLayer, NetDevice, PORT_ACTIVE, SysfsRoot, VirtualDevice, choose_gid,
    configured_pkey, port_state_name, select_ib_gid,
};
use crate::verbs::{Device, ProtectionDomain, RegionPool, interface_addrs};

/// One NCCL device opened for connections.
#[derive(Debug)]
pub struct DeviceContext {
    /// The member ports, in QP striping order; at least one.
    pub ports: Vec<Arc<PortContext>>,
    /// The configuration in force.
    pub config: Config,
    /// Per member, the port-event count its last failover line was logged for: one line per
    /// event and device, however many comms see it.
    logged: Vec<AtomicU64>,
    /// Per member, when its last lost-path line was logged (ms since [`DeviceContext::opened`]).
    path_logged: Vec<AtomicU64>,
    opened: Instant,
    /// The listening socket its listen comms share, while any is open.
    door: Mutex<Weak<Door>>,
    /// The comms' control rings, carved from registrations they share.
    pub(super) rings: RegionPool,
}

/// Comms that lose a path over the same member within this long share one WARN line: their
/// QPs run out of retries at about the same time, one after the other.
const PATH_LINE_QUIET: Duration = Duration::from_secs(10);

impl DeviceContext {
    /// Open every member of `device`; `relaxed_ordering[i]` says whether member `i`'s data
    /// registrations carry relaxed ordering.
    ///
    /// # Errors
    /// As [`PortContext::open`], for the first member that fails.
    pub fn open(
        device: &VirtualDevice,
        relaxed_ordering: &[bool],
        config: &Config,
        sysfs: &SysfsRoot,
    ) -> Result<Arc<Self>> {
        let ports = device
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let relaxed = relaxed_ordering.get(i).copied().unwrap_or(false);
                PortContext::open(m, relaxed, config, sysfs).map(Arc::new)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Self {
            logged: ports.iter().map(|_| AtomicU64::new(u64::MAX)).collect(),
            path_logged: ports.iter().map(|_| AtomicU64::new(u64::MAX)).collect(),
            opened: Instant::now(),
            door: Mutex::new(Weak::new()),
            rings: RegionPool::new(ports.iter().map(|p| Arc::clone(&p.pd)).collect()),
            ports,
            config: config.clone(),
        }))
    }

    /// The device's listening socket, opened on the out-of-band address if no listen comm holds
    /// it now.
    ///
    /// # Errors
    /// `System` when the socket cannot be bound.
    pub(super) fn door(&self) -> Result<Arc<Door>> {
        let mut door = self.door.lock();
        if let Some(open) = door.upgrade() {
            return Ok(open);
        }
        let open = Arc::new(Door::open(self.oob_ip())?);
        *door = Arc::downgrade(&open);
        Ok(open)
    }

    /// `Err` once a member device reported a fatal asynchronous event.
    ///
    /// # Errors
    /// `System`, naming the device.
    #[inline]
    pub fn check_health(&self) -> Result<()> {
        self.ports.iter().try_for_each(|p| p.health.check())
    }

    /// Every member's device health, in member order.
    pub(super) fn healths(&self) -> Vec<Arc<DeviceHealth>> {
        self.ports.iter().map(|p| Arc::clone(&p.health)).collect()
    }

    /// `"rxe1+rxe3"`: the members' names.
    pub fn name(&self) -> String {
        let names: Vec<&str> = self.ports.iter().map(|p| p.name()).collect();
        names.join("+")
    }

    /// Log, once per port event and device, that member `m` went down (a WARN naming the
    /// members that carry its connections) or is back (INFO).
    pub(super) fn note_member(&self, m: usize, down: bool, events: u64) {
        let Some(logged) = self.logged.get(m) else {
            return;
        };
        if logged.swap(events, Ordering::AcqRel) == events {
            return;
        }
        let member = self.member(m);
        if down {
            tracing::warn!(
                "NET/{PLUGIN_NAME}: {member} went down (port event){}",
                self.what_carries_on(m)
            );
        } else {
            tracing::info!(
                "NET/{PLUGIN_NAME}: {member} is active again: its connections use it again"
            );
        }
    }

    /// `"rxe1+rxe3: member rxe3:1"`, or `"rxe1:1"` for a device of one port.
    fn member(&self, m: usize) -> String {
        if self.ports.len() == 1 {
            self.ports[m].label()
        } else {
            format!("{}: member {}", self.name(), self.ports[m].label())
        }
    }

    /// Log that a connection's path from member `m` to the peer's `peer` failed for `cause` (its
    /// port stays up): one WARN per member and device, however many comms lose such a path
    /// within [`PATH_LINE_QUIET`].
    pub(super) fn note_path_lost(&self, m: usize, peer: &str, cause: Cause) {
        let Some(last) = self.path_logged.get(m) else {
            return;
        };
        if self.ports[m].is_down() {
            // Its port event says it (`note_member`).
            return;
        }
        let now = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let before = last.load(Ordering::Acquire);
        let quiet = u64::try_from(PATH_LINE_QUIET.as_millis()).unwrap_or(u64::MAX);
        if (before != u64::MAX && now.saturating_sub(before) < quiet)
            || last
                .compare_exchange(before, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        tracing::warn!(
            "NET/{PLUGIN_NAME}: {} lost its path to {peer} ({cause}){}",
            self.member(m),
            self.what_carries_on(m)
        );
    }

    /// What becomes of member `m`'s connections, for the lines above.
    fn what_carries_on(&self, m: usize) -> String {
        let others: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .filter(|(i, p)| *i != m && !p.is_down())
            .map(|(_, p)| p.label())
            .collect();
        if self.ports.len() == 1 {
            ": its connections wait for it to come back, up to the retry budget \
             (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT)"
                .to_owned()
        } else if others.is_empty() {
            ": no member is left: its connections wait for one to come back, up to the retry \
             budget (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT)"
                .to_owned()
        } else {
            format!(": its connections carry on over {}", others.join(", "))
        }
    }

    /// `"rxe2:1 is DOWN"` for every member port that is not ACTIVE now (one query each: for
    /// error messages, never the data path).
    pub fn inactive_ports(&self) -> Vec<String> {
        self.ports
            .iter()
            .filter_map(|p| {
                let state = p.device.port_state(p.net.port).map(|s| s.state);
                match state {
                    Ok(PORT_ACTIVE) => None,
                    Ok(code) => Some(format!(
                        "port {}:{} is {}",
                        p.name(),
                        p.net.port,
                        port_state_name(code)
                    )),
                    Err(e) => Some(format!(
                        "port {}:{} cannot be queried ({e})",
                        p.name(),
                        p.net.port
                    )),
                }
            })
            .collect()
    }

    /// Every member's GID for a connection made now ([`PortContext::current_gid`]), in member
    /// order.
    pub fn current_gids(&self) -> Vec<GidEntry> {
        self.ports
            .iter()
            .map(|p| p.current_gid(&self.config))
            .collect()
    }

    /// Address the out-of-band listener binds: the first member's.
    pub fn oob_ip(&self) -> IpAddr {
        self.ports[0].oob_ip
    }
}

/// One port opened for connections.
#[derive(Debug)]
pub struct PortContext {
    /// What topology chose (name, port, link layer).
    pub net: NetDevice,
    pub(super) device: Arc<Device>,
    pub(super) pd: Arc<ProtectionDomain>,
    /// GID for the next connection's QPs (on InfiniBand the port GID, or the routable one
    /// [`select_ib_gid`] picks); see [`PortContext::current_gid`].
    gid: Mutex<ChosenGid>,
    /// Where the GID table is read when it changes.
    sysfs: SysfsRoot,
    /// Local ID (InfiniBand).
    pub lid: u16,
    /// The port requires a global route header (InfiniBand; see
    /// [`ib_route`](crate::topology::ib_route)).
    pub grh_required: bool,
    /// P_Key index of every QP on this port (`NCCL_IB_PKEY`, else 0).
    pub pkey_index: u16,
    /// Active MTU code.
    pub mtu: u8,
    /// Link layer code.
    pub link_layer: u8,
    /// Address the out-of-band listener binds when this port is a device's first member.
    pub oob_ip: IpAddr,
    pub(super) mrs: Mutex<MrCache>,
    /// The CQs the comms on this port share.
    pub(super) cqs: CqPool,
    /// The loopback QP every receive comm on this port flushes through.
    pub(super) flush: PortFlush,
    /// Data registrations carry relaxed ordering; cleared for good when the driver refuses it.
    pub(super) relaxed_ordering: AtomicBool,
    /// What the device's asynchronous events said.
    pub(super) health: Arc<DeviceHealth>,
}

impl PortContext {
    /// Whether the device's latest event for this port said it went down.
    pub(super) fn is_down(&self) -> bool {
        self.health.port_down(self.port_num())
    }

    /// Open `net` for connections.
    ///
    /// # Errors
    /// `System` when the device or PD cannot be opened, `Config` when no GID or out-of-band
    /// address can be chosen.
    pub fn open(
        net: &NetDevice,
        relaxed_ordering: bool,
        config: &Config,
        sysfs: &SysfsRoot,
    ) -> Result<Self> {
        let device = Device::open(&net.device)?;
        let pd = ProtectionDomain::new(&device)?;
        let cqs = CqPool::new(&device)?;
        let port = device.port_state(net.port)?;
        let where_ = format!("{}:{}", net.device, net.port);
        let (gid, shortfalls, outside_range) = port_gid(&device, net, config, sysfs)?;
        let pkey = match config.pkey_index {
            Some(index) => {
                let key =
                    configured_pkey(sysfs, &net.device, net.port, index).map_err(Error::config)?;
                format!(", P_Key {key} at index {index}")
            }
            None => String::new(),
        };
        let interfaces = interface_addrs()?;
        let oob = choose_oob_address(&interfaces, &oob_settings(config), &gid).map_err(|why| {
            Error::config(format!(
                "no address for the out-of-band exchange of {where_}: {why}"
            ))
        })?;
        // Last fallible step: once registered, the watcher holds the device until `Drop`.
        let health = DeviceHealth::watch(Arc::clone(&device), config.return_async_events)?;
        let grh = if port.grh_required {
            ", a global route header on every QP (the port requires one)"
        } else {
            ""
        };
        let gid_says = if shortfalls.is_empty() {
            String::new()
        } else {
            format!(" (best available: {})", shortfalls.join("; "))
        };
        let line = format!(
            "NET/{}: {where_} uses {gid}{gid_says}{pkey}, MTU code {}, out-of-band address {oob}{grh}",
            PLUGIN_NAME, port.active_mtu
        );
        // A range the user named and no GID inside it: likely unreachable from the peers.
        if outside_range {
            tracing::warn!(target: crate::log::INIT_TARGET, "{line}");
        } else {
            tracing::info!(target: crate::log::INIT_TARGET, "{line}");
        }
        Ok(Self {
            net: net.clone(),
            device,
            pd,
            gid: Mutex::new(ChosenGid {
                entry: gid,
                changes_seen: 0,
            }),
            sysfs: sysfs.clone(),
            lid: port.lid,
            grh_required: port.grh_required,
            pkey_index: config.pkey_index.unwrap_or(0),
            mtu: port.active_mtu,
            link_layer: port.link_layer,
            oob_ip: oob.addr,
            mrs: Mutex::new(MrCache::default()),
            cqs,
            flush: PortFlush::default(),
            relaxed_ordering: AtomicBool::new(relaxed_ordering),
            health,
        })
    }

    /// The GID for a connection made now: the one chosen at open, or the one chosen again when
    /// the device reported a change in a GID table since (`IBV_EVENT_GID_CHANGE`: an address
    /// added, removed or moved, after which an index may hold another GID). A connection takes
    /// it once and uses it for its hello and its QPs alike.
    pub fn current_gid(&self, config: &Config) -> GidEntry {
        let changes = self.health.gid_changes();
        let mut chosen = self.gid.lock();
        if chosen.changes_seen != changes {
            chosen.changes_seen = changes;
            let where_ = format!("{}:{}", self.net.device, self.net.port);
            match port_gid(&self.device, &self.net, config, &self.sysfs) {
                Ok((entry, ..)) if entry == chosen.entry => {}
                Ok((entry, ..)) => {
                    tracing::info!(
                        target: crate::log::INIT_TARGET,
                        "NET/{}: {where_}: after the GID table changed, connections use {entry} \
                         (was {})",
                        PLUGIN_NAME,
                        chosen.entry
                    );
                    chosen.entry = entry;
                }
                Err(e) => tracing::warn!(
                    "NET/{}: {where_}: after the GID table changed, no GID is usable ({e}); \
                     connections keep {}",
                    PLUGIN_NAME,
                    chosen.entry
                ),
            }
        }
        chosen.entry.clone()
    }

    /// The device name.
    pub fn name(&self) -> &str {
        self.device.name()
    }

    /// The port number as verbs wants it.
    pub(super) fn port_num(&self) -> u8 {
        u8::try_from(self.net.port).unwrap_or(1)
    }

    /// `"rxe3:1"`: device and port, as the log names a member.
    pub(super) fn label(&self) -> String {
        format!("{}:{}", self.name(), self.port_num())
    }
}

impl Drop for PortContext {
    fn drop(&mut self) {
        self.health.unwatch();
    }
}

/// A port's GID and the count of its device's GID-table changes the choice has seen.
#[derive(Debug)]
struct ChosenGid {
    entry: GidEntry,
    changes_seen: u64,
}

/// The GID `net`'s QPs use, the preferences it misses (for the port's log line), and whether it
/// lies outside the `NCCL_IB_ADDR_RANGE` the user named. The table comes from one verbs query
/// of `device`, or from sysfs where that query fails.
fn port_gid(
    device: &Device,
    net: &NetDevice,
    config: &Config,
    sysfs: &SysfsRoot,
) -> Result<(GidEntry, Vec<String>, bool)> {
    let gids = device
        .gid_table(net.port)
        .unwrap_or_else(|_| sysfs.port_gids(&net.device, net.port));
    if net.link_layer != LinkLayer::Ethernet {
        let gid = select_ib_gid(&gids, config.routable_flid_gid_index);
        return Ok((gid, Vec::new(), false));
    }
    let policy = GidPolicy::from_config(config);
    let choice = choose_gid(&gids, &policy);
    let gid = choice.chosen.map_err(|why| {
        Error::config(format!(
            "no usable GID on {}:{}: {why}",
            net.device, net.port
        ))
    })?;
    let outside_range = policy.range_missed_by(&gid).is_some();
    Ok((gid, choice.shortfalls, outside_range))
}

/// What besides the interfaces decides the out-of-band address: NCCL's socket variables, with
/// `NCCL_COMM_ID` resolved as NCCL resolves it (`host:port`, `[v6]:port`; unresolvable: unused).
pub fn oob_settings(config: &Config) -> OobSettings<'_> {
    let comm_id = config
        .comm_id
        .as_deref()
        .and_then(|id| id.to_socket_addrs().ok()?.next());
    OobSettings {
        ifname: config.socket_ifname.as_deref(),
        family: config.socket_family,
        comm_id,
    }
}
