//! The sending side's part in the repairs: report what it finds broken, take up the receiver's
//! offers, and write again what the receiver did not take.

use super::*;

/// Where a lane stands on the sending side.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Follow {
    Up(Route),
    /// Broken, waiting for the receiver's offer.
    Broken {
        since: Instant,
        failed: Route,
    },
    /// Connecting the QP of an offer.
    Connecting {
        since: Instant,
        epoch: u32,
        route: Route,
    },
    /// Accepted; waiting for the receiver to resume.
    Accepted {
        since: Instant,
        epoch: u32,
        route: Route,
    },
}

impl LaneState for Follow {
    fn since(&self) -> Option<Instant> {
        match *self {
            Self::Up(_) => None,
            Self::Broken { since, .. }
            | Self::Connecting { since, .. }
            | Self::Accepted { since, .. } => Some(since),
        }
    }

    /// The sender cannot tell a wait for a member from a repair the receiver has not offered
    /// yet: it allows both as long as the receiver would, and [`SENDER_GRACE`] more.
    fn waiting(&self) -> bool {
        false
    }

    fn route(&self) -> Route {
        match *self {
            Self::Up(route)
            | Self::Broken { failed: route, .. }
            | Self::Connecting { route, .. }
            | Self::Accepted { route, .. } => route,
        }
    }
}

/// The sending side's part in the repairs of one connection.
#[derive(Debug)]
pub struct FollowRepair {
    pub(super) lanes: Lanes<Follow>,
}

impl FollowRepair {
    /// Every lane up on its home route; a lane down for longer than the receiver would allow
    /// with the same `budget`, and [`SENDER_GRACE`] more, fails the comm.
    pub fn new(layout: Layout, budget: Duration) -> Self {
        Self {
            lanes: Lanes::new(layout, budget, SENDER_GRACE, Follow::Up),
        }
    }

    /// Whether `lane` carries traffic now: the sender posts a message's writes on a lane only
    /// while it is up, and writes the rest when the receiver resumes it.
    pub fn is_up(&self, lane: usize) -> bool {
        self.lanes.is_up(lane)
    }

    /// Whether every lane is up.
    pub fn all_up(&self) -> bool {
        self.lanes.all_up()
    }

    /// Whether time alone may change what this side does: while a lane is down its budget
    /// runs. The receiver moves lanes home, and its frames make the comm due.
    pub fn wants_ticks(&self, _recovery: bool) -> bool {
        !self.all_up()
    }

    /// The route of `lane`'s current QP.
    pub fn route(&self, lane: usize) -> Route {
        self.lanes.route(lane)
    }

    /// What both sides' members look like, as this side knows.
    pub fn health(&self) -> Health {
        self.lanes.health
    }

    /// `lane`'s QP failed for `cause`: flush it and tell the receiver.
    pub fn broken(&mut self, lane: usize, cause: Cause, now: Instant) -> Vec<Action> {
        let Some(state) = self.lanes.states.get(lane).copied() else {
            return Vec::new();
        };
        let (since, failed, offer) = match state {
            Follow::Broken { .. } => return Vec::new(),
            Follow::Up(route) => (now, route, None),
            // The offer's QP is not made yet (it waits for the old one's drain), so a QP
            // failure now is the old QP's (rxe reports its fatal event after the retries ran
            // out, which can be after the offer came): the offer stands.
            Follow::Connecting { .. } if matches!(cause, Cause::QpFatal | Cause::Completion(_)) => {
                return Vec::new();
            }
            // Its member or the receiver says the offer's route is gone: refuse the offer,
            // which the receiver reads as this epoch's failure (a `Broken` there would be taken
            // for the old QP's).
            Follow::Connecting {
                since,
                epoch,
                route,
            } => (since, route, Some(epoch)),
            Follow::Accepted { since, route, .. } => (since, route, None),
        };
        self.lanes.causes[lane].get_or_insert(cause);
        if let Some(epoch) = offer {
            return vec![self.refuse(lane, epoch, since, failed)];
        }
        self.lanes.states[lane] = Follow::Broken { since, failed };
        flush_and_tell(lane, cause, self.lanes.health)
    }

    /// Refuse repair `epoch` of `lane` (on `route`, down since `since`): the lane waits, broken,
    /// for the receiver's next offer. Returns the frame to send.
    fn refuse(&mut self, lane: usize, epoch: u32, since: Instant, route: Route) -> Action {
        self.lanes.states[lane] = Follow::Broken {
            since,
            failed: route,
        };
        Action::Send(Frame::Refuse {
            lane: lane_byte(lane),
            epoch,
            down: self.lanes.health.local_down,
        })
    }

    /// Whether repair `epoch` of `lane` still wants its QP connected (the offer was not
    /// refused or replaced while the lane's old QP drained).
    pub fn connecting(&self, lane: usize, epoch: u32) -> bool {
        matches!(
            self.lanes.states.get(lane),
            Some(Follow::Connecting { epoch: e, .. }) if *e == epoch
        )
    }

    /// This side's member `m` went down (`true`) or came back: the receiver learns it.
    pub fn local_member(&mut self, m: u8, down: bool, now: Instant) -> Vec<Action> {
        if down {
            self.lanes.health.local_down |= bit(m);
        } else {
            self.lanes.health.local_down &= !bit(m);
        }
        let mut actions = vec![Action::Send(Frame::Health {
            down: self.lanes.health.local_down,
        })];
        if down {
            // Lanes whose QP lives there, up or being repaired onto it.
            let hit: Vec<usize> = (0..self.lanes.states.len())
                .filter(|&l| {
                    !matches!(self.lanes.states[l], Follow::Broken { .. })
                        && self.route(l).local == m
                })
                .collect();
            for lane in hit {
                actions.extend(self.broken(lane, Cause::PortDown, now));
            }
        }
        actions
    }

    /// A frame from the receiver.
    pub fn handle(&mut self, frame: Frame, now: Instant) -> Vec<Action> {
        match frame {
            Frame::Health { down } => {
                self.lanes.health.remote_down = down;
                Vec::new()
            }
            Frame::Offer {
                lane,
                epoch,
                recv_member,
                send_member,
                qpn,
                psn,
            } => {
                let lane = usize::from(lane);
                let Some(state) = self.lanes.states.get(lane).copied() else {
                    return Vec::new();
                };
                let route = Route {
                    local: send_member,
                    remote: recv_member,
                };
                let mut actions = Vec::new();
                let since = match state {
                    // The receiver found the failure first: our QP goes too.
                    Follow::Up(_) => {
                        self.lanes.causes[lane].get_or_insert(Cause::Peer);
                        actions.push(Action::Flush { lane });
                        now
                    }
                    Follow::Broken { since, .. } => since,
                    // A later offer replaces one this side had taken up.
                    Follow::Connecting { since, .. } | Follow::Accepted { since, .. } => {
                        actions.push(Action::Discard { lane });
                        since
                    }
                };
                if self.lanes.health.local_down & bit(send_member) != 0
                    || usize::from(send_member) >= self.lanes.layout.local_members
                {
                    actions.push(self.refuse(lane, epoch, since, route));
                    return actions;
                }
                self.lanes.states[lane] = Follow::Connecting {
                    since,
                    epoch,
                    route,
                };
                actions.push(Action::Connect {
                    lane,
                    epoch,
                    route,
                    qpn,
                    psn,
                });
                actions
            }
            Frame::Resume {
                lane,
                epoch,
                consumed,
            } => {
                let lane = usize::from(lane);
                match self.lanes.states.get(lane).copied() {
                    Some(Follow::Accepted {
                        epoch: e, route, ..
                    }) if e == epoch => {
                        self.lanes.states[lane] = Follow::Up(route);
                        self.lanes.causes[lane] = None;
                        vec![Action::Replay { lane, consumed }]
                    }
                    _ => Vec::new(),
                }
            }
            // The receiver lost these lanes: stop writing on them and wait for its offers.
            Frame::Broken { lanes, down } => {
                self.lanes.health.remote_down = down;
                (0..self.lanes.states.len())
                    .filter(|&lane| lanes & (1u128 << lane) != 0)
                    .flat_map(|lane| self.broken(lane, Cause::Peer, now))
                    .collect()
            }
            // Frames the sender sends.
            Frame::Accept { .. } | Frame::Refuse { .. } => Vec::new(),
        }
    }

    /// The QP of repair `epoch` of `lane` is connected (`Some(qpn, psn)`), or could not be:
    /// accept or refuse the offer.
    pub fn accepted(&mut self, lane: usize, epoch: u32, qp: Option<(u32, u32)>) -> Vec<Action> {
        let Some(Follow::Connecting {
            since,
            epoch: e,
            route,
        }) = self.lanes.states.get(lane).copied()
        else {
            return vec![Action::Discard { lane }];
        };
        if e != epoch {
            return vec![Action::Discard { lane }];
        }
        match qp {
            Some((qpn, psn)) => {
                self.lanes.states[lane] = Follow::Accepted {
                    since,
                    epoch,
                    route,
                };
                vec![Action::Send(Frame::Accept {
                    lane: lane_byte(lane),
                    epoch,
                    qpn,
                    psn,
                })]
            }
            None => vec![
                Action::Discard { lane },
                self.refuse(lane, epoch, since, route),
            ],
        }
    }

    /// The lanes down for longer than the budget, once any is.
    pub fn overdue(&self, now: Instant) -> Vec<GaveUp> {
        self.lanes.overdue(now)
    }

    /// `lane`'s old QP is drained: nothing to do here (the receiver plans, and its offer
    /// waits for this side's drain in the glue).
    pub fn drained(&mut self, _lane: usize) -> Vec<Action> {
        Vec::new()
    }

    /// Nothing is due by the clock here: the receiver moves lanes home.
    pub fn tick(&mut self, _now: Instant) -> Vec<Action> {
        Vec::new()
    }
}
