//! What both ends of a connection share: sizes of the QPs and rings, the handshake message each
//! side builds, the compatibility check on the peer's message, the QPs' path parameters, and
//! the plain-words description of a failed work completion.

use super::peer_link::Watched;
use super::qp_set::QpSet;
use super::{DeviceContext, PortContext};
use crate::core::config::{Config, Traffic};
use crate::core::eager;
use crate::core::error::{Error, Kind, Result};
use crate::core::proto::{Layout, SLOTS};
use crate::core::queues::QueueMemory;
use crate::core::wire::{Cts, DATA_PATH_REVISION, Endpoint, Hello, MAX_RECVS, Role};
use crate::topology::{GidEntry, IbRoute, ib_route};
use crate::verbs::{Completion, HostRegion, PathParams, QpCaps};
use std::net::{Ipv6Addr, SocketAddr};

/// Bytes of the sender's CTS ring: one slot of `MAX_RECVS` entries per message slot.
pub(super) const CTS_RING_BYTES: usize = SLOTS * MAX_RECVS * Cts::LEN;
/// Where the receiver's credit word lies in the sender's ring region (quiet receives, see
/// `core::proto`): right behind the ring, on a line of its own.
pub(super) const CREDIT_OFFSET: usize = CTS_RING_BYTES;
/// Bytes of the sender's ring region: the ring and the credit's line.
pub(super) const CTS_REGION_BYTES: usize = CTS_RING_BYTES + Cts::LEN;
/// Bytes of the receiver's CTS staging: one ring in the sender's ring's layout. A receive that
/// copied an eager message completes without the sender, so the next receive in its slot (a
/// ring later) may come before the NIC read the answer out of staging: it waits until a
/// signaled write posted with or after that answer completed (`core::proto::answers`).
pub(super) const CTS_STAGING_BYTES: usize = CTS_RING_BYTES;
/// Where the receiver stages its credit word: behind the ring. Rewritten while a post of it
/// may not have been read yet, which is harmless: credits only grow, and each is true when
/// staged.
pub(super) const CREDIT_STAGING: usize = CTS_STAGING_BYTES;
/// Bytes of the receiver's staging region: the ring and the credit word.
pub(super) const CTS_STAGING_REGION_BYTES: usize = CREDIT_STAGING + 8;
/// Bytes of one slot of the receiver's sizes ring (`MAX_RECVS` u64 sizes).
pub(super) const SIZES_SLOT_BYTES: usize = MAX_RECVS * 8;
/// Bytes of the sizes ring.
pub(super) const SIZES_RING_BYTES: usize = SLOTS * SIZES_SLOT_BYTES;

/// How a connection's eager path came out of the handshake, for its debug line.
pub(super) fn describe_eager(layout: &Layout) -> String {
    let (bytes, slots) = (layout.eager_bytes, layout.bounce_slots);
    match (bytes, layout.quiet) {
        (0, _) => "no eager messages".into(),
        (_, false) => {
            format!("eager messages up to {bytes} bytes, {slots} in flight, no quiet receives")
        }
        (_, true) => {
            format!("eager messages up to {bytes} bytes, {slots} in flight, quiet receives")
        }
    }
}

/// The bounce ring's slots of a connection whose hellos offered `connector` and `acceptor`
/// slots, with the eager path `eager_bytes` and quiet receives `quiet` agreed.
pub(super) fn bounce_slots(connector: u8, acceptor: u8, eager_bytes: u64, quiet: bool) -> usize {
    if eager_bytes == 0 {
        return SLOTS;
    }
    eager::agreed_bounce_slots(connector, acceptor, quiet)
}

/// Bytes of the sender's staging: a sizes slot and an eager header per message slot.
pub(super) const STAGING_BYTES: usize = SIZES_RING_BYTES + SLOTS * eager::HEADER_BYTES;
/// Where the sender's staging lies in its rings' registration: behind the CTS ring and the
/// credit's line. One registration for both (the receiver may then write the staging too,
/// which changes only what is sent back to it; see docs/security.md).
pub(super) const SEND_STAGING_AT: usize = CTS_REGION_BYTES;
/// Bytes of the sender's rings' registration.
pub(super) const SEND_RINGS_BYTES: usize = SEND_STAGING_AT + STAGING_BYTES;

/// Where the receiver's CTS staging lies in its rings' registration (sizes ring, bounce ring
/// of `bounce_bytes`, staging): on a line of its own behind the bounce ring.
pub(super) fn recv_staging_at(bounce_bytes: usize) -> usize {
    (SIZES_RING_BYTES + bounce_bytes).next_multiple_of(64)
}

/// Bytes of the receiver's rings' registration.
pub(super) fn recv_rings_bytes(bounce_bytes: usize) -> usize {
    recv_staging_at(bounce_bytes) + CTS_STAGING_REGION_BYTES
}

/// Sender QPs: room for one post per message slot, one less than a power of two (rxe rounds
/// depth + 1 up to one; mlx5 rounds the queue's bytes). NCCL's proxy keeps at most `NCCL_STEPS`
/// (8) sends in flight per comm, each one or two posts (a payload write and the closing
/// write-with-immediate, or an eager message and the rendezvous write that may replace it), so
/// this is twice what it uses; NCCL's transport sizes its send queue for two posts per request
/// (`2 * NET_IB_MAX_REQUESTS`, connect.cc), which is why its queues are larger. What does not
/// fit (more requests in flight, or a grouped receive of buffers over 1 GiB: up to
/// `POSTS_PER_MESSAGE` per QP) waits in its lane's queue until completions make room (`held`).
/// Inline up to 32 bytes: what two scatter/gather entries take anyway, so it costs no memory on
/// mlx5 or rxe (64 would double every entry on both, see `core::queues`). No receive queue:
/// nothing is ever sent to the sender with a receive to consume (the receiver's answers are
/// plain RDMA writes), and on mlx5 a receive queue of one entry costs the QP a page.
pub(super) const SEND_QP_CAPS: QpCaps = QpCaps {
    max_send_wr: (SLOTS - 1) as u32,
    max_recv_wr: 0,
    max_inline: 32,
};

/// Receiver QPs: one receive per message in flight, plus `eager_pool` for eager messages
/// (the bounce ring's slots, see `eager_receive_pool`); CTS writes (64-byte entries read from
/// the staging ring, not inline: 64 bytes inline would double every entry, see `core::queues`;
/// the 8-byte credit goes inline), signaled every `CTS_SIGNAL_EVERY`, with room for almost four
/// signal periods (what does not fit waits, as above).
pub(super) const fn recv_qp_caps(eager_pool: usize) -> QpCaps {
    QpCaps {
        max_send_wr: (SLOTS - 1) as u32,
        max_recv_wr: (SLOTS + eager_pool) as u32,
        max_inline: 32,
    }
}

/// Receives kept posted on a connection's QP for eager messages, which arrive unannounced: one
/// per bounce slot, as no more are written before the receiver handled the earlier ones (the
/// sender writes a bounce slot again only once it is free, and a handled arrival's receive is
/// posted again or taken by the receive it was copied into); none without the eager path.
pub(super) fn eager_receive_pool(eager_bytes: u64, bounce_slots: usize) -> usize {
    if eager_bytes > 0 { bounce_slots } else { 0 }
}

/// Whether a connection with `eager_bytes` agreed uses quiet receives (`core::proto`): when
/// both sides offer them (`NCCL_NET_RS_QUIET`).
pub(super) fn quiet_receives(config: &Config, eager_bytes: u64, peer: &Hello) -> bool {
    eager_bytes > 0 && config.quiet && peer.quiet
}

/// The eager message size of a connection of `nqps` QPs whose peer offered `offered` bytes:
/// this side's `NCCL_NET_RS_EAGER_BYTES` capped by the offer, and 0 on connections of several
/// QPs (the eager path relies on one ordered queue, see `core::eager`).
pub(super) fn agreed_eager_bytes(config: &Config, nqps: usize, offered: u64) -> u64 {
    if nqps == 1 {
        config.eager_bytes.min(offered)
    } else {
        0
    }
}
/// Memory one connection pair (a send comm and a receive comm, one peer) takes, from the sizes
/// the comms are built with.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ConnectionMemory {
    /// Bytes of the control rings, page-rounded, registered on every member (each registration
    /// pins its pages and counts against memlock on its own).
    pub registered: u64,
    /// Bytes of the QPs' and CQs' queues, by the provider's rule.
    pub queues: u64,
    /// Where the provider keeps the queues.
    pub memory: QueueMemory,
}

impl ConnectionMemory {
    /// What counts against the locked-memory limit: the rings, and the queues where the
    /// provider pins them.
    pub fn pinned(&self) -> u64 {
        self.registered
            + if self.memory.counts_against_memlock() {
                self.queues
            } else {
                0
            }
    }
}

/// Entries of a comm's CQ on a member that `lanes` QPs of `caps` may use. Both sides of the
/// estimate and `QpSet::new` size CQs by this.
pub(super) fn cq_entries(caps: QpCaps, lanes: u32) -> u32 {
    (caps.max_send_wr + caps.max_recv_wr) * lanes + 16
}

/// The lanes of a connection of `lanes` over `members` members whose completions member `m`'s
/// CQ may take: those on it (lane `i` lives on member `i % members`), or, where failover may
/// move any lane to any member (`movable`), every lane.
pub(super) fn lanes_on_cq(m: usize, lanes: usize, members: usize, movable: bool) -> u32 {
    let n = if movable {
        lanes
    } else {
        (m..lanes).step_by(members.max(1)).count()
    };
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// [`ConnectionMemory`] of a connection on a device of `members` ports whose provider keeps
/// queues as `memory` says. The process's flush QPs (one per member port, built at the first
/// `iflush`, which NCCL makes for receives into GPU memory) and NCCL's own staging buffers
/// come on top, once per process.
pub fn connection_memory(config: &Config, members: usize, memory: QueueMemory) -> ConnectionMemory {
    let region = |bytes: usize| (bytes as u64).div_ceil(PAGE) * PAGE;
    let lanes = members * config.qps_per_connection as usize;
    // Against a peer of this version and settings.
    let slots = eager::agreed_bounce_slots(config.eager_slots, config.eager_slots, config.quiet);
    let eager_bytes = agreed_eager_bytes(config, lanes, u64::MAX);
    let bounce = eager::ring_bytes(eager_bytes, slots);
    let recv_caps = recv_qp_caps(eager_receive_pool(eager_bytes, slots));
    // With quiet receives, the sender's staging ring for eager payloads matches the bounce ring.
    let eager_staging = if config.quiet {
        region(bounce as usize)
    } else {
        0
    };
    let send_rings = region(SEND_RINGS_BYTES) + eager_staging;
    let recv_rings = region(recv_rings_bytes(bounce as usize));
    let cqs: u64 = (0..members)
        .map(|m| {
            let here = lanes_on_cq(m, lanes, members, config.port_failover);
            memory.cq_share_bytes(cq_entries(SEND_QP_CAPS, here))
                + memory.cq_share_bytes(cq_entries(recv_caps, here))
        })
        .sum();
    let qps = lanes as u64 * (memory.qp_bytes(SEND_QP_CAPS) + memory.qp_bytes(recv_caps));
    ConnectionMemory {
        registered: members as u64 * (send_rings + recv_rings),
        queues: qps + cqs,
        memory,
    }
}

const PAGE: u64 = 4096;

/// Every n-th CTS write is signaled so the receiver's send queue drains. Each completion is
/// work for the device and for the poll that finds it, so it is rare: one per quarter ring, i.e.
/// almost four signal periods fit in the queue's `SLOTS - 1` entries (NCCL's transport signals
/// one CTS write per ring of 32, in a queue of 64).
pub(super) const CTS_SIGNAL_EVERY: u64 = (SLOTS / 4) as u64;

/// `wr_id` kinds (top byte); the low bits carry a slot or flush index.
pub(super) const WR_SEND_DONE: u64 = 1 << 56;
pub(super) const WR_CTS: u64 = 2 << 56;
pub(super) const WR_RECV: u64 = 4 << 56;
pub(super) const WR_DATA: u64 = 5 << 56;
/// A receive comm's last write at close, behind its answers (see `RecvComm`'s drop).
pub(super) const WR_DRAIN: u64 = 6 << 56;
pub(super) const WR_INDEX_MASK: u64 = (1 << 56) - 1;

const LINK_LAYER_ETHERNET: u8 = 2;

/// A comm's fatal error. `test` returns it at every later call; `isend`, `irecv` and `iflush`
/// only when a work completion did not report it: NCCL's transport never polls a CQ in those
/// calls (`ncclIbIsend`/`ncclIbIrecv` check only the comm's fatal async events), so a failed
/// completion surfaces through `test` alone, and NCCL, which may close comms with work in
/// flight and build new ones, never sees a post fail for one.
#[derive(Debug, Default)]
pub(super) struct Failure(Option<Recorded>);

#[derive(Debug)]
struct Recorded {
    kind: Kind,
    what: String,
    /// Reported by a work completion: `test` returns it, posting calls do not.
    by_completion: bool,
}

impl Failure {
    /// `Err` with the recorded error, if any (for `test`).
    pub(super) fn check(&self) -> Result<()> {
        match &self.0 {
            Some(r) => Err(Error::new(r.kind, r.what.clone())),
            None => Ok(()),
        }
    }

    /// `Err` with the recorded error unless a work completion reported it (for `isend`,
    /// `irecv` and `iflush`).
    #[inline(always)]
    pub(super) fn check_posting(&self) -> Result<()> {
        match &self.0 {
            Some(r) if !r.by_completion => self.check(),
            _ => Ok(()),
        }
    }

    /// Remember `e`, which fails every later call, and hand it back. The first such error
    /// stays; it replaces one a completion reported.
    pub(super) fn record(&mut self, e: Error) -> Error {
        if self.0.as_ref().is_none_or(|r| r.by_completion) {
            self.0 = Some(Recorded::of(&e, false));
        }
        e
    }

    /// What `isend`, `irecv` or `iflush` makes of the progress it made: whatever failed is
    /// recorded, and returned only when it is not a failed completion (NCCL's transport finds
    /// those in `test` alone).
    pub(super) fn after_posting_progress(&mut self, progressed: Result<()>) -> Result<()> {
        if let Err(e) = progressed {
            self.record_completion(e);
        }
        self.check_posting()
    }

    /// Remember `e`, reported by a work completion, unless an error is recorded already, and
    /// hand it back.
    pub(super) fn record_completion(&mut self, e: Error) -> Error {
        if self.0.is_none() {
            self.0 = Some(Recorded::of(&e, true));
        }
        e
    }
}

impl Recorded {
    fn of(e: &Error, by_completion: bool) -> Self {
        Self {
            kind: e.kind(),
            what: e.to_string(),
            by_completion,
        }
    }
}

impl PortContext {
    /// Whether this port is RoCE (Ethernet link layer).
    pub(super) fn is_roce(&self) -> bool {
        self.link_layer == LINK_LAYER_ETHERNET
    }

    /// This port as the peer sees it with `gid`, and the key of this side's control ring on it.
    pub(super) fn endpoint(&self, gid: &GidEntry, ring_rkey: u32) -> Endpoint {
        Endpoint {
            lid: self.lid,
            port: self.port_num(),
            mtu: self.mtu,
            link_layer: self.link_layer,
            roce_version: gid.roce_version.unwrap_or(0),
            gid: gid.gid,
            gid_index: gid.index,
            ring_rkey,
            device: self.name().to_owned(),
        }
    }
}

/// The handshake nonces a hello carries: the listener's (from the handle) and the connect's.
#[derive(Copy, Clone, Debug)]
pub(super) struct Nonces {
    pub(super) listen: u64,
    pub(super) connect: u64,
}

/// The handshake message describing this side (with the GIDs of `qps`); `ring` is the control
/// ring the peer writes.
pub(super) fn local_hello(
    ctx: &DeviceContext,
    qps: &QpSet,
    role: Role,
    nonces: Nonces,
    ring: &HostRegion,
    split: bool,
    traffic: Traffic,
) -> Hello {
    Hello {
        role,
        listen_nonce: nonces.listen,
        connect_nonce: nonces.connect,
        qpns: (0..qps.len()).map(|i| qps.qpn(i)).collect(),
        members: ctx
            .ports
            .iter()
            .enumerate()
            .map(|(m, port)| port.endpoint(&qps.gids[m], ring.mr(m).rkey()))
            .collect(),
        ring_addr: ring.addr(0),
        traffic_class: traffic.class,
        service_level: traffic.level,
        split_data: split,
        eager_bytes: 0,
        revision: DATA_PATH_REVISION,
        quiet: ctx.config.quiet,
        failover: ctx.config.port_failover,
        failover_quiet: ctx.config.port_failover,
        bounce_slots: ctx.config.eager_slots,
        // Set by the connect and accept that exchange a link proposal.
        shares_links: false,
    }
}

/// Whether a connection repairs its lanes when a port or path fails, decided from what both
/// hellos say (so both sides decide alike, whatever their versions): when both offer it, and,
/// for a connection with quiet receives (`quiet`, agreed from both hellos), both offer it for
/// those too (0.3.2 to 0.3.4 do not). A single-port connection then waits for its port to come
/// back (up to the retry budget), and its eager path's messages, answers and credits are
/// written again like the rest.
pub(super) fn failover_agreed(local: &Hello, peer: &Hello, quiet: bool) -> bool {
    local.failover && peer.failover && (!quiet || (local.failover_quiet && peer.failover_quiet))
}

fn describe_gid(gid: &[u8; 16], index: u32, version: u8) -> String {
    let v6 = Ipv6Addr::from(*gid);
    let ip = v6
        .to_ipv4_mapped()
        .map_or_else(|| format!("{v6} (IPv6)"), |v4| format!("{v6} (IPv4 {v4})"));
    if version == 0 {
        format!("GID index {index} {ip}")
    } else {
        format!("GID index {index} {ip} RoCE v{version}")
    }
}

fn describe_port(port: &PortContext, gid: &GidEntry) -> String {
    format!(
        "{} {}",
        port.name(),
        describe_gid(&gid.gid, gid.index, gid.roce_version.unwrap_or(0))
    )
}

/// A value no other process is likely to hold (listen nonces, connect nonces, handle tokens):
/// std's `RandomState` is seeded from the OS per thread and keyed differently per instance.
pub fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// `"rxe0 at 127.0.0.1:4242 GID index 1 ..."`: one member of the peer's device.
fn describe_endpoint(member: &Endpoint, peer: SocketAddr) -> String {
    format!(
        "{} at {peer} {}",
        member.device,
        describe_gid(&member.gid, member.gid_index, member.roce_version)
    )
}

/// `"rxe0 GID index 1 ::ffff:127.0.0.1 (IPv4 127.0.0.1) RoCE v2"` for this side with the
/// connection's `gids` (members joined by `" + "`).
pub(super) fn describe_local(ctx: &DeviceContext, gids: &[GidEntry]) -> String {
    let ports: Vec<String> = ctx
        .ports
        .iter()
        .zip(gids)
        .map(|(p, gid)| describe_port(p, gid))
        .collect();
    ports.join(" + ")
}

/// The same for the peer, with its address.
pub(super) fn describe_remote(remote: &Hello, peer: SocketAddr) -> String {
    let members: Vec<String> = remote
        .members
        .iter()
        .map(|m| describe_endpoint(m, peer))
        .collect();
    members.join(" + ")
}

/// `Err` when a comm cannot make progress any more: a member device reported a fatal error, or
/// the peer closed `peer_comm` or its process is gone. Every `test` that finds nothing asks.
#[inline(always)]
pub(super) fn check_alive(
    ctx: &DeviceContext,
    link: Option<&Watched>,
    peer_comm: &str,
) -> Result<()> {
    ctx.check_health()?;
    match link {
        Some(l) => l.link().check(peer_comm),
        None => Ok(()),
    }
}

/// QPs a connection between `ctx` and a device of `remote_members` ports has.
pub(super) fn connection_qps(ctx: &DeviceContext, remote_members: usize) -> usize {
    ctx.ports.len().max(remote_members) * ctx.config.qps_per_connection as usize
}

/// Refuse a peer whose QP count, link layer or GID kind differs from ours (with `gids`): such
/// QPs would connect and then fail every transfer with "retry exceeded", which is much harder
/// to diagnose.
pub(super) fn check_peer(
    ctx: &DeviceContext,
    gids: &[GidEntry],
    remote: &Hello,
    peer: SocketAddr,
) -> Result<()> {
    let rails = ctx.ports.len().max(remote.members.len());
    if remote.qpns.len() != connection_qps(ctx, remote.members.len()) {
        return Err(Error::config(format!(
            "NCCL_IB_QPS_PER_CONNECTION differs: {} here, {} on {}: set the same value on every node",
            ctx.config.qps_per_connection,
            remote.qpns.len() / rails,
            describe_remote(remote, peer)
        )));
    }
    for rail in 0..rails {
        let local = rail % ctx.ports.len();
        let member = &remote.members[rail % remote.members.len()];
        check_member(&ctx.ports[local], &gids[local], member, peer)?;
    }
    Ok(())
}

fn check_member(
    port: &PortContext,
    gid: &GidEntry,
    member: &Endpoint,
    peer: SocketAddr,
) -> Result<()> {
    if member.link_layer != port.link_layer {
        return Err(Error::config(format!(
            "link layers differ: {} is {} but {} is {}",
            port.name(),
            link_layer_name(port.link_layer),
            describe_endpoint(member, peer),
            link_layer_name(member.link_layer)
        )));
    }
    if port.is_roce() {
        let local_v4 = Ipv6Addr::from(gid.gid).to_ipv4_mapped().is_some();
        let remote_v4 = Ipv6Addr::from(member.gid).to_ipv4_mapped().is_some();
        let local_version = gid.roce_version.unwrap_or(0);
        if local_v4 != remote_v4 || local_version != member.roce_version {
            return Err(Error::config(format!(
                "GID mismatch: local {} vs remote {}: both sides must use the same address \
                 family and RoCE version (NCCL_IB_GID_INDEX, NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM)",
                describe_port(port, gid),
                describe_endpoint(member, peer)
            )));
        }
    }
    Ok(())
}

fn link_layer_name(code: u8) -> &'static str {
    match code {
        LINK_LAYER_ETHERNET => "RoCE",
        0 | 1 => "InfiniBand",
        _ => "unknown",
    }
}

/// Path parameters for a QP on `port` with source GID `gid` towards the peer's member `peer`,
/// with the sender's traffic class and service level. RoCE always sends a global route header;
/// InfiniBand as NCCL's transport does ([`ib_route`]).
pub(super) fn path_params(
    port: &PortContext,
    gid: &GidEntry,
    config: &Config,
    peer: &Endpoint,
    traffic: Traffic,
) -> PathParams {
    let route = if port.is_roce() {
        IbRoute {
            global: true,
            dlid: peer.lid,
            why: None,
        }
    } else {
        ib_route(&gid.gid, &peer.gid, peer.lid, port.grh_required)
    };
    if let Some(why) = route.why {
        tracing::debug!(
            "{} to {}: a global route header ({why}), destination LID {}",
            port.name(),
            peer.device,
            route.dlid
        );
    }
    PathParams {
        port: port.port_num(),
        mtu: port.mtu.min(peer.mtu),
        global: route.global,
        dlid: route.dlid,
        sgid_index: u8::try_from(gid.index).unwrap_or(0),
        traffic_class: traffic.class,
        service_level: traffic.level,
        timeout: config.ib_timeout,
        retry_cnt: config.retry_cnt,
    }
}

fn wr_kind_name(wr_id: u64) -> &'static str {
    match wr_id & !WR_INDEX_MASK {
        WR_SEND_DONE => "RDMA write-with-immediate (end of a send)",
        WR_DATA => "RDMA write (payload)",
        WR_CTS => "RDMA write (clear-to-send)",
        WR_RECV => "receive (write-with-immediate from the peer)",
        _ => "work request",
    }
}

/// A failed completion in plain words: status, operation, QP, both GIDs, the likely cause. A peer
/// already known to be gone, or else a member port of `ctx` that is not ACTIVE now (queried
/// here, on the error path), is named as the likely cause, whatever the status says.
pub(super) fn completion_error(
    ctx: &DeviceContext,
    link: Option<&Watched>,
    c: &Completion,
    local: &str,
    remote: &str,
    anything_completed: bool,
) -> Error {
    // ibv_wc_status values.
    let (kind, cause) = match c.status {
        12 if !anything_completed => (
            Kind::Remote,
            "retry exceeded before anything completed on this connection: the peer is unreachable \
             at this GID (GID index / route / VLAN mismatch; check NCCL_IB_GID_INDEX on both nodes)",
        ),
        12 => (
            Kind::Remote,
            "retry exceeded: the peer stopped answering (process gone, link down, or congestion; NCCL_IB_TIMEOUT)",
        ),
        13 => (
            Kind::Remote,
            "receiver not ready retry exceeded: the peer posted no receive",
        ),
        4 => (
            Kind::System,
            "local protection error: a buffer is not covered by its registration, or PCIe ACS/IOMMU \
             blocks peer-to-peer DMA (test with NCCL_NET_GDR_LEVEL=0)",
        ),
        10 => (
            Kind::Remote,
            "remote access error: the peer's registration rejected the access (deregistered buffer or wrong key)",
        ),
        5 => (
            Kind::Remote,
            "flushed: the QP had already failed on an earlier error",
        ),
        1 | 2 | 8 => (Kind::System, "local error in the NIC or driver"),
        _ => (Kind::Remote, "the peer or the network reported an error"),
    };
    let inactive = ctx.inactive_ports();
    let peer_gone = link.and_then(|l| l.link().check("comm").err());
    let cause = if let Some(gone) = peer_gone {
        gone.to_string()
    } else if inactive.is_empty() {
        cause.to_owned()
    } else {
        format!(
            "{} (link, cable or switch; `ibv_devinfo` and `ip link` show it)",
            inactive.join(", ")
        )
    };
    Error::new(
        kind,
        format!(
            "work completion failed: {} (status {}, vendor_err {:#x}) for {} on QP {:#x}; local {local}, \
             remote {remote}; likely cause: {cause}",
            c.status_name(),
            c.status,
            c.vendor_err,
            wr_kind_name(c.wr_id),
            c.qp_num
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(failover: bool, failover_quiet: bool) -> Hello {
        Hello {
            role: Role::Connect,
            listen_nonce: 1,
            connect_nonce: 2,
            qpns: vec![0x11],
            members: Vec::new(),
            ring_addr: 0,
            traffic_class: 0,
            service_level: 0,
            split_data: false,
            eager_bytes: 4096,
            revision: DATA_PATH_REVISION,
            quiet: true,
            failover,
            failover_quiet,
            bounce_slots: 8,
            shares_links: false,
        }
    }

    /// Both sides decide from both hellos, so any two versions agree: a 0.3.4 peer (failover
    /// offered, not for quiet receives) gets none on a quiet connection from either side.
    #[test]
    fn failover_is_agreed_from_both_hellos_alike() {
        let this = offer(true, true);
        let v034 = offer(true, false);
        let off = offer(false, false);
        for quiet in [false, true] {
            for (a, b) in [(&this, &v034), (&this, &off), (&this, &this), (&v034, &off)] {
                assert_eq!(
                    failover_agreed(a, b, quiet),
                    failover_agreed(b, a, quiet),
                    "both sides of {a:?} and {b:?} (quiet {quiet}) decide alike"
                );
            }
        }
        assert!(failover_agreed(&this, &this, true));
        assert!(failover_agreed(&this, &v034, false));
        assert!(!failover_agreed(&this, &v034, true));
        assert!(!failover_agreed(&this, &off, false));
    }

    /// NCCL's `ncclIbIsend`/`ncclIbIrecv` never poll a CQ: a failed completion fails `test`
    /// only; any other failure fails every call, and replaces a completion's.
    #[test]
    fn a_failed_completion_fails_test_but_not_the_posting_calls() {
        let mut failed = Failure::default();
        assert!(failed.check().is_ok() && failed.check_posting().is_ok());
        failed.record_completion(Error::new(Kind::Remote, "remote access error"));
        assert_eq!(failed.check().unwrap_err().kind(), Kind::Remote);
        assert!(failed.check_posting().is_ok());
        // A later completion keeps the first one's words.
        failed.record_completion(Error::new(Kind::Remote, "flushed"));
        assert!(
            failed
                .check()
                .unwrap_err()
                .to_string()
                .contains("remote access")
        );
        let progressed = Err(Error::new(Kind::Remote, "retry exceeded"));
        assert!(failed.after_posting_progress(progressed).is_ok());
        failed.record(Error::new(Kind::Remote, "receive comm closed"));
        let e = failed.check_posting().unwrap_err();
        assert!(e.to_string().contains("closed"), "{e}");
        failed.record(Error::new(Kind::System, "second"));
        assert!(failed.check().unwrap_err().to_string().contains("closed"));
        failed.record_completion(Error::new(Kind::Remote, "late"));
        assert!(
            failed.check_posting().is_err(),
            "a completion never hides it"
        );
    }

    #[test]
    fn connection_memory_counts_rings_per_member_and_queues_by_provider() {
        const PAGE: u64 = 4096;
        let config = Config::default();
        let mlx5 = connection_memory(&config, 1, QueueMemory::Pinned);
        // Send, one registration: CTS ring 32 x 8 x 64 B and the credit's line, staging (sizes
        // 2048 B + eager headers 512 B): 19,008 B -> 5 pages. Receive, one registration: sizes
        // ring 2048 B + bounce ring 8 x (16 + 4096) B, CTS staging (the ring and the credit
        // word): 51,336 B -> 13 pages.
        assert_eq!(mlx5.registered, (5 + 13) * PAGE);
        // mlx5: the send QP 31 x 256-byte entries (8 KiB), no receive queue, 2 pages; the
        // receive QP 31 x 256-byte entries (the CTS from staging, not inline) and 32 + 8
        // receives (1 KiB), 3 pages; room for 47 and 87 completions on the shared CQs, 64
        // bytes each.
        let cq_entry = 64;
        assert_eq!(mlx5.queues, (2 + 3) * PAGE + (47 + 87) * cq_entry);
        assert_eq!(mlx5.pinned(), (18 + 5) * PAGE + (47 + 87) * cq_entry);
        // rxe keeps its queues in kernel memory: only the rings count against memlock.
        let rxe = connection_memory(&config, 1, QueueMemory::Kernel);
        assert_eq!(rxe.pinned(), 18 * PAGE);
        assert!(rxe.queues > 0);
        // Without the eager path: no bounce ring, 2048 + 16,392 B -> 5 pages on the receiver.
        let no_eager = Config {
            eager_bytes: 0,
            ..Config::default()
        };
        let no_eager = connection_memory(&no_eager, 1, QueueMemory::Kernel);
        assert_eq!(no_eager.pinned(), (5 + 5) * PAGE);
        // Quiet receives: a bounce ring of 32 slots, 24 pages more in the receiver's
        // registration, and the sender's eager staging ring that matches it, 33 pages.
        let quiet = Config {
            quiet: true,
            ..Config::default()
        };
        let quiet = connection_memory(&quiet, 1, QueueMemory::Pinned);
        assert_eq!(quiet.registered, mlx5.registered + (24 + 33) * PAGE);
        // Two members, two QPs each: no eager path, no bounce ring; every ring registered on
        // both members; with failover every CQ has room for all four lanes.
        let fused = Config {
            qps_per_connection: 2,
            ..Config::default()
        };
        let two = connection_memory(&fused, 2, QueueMemory::Pinned);
        assert_eq!(two.registered, 2 * (5 + 5) * PAGE);
        // Receive QPs: 32 receives, no eager pool.
        let qps = 4 * (2 + 3) * PAGE;
        // Room on each member's shared CQs: 4 x 31 + 16 = 140 and 4 x 63 + 16 = 268.
        assert_eq!(two.queues, qps + 2 * (140 + 268) * cq_entry);
    }
}
