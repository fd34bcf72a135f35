//! Port failover, without I/O: which lanes of a connection are up, how a broken one is moved to
//! another pair of member ports, and when to give up.
//!
//! A *lane* is one QP index of a connection ([`super::proto::Layout`]): messages keep the lanes
//! the layout gives them whatever happens to the ports, and every message a lane carries ends with
//! one write-with-immediate on it, so "how many messages the receiver took on this lane" says
//! exactly which ones still have to be written. A lane's *route* is the pair of member ports its
//! current QP connects (one of this side's, one of the peer's); at first the layout's.
//!
//! The receiver leads every repair (it alone knows what arrived):
//!
//! 1. Either side finds a lane broken (a completion error on its QP, its port going down, or, on
//!    the sender, the peer's word): the QP is moved to the error state, so nothing more lands
//!    through it; the sender tells the receiver ([`Frame::Broken`]).
//! 2. Once the receiver drained the old QP (every completion polled), it picks a route between
//!    rail whose members are up on both sides, avoiding those that failed, creates a QP there and
//!    offers it ([`Frame::Offer`]); with no route it waits for a member to come back.
//! 3. The sender creates its QP on the offered member, connects it, and accepts
//!    ([`Frame::Accept`]), or refuses when that member is down ([`Frame::Refuse`]).
//! 4. The receiver connects its QP, posts its receives on it, writes again the answers that may
//!    not have landed, and resumes ([`Frame::Resume`]) with the number of messages it took.
//! 5. The sender writes every later message of the lane again on the new QP, in order.
//!
//! The frames travel on the comm's out-of-band TCP connection, which is reliable and ordered:
//! none is lost, so the two sides cannot end a repair disagreeing; a stale answer (an earlier
//! epoch of the lane) is ignored. A lane that stays down longer than the retry budget fails the
//! comm, naming every port and why. The glue (`transport`) runs the actions on verbs objects and
//! reads the clock; here time is a parameter.

mod frame;

use std::time::{Duration, Instant};

pub use frame::{Frame, GOODBYE, LaneSet, MAX_FRAME_LEN, MemberSet};

use super::proto::Layout;

/// How long a member that came back must stay up before lanes move home to it: a port that
/// flaps faster than this keeps its lanes where they are.
pub const SETTLE: Duration = Duration::from_millis(250);

/// How long a repair towards members that are up may take, however short the retry budget: the
/// budget bounds the wait for a member to come back, not the handshake that moves a lane (a
/// `NCCL_IB_TIMEOUT` of 12 gives 117 ms, less than one repair on a busy host).
pub const REPAIR_LIMIT: Duration = Duration::from_secs(10);

/// How much longer than the receiver the sender waits before it gives up: the receiver decides
/// first (its error names the ports; the sender's would only say the receiver stopped answering).
pub const SENDER_GRACE: Duration = Duration::from_secs(5);

/// The pair of member ports a lane's QP connects: one of this side's, one of the peer's.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// This side's member.
    pub local: u8,
    /// The peer's member.
    pub remote: u8,
}

impl Route {
    /// The layout's route of `lane`.
    pub fn home(layout: &Layout, lane: usize) -> Self {
        Self {
            local: member(layout.local_member(lane)),
            remote: member(layout.remote_member(lane)),
        }
    }
}

fn member(m: usize) -> u8 {
    u8::try_from(m).unwrap_or(u8::MAX)
}

fn bit(m: u8) -> MemberSet {
    1u8.checked_shl(u32::from(m)).unwrap_or(0)
}

/// Why a lane went down, for the log and for the error when it never comes back.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A member port it used went down (the device's port event).
    PortDown,
    /// A work completion on its QP failed with this `ibv_wc_status`.
    Completion(u32),
    /// The QP reported a fatal asynchronous event.
    QpFatal,
    /// The peer found it broken.
    Peer,
    /// Its home ports are back: it moves home (not a failure).
    Homecoming,
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::PortDown => f.write_str("its port went down"),
            Self::Completion(12) => f.write_str("transport retries exhausted (status 12)"),
            Self::Completion(5) => f.write_str("work requests flushed (status 5)"),
            Self::Completion(s) => write!(f, "a work completion failed (status {s})"),
            Self::QpFatal => f.write_str("its QP reported a fatal error"),
            Self::Peer => f.write_str("the peer lost it"),
            Self::Homecoming => f.write_str("its home ports are back"),
        }
    }
}

/// The members of both sides that are down, as each side knows them.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Health {
    /// This side's members that are down.
    pub local_down: MemberSet,
    /// The peer's members that are down (as its last frame said).
    pub remote_down: MemberSet,
}

impl Health {
    /// A route whose members are both up.
    pub fn allows(&self, r: Route) -> bool {
        self.local_down & bit(r.local) == 0 && self.remote_down & bit(r.remote) == 0
    }
}

/// The routes a connection's lanes use at home: the pairs of members the layout connects (its
/// rails). A repair moves a lane only among these: on a multi-rail fabric a member of one rail
/// may not reach the peer's member of another.
fn rails(layout: &Layout) -> impl Iterator<Item = Route> + '_ {
    let rails = layout.rails();
    (0..rails).map(move |lane| Route::home(layout, lane))
}

/// Routes as a bit set (`local * 8 + remote`).
type RouteSet = u64;

fn route_bit(r: Route) -> RouteSet {
    1u64.checked_shl(u32::from(r.local) * 8 + u32::from(r.remote))
        .unwrap_or(0)
}

/// The route a broken lane moves to: its home route when both its members are up and it has not
/// failed in this outage; else the rail whose members are up, that has not failed, and that
/// carries the fewest lanes (`load`). `None` when no such rail is left: the lane waits for a
/// member to come back (trying a rail that failed again, with no sign that it works now, would
/// cost the stream another round of retries, and keep a path that keeps losing its packets
/// from ever failing the comm).
pub fn plan_route(
    layout: &Layout,
    lane: usize,
    health: Health,
    failed: RouteSet,
    load: impl Fn(Route) -> usize,
) -> Option<Route> {
    let home = Route::home(layout, lane);
    if health.allows(home) && failed & route_bit(home) == 0 {
        return Some(home);
    }
    rails(layout)
        .filter(|r| health.allows(*r) && failed & route_bit(*r) == 0)
        .min_by_key(|r| load(*r))
}

/// What the glue must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Move the lane's current QP to the error state (nothing lands through it from now on) and
    /// keep polling it until every work request is accounted for; report [`LeadRepair::drained`].
    Flush {
        /// The lane.
        lane: usize,
    },
    /// Receiver: create a QP for `lane` on this side's member `route.local` and report its number
    /// and first PSN ([`LeadRepair::created`]).
    Create {
        /// The lane.
        lane: usize,
        /// Which repair this is.
        epoch: u32,
        /// Where the QP goes.
        route: Route,
    },
    /// Drop the QP created for a repair that did not happen.
    Discard {
        /// The lane.
        lane: usize,
    },
    /// Connect the lane's new QP to the peer's QP `qpn` (first PSN `psn`) on the route's remote
    /// member; the sender creates it first, on `route.local`. Report success
    /// ([`LeadRepair::connected`], [`FollowRepair::accepted`]) or failure.
    Connect {
        /// The lane.
        lane: usize,
        /// Which repair this is.
        epoch: u32,
        /// Both members.
        route: Route,
        /// The peer's QP.
        qpn: u32,
        /// The peer's first PSN.
        psn: u32,
    },
    /// Send this frame to the peer.
    Send(Frame),
    /// Receiver: the lane's new QP is connected: post its receives, write again the answers that
    /// may not have landed, and send [`Frame::Resume`] with the messages taken on the lane.
    Resume {
        /// The lane.
        lane: usize,
        /// Which repair this is.
        epoch: u32,
    },
    /// Sender: the messages of the lane from `consumed` on go again, on the new QP; those before
    /// it arrived.
    Replay {
        /// The lane.
        lane: usize,
        /// Messages of the lane the receiver took.
        consumed: u64,
    },
}

mod follow;
mod lead;

pub use follow::FollowRepair;
pub use lead::LeadRepair;

/// What both sides' lane states tell alike: the route of the lane's current QP, and since when
/// it is down (`None` while up).
trait LaneState: Copy {
    fn route(&self) -> Route;
    fn since(&self) -> Option<Instant>;
    /// Whether the lane waits for a member to come back (no repair is under way).
    fn waiting(&self) -> bool;
}

/// The lanes of one side.
#[derive(Debug)]
struct Lanes<S> {
    layout: Layout,
    states: Vec<S>,
    /// Why each lane that is down went down first.
    causes: Vec<Option<Cause>>,
    health: Health,
    budget: Duration,
    /// Added to every limit (the sender's [`SENDER_GRACE`]).
    grace: Duration,
}

impl<S: LaneState> Lanes<S> {
    fn new(layout: Layout, budget: Duration, grace: Duration, up: impl Fn(Route) -> S) -> Self {
        Self {
            layout,
            states: (0..layout.nqps)
                .map(|lane| up(Route::home(&layout, lane)))
                .collect(),
            causes: vec![None; layout.nqps],
            health: Health::default(),
            budget,
            grace,
        }
    }

    fn is_up(&self, lane: usize) -> bool {
        self.states.get(lane).is_some_and(|s| s.since().is_none())
    }

    fn all_up(&self) -> bool {
        self.states.iter().all(|s| s.since().is_none())
    }

    fn route(&self, lane: usize) -> Route {
        self.states
            .get(lane)
            .map_or(Route::home(&self.layout, lane), LaneState::route)
    }

    /// How long `state` may stay down: the budget while it waits for a member, at least
    /// [`REPAIR_LIMIT`] while a repair is under way.
    fn limit(&self, state: &S) -> Duration {
        let base = if state.waiting() {
            self.budget
        } else {
            self.budget.max(REPAIR_LIMIT)
        };
        base + self.grace
    }

    /// The lanes down for longer than their limit.
    fn overdue(&self, now: Instant) -> Vec<GaveUp> {
        self.states
            .iter()
            .enumerate()
            .filter_map(|(lane, state)| {
                let down_for = now.saturating_duration_since(state.since()?);
                (down_for > self.limit(state)).then(|| GaveUp {
                    lane,
                    route: state.route(),
                    cause: self.causes[lane].unwrap_or(Cause::Peer),
                    down_for,
                    health: self.health,
                })
            })
            .collect()
    }
}

/// A lane that stayed down past the budget: what the comm's error names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GaveUp {
    /// The lane.
    pub lane: usize,
    /// The route it last had.
    pub route: Route,
    /// Why it went down first.
    pub cause: Cause,
    /// How long it was down.
    pub down_for: Duration,
    /// Both sides' members that were down.
    pub health: Health,
}

/// Flush a lane's QP, and tell the peer unless it told us.
fn flush_and_tell(lane: usize, cause: Cause, health: Health) -> Vec<Action> {
    let mut actions = vec![Action::Flush { lane }];
    if cause != Cause::Peer {
        actions.push(Action::Send(Frame::Broken {
            lanes: 1u128 << lane,
            down: health.local_down,
        }));
    }
    actions
}

/// A lane index as the frames carry it (lanes are fewer than 256).
fn lane_byte(lane: usize) -> u8 {
    u8::try_from(lane).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests;
