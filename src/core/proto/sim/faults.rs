//! Lanes that fail in the middle of traffic and are repaired (`core::repair` decides when and
//! where; here only what the data path must guarantee): whatever part of a lane's traffic got
//! through before it failed, in either direction, every receive completes exactly once with
//! every byte and its size, every send completes once, and nothing stalls.

use super::*;

/// How the messages of a schedule are received: `group(i)` is the number of messages the
/// receive that starts at message `i` takes (one: single receives). The sends of a group go
/// in the order of its entries' tags, or, in every other group, in the reverse order.
struct Groups {
    /// Per message, its tag.
    tags: Vec<i32>,
    /// Per receive, its messages in the order of its entries.
    receives: Vec<Vec<usize>>,
}

impl Groups {
    fn new(count: usize, group: &dyn Fn(usize) -> usize) -> Self {
        let (mut tags, mut receives) = (vec![0; count], Vec::new());
        let mut start = 0;
        while start < count {
            let n = group(start).clamp(1, MAX_RECVS).min(count - start);
            let reversed = receives.len() % 2 == 1;
            // Entry k takes tag 3 + k; the sends go in message order.
            let entries: Vec<usize> = (0..n)
                .map(|k| start + if reversed { n - 1 - k } else { k })
                .collect();
            for (k, &m) in entries.iter().enumerate() {
                tags[m] = 3 + k as i32;
            }
            receives.push(entries);
            start += n;
        }
        Self { tags, receives }
    }

    fn largest(&self) -> usize {
        self.receives.iter().map(Vec::len).max().unwrap_or(1)
    }
}

/// A schedule of messages for [`run_with_failures`].
struct Schedule<'a> {
    count: usize,
    size: &'a dyn Fn(usize) -> u64,
    /// The receives' groups ([`Groups`]).
    group: &'a dyn Fn(usize) -> usize,
    /// Each receive buffer's size.
    slot_bytes: u64,
    /// Receives in flight at most.
    in_flight: usize,
    /// One step in this many fails a lane.
    fail_every: u64,
}

/// One seeded run of `s` on `p` (a fault-mode pair), failing random lanes at random points and
/// repairing each after a random while, onto a random rail; sometimes a lane fails again while
/// its repair's writes are on the wire. Returns the failures injected.
fn run_with_failures(mut p: Pair, seed: u64, s: &Schedule<'_>) -> usize {
    let mut rng = Rng(seed);
    let lanes = p.wire.len();
    let rails = p.send.layout().rails();
    let (count, in_flight, slot_bytes) = (s.count, s.in_flight, s.slot_bytes);
    let groups = Groups::new(count, s.group);
    // Receive buffers, and sends in flight: as many as messages the receives in flight can
    // take (the sends of a group are written only once all of them are posted, as NCCL's).
    let buffers = in_flight * groups.largest();
    let src = |i: usize| (i as u64 * 97) % 4096;
    let dst = |i: usize| 16_384 + (i % buffers) as u64 * slot_bytes;
    assert!(
        dst(buffers - 1) + slot_bytes <= WARM_UP_AT,
        "receive buffers past the memory"
    );
    let mut fly = InFlight {
        sends: VecDeque::new(),
        recvs: VecDeque::new(),
        size: s.size,
        src: &src,
        dst: &dst,
    };
    let (mut sent, mut posted, mut idle, mut failures) = (0, 0, 0, 0);
    // Lanes down, with the step they come back at.
    let mut down: Vec<Option<usize>> = vec![None; lanes];
    let mut step = 0;
    while sent < count || posted < groups.receives.len() || !fly.is_empty() {
        step += 1;
        idle += 1;
        assert!(
            idle < 20_000,
            "seed {seed:#x}: stalled at send {sent}, receive {posted}\n{:#?}\n{:#?}",
            p.send,
            p.recv
        );
        for (lane, back_at) in down.iter_mut().enumerate() {
            if back_at.is_some_and(|at| step >= at) {
                *back_at = None;
                let rail = rng.below(rails as u64) as usize;
                let layout = p.send.layout();
                p.repair(
                    lane,
                    (layout.local_member(rail), layout.remote_member(rail)),
                );
            }
        }
        if rng.below(s.fail_every) == 0 {
            let lane = rng.below(lanes as u64) as usize;
            if down[lane].is_none() {
                p.fail(lane);
                failures += 1;
                down[lane] = Some(step + rng.below(40) as usize);
            }
        }
        let progressed = match rng.below(5) {
            0 if sent < count && fly.sends.len() < buffers => p
                .isend(sbuf(src(sent), (s.size)(sent), groups.tags[sent]))
                .unwrap()
                .map(|a| {
                    fly.sends.push_back((sent, a.req));
                    sent += 1;
                })
                .is_some(),
            1 if posted < groups.receives.len() && fly.recvs.len() < in_flight => {
                let messages = &groups.receives[posted];
                let bufs: Vec<RecvBuf> = messages
                    .iter()
                    .map(|&m| rbuf(dst(m), slot_bytes, groups.tags[m]))
                    .collect();
                p.irecv(&bufs)
                    .map(|slot| {
                        fly.recvs.push_back((messages.clone(), slot));
                        posted += 1;
                    })
                    .is_some()
            }
            2 => {
                // A few deliveries, not all: failures must meet traffic on the wire.
                for _ in 0..rng.below(6) {
                    p.deliver_one();
                }
                if rng.below(4) == 0 {
                    p.time_passes();
                }
                false
            }
            _ => fly.finish_receive(&mut p, step) | fly.finish_send(&mut p, step),
        };
        if progressed {
            idle = 0;
        }
    }
    failures
}

/// Fused connections of two ports a side (one or two QPs per port, data split or rotated,
/// messages below and above the striping threshold), lanes failing anywhere in a message and
/// coming back on any rail.
#[test]
fn fused_traffic_survives_lanes_failing_at_random_points() {
    let size = |i: usize| [8, 4000, 70_000, 1, 65_536, 130_000][i % 6] + (i / 6) as u64;
    let mut failures = 0;
    for seed in 1..=24u64 {
        let (per_member, split) = [(1, false), (2, false), (2, true)][seed as usize % 3];
        let p = Pair::fused(2 * per_member, split, 2, 2).with_faults();
        let schedule = Schedule {
            count: 120,
            size: &size,
            group: &|_| 1,
            slot_bytes: 140_000,
            in_flight: 6,
            fail_every: 25,
        };
        failures += run_with_failures(p, seed * 0x9e37_79b9, &schedule);
    }
    assert!(failures > 100, "only {failures} failures injected");
}

/// One-lane connections with eager messages (and with quiet receives): the only lane fails
/// and comes back (a port that flapped), with eager and rendezvous messages, answers,
/// acknowledgements and credits lost at random on the way.
#[test]
fn an_eager_connection_survives_its_only_lane_failing_and_returning() {
    let size = |i: usize| [0, 8, EAGER - 1, EAGER, EAGER + 1, 100][i % 6] + (i / 6) as u64;
    let mut failures = 0;
    for seed in 1..=30u64 {
        let quiet = seed % 2 == 0;
        let p = Pair::eager_with(EAGER, 3, quiet).with_faults();
        let schedule = Schedule {
            count: 3 * SLOTS,
            size: &size,
            group: &|_| 1,
            slot_bytes: 2 * EAGER,
            in_flight: SLOTS / 2,
            fail_every: 30,
        };
        failures += run_with_failures(p, seed * 0x2545_f491, &schedule);
    }
    assert!(failures > 100, "only {failures} failures injected");
}

/// Grouped receives (NCCL's grouped point-to-point: one receive for several tags, here one to
/// four, their sends in the entries' order or reversed) on fused connections of every layout and
/// on a one-lane eager connection (where the first group ends the eager path), lanes failing at
/// random points: every entry completes once with its own message's bytes and size.
#[test]
fn grouped_receives_survive_lanes_failing_at_random_points() {
    let group = |i: usize| 1 + (i * 7) % 4;
    let fused_size = |i: usize| [8, 4000, 70_000, 1, 65_536, 20_000][i % 6] + (i / 6) as u64;
    let eager_size = |i: usize| [0, 8, EAGER - 1, EAGER, EAGER + 1, 100][i % 6] + (i / 6) as u64;
    let fused = Schedule {
        count: 120,
        size: &fused_size,
        group: &group,
        slot_bytes: 72_000,
        in_flight: 3,
        fail_every: 25,
    };
    let eager = Schedule {
        count: 3 * SLOTS,
        size: &eager_size,
        group: &group,
        slot_bytes: 2 * EAGER,
        in_flight: SLOTS / 4,
        fail_every: 30,
    };
    let mut failures = 0;
    for seed in 1..=32u64 {
        let (p, schedule) = match seed % 4 {
            0 => (Pair::eager_with(EAGER, 3, seed % 8 == 0), &eager),
            n => {
                let (per_member, split) = [(1, false), (2, false), (2, true)][n as usize - 1];
                (Pair::fused(2 * per_member, split, 2, 2), &fused)
            }
        };
        failures += run_with_failures(p.with_faults(), seed * 0x9e37_79b9_7f4a, schedule);
    }
    assert!(failures > 100, "only {failures} failures injected");
}
