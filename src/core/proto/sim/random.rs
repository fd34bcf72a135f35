//! Random schedules of both paths, full rings in flight, and the single-write way.

use super::*;

/// Random interleavings of both paths: each message is posted receive-first or send-first,
/// sized around the threshold, sent from host or GPU memory, with deliveries at random points
/// (receives stay in host memory: one refusal ends the eager path, tested on its own). Every
/// message must arrive byte-exact in its own buffer and both sides must report its size.
#[test]
fn eager_and_rendezvous_messages_mix_in_any_order() {
    for quiet in [false, true] {
        mix_in_any_order(quiet);
    }
}

fn mix_in_any_order(quiet: bool) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..40 {
        let mut p = Pair::eager_with(EAGER, 3, quiet);
        let count = 3 * SLOTS;
        let (mut sent, mut posted, mut eager) = (0, 0, 0);
        let size = |i: usize| [0, 8, EAGER - 1, EAGER, EAGER + 1, 100][i % 6] + (i / 6) as u64;
        let src = |i: usize| (i as u64 * 97) % 4096;
        let dst = |i: usize| 16_384 + (i % SLOTS) as u64 * 8192;
        let mut fly = InFlight {
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            size: &size,
            src: &src,
            dst: &dst,
        };
        let mut steps = 0;
        while sent < count || posted < count || !fly.is_empty() {
            steps += 1;
            if steps == 200_000 {
                eprintln!("{:#?}\n{:#?}\ncredit {}", p.send, p.recv, p.credit);
                panic!("round {round}: stalled at send {sent}, receive {posted}");
            }
            match rng.next() % 4 {
                0 if sent < count && fly.sends.len() < SLOTS => {
                    let host = !rng.next().is_multiple_of(5);
                    let buf = SendBuf {
                        host,
                        ..sbuf(src(sent), size(sent), 3)
                    };
                    if let Some(a) = p.isend(buf).unwrap() {
                        eager += usize::from(is_eager(&a));
                        fly.sends.push_back((sent, a.req));
                        sent += 1;
                    }
                }
                // In odd rounds receives lag: message i's receive only after send i - 1.
                1 if posted < count
                    && fly.recvs.len() < SLOTS / 2
                    && (round % 2 == 0 || posted <= sent) =>
                {
                    if let Some(slot) = p.irecv(&[rbuf(dst(posted), 2 * EAGER, 3)]) {
                        fly.recvs.push_back((vec![posted], slot));
                        posted += 1;
                    }
                }
                2 => {
                    p.deliver_all();
                    // Sometimes long enough for quiet receives to announce themselves.
                    if rng.next().is_multiple_of(3) {
                        p.time_passes();
                    }
                }
                _ => {
                    fly.finish_receive(&mut p, round);
                    fly.finish_send(&mut p, round);
                }
            }
        }
        assert!(
            p.send.eager_active() && p.recv.eager_active(),
            "single receives never stop it"
        );
        // With receives lagging, a good share goes eagerly (12 to 37 of 96 in these rounds on
        // a ring of 8 bounce slots, 16 to 35 on one of 32).
        assert!(
            round % 2 == 0 || eager > count / 16,
            "round {round}: {eager} of {count} went eager"
        );
    }
}

/// Both sides with a full ring in flight, as a pipelined benchmark runs them (32 sends and 32
/// receives outstanding, each completed in order), at random relative speeds: in some rounds
/// the sender rarely looks at its ring, so the receiver copies eager messages and goes round
/// the ring before their answers are read. Every message arrives byte-exact and both sides
/// finish: a stall (no progress in many steps) fails the test.
#[test]
fn a_full_ring_in_flight_on_both_sides_never_stalls() {
    for quiet in [false, true] {
        full_ring_never_stalls(quiet);
    }
}

fn full_ring_never_stalls(quiet: bool) {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..60 {
        let mut p = Pair::eager_with(EAGER, 3, quiet);
        let count = 6 * SLOTS;
        // The sender's share of the steps: from one in two down to one in 256.
        let sender_every = 2 << (round % 8);
        let (mut sent, mut posted, mut idle) = (0, 0, 0);
        let size = |i: usize| (i as u64 * 37) % (EAGER + 64);
        let src = |i: usize| (i as u64 * 97) % 4096;
        let dst = |i: usize| 16_384 + (i % SLOTS) as u64 * 8192;
        let mut fly = InFlight {
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            size: &size,
            src: &src,
            dst: &dst,
        };
        while sent < count || !fly.is_empty() {
            idle += 1;
            if idle >= 10_000 {
                eprintln!("{:#?}\n{:#?}\ncredit {}", p.send, p.recv, p.credit);
            }
            assert!(
                idle < 10_000,
                "round {round}: stalled at send {sent}, receive {posted}"
            );
            let sender_turn = rng.next().is_multiple_of(sender_every);
            let progressed = match (sender_turn, rng.next() % 3) {
                (true, 0) if sent < count && fly.sends.len() < SLOTS => {
                    let accepted = p.isend(sbuf(src(sent), size(sent), 3)).unwrap();
                    accepted
                        .map(|a| {
                            fly.sends.push_back((sent, a.req));
                            sent += 1;
                        })
                        .is_some()
                }
                (true, _) => fly.finish_send(&mut p, round),
                (false, 0) if posted < count && fly.recvs.len() < SLOTS => {
                    let slot = p.irecv(&[rbuf(dst(posted), 2 * EAGER, 3)]);
                    slot.map(|slot| {
                        fly.recvs.push_back((vec![posted], slot));
                        posted += 1;
                    })
                    .is_some()
                }
                (false, 1) => {
                    p.deliver_all();
                    if rng.next().is_multiple_of(3) {
                        p.time_passes();
                    }
                    false
                }
                (false, _) => fly.finish_receive(&mut p, round),
            };
            if progressed {
                idle = 0;
            }
        }
    }
}

/// One seeded random schedule of sends and receives (tags 3 and 4, single and grouped
/// receives, sizes around the eager threshold and above the receive, host and GPU sends),
/// every call's outcome written down.
fn schedule_trace(seed: u64, single: bool, quiet: bool) -> (Vec<String>, usize) {
    let mut rng = Rng(seed);
    let mut p = Pair::eager_with(EAGER, 3, quiet);
    (p.single, p.singles) = (single, 0);
    let mut trace = Vec::new();
    let (mut sends, mut recvs) = (VecDeque::new(), VecDeque::new());
    for step in 0..600 {
        let tag = 3 + i32::from(rng.next().is_multiple_of(4));
        match rng.next() % 5 {
            0 | 1 if sends.len() < SLOTS => {
                let size = [0, 8, EAGER, EAGER + 1, 3000, 9000][(rng.next() % 6) as usize];
                let buf = SendBuf {
                    host: !rng.next().is_multiple_of(6),
                    ..sbuf((step % 64) * 16, size, tag)
                };
                let a = p.isend(buf).unwrap();
                if let Some(a) = &a {
                    sends.push_back(a.req);
                }
                trace.push(format!("isend {buf:?}: {a:?}"));
            }
            2 if recvs.len() < SLOTS / 2 => {
                let dst = 16_384 + (step % SLOTS as u64) * 16_384;
                let bufs = if rng.next().is_multiple_of(8) {
                    vec![rbuf(dst, 4096, tag), rbuf(dst + 8192, 4096, 7 - tag)]
                } else {
                    vec![rbuf(dst, 4096, tag)]
                };
                let slot = p.irecv(&bufs);
                if let Some(slot) = slot {
                    recvs.push_back(slot);
                }
                trace.push(format!("irecv {bufs:?}: {slot:?}"));
            }
            3 => {
                p.deliver_all();
                if rng.next().is_multiple_of(3) {
                    p.time_passes();
                }
            }
            _ => {
                if let Some(&req) = sends.front()
                    && let Some(size) = p.sent(req)
                {
                    p.send.release(req);
                    sends.pop_front();
                    trace.push(format!("sent {req}: {size}"));
                }
                if let Some(&slot) = recvs.front()
                    && let Some(sizes) = p.received(slot)
                {
                    p.recv.release(slot);
                    recvs.pop_front();
                    trace.push(format!("received {slot}: {sizes:?}"));
                }
            }
        }
    }
    let memory = p
        .recv_mem
        .iter()
        .fold(0u64, |h, &b| h.rotate_left(5) ^ u64::from(b));
    trace.push(format!("memory {memory:x}"));
    (trace, p.singles)
}

/// The single-write way (`isend_single`, taken by the glue when the next message's CTS is a
/// single receive with the send's tag) is only a shortcut: over random schedules, with it and
/// without it, every call returns the same, every message lands the same.
#[test]
fn the_single_write_way_changes_no_outcome() {
    for (seed, quiet) in (1..=40u64).flat_map(|s| [(s, false), (s, true)]) {
        let seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let ((with, singles), (without, none)) = (
            schedule_trace(seed, true, quiet),
            schedule_trace(seed, false, quiet),
        );
        let started = with
            .iter()
            .filter(|t| t.starts_with("isend") && t.contains("Some"))
            .count();
        // With quiet receives most sends go eagerly, a few by the single-write way.
        assert!(
            (quiet || singles > 10) && started > singles,
            "seed {seed:#x}: {singles} of {started} sends went the single-write way"
        );
        assert_eq!(none, 0);
        assert_eq!(with, without, "seed {seed:#x}");
    }
}
