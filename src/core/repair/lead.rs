//! The receiving side's repairs: it alone knows what arrived, so it leads every one.

use super::*;

/// Where a lane stands on the receiving side.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Lead {
    Up(Route),
    /// The old QP is being flushed.
    Draining {
        since: Instant,
        failed: Route,
    },
    /// No route now; waiting for a member to come back.
    Waiting {
        since: Instant,
        failed: Route,
    },
    /// A QP is being created for `route`.
    Creating {
        since: Instant,
        epoch: u32,
        route: Route,
    },
    /// Offered to the peer.
    Offered {
        since: Instant,
        epoch: u32,
        route: Route,
    },
    /// The peer accepted; connecting.
    Connecting {
        since: Instant,
        epoch: u32,
        route: Route,
    },
}

impl LaneState for Lead {
    fn since(&self) -> Option<Instant> {
        match *self {
            Self::Up(_) => None,
            Self::Draining { since, .. }
            | Self::Waiting { since, .. }
            | Self::Creating { since, .. }
            | Self::Offered { since, .. }
            | Self::Connecting { since, .. } => Some(since),
        }
    }

    fn waiting(&self) -> bool {
        matches!(self, Self::Waiting { .. })
    }

    fn route(&self) -> Route {
        match *self {
            Self::Up(route)
            | Self::Draining { failed: route, .. }
            | Self::Waiting { failed: route, .. }
            | Self::Creating { route, .. }
            | Self::Offered { route, .. }
            | Self::Connecting { route, .. } => route,
        }
    }
}

/// The receiving side's repairs of one connection.
#[derive(Debug)]
pub struct LeadRepair {
    pub(super) lanes: Lanes<Lead>,
    pub(super) epochs: Vec<u32>,
    /// Per lane, the routes that failed since it went down.
    tried: Vec<RouteSet>,
    /// When each member of this side and of the peer last came back (`None`: never down).
    back_since: [[Option<Instant>; 8]; 2],
    /// Per lane, whether it left a home route whose members were all up (a path that lost its
    /// packets, a QP that failed): nothing says when that route works again, and trying it costs
    /// the stream the whole retry budget, so the lane stays away until a home member goes down
    /// and comes back.
    pub(super) stranded: Vec<bool>,
}

impl LeadRepair {
    /// Every lane up on its home route; a lane that waits for a member longer than `budget`
    /// (or whose repair takes longer than [`REPAIR_LIMIT`]) fails the comm.
    pub fn new(layout: Layout, budget: Duration) -> Self {
        Self {
            lanes: Lanes::new(layout, budget, Duration::ZERO, Lead::Up),
            epochs: vec![0; layout.nqps],
            tried: vec![0; layout.nqps],
            back_since: [[None; 8]; 2],
            stranded: vec![false; layout.nqps],
        }
    }

    /// Whether `lane` carries traffic now.
    pub fn is_up(&self, lane: usize) -> bool {
        self.lanes.is_up(lane)
    }

    /// Whether every lane is up.
    pub fn all_up(&self) -> bool {
        self.lanes.all_up()
    }

    /// Whether time alone may change what this side does: a lane is down (its budget and the
    /// repair limit run), or, with `recovery`, a lane is away from a home it may go back to
    /// once the home's members have settled ([`Self::tick`]). A lane away from a home whose
    /// member is down, or stranded, waits for a port event or a frame: those make the comm due,
    /// so it needs no ticks meanwhile.
    pub fn wants_ticks(&self, recovery: bool) -> bool {
        (0..self.lanes.states.len()).any(|lane| {
            !matches!(self.lanes.states[lane], Lead::Up(_))
                || (recovery && self.home_open(lane).is_some())
        })
    }

    /// `lane`'s home route when the lane is up away from it, not stranded, and both the
    /// home's members are up: it goes home once they have settled.
    fn home_open(&self, lane: usize) -> Option<Route> {
        let home = Route::home(&self.lanes.layout, lane);
        (matches!(self.lanes.states[lane], Lead::Up(r) if r != home)
            && !self.stranded[lane]
            && self.lanes.health.allows(home))
        .then_some(home)
    }

    /// The route of `lane`'s current QP.
    pub fn route(&self, lane: usize) -> Route {
        self.lanes.route(lane)
    }

    /// What both sides' members look like.
    pub fn health(&self) -> Health {
        self.lanes.health
    }

    /// `lane`'s QP failed for `cause`.
    pub fn broken(&mut self, lane: usize, cause: Cause, now: Instant) -> Vec<Action> {
        let Some(state) = self.lanes.states.get(lane).copied() else {
            return Vec::new();
        };
        let failed = state.route();
        let since = state.since().unwrap_or(now);
        match state {
            Lead::Draining { .. } | Lead::Waiting { .. } => Vec::new(),
            Lead::Up(_) => {
                self.lanes.causes[lane] = Some(cause);
                self.lanes.states[lane] = Lead::Draining { since, failed };
                // The sender stops writing on it and flushes its QP now, not when its writes run
                // out of retries.
                flush_and_tell(lane, cause, self.lanes.health)
            }
            // The new QP failed during the repair (it carried nothing yet): drop it and plan
            // again, away from it.
            Lead::Creating { .. } | Lead::Offered { .. } | Lead::Connecting { .. } => {
                let mut actions = vec![Action::Discard { lane }];
                actions.extend(self.left(lane, since, failed));
                actions
            }
        }
    }

    /// `lane`'s old QP is drained: plan where it goes.
    pub fn drained(&mut self, lane: usize) -> Vec<Action> {
        match self.lanes.states.get(lane).copied() {
            Some(Lead::Draining { since, failed }) => self.left(lane, since, failed),
            _ => Vec::new(),
        }
    }

    /// `lane` left `route` (it failed, or was refused, or the lane moves home from it): plan
    /// where it goes.
    fn left(&mut self, lane: usize, since: Instant, route: Route) -> Vec<Action> {
        if self.lanes.causes[lane] != Some(Cause::Homecoming) {
            self.tried[lane] |= route_bit(route);
            if route == Route::home(&self.lanes.layout, lane) && self.lanes.health.allows(route) {
                self.stranded[lane] = true;
            }
        }
        self.plan(lane, since, route)
    }

    /// Where `lane`, down since `since` (last on `failed`), goes: a route it has not tried in
    /// this outage, or nowhere yet (it waits).
    fn plan(&mut self, lane: usize, since: Instant, failed: Route) -> Vec<Action> {
        let tried = self.tried[lane];
        let load = |r: Route| {
            self.lanes
                .states
                .iter()
                .filter(|l| **l == Lead::Up(r))
                .count()
        };
        match plan_route(&self.lanes.layout, lane, self.lanes.health, tried, load) {
            Some(route) => {
                self.epochs[lane] += 1;
                let epoch = self.epochs[lane];
                self.lanes.states[lane] = Lead::Creating {
                    since,
                    epoch,
                    route,
                };
                vec![Action::Create { lane, epoch, route }]
            }
            None => {
                self.lanes.states[lane] = Lead::Waiting { since, failed };
                Vec::new()
            }
        }
    }

    /// The QP of repair `epoch` of `lane` exists: offer it.
    pub fn created(&mut self, lane: usize, epoch: u32, qpn: u32, psn: u32) -> Vec<Action> {
        match self.lanes.states.get(lane).copied() {
            Some(Lead::Creating {
                since,
                epoch: e,
                route,
            }) if e == epoch => {
                self.lanes.states[lane] = Lead::Offered {
                    since,
                    epoch,
                    route,
                };
                vec![Action::Send(Frame::Offer {
                    lane: lane_byte(lane),
                    epoch,
                    recv_member: route.local,
                    send_member: route.remote,
                    qpn,
                    psn,
                })]
            }
            _ => vec![Action::Discard { lane }],
        }
    }

    /// Repair `epoch` of `lane` is connected on this side: resume it.
    pub fn connected(&mut self, lane: usize, epoch: u32) -> Vec<Action> {
        match self.lanes.states.get(lane).copied() {
            Some(Lead::Connecting {
                epoch: e, route, ..
            }) if e == epoch => {
                self.lanes.states[lane] = Lead::Up(route);
                self.lanes.causes[lane] = None;
                self.tried[lane] = 0;
                if route == Route::home(&self.lanes.layout, lane) {
                    self.stranded[lane] = false;
                }
                vec![Action::Resume { lane, epoch }]
            }
            _ => Vec::new(),
        }
    }

    /// A frame from the sender.
    pub fn handle(&mut self, frame: Frame, now: Instant) -> Vec<Action> {
        match frame {
            Frame::Broken { lanes, down } => {
                let mut actions = self.remote_health(down, now);
                for lane in 0..self.lanes.states.len() {
                    // A lane whose repair the sender has not accepted yet: the frame is about
                    // the QP before it (the sender writes it before it reads the offer, and
                    // refuses an offer whose QP fails), not a failure of the new route.
                    let unaccepted = matches!(
                        self.lanes.states[lane],
                        Lead::Creating { .. } | Lead::Offered { .. }
                    );
                    if lanes & (1u128 << lane) != 0 && !unaccepted {
                        actions.extend(self.broken(lane, Cause::Peer, now));
                    }
                }
                actions
            }
            Frame::Health { down } => self.remote_health(down, now),
            Frame::Accept {
                lane,
                epoch,
                qpn,
                psn,
            } => {
                let lane = usize::from(lane);
                match self.lanes.states.get(lane).copied() {
                    // A member of the offered route went down meanwhile: go elsewhere.
                    Some(Lead::Offered {
                        since,
                        epoch: e,
                        route,
                    }) if e == epoch && !self.lanes.health.allows(route) => {
                        let mut actions = vec![Action::Discard { lane }];
                        actions.extend(self.left(lane, since, route));
                        actions
                    }
                    Some(Lead::Offered {
                        since,
                        epoch: e,
                        route,
                    }) if e == epoch => {
                        self.lanes.states[lane] = Lead::Connecting {
                            since,
                            epoch,
                            route,
                        };
                        vec![Action::Connect {
                            lane,
                            epoch,
                            route,
                            qpn,
                            psn,
                        }]
                    }
                    _ => Vec::new(),
                }
            }
            Frame::Refuse { lane, epoch, down } => {
                let mut actions = self.remote_health(down, now);
                let lane = usize::from(lane);
                if let Some(Lead::Offered {
                    since,
                    epoch: e,
                    route,
                }) = self.lanes.states.get(lane).copied()
                    && e == epoch
                {
                    actions.push(Action::Discard { lane });
                    actions.extend(self.left(lane, since, route));
                }
                actions
            }
            // Frames the receiver sends; a peer that sends them back breaks the protocol.
            Frame::Offer { .. } | Frame::Resume { .. } => Vec::new(),
        }
    }

    fn remote_health(&mut self, down: MemberSet, now: Instant) -> Vec<Action> {
        let back = self.lanes.health.remote_down & !down;
        for m in 0..8u8 {
            if back & bit(m) != 0 {
                self.back_since[REMOTE][usize::from(m)] = Some(now);
                self.through_member_back(|r| r.remote == m);
            }
        }
        self.lanes.health.remote_down = down;
        self.retry_waiting()
    }

    /// This side's member `m` went down (`true`) or came back.
    pub fn local_member(&mut self, m: u8, down: bool, now: Instant) -> Vec<Action> {
        if down {
            self.lanes.health.local_down |= bit(m);
            // Lanes whose QP lives there, up or being repaired onto it.
            let hit: Vec<usize> = (0..self.lanes.states.len())
                .filter(|&l| {
                    let lead = self.lanes.states[l];
                    !matches!(lead, Lead::Draining { .. } | Lead::Waiting { .. })
                        && lead.route().local == m
                })
                .collect();
            hit.into_iter()
                .flat_map(|lane| self.broken(lane, Cause::PortDown, now))
                .collect()
        } else {
            if self.lanes.health.local_down & bit(m) != 0 {
                self.back_since[LOCAL][usize::from(m)] = Some(now);
                self.through_member_back(|r| r.local == m);
            }
            self.lanes.health.local_down &= !bit(m);
            self.retry_waiting()
        }
    }

    /// A member came back: routes `through` it may work now. Lanes whose home passes through
    /// it are no longer stranded, and no lane counts those routes as failed.
    fn through_member_back(&mut self, through: impl Fn(Route) -> bool) {
        let layout = self.lanes.layout;
        for lane in 0..self.stranded.len() {
            if through(Route::home(&layout, lane)) {
                self.stranded[lane] = false;
            }
            for r in rails(&layout).filter(|r| through(*r)) {
                self.tried[lane] &= !route_bit(r);
            }
        }
    }

    fn retry_waiting(&mut self) -> Vec<Action> {
        let waiting: Vec<(usize, Instant, Route)> = self
            .lanes
            .states
            .iter()
            .enumerate()
            .filter_map(|(l, s)| match *s {
                Lead::Waiting { since, failed } => Some((l, since, failed)),
                _ => None,
            })
            .collect();
        waiting
            .into_iter()
            .flat_map(|(lane, since, failed)| self.plan(lane, since, failed))
            .collect()
    }

    /// The lanes down for longer than the budget, once any is: the comm fails naming them.
    pub fn overdue(&self, now: Instant) -> Vec<GaveUp> {
        self.lanes.overdue(now)
    }

    /// Lanes away from home move back once both their home members have been up for
    /// [`SETTLE`] (stranded lanes: once one of them came back): the same repair, started on
    /// purpose.
    pub fn tick(&mut self, now: Instant) -> Vec<Action> {
        let settled = |side: usize, m: u8| {
            self.back_since[side][usize::from(m)]
                .is_none_or(|at| now.saturating_duration_since(at) >= SETTLE)
        };
        let homeward: Vec<usize> = (0..self.lanes.states.len())
            .filter(|&lane| {
                self.home_open(lane)
                    .is_some_and(|home| settled(LOCAL, home.local) && settled(REMOTE, home.remote))
            })
            .collect();
        homeward
            .into_iter()
            .flat_map(|lane| self.broken(lane, Cause::Homecoming, now))
            .collect()
    }
}

const LOCAL: usize = 0;
const REMOTE: usize = 1;
