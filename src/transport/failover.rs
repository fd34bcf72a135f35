//! Port failover on real QPs: runs what `core::repair` decides (flush a broken lane's QP, make
//! one on another member, exchange frames on the out-of-band connection, write again what did
//! not arrive), and feeds it what the device and the peer tell: port events, failed
//! completions, frames.
//!
//! A comm that agreed on failover with its peer keeps a [`Failover`]; everything here runs
//! inside the comm's calls (its `test`, `isend`, `irecv`), under its state lock. A comm without
//! one pays a branch on an `Option` per call.
#![allow(unsafe_code)] // posts again what NCCL's requests still own (see the transport module doc)

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::DeviceContext;
use super::conn::Failure;
use super::conn::WR_INDEX_MASK;
use super::conn::{WR_RECV, eager_receive_pool};
use super::health::health_changes;
use super::peer_link::{PeerLink, Watched};
use super::qp_set::QpSet;
use super::recv::{RecvComm, RecvState};
use super::recv_writes::AnswerWrites;
use super::send::{SendComm, SendState};
use crate::core::config::Traffic;
use crate::core::error::{Error, Kind, Result};
use crate::core::proto::Layout;
use crate::core::repair::{
    Action, Cause, FollowRepair, Frame, GaveUp, Health, LaneSet, LeadRepair, MemberSet, Route,
};
use crate::core::wire::Endpoint;
use crate::plugin::PLUGIN_NAME;

/// `wr_id` kinds of a lane's drain markers, in its send and receive queue (the low bits: the
/// lane).
const WR_LANE_DRAIN: u64 = 7 << 56;
const WR_LANE_DRAIN_RECV: u64 = 8 << 56;

/// How long a lane may stay down before the comm fails: as long as NCCL's transport keeps
/// retrying one work request on hardware, `4.096 us * 2^NCCL_IB_TIMEOUT` per try,
/// `NCCL_IB_RETRY_CNT + 1` tries.
pub(super) fn retry_budget(ib_timeout: u8, retry_cnt: u8) -> Duration {
    let one = Duration::from_nanos(4096u64.saturating_mul(1u64 << ib_timeout.min(40)));
    one.saturating_mul(u32::from(retry_cnt) + 1)
}

/// Whether a work completion's `status` (`ibv_wc_status`) says its path failed, which another
/// QP, on another member or after the port came back, may mend: no acknowledgement within the
/// retries (`RETRY_EXC_ERR`), the QP flushed or failed under it (`WR_FLUSH_ERR`, `FATAL_ERR`,
/// `LOC_QP_OP_ERR`: Soft-RoCE's answer to a post on a port that is down), no response
/// (`RESP_TIMEOUT_ERR`). The others (lengths, protection, access, invalid requests) are the
/// comm's own faults and would fail on any path.
fn path_failure(status: u32) -> bool {
    matches!(status, 2 | 5 | 12 | 19 | 20)
}

/// What both sides' repairs offer the glue.
pub(super) trait Repair {
    fn is_up(&self, lane: usize) -> bool;
    /// `lane`'s old QP is drained (the receiver plans where the lane goes).
    fn drained(&mut self, lane: usize) -> Vec<Action>;
    fn route(&self, lane: usize) -> Route;
    fn health(&self) -> Health;
    fn broken(&mut self, lane: usize, cause: Cause, now: Instant) -> Vec<Action>;
    fn local_member(&mut self, m: u8, down: bool, now: Instant) -> Vec<Action>;
    fn handle(&mut self, frame: Frame, now: Instant) -> Vec<Action>;
    fn overdue(&self, now: Instant) -> Vec<GaveUp>;
    /// Lanes away from home that may move back (the receiver's; the sender follows).
    fn tick(&mut self, now: Instant) -> Vec<Action>;
    /// Whether the repair needs the clock: without, only events and frames move it.
    fn wants_ticks(&self, recovery: bool) -> bool;
}

/// Both sides' repairs have these methods of their own; the trait lets the glue hold either.
macro_rules! repair_of {
    ($side:ty) => {
        impl Repair for $side {
            fn is_up(&self, lane: usize) -> bool {
                Self::is_up(self, lane)
            }
            fn drained(&mut self, lane: usize) -> Vec<Action> {
                Self::drained(self, lane)
            }
            fn route(&self, lane: usize) -> Route {
                Self::route(self, lane)
            }
            fn health(&self) -> Health {
                Self::health(self)
            }
            fn broken(&mut self, lane: usize, cause: Cause, now: Instant) -> Vec<Action> {
                Self::broken(self, lane, cause, now)
            }
            fn local_member(&mut self, m: u8, down: bool, now: Instant) -> Vec<Action> {
                Self::local_member(self, m, down, now)
            }
            fn handle(&mut self, frame: Frame, now: Instant) -> Vec<Action> {
                Self::handle(self, frame, now)
            }
            fn overdue(&self, now: Instant) -> Vec<GaveUp> {
                Self::overdue(self, now)
            }
            fn tick(&mut self, now: Instant) -> Vec<Action> {
                Self::tick(self, now)
            }
            fn wants_ticks(&self, recovery: bool) -> bool {
                Self::wants_ticks(self, recovery)
            }
        }
    };
}

repair_of!(LeadRepair);
repair_of!(FollowRepair);

/// One comm's failover: the core's repairs, the members' states as last seen, and the lanes
/// whose old QP is still draining.
#[derive(Debug)]
pub(super) struct Failover<R> {
    pub(super) core: R,
    /// Per member, the device's port-event count when last looked at.
    seen: Vec<u64>,
    /// Per member, whether the core was told it is down.
    down: Vec<bool>,
    /// Per member, the device's count of failed QPs when last looked at.
    seen_qp_failures: Vec<u64>,
    /// The process's count of port events and failed QPs before the members were last looked
    /// at ([`health_changes`]).
    seen_changes: u64,
    /// Per lane, the drain of its old QP, while one runs.
    draining: Vec<Option<Drain>>,
    /// The peer's members, to connect new QPs to.
    pub(super) peer: Vec<Endpoint>,
    /// Actions waiting for a lane's old QP to drain (the sender connects a lane's new QP only
    /// then: the old one's completions must not be taken for the new one's).
    deferred: Vec<Action>,
    /// Whether lanes move back to their home members (`NCCL_IB_RESILIENCY_PORT_RECOVERY`).
    recovery: bool,
    layout: Layout,
    /// Every lane is up, and none waits for a clock (a lane away from home whose home member
    /// is down waits for the port event): nothing to do unless a member or the peer says
    /// otherwise.
    settled: bool,
    polls: u32,
}

/// A broken lane's old QP on its way out: its markers are posted
/// ([`QueuePair::post_drain_markers`]); the send queue's completes after every send request,
/// the receive queue's after every receive (a sender's QP has no receive queue, nor marker).
/// Some providers never flush a receive posted to a QP in ERR (rxe before Linux 6.4): then the
/// drain ends [`RECEIVE_GRACE`] after the send queue's marker, by which time the receives that
/// completed before ERR are polled.
#[derive(Copy, Clone, Debug)]
struct Drain {
    send_done: Option<Instant>,
    receive_done: bool,
}

/// See [`Drain`].
const RECEIVE_GRACE: Duration = Duration::from_millis(20);

/// While lanes are down or away from home, the clock is read (for the budget and the move
/// home) once in this many polls: in a VM every read may be a system call.
const POLLS_PER_CLOCK_READ: u32 = 32;

impl<R: Repair> Failover<R> {
    fn with(core: R, ctx: &DeviceContext, layout: Layout, peer: Vec<Endpoint>) -> Self {
        Self {
            core,
            // A member already down when the connection was made is seen at the first poll.
            seen: vec![u64::MAX; ctx.ports.len()],
            down: vec![false; ctx.ports.len()],
            // Only QPs that fail from now on can be this connection's.
            seen_qp_failures: ctx.ports.iter().map(|p| p.health.qp_failures()).collect(),
            // So that the first poll looks at the members.
            seen_changes: u64::MAX,
            draining: vec![None; layout.nqps],
            peer,
            deferred: Vec::new(),
            recovery: ctx.config.port_recovery,
            layout,
            settled: true,
            polls: 0,
        }
    }

    /// Whether `lane` carries traffic now.
    #[inline]
    pub(super) fn is_up(&self, lane: usize) -> bool {
        self.core.is_up(lane)
    }

    /// Whether there is progress to make without the client: a repair under way or lanes
    /// on their way home, or a port event, a failed QP (on any device of the process) or a frame
    /// not looked at yet. Atomics only: the watcher asks at every tick, so that a repair never
    /// waits for a client that stopped calling on this comm (NCCL polls only the comms it has
    /// requests on).
    #[inline]
    pub(super) fn due(&self, link: &PeerLink) -> bool {
        !self.settled || link.has_frames() || health_changes() != self.seen_changes
    }

    /// What changed since the last call: QPs of the connection that failed, members that went
    /// down or came back (port events), frames from the peer; and, while the repair wants the
    /// clock, every [`POLLS_PER_CLOCK_READ`]th call or at the watcher's `tick` (the time it
    /// read for all the comms it tends: a repair of a comm whose client does not call must not
    /// wait 32 ticks for each step), lanes due home and lanes down for too long (an error
    /// naming every port). Returns the core's actions.
    pub(super) fn poll(
        &mut self,
        ctx: &DeviceContext,
        link: &PeerLink,
        qps: &QpSet,
        tick: Option<Instant>,
    ) -> Result<Vec<Action>> {
        let now = || tick.unwrap_or_else(Instant::now);
        let mut actions = Vec::new();
        // Read before the members: a change counted after this is looked at next time.
        self.seen_changes = health_changes();
        for (m, port) in ctx.ports.iter().enumerate() {
            if port.health.qp_failures() != self.seen_qp_failures[m] {
                let (failed, count) = port.health.failed_qps_since(self.seen_qp_failures[m]);
                self.seen_qp_failures[m] = count;
                let now = now();
                for lane in failed.iter().filter_map(|&qpn| qps.index_of(m, qpn)) {
                    tracing::info!("NET/{PLUGIN_NAME}: lane {lane}: its QP failed: moving it");
                    actions.extend(self.core.broken(lane, Cause::QpFatal, now));
                    self.settled = false;
                }
            }
            let events = port.health.port_events();
            if events == self.seen[m] {
                continue;
            }
            self.seen[m] = events;
            let down = port.is_down();
            if down != self.down[m] {
                self.down[m] = down;
                ctx.note_member(m, down, events);
                let m = u8::try_from(m).unwrap_or(u8::MAX);
                actions.extend(self.core.local_member(m, down, now()));
                self.settled = false;
            }
        }
        if !self.settled && self.polls.is_multiple_of(POLLS_PER_CLOCK_READ) {
            link.pull();
        }
        let frames = link.frames();
        if !frames.is_empty() {
            let now = now();
            for frame in frames {
                tracing::debug!("NET/{PLUGIN_NAME}: the peer says {frame:?}");
                if let Frame::Broken { lanes, down } = frame {
                    self.note_peer_lost(ctx, lanes, down);
                }
                actions.extend(self.core.handle(frame, now));
            }
            self.settled = false;
        }
        if !self.settled {
            self.polls = self.polls.wrapping_add(1);
            if tick.is_some()
                || self.polls.is_multiple_of(POLLS_PER_CLOCK_READ)
                || !actions.is_empty()
            {
                let now = now();
                if self.recovery {
                    actions.extend(self.core.tick(now));
                }
                actions.extend(self.drains_due(now));
                let overdue = self.core.overdue(now);
                if !overdue.is_empty() {
                    return Err(gave_up(ctx, &self.peer, &overdue));
                }
                self.settled = actions.is_empty()
                    && !self.core.wants_ticks(self.recovery)
                    && self.draining.iter().all(Option::is_none);
            }
        }
        link.set_repairing(!self.settled);
        Ok(actions)
    }

    /// The peer found `lanes` broken while its members `down` were down: a lane that is up here
    /// and whose peer member is up there lost its path (the peer's completions failed), which
    /// this side's port events cannot show: log it as a path loss. A lane away from home whose
    /// home members are up is being moved home, not lost.
    fn note_peer_lost(&self, ctx: &DeviceContext, lanes: LaneSet, down: MemberSet) {
        for lane in (0..self.layout.nqps).filter(|&l| lanes & (1 << l) != 0) {
            let route = self.core.route(lane);
            let home = Route::home(&self.layout, lane);
            let moving_home = route != home && self.core.health().allows(home);
            if !self.core.is_up(lane) || down & (1 << route.remote) != 0 || moving_home {
                continue;
            }
            self.note_path_lost(ctx, route, Cause::Peer);
        }
    }

    /// Log that `route` failed for `cause` while both its ports stay up.
    fn note_path_lost(&self, ctx: &DeviceContext, route: Route, cause: Cause) {
        if let Some(peer) = self.peer.get(usize::from(route.remote)) {
            let peer = format!("{}:{}", peer.device, peer.port);
            ctx.note_path_lost(usize::from(route.local), &peer, cause);
        }
    }

    /// A work completion on `lane` failed with `status`, or was a drain marker. Returns the
    /// core's actions: nothing for a lane already down (its QP's requests are flushed), the
    /// lane's repair for a failure of its path; `None` for a failure no other path mends (a
    /// protection or access error: a fault of the comm's own, which fails it).
    pub(super) fn failed_completion(
        &mut self,
        ctx: &DeviceContext,
        lane: usize,
        wr_id: u64,
        status: u32,
    ) -> Option<Vec<Action>> {
        match wr_id & !WR_INDEX_MASK {
            WR_LANE_DRAIN => return Some(self.marker_done(lane, false)),
            WR_LANE_DRAIN_RECV => return Some(self.marker_done(lane, true)),
            _ => {}
        }
        if !self.core.is_up(lane) {
            return Some(Vec::new());
        }
        if !path_failure(status) {
            return None;
        }
        tracing::info!(
            "NET/{PLUGIN_NAME}: lane {lane}: a work completion failed (status {status}): moving it"
        );
        let cause = Cause::Completion(status);
        self.note_path_lost(ctx, self.core.route(lane), cause);
        self.settled = false;
        Some(self.core.broken(lane, cause, Instant::now()))
    }

    /// Move lane `lane`'s QP to ERR and post its drain markers (send and receive queue; a
    /// sender's QP has no receive queue).
    pub(super) fn flush(&mut self, qps: &QpSet, lane: usize) -> Result<()> {
        let qp = qps.qp(lane);
        qp.to_error()?;
        let receive_marker = qp.post_drain_markers(
            WR_LANE_DRAIN | lane as u64,
            WR_LANE_DRAIN_RECV | lane as u64,
        )?;
        self.draining[lane] = Some(Drain {
            send_done: None,
            receive_done: !receive_marker,
        });
        Ok(())
    }

    /// Whether `lane`'s old QP is still draining.
    pub(super) fn draining(&self, lane: usize) -> bool {
        self.draining.get(lane).is_some_and(Option::is_some)
    }

    /// A drain marker of `lane` completed (`receive`: the receive queue's).
    fn marker_done(&mut self, lane: usize, receive: bool) -> Vec<Action> {
        let Some(Some(d)) = self.draining.get_mut(lane) else {
            return Vec::new();
        };
        if receive {
            d.receive_done = true;
        } else {
            d.send_done = Some(Instant::now());
        }
        if d.send_done.is_none() || !d.receive_done {
            return Vec::new();
        }
        self.drained(lane)
    }

    /// Drains whose send queue is done and whose receive queue had its grace.
    fn drains_due(&mut self, now: Instant) -> Vec<Action> {
        let due: Vec<usize> = (0..self.draining.len())
            .filter(|&lane| {
                self.draining[lane].is_some_and(|d| {
                    d.send_done
                        .is_some_and(|at| now.saturating_duration_since(at) >= RECEIVE_GRACE)
                })
            })
            .collect();
        due.into_iter()
            .flat_map(|lane| self.drained(lane))
            .collect()
    }

    fn drained(&mut self, lane: usize) -> Vec<Action> {
        tracing::debug!("NET/{PLUGIN_NAME}: lane {lane}: its old QP is drained");
        self.draining[lane] = None;
        // Actions that waited for this lane.
        let (ready, rest): (Vec<Action>, Vec<Action>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|a| action_lane(a) == Some(lane));
        self.deferred = rest;
        let mut actions = self.core.drained(lane);
        actions.extend(ready);
        actions
    }

    /// Keep `action` until `lane`'s old QP is drained.
    pub(super) fn defer(&mut self, action: Action) {
        tracing::debug!("NET/{PLUGIN_NAME}: {action:?} waits for the lane's old QP to drain");
        self.deferred.push(action);
    }
}

impl Failover<LeadRepair> {
    /// The receiving side's failover for a connection of `layout` with the peer's `members`.
    pub(super) fn lead(ctx: &DeviceContext, layout: Layout, peer: Vec<Endpoint>) -> Self {
        let budget = retry_budget(ctx.config.ib_timeout, ctx.config.retry_cnt);
        Self::with(LeadRepair::new(layout, budget), ctx, layout, peer)
    }
}

impl Failover<FollowRepair> {
    /// The sending side's failover for a connection of `layout` with the peer's `members`.
    pub(super) fn follow(ctx: &DeviceContext, layout: Layout, peer: Vec<Endpoint>) -> Self {
        let budget = retry_budget(ctx.config.ib_timeout, ctx.config.retry_cnt);
        Self::with(FollowRepair::new(layout, budget), ctx, layout, peer)
    }
}

fn action_lane(a: &Action) -> Option<usize> {
    match *a {
        Action::Flush { lane }
        | Action::Create { lane, .. }
        | Action::Discard { lane }
        | Action::Connect { lane, .. }
        | Action::Resume { lane, .. }
        | Action::Replay { lane, .. } => Some(lane),
        Action::Send(_) => None,
    }
}

/// The comm's error once lanes stayed down past the budget: every port of both sides that is
/// down, and why each lane went down.
fn gave_up(ctx: &DeviceContext, peer: &[Endpoint], overdue: &[GaveUp]) -> Error {
    let mut down = Vec::new();
    let health = overdue[0].health;
    for (m, port) in ctx.ports.iter().enumerate() {
        if health.local_down & (1 << m) != 0 {
            down.push(format!("{} (here)", port.label()));
        }
    }
    for (m, ep) in peer.iter().enumerate() {
        if health.remote_down & (1 << m) != 0 {
            down.push(format!("{}:{} (peer)", ep.device, ep.port));
        }
    }
    let lanes: Vec<String> = overdue
        .iter()
        .map(|g| {
            let local = ctx.ports.get(usize::from(g.route.local));
            let remote = peer.get(usize::from(g.route.remote));
            format!(
                "lane {} ({}:{} to {}:{}) down for {:.1} s: {}",
                g.lane,
                local.map_or("?", |p| p.name()),
                local.map_or(0, |p| p.port_num()),
                remote.map_or("?", |e| e.device.as_str()),
                remote.map_or(0, |e| e.port),
                g.down_for.as_secs_f64(),
                g.cause
            )
        })
        .collect();
    let ports = if down.is_empty() {
        "no port reported down (the path between them fails)".to_owned()
    } else {
        format!("ports down: {}", down.join(", "))
    };
    Error::new(
        Kind::Remote,
        format!(
            "no member of the connection came back within the retry budget \
             (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT): {ports}; {}",
            lanes.join("; ")
        ),
    )
}

/// A comm with failover: where its repairs live in its state, and what each action does on it;
/// polling and running actions in order are the same on both sides.
pub(super) trait Repairing: CommParts {
    /// Do `action` (other than a flush or a frame); returns what it leads to.
    fn run_action(&self, st: &mut Self::State, action: Action) -> Result<Vec<Action>>;

    /// Whether the comm's failover owes progress now (see [`Failover::due`]); false without
    /// failover.
    fn failover_due(&self, st: &mut Self::State) -> bool {
        match (Self::failover(st), self.link()) {
            (Some(f), Some(link)) => f.due(link.link()),
            _ => false,
        }
    }

    /// Take what port events and the peer's frames say, and do what the repairs ask. A healthy
    /// comm's every progress comes here: it reads a few atomics and returns. `tick`: see
    /// [`Failover::poll`].
    fn tend_failover(&self, st: &mut Self::State, tick: Option<Instant>) -> Result<()> {
        let (Some(f), Some(link)) = (Self::failover(st), self.link()) else {
            return Ok(());
        };
        if !f.due(link.link()) {
            return Ok(());
        }
        match f.poll(self.ctx(), link.link(), self.qps(), tick) {
            Ok(actions) => self.run_actions(st, actions),
            Err(e) => Err(Self::failure(st).record(e)),
        }
    }

    /// Do `actions` and whatever they lead to, in order.
    fn run_actions(&self, st: &mut Self::State, actions: Vec<Action>) -> Result<()> {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(a) = queue.pop_front() {
            let done = match a {
                Action::Flush { lane } => match Self::failover(st) {
                    Some(f) => f.flush(self.qps(), lane).map(|()| Vec::new()),
                    None => Ok(Vec::new()),
                },
                Action::Send(frame) => self.send_frame(&frame).map(|()| Vec::new()),
                other => self.run_action(st, other),
            };
            match done {
                Ok(more) => queue.extend(more),
                Err(e) => return Err(Self::failure(st).record(e)),
            }
        }
        Ok(())
    }

    /// Send `frame` to the peer.
    fn send_frame(&self, frame: &Frame) -> Result<()> {
        match self.link() {
            Some(link) => link.link().send(frame),
            None => Ok(()),
        }
    }
}

/// Log once per process that a peer takes no part in failover, where this side offered it.
pub(super) fn log_failover(ctx: &DeviceContext, agreed: bool, remote: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if agreed || !ctx.config.port_failover {
        return;
    }
    ONCE.call_once(|| {
        tracing::info!(
            "NET/{PLUGIN_NAME}: no port failover on the connection with {remote}: the peer does \
             not offer it (an earlier version, or NCCL_IB_RESILIENCY_PORT_FAILOVER=0 there); a \
             failed port fails such comms (logged once)"
        );
    });
}

impl Repairing for SendComm {
    fn run_action(&self, st: &mut SendState, action: Action) -> Result<Vec<Action>> {
        tracing::debug!(
            "NET/{PLUGIN_NAME}: send comm to {}: {action:?}",
            self.remote
        );
        let SendState {
            proto, failover, ..
        } = st;
        let Some(f) = failover.as_deref_mut() else {
            return Ok(Vec::new());
        };
        match action {
            Action::Connect {
                lane,
                epoch,
                route,
                qpn,
                ..
            } => {
                if f.draining(lane) {
                    f.defer(action);
                    return Ok(Vec::new());
                }
                if !f.core.connecting(lane, epoch) {
                    // Refused or replaced while the old QP drained.
                    return Ok(Vec::new());
                }
                let made = connect_lane(self, f, lane, route, qpn);
                let qp = match made {
                    Ok(qpn) => {
                        tracing::debug!("NET/{PLUGIN_NAME}: lane {lane}: QP {qpn} connected");
                        Some((qpn, 0))
                    }
                    Err(e) => {
                        tracing::info!("NET/{PLUGIN_NAME}: lane {lane}: refusing the offer: {e}");
                        None
                    }
                };
                Ok(f.core.accepted(lane, epoch, qp))
            }
            Action::Replay { lane, consumed } => {
                let route = f.core.route(lane);
                proto.set_route(lane, usize::from(route.local), usize::from(route.remote));
                let posts = proto.replay(lane, consumed)?;
                tracing::debug!(
                    "NET/{PLUGIN_NAME}: lane {lane} resumed on {}: {} writes again",
                    self.ctx.ports[usize::from(route.local)].name(),
                    posts.len()
                );
                // SAFETY: the writes carry sends whose requests are not done yet (a send is
                // done once its lanes' writes completed), which NCCL keeps unchanged.
                unsafe { self.post(&posts, false, Some(f)) }?;
                proto.recycle(posts);
                Ok(Vec::new())
            }
            // The receiver's actions; flushes and frames are done by `run_actions`.
            _ => Ok(Vec::new()),
        }
    }
}

/// Make lane `lane`'s new QP on `route`'s local member and connect it to the peer's QP `qpn`
/// on its member; the lane's old QP (drained) goes. Returns the new QP's number.
fn connect_lane<R: Repair>(
    comm: &impl CommParts,
    f: &Failover<R>,
    lane: usize,
    route: Route,
    qpn: u32,
) -> Result<u32> {
    let (ctx, qps) = (comm.ctx(), comm.qps());
    let (local, remote) = (usize::from(route.local), usize::from(route.remote));
    let peer = f.peer.get(remote).ok_or_else(|| {
        Error::new(
            Kind::Remote,
            format!("offer names the peer's member {remote}, which it does not have"),
        )
    })?;
    if ctx.ports.get(local).is_none_or(|p| p.is_down()) {
        return Err(Error::new(
            Kind::Remote,
            format!("member {local} is down here"),
        ));
    }
    let qp = qps.create(ctx, local)?;
    qps.connect_qp(ctx, &qp, local, (peer, qpn), comm.traffic())?;
    let number = qp.qpn();
    qps.replace(lane, qp, (local, remote), ctx.config.batch);
    Ok(number)
}

/// What a comm lends the failover glue: its device, lanes, traffic class and link, and where
/// its repairs and its failure live in its state.
pub(super) trait CommParts {
    type State;
    type Core: Repair;

    fn ctx(&self) -> &DeviceContext;
    fn qps(&self) -> &QpSet;
    fn traffic(&self) -> Traffic;
    fn link(&self) -> Option<&Watched>;
    fn failover(st: &mut Self::State) -> Option<&mut Failover<Self::Core>>;
    fn failure(st: &mut Self::State) -> &mut Failure;
}

macro_rules! comm_parts {
    ($comm:ty, $state:ty, $core:ty) => {
        impl CommParts for $comm {
            type State = $state;
            type Core = $core;

            fn ctx(&self) -> &DeviceContext {
                &self.ctx
            }
            fn qps(&self) -> &QpSet {
                &self.qps
            }
            fn traffic(&self) -> Traffic {
                self.traffic
            }
            fn link(&self) -> Option<&Watched> {
                self.link.as_ref()
            }
            fn failover(st: &mut $state) -> Option<&mut Failover<$core>> {
                st.failover.as_deref_mut()
            }
            fn failure(st: &mut $state) -> &mut Failure {
                &mut st.failed
            }
        }
    };
}

comm_parts!(SendComm, SendState, FollowRepair);
comm_parts!(RecvComm, RecvState, LeadRepair);

impl Repairing for RecvComm {
    fn run_action(&self, st: &mut RecvState, action: Action) -> Result<Vec<Action>> {
        tracing::debug!(
            "NET/{PLUGIN_NAME}: recv comm from {}: {action:?}",
            self.remote
        );
        let Some(f) = st.failover.as_deref_mut() else {
            return Ok(Vec::new());
        };
        match action {
            Action::Create { lane, epoch, route } => {
                if f.draining(lane) {
                    f.defer(action);
                    return Ok(Vec::new());
                }
                let (local, remote) = (usize::from(route.local), usize::from(route.remote));
                let qp = self.qps.create(&self.ctx, local)?;
                let qpn = qp.qpn();
                self.qps
                    .replace(lane, qp, (local, remote), self.ctx.config.batch);
                Ok(f.core.created(lane, epoch, qpn, 0))
            }
            Action::Connect {
                lane,
                epoch,
                route,
                qpn,
                ..
            } => {
                let peer = f.peer.get(usize::from(route.remote)).ok_or_else(|| {
                    Error::new(Kind::Remote, "accept names a member the peer does not have")
                })?;
                let qp = self.qps.qp(lane);
                match self.qps.connect_qp(
                    &self.ctx,
                    &qp,
                    usize::from(route.local),
                    (peer, qpn),
                    self.traffic,
                ) {
                    Ok(()) => Ok(f.core.connected(lane, epoch)),
                    Err(e) => {
                        tracing::info!(
                            "NET/{PLUGIN_NAME}: lane {lane}: connecting its new QP: {e}"
                        );
                        Ok(f.core.broken(lane, Cause::QpFatal, Instant::now()))
                    }
                }
            }
            Action::Resume { lane, epoch } => {
                self.resume(st, lane)?;
                let consumed = st.proto.consumed(lane);
                let lane_byte = u8::try_from(lane).unwrap_or(u8::MAX);
                self.send_frame(&Frame::Resume {
                    lane: lane_byte,
                    epoch,
                    consumed,
                })?;
                tracing::debug!("NET/{PLUGIN_NAME}: lane {lane} resumed after {consumed} messages");
                Ok(Vec::new())
            }
            // A discarded repair's QP is replaced by the next one; replays are the sender's;
            // flushes and frames are done by `run_actions`.
            _ => Ok(Vec::new()),
        }
    }
}

impl RecvComm {
    /// Lane `lane`'s new QP is connected: post a receive for every message it still owes (and,
    /// with eager messages, the receives they arrive on, one per bounce slot, as at connect), and
    /// write again the answers that went on it and, with quiet receives, the latest credit
    /// (they may not have landed).
    fn resume(&self, st: &mut RecvState, lane: usize) -> Result<()> {
        let slot = self.qps.lanes[lane].read();
        let layout = st.proto.layout();
        let eager_pool = eager_receive_pool(layout.eager_bytes, layout.bounce_slots);
        for _ in 0..st.proto.expecting(lane) + eager_pool {
            slot.qp.post_recv(WR_RECV)?;
        }
        // Signaled writes on the old QP never complete.
        st.answers.lost_in_flight();
        let answers: Vec<(usize, usize)> = st.proto.answers_on(lane).collect();
        for (ring_slot, n) in answers {
            let write = st.answers.post_answer(ring_slot);
            let writes = AnswerWrites {
                slot: ring_slot,
                write: write.index,
                lkey: self.rings.mr(slot.member).lkey(),
                rkey: self.remote_ring_rkeys[slot.remote],
            };
            let apart = self.answers_apart(n);
            // SAFETY: the staged entries of an answer still recorded as its slot's latest are
            // rewritten only for a later message of that slot, which replaces the record.
            unsafe { self.submit_answer(&slot.queue, &writes, n, write.signaled, false, apart) }?;
        }
        drop(slot);
        let credit = st.proto.credited();
        if st.proto.layout().quiet && credit > 0 {
            self.write_credit(st, credit)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_what_the_hardware_retries_last() {
        // 4.096 us * 2^20 = 4.29 s per try, 8 tries.
        let b = retry_budget(20, 7);
        assert!(
            b > Duration::from_millis(34_300) && b < Duration::from_millis(34_400),
            "{b:?}"
        );
        // 4.096 us * 2^12 = 16.8 ms, 7 tries.
        let b = retry_budget(12, 6);
        assert!(
            b > Duration::from_millis(117) && b < Duration::from_millis(118),
            "{b:?}"
        );
    }
}
