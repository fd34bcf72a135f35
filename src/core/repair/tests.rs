//! Both sides' repair machines wired together through their frames, with a glue that creates,
//! connects and drains QPs at once (or refuses, for a member that is down).

use std::collections::VecDeque;

use super::lead::Lead;
use super::*;
use crate::core::xorshift::Rng;

const BUDGET: Duration = Duration::from_secs(30);

fn fused(members: usize, per_member: usize) -> Layout {
    Layout {
        nqps: members * per_member,
        split: false,
        local_members: members,
        remote_members: members,
        eager_bytes: 0,
        quiet: false,
        bounce_slots: crate::core::proto::SLOTS,
    }
}

/// A receiver and a sender, the frames in flight between them, and what the glue did.
struct Pair {
    lead: LeadRepair,
    follow: FollowRepair,
    to_sender: VecDeque<Frame>,
    to_receiver: VecDeque<Frame>,
    next_qpn: u32,
    /// `(lane, consumed)` of every replay the sender was told to make.
    replays: Vec<(usize, u64)>,
    /// Lanes resumed by the receiver.
    resumed: Vec<usize>,
    /// Messages the receiver took per lane (what its Resume carries).
    consumed: Vec<u64>,
    /// This side's members whose QPs cannot be connected (down at the verbs level).
    lead_dead: MemberSet,
    follow_dead: MemberSet,
    now: Instant,
}

impl Pair {
    fn new(layout: Layout) -> Self {
        let mirrored = Layout {
            local_members: layout.remote_members,
            remote_members: layout.local_members,
            ..layout
        };
        Self {
            lead: LeadRepair::new(layout, BUDGET),
            follow: FollowRepair::new(mirrored, BUDGET),
            to_sender: VecDeque::new(),
            to_receiver: VecDeque::new(),
            next_qpn: 100,
            replays: Vec::new(),
            resumed: Vec::new(),
            consumed: vec![0; layout.nqps],
            lead_dead: 0,
            follow_dead: 0,
            now: Instant::now(),
        }
    }

    fn lead_actions(&mut self, actions: Vec<Action>) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(a) = queue.pop_front() {
            let more = match a {
                Action::Flush { lane } => self.lead.drained(lane),
                Action::Create { lane, epoch, .. } => {
                    self.next_qpn += 1;
                    self.lead.created(lane, epoch, self.next_qpn, 7)
                }
                Action::Connect {
                    lane, epoch, route, ..
                } => {
                    if self.lead_dead & bit(route.local) != 0 {
                        self.lead.broken(lane, Cause::Completion(12), self.now)
                    } else {
                        self.lead.connected(lane, epoch)
                    }
                }
                Action::Resume { lane, epoch } => {
                    self.resumed.push(lane);
                    self.to_sender.push_back(Frame::Resume {
                        lane: lane_byte(lane),
                        epoch,
                        consumed: self.consumed[lane],
                    });
                    Vec::new()
                }
                Action::Send(f) => {
                    self.to_sender.push_back(f);
                    Vec::new()
                }
                Action::Discard { .. } => Vec::new(),
                Action::Replay { .. } => panic!("the receiver never replays"),
            };
            queue.extend(more);
        }
    }

    fn follow_actions(&mut self, actions: Vec<Action>) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(a) = queue.pop_front() {
            let more = match a {
                Action::Flush { .. } | Action::Discard { .. } => Vec::new(),
                Action::Connect {
                    lane, epoch, route, ..
                } => {
                    let qp = (self.follow_dead & bit(route.local) == 0).then(|| {
                        self.next_qpn += 1;
                        (self.next_qpn, 9)
                    });
                    self.follow.accepted(lane, epoch, qp)
                }
                Action::Send(f) => {
                    self.to_receiver.push_back(f);
                    Vec::new()
                }
                Action::Replay { lane, consumed } => {
                    self.replays.push((lane, consumed));
                    Vec::new()
                }
                Action::Create { .. } | Action::Resume { .. } => {
                    panic!("the sender never leads a repair")
                }
            };
            queue.extend(more);
        }
    }

    /// Deliver frames both ways until none is left.
    fn settle(&mut self) {
        loop {
            if let Some(f) = self.to_receiver.pop_front() {
                let actions = self.lead.handle(f, self.now);
                self.lead_actions(actions);
            } else if let Some(f) = self.to_sender.pop_front() {
                let actions = self.follow.handle(f, self.now);
                self.follow_actions(actions);
            } else {
                return;
            }
        }
    }

    fn routes(&self) -> Vec<(Route, Route)> {
        (0..self.consumed.len())
            .map(|l| (self.lead.route(l), self.follow.route(l)))
            .collect()
    }

    fn assert_agree(&self) {
        for (lane, (r, s)) in self.routes().into_iter().enumerate() {
            assert_eq!(
                (r.local, r.remote),
                (s.remote, s.local),
                "lane {lane}: the two sides disagree on its route"
            );
        }
    }
}

#[test]
fn a_lane_the_sender_loses_moves_to_the_other_members_and_resumes_where_the_receiver_stood() {
    let mut p = Pair::new(fused(2, 1));
    p.consumed[1] = 41;
    p.follow_dead = 0;
    let actions = p.follow.broken(1, Cause::Completion(12), p.now);
    p.follow_actions(actions);
    assert!(!p.follow.is_up(1), "no writes on a broken lane");
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
    assert_eq!(p.replays, vec![(1, 41)]);
    // Lane 1's home (member 1 on both sides) failed: it moves off that pair.
    assert_ne!(
        p.lead.route(1),
        Route {
            local: 1,
            remote: 1
        }
    );
    p.assert_agree();
}

#[test]
fn a_port_down_on_the_receiver_moves_every_lane_on_it() {
    let mut p = Pair::new(fused(2, 2));
    let actions = p.lead.local_member(0, true, p.now);
    p.lead_actions(actions);
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
    for lane in 0..4 {
        assert_eq!(p.lead.route(lane).local, 1, "lane {lane} left member 0");
    }
    let mut moved: Vec<usize> = p.replays.iter().map(|r| r.0).collect();
    moved.sort_unstable();
    assert_eq!(moved, vec![0, 2], "the lanes of member 0 and no other");
    p.assert_agree();
}

#[test]
fn an_offer_to_a_member_the_sender_lost_is_refused_and_made_again_elsewhere() {
    let mut p = Pair::new(fused(3, 1));
    // The sender's member 1 goes down; before its word arrives, the receiver loses lane 0 and
    // offers the next rail, on that member.
    p.follow_dead = 0b10;
    let actions = p.follow.local_member(1, true, p.now);
    p.follow_actions(actions);
    let actions = p.lead.broken(0, Cause::Completion(12), p.now);
    p.lead_actions(actions);
    assert!(
        matches!(
            p.to_sender.back(),
            Some(Frame::Offer { send_member: 1, .. })
        ),
        "{:?}",
        p.to_sender
    );
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
    assert_eq!(
        p.follow.route(0).local,
        2,
        "lane 0 on the rail neither failed nor refused"
    );
    for lane in 0..3 {
        assert_ne!(
            p.follow.route(lane).local,
            1,
            "lane {lane} on a live member"
        );
    }
    p.assert_agree();
}

#[test]
fn a_member_down_on_both_sides_moves_its_lanes_once_whichever_side_hears_first() {
    // The same link fails under both sides: the receiver's port event comes first and it
    // offers lanes 1 and 3 on members 0; the sender's word that they broke, written before it
    // read the offers, arrives after. That word is about the old QPs: the offers stand (taken
    // for a failure of the new route, it left the lanes waiting with every port they need up).
    let mut p = Pair::new(fused(2, 2));
    p.lead_dead = 0b10;
    p.follow_dead = 0b10;
    let actions = p.lead.local_member(1, true, p.now);
    p.lead_actions(actions);
    let actions = p.follow.local_member(1, true, p.now);
    p.follow_actions(actions);
    let told: LaneSet = p
        .to_receiver
        .iter()
        .map(|f| match f {
            Frame::Broken { lanes, .. } => *lanes,
            _ => 0,
        })
        .fold(0, |a, b| a | b);
    assert_eq!(told, 0b1010, "{:?}", p.to_receiver);
    p.settle();
    assert!(
        p.lead.all_up() && p.follow.all_up(),
        "{:?}",
        p.lead.lanes.states
    );
    let zero = Route {
        local: 0,
        remote: 0,
    };
    for lane in 0..4 {
        assert_eq!(p.lead.route(lane), zero, "lane {lane}");
    }
    assert_eq!(p.lead.epochs, vec![0, 1, 0, 1], "one repair per moved lane");
    p.assert_agree();
}

/// Lane 0 of a fused pair (3 members against 1) fails on the receiver, which offers it a new
/// QP; the sender reads the offer, whose connect the glue holds for the old QP's drain.
/// Returns the pair and the offer's epoch and route.
fn an_offer_held_for_the_drain() -> (Pair, u32, Route) {
    let mut p = Pair::new(fused(3, 1));
    let actions = p.lead.broken(0, Cause::Completion(12), p.now);
    p.lead_actions(actions);
    let (mut offer, mut rest) = (None, Vec::new());
    while let Some(frame) = p.to_sender.pop_front() {
        for a in p.follow.handle(frame, p.now) {
            match a {
                Action::Connect { epoch, route, .. } => offer = Some((epoch, route)),
                other => rest.push(other),
            }
        }
    }
    p.follow_actions(rest);
    let (epoch, route) = offer.expect("an offer");
    assert!(p.follow.connecting(0, epoch));
    (p, epoch, route)
}

#[test]
fn an_offer_whose_member_goes_down_before_its_qp_is_made_is_refused() {
    let (mut p, epoch, route) = an_offer_held_for_the_drain();
    // Meanwhile the offered member goes down here.
    p.follow_dead = bit(route.local);
    let actions = p.follow.local_member(route.local, true, p.now);
    assert!(
        actions.contains(&Action::Send(Frame::Refuse {
            lane: 0,
            epoch,
            down: bit(route.local),
        })),
        "{actions:?}"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Send(Frame::Broken { lanes, .. }) if lanes & 1 != 0)),
        "a Broken would be taken for the old QP's: {actions:?}"
    );
    assert!(
        !p.follow.connecting(0, epoch),
        "the held connect is dropped"
    );
    p.follow_actions(actions);
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
    assert_ne!(p.follow.route(0).local, route.local);
    p.assert_agree();
}

#[test]
fn the_old_qps_late_fatal_event_does_not_refuse_an_offer_on_a_live_route() {
    let (mut p, epoch, _) = an_offer_held_for_the_drain();
    // The old QP's fatal event (its retries ran out) comes now.
    let actions = p.follow.broken(0, Cause::QpFatal, p.now);
    assert_eq!(actions, Vec::new(), "the offer stands");
    assert!(p.follow.connecting(0, epoch), "the held connect still goes");
}

#[test]
fn a_lane_whose_every_rail_failed_waits_for_a_member_and_then_fails_past_the_budget() {
    // One member a side, its path losing packets with the ports up: no rail is left to try,
    // so the lane waits (retrying the path with no sign that it works would never end).
    let mut p = Pair::new(fused(1, 1));
    let actions = p.lead.broken(0, Cause::Completion(12), p.now);
    p.lead_actions(actions);
    p.settle();
    assert!(!p.lead.is_up(0), "waiting");
    p.now += BUDGET + Duration::from_millis(1);
    let gone = p.lead.overdue(p.now);
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].cause, Cause::Completion(12));
    // Had its port gone down and come back meanwhile, the lane would have tried it again.
    let mut p = Pair::new(fused(1, 1));
    let actions = p.lead.broken(0, Cause::Completion(12), p.now);
    p.lead_actions(actions);
    p.settle();
    for down in [true, false] {
        let actions = p.lead.local_member(0, down, p.now);
        p.lead_actions(actions);
        p.settle();
    }
    assert!(p.lead.all_up() && p.follow.all_up());
    p.assert_agree();
}

#[test]
fn the_last_member_down_waits_and_comes_back_when_a_member_does() {
    let mut p = Pair::new(fused(1, 1));
    let actions = p.lead.local_member(0, true, p.now);
    p.lead_actions(actions);
    p.settle();
    assert!(!p.lead.is_up(0));
    p.now += Duration::from_secs(5);
    assert!(p.lead.overdue(p.now).is_empty(), "within the budget");
    let actions = p.lead.local_member(0, false, p.now);
    p.lead_actions(actions);
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
    assert_eq!(p.replays, vec![(0, 0)]);
}

#[test]
fn a_lane_down_past_the_budget_is_named_with_its_cause() {
    let mut p = Pair::new(fused(2, 1));
    for m in 0..2 {
        let actions = p.lead.local_member(m, true, p.now);
        p.lead_actions(actions);
    }
    p.settle();
    p.now += BUDGET + Duration::from_millis(1);
    let gone = p.lead.overdue(p.now);
    assert_eq!(gone.len(), 2);
    assert!(gone.iter().all(|g| g.cause == Cause::PortDown));
    assert_eq!(gone[0].health.local_down, 0b11);
    p.now += Duration::from_secs(5);
    assert_eq!(p.follow.overdue(p.now).len(), 2, "the sender gives up too");
}

#[test]
fn a_short_budget_bounds_the_wait_for_a_member_not_a_repair() {
    let short = Duration::from_millis(117);
    let now = Instant::now();
    // A lane moving to the other member: the peer has not accepted the offer yet.
    let mut lead = LeadRepair::new(fused(2, 1), short);
    let actions = lead.broken(0, Cause::Completion(12), now);
    assert!(actions.contains(&Action::Flush { lane: 0 }));
    assert!(matches!(lead.drained(0)[..], [Action::Create { .. }]));
    assert!(
        lead.overdue(now + Duration::from_secs(1)).is_empty(),
        "a repair under way may take longer than the budget"
    );
    assert_eq!(
        lead.overdue(now + REPAIR_LIMIT + Duration::from_millis(1))
            .len(),
        1
    );
    // Both members down: nothing to repair onto, so the budget applies.
    let mut lead = LeadRepair::new(fused(2, 1), short);
    for m in 0..2 {
        lead.local_member(m, true, now);
    }
    for lane in 0..2 {
        assert!(lead.drained(lane).is_empty(), "no route for lane {lane}");
    }
    assert_eq!(lead.overdue(now + Duration::from_millis(118)).len(), 2);
    // The sender allows what the receiver would, and its grace.
    let mut follow = FollowRepair::new(fused(2, 1), short);
    follow.broken(0, Cause::PortDown, now);
    let limit = REPAIR_LIMIT + SENDER_GRACE;
    assert!(follow.overdue(now + limit).is_empty());
    assert_eq!(
        follow.overdue(now + limit + Duration::from_millis(1)).len(),
        1
    );
}

#[test]
fn a_lane_whose_home_path_failed_with_its_ports_up_stays_away_until_a_port_comes_back() {
    let mut p = Pair::new(fused(2, 1));
    // Lane 1's path loses its packets: no port event, a completion error.
    let actions = p.lead.broken(1, Cause::Completion(12), p.now);
    p.lead_actions(actions);
    p.settle();
    let away = Route {
        local: 0,
        remote: 0,
    };
    assert_eq!(p.lead.route(1), away, "moved to the other member");
    for _ in 0..10 {
        p.now += SETTLE * 4;
        let actions = p.lead.tick(p.now);
        assert!(
            actions.is_empty(),
            "no move home: nothing says the path works"
        );
    }
    // Its port goes down and comes back: now the lane goes home once it settled.
    let actions = p.lead.local_member(1, true, p.now);
    p.lead_actions(actions);
    let actions = p.lead.local_member(1, false, p.now);
    p.lead_actions(actions);
    p.settle();
    assert!(p.lead.tick(p.now).is_empty(), "not settled yet");
    p.now += SETTLE;
    let actions = p.lead.tick(p.now);
    p.lead_actions(actions);
    p.settle();
    assert_eq!(
        p.lead.route(1),
        Route {
            local: 1,
            remote: 1
        },
        "home again"
    );
    assert!(p.lead.all_up() && p.follow.all_up());
    p.assert_agree();
}

#[test]
fn answers_of_an_earlier_repair_are_ignored() {
    let mut p = Pair::new(fused(2, 1));
    let actions = p.lead.broken(0, Cause::Completion(12), p.now);
    p.lead_actions(actions);
    let stale = Frame::Accept {
        lane: 0,
        epoch: 99,
        qpn: 5,
        psn: 5,
    };
    assert!(p.lead.handle(stale, p.now).is_empty());
    let stale = Frame::Resume {
        lane: 0,
        epoch: 99,
        consumed: 3,
    };
    assert!(p.follow.handle(stale, p.now).is_empty());
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
}

#[test]
fn a_new_qp_that_fails_to_connect_is_dropped_and_the_repair_goes_elsewhere() {
    let mut p = Pair::new(fused(3, 1));
    // The receiver's member 1 cannot connect, though no port event said so.
    p.lead_dead = 0b010;
    let actions = p.lead.broken(0, Cause::Completion(12), p.now);
    p.lead_actions(actions);
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
    assert_ne!(p.lead.route(0).local, 1);
    p.assert_agree();
}

#[test]
fn routes_prefer_home_then_the_least_loaded_live_rail() {
    let layout = fused(2, 2);
    let all_up = Health::default();
    let none = |_| 0;
    let rail = |m| Route {
        local: m,
        remote: m,
    };
    assert_eq!(plan_route(&layout, 3, all_up, 0, none), Some(rail(1)));
    let down0 = Health {
        local_down: 0b01,
        remote_down: 0,
    };
    assert_eq!(plan_route(&layout, 0, down0, 0, none), Some(rail(1)));
    let dead = Health {
        local_down: 0b11,
        remote_down: 0,
    };
    assert_eq!(plan_route(&layout, 0, dead, 0, none), None);
    // Never across rails: member 0 here never pairs with the peer's member 1.
    let crossed = Health {
        local_down: 0b10,
        remote_down: 0b01,
    };
    assert_eq!(plan_route(&layout, 0, crossed, 0, none), None);
    let four = fused(4, 1);
    let load = |r: Route| usize::from(r.local == 1) * 3;
    assert_eq!(
        plan_route(&four, 0, all_up, route_bit(rail(0)), load),
        Some(rail(2)),
        "the least loaded of the rails that did not fail"
    );
    // A rail that failed is not taken again, even when it is the only one up: the lane waits
    // for a member to come back.
    let one = fused(1, 1);
    assert_eq!(plan_route(&one, 0, all_up, route_bit(rail(0)), none), None);
}

/// Random schedules of ports going down and up on either side (one at a time or together),
/// lanes failing on either side, and frames delivered in any interleaving of the two
/// directions: once every port is back and the frames settle, every lane is up and both sides
/// agree on its route; and no lane is ever up on a member that is down.
#[test]
fn any_schedule_of_failures_and_returns_converges_with_both_sides_agreeing() {
    for seed in 1..=300u64 {
        let members = 1 + seed as usize % 3;
        let mut p = Pair::new(fused(members, 1 + seed as usize % 2));
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let (mut lead_down, mut follow_down) = (0u8, 0u8);
        for _ in 0..200 {
            p.now += Duration::from_millis(rng.below(50));
            let m = rng.below(members as u64) as u8;
            let lane = rng.below(p.consumed.len() as u64) as usize;
            match rng.below(8) {
                0 => {
                    lead_down ^= bit(m);
                    p.lead_dead = lead_down;
                    let actions = p.lead.local_member(m, lead_down & bit(m) != 0, p.now);
                    p.lead_actions(actions);
                }
                1 => {
                    follow_down ^= bit(m);
                    p.follow_dead = follow_down;
                    let actions = p.follow.local_member(m, follow_down & bit(m) != 0, p.now);
                    p.follow_actions(actions);
                }
                2 => {
                    let actions = p.lead.broken(lane, Cause::Completion(12), p.now);
                    p.lead_actions(actions);
                }
                3 => {
                    let actions = p.follow.broken(lane, Cause::Completion(12), p.now);
                    p.follow_actions(actions);
                }
                4 | 5 => {
                    if let Some(f) = p.to_receiver.pop_front() {
                        let actions = p.lead.handle(f, p.now);
                        p.lead_actions(actions);
                    }
                }
                _ => {
                    if let Some(f) = p.to_sender.pop_front() {
                        let actions = p.follow.handle(f, p.now);
                        p.follow_actions(actions);
                    }
                }
            }
            for l in 0..p.consumed.len() {
                if p.lead.is_up(l) {
                    assert_eq!(
                        lead_down & bit(p.lead.route(l).local),
                        0,
                        "seed {seed}: lane {l} up on a receiver member that is down"
                    );
                }
                if p.follow.is_up(l) {
                    assert_eq!(
                        follow_down & bit(p.follow.route(l).local),
                        0,
                        "seed {seed}: lane {l} up on a sender member that is down"
                    );
                }
            }
        }
        for m in 0..members as u8 {
            if lead_down & bit(m) != 0 {
                let actions = p.lead.local_member(m, false, p.now);
                p.lead_actions(actions);
            }
            if follow_down & bit(m) != 0 {
                let actions = p.follow.local_member(m, false, p.now);
                p.follow_actions(actions);
            }
        }
        p.lead_dead = 0;
        p.follow_dead = 0;
        p.settle();
        // A lane is up, or waits for a member because every rail it could take failed with
        // its ports up (nothing says such a path works again).
        for (lane, state) in p.lead.lanes.states.iter().enumerate() {
            assert!(
                matches!(state, Lead::Up(_) | Lead::Waiting { .. }),
                "seed {seed}: lane {lane} stuck in {state:?}"
            );
        }
        // Every receiver member goes down and comes back: then every lane is up, and goes home.
        for m in 0..members as u8 {
            for down in [true, false] {
                let actions = p.lead.local_member(m, down, p.now);
                p.lead_actions(actions);
                p.settle();
            }
        }
        assert!(
            p.lead.all_up() && p.follow.all_up(),
            "seed {seed}: not every lane came back: {:?} / {:?}",
            p.lead.lanes.states,
            p.follow.lanes.states
        );
        p.assert_agree();
        p.now += SETTLE;
        let actions = p.lead.tick(p.now);
        p.lead_actions(actions);
        p.settle();
        for lane in 0..p.consumed.len() {
            assert_eq!(
                p.lead.route(lane),
                Route::home(&p.lead.lanes.layout, lane),
                "seed {seed}: lane {lane} did not move home after its ports came back"
            );
        }
        p.assert_agree();
    }
}

#[test]
fn lanes_move_home_once_their_ports_have_been_back_a_while() {
    let mut p = Pair::new(fused(2, 2));
    let actions = p.follow.local_member(1, true, p.now);
    p.follow_actions(actions);
    p.settle();
    assert!(p.lead.all_up() && (0..4).all(|l| p.lead.route(l).remote == 0));
    let actions = p.follow.local_member(1, false, p.now);
    p.follow_actions(actions);
    p.settle();
    p.now += SETTLE / 2;
    assert!(p.lead.tick(p.now).is_empty(), "not before the port settled");
    p.now += SETTLE;
    let replays = p.replays.len();
    let actions = p.lead.tick(p.now);
    p.lead_actions(actions);
    p.settle();
    assert!(p.lead.all_up() && p.follow.all_up());
    for lane in 0..4 {
        assert_eq!(p.lead.route(lane), Route::home(&p.lead.lanes.layout, lane));
    }
    assert_eq!(
        p.replays.len(),
        replays + 2,
        "the two lanes of member 1 moved back"
    );
    p.assert_agree();
}

/// What a thousand comms away from home cost while their home member is down: nothing. Only a
/// lane that is down, or one that may go home once its members settled, needs the clock; a
/// lane parked on another member waits for the port event (issue #62: comms whose every lane
/// is up tick no more).
#[test]
fn only_lanes_down_or_on_their_way_home_want_ticks() {
    let mut p = Pair::new(fused(2, 1));
    assert!(
        !p.lead.wants_ticks(true) && !p.follow.wants_ticks(true),
        "at home"
    );
    let actions = p.follow.local_member(1, true, p.now);
    p.follow_actions(actions);
    assert!(
        p.follow.wants_ticks(true),
        "the sender's lane 1 is down: its budget runs"
    );
    p.settle();
    assert!(
        p.lead.all_up() && p.lead.route(1).remote == 0,
        "lane 1 moved"
    );
    assert!(
        !p.lead.wants_ticks(true) && !p.follow.wants_ticks(true),
        "away, its home member down: nothing to do until the port comes back"
    );
    let actions = p.follow.local_member(1, false, p.now);
    p.follow_actions(actions);
    p.settle();
    assert!(
        p.lead.wants_ticks(true),
        "home is back: it moves once the port settled"
    );
    assert!(
        !p.lead.wants_ticks(false),
        "without NCCL_IB_RESILIENCY_PORT_RECOVERY lanes stay where they are"
    );
    p.now += SETTLE;
    let actions = p.lead.tick(p.now);
    p.lead_actions(actions);
    p.settle();
    assert_eq!(p.lead.route(1), Route::home(&p.lead.lanes.layout, 1));
    assert!(
        !p.lead.wants_ticks(true) && !p.follow.wants_ticks(true),
        "home again"
    );
}
