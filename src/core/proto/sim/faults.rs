//! Lanes that fail in the middle of traffic and are repaired (`core::repair` decides when and
//! where; here only what the data path must guarantee): whatever part of a lane's traffic got
//! through before it failed, in either direction, every receive completes exactly once with
//! every byte and its size, every send completes once, and nothing stalls.

use super::*;

/// One seeded schedule of `count` messages on `p` (a fault-mode pair), failing random lanes at
/// random points (`fail_every`: one step in that many) and repairing each after a random while,
/// onto a random rail; sometimes a lane fails again while its repair's writes are on the wire.
fn run_with_failures(
    mut p: Pair,
    seed: u64,
    count: usize,
    size: &dyn Fn(usize) -> u64,
    slot_bytes: u64,
    in_flight: usize,
    fail_every: u64,
) -> usize {
    let mut rng = Rng(seed);
    let lanes = p.wire.len();
    let rails = p.send.layout().rails();
    let src = |i: usize| (i as u64 * 97) % 4096;
    let dst = |i: usize| 16_384 + (i % in_flight) as u64 * slot_bytes;
    let mut fly = InFlight {
        sends: VecDeque::new(),
        recvs: VecDeque::new(),
        size,
        src: &src,
        dst: &dst,
    };
    let (mut sent, mut posted, mut idle, mut failures) = (0, 0, 0, 0);
    // Lanes down, with the step they come back at.
    let mut down: Vec<Option<usize>> = vec![None; lanes];
    let mut step = 0;
    while sent < count || posted < count || !fly.is_empty() {
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
                idle = 0;
            }
        }
        if rng.below(fail_every) == 0 {
            let lane = rng.below(lanes as u64) as usize;
            if down[lane].is_none() {
                p.fail(lane);
                failures += 1;
                down[lane] = Some(step + rng.below(40) as usize);
            }
        }
        let progressed = match rng.below(5) {
            0 if sent < count && fly.sends.len() < in_flight => p
                .isend(sbuf(src(sent), size(sent), 3))
                .unwrap()
                .map(|a| {
                    fly.sends.push_back((sent, a.req));
                    sent += 1;
                })
                .is_some(),
            1 if posted < count && fly.recvs.len() < in_flight => p
                .irecv(&[rbuf(dst(posted), slot_bytes, 3)])
                .map(|slot| {
                    fly.recvs.push_back((posted, slot));
                    posted += 1;
                })
                .is_some(),
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
        failures += run_with_failures(p, seed * 0x9e37_79b9, 120, &size, 140_000, 6, 25);
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
        failures += run_with_failures(
            p,
            seed * 0x2545_f491,
            3 * SLOTS,
            &size,
            2 * EAGER,
            SLOTS / 2,
            30,
        );
    }
    assert!(failures > 100, "only {failures} failures injected");
}
