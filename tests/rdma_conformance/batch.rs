//! Held answers (`NCCL_NET_RS_BATCH=1`, `transport::held`): a receive comm holds the answers
//! of back-to-back `irecv`s and writes them as one write at the next other call. Every
//! scenario runs with batching on for both ranks and pins one promise: the data is intact, a
//! client that waits on something else still sends what it holds at once, and a client that
//! leaves the plugin altogether has its held answers written by the watcher.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use crate::eager::watcher_wakeups;
use crate::support::net::pattern;
use crate::{Cx, Scenario};

const BATCH_ON: &[&[(&str, &str)]] = &[&[("NCCL_NET_RS_BATCH", "1")]];
/// Larger than the eager threshold: the sender must wait for the receiver's CTS.
const RENDEZVOUS: usize = 8192;

/// NCCL's proxy posts a step's receives before it tests any: 24 receives back to back (single
/// ones below, at and above the eager threshold, by rendezvous, and a grouped one of three in
/// the middle), then each tested. Every byte arrives, in every buffer.
fn back_to_back_receives_are_answered_byte_exact(cx: &mut Cx) {
    let sizes: Vec<usize> = (0..24).map(|i| [8, 4096, 4097, 65_536, 1][i % 5]).collect();
    const GROUPED_AT: usize = 10;
    const GROUP: usize = 3;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let slot = 70_000;
        let mut buf = vec![0xa5u8; sizes.len() * slot];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let mut reqs = Vec::new();
        let mut i = 0;
        while i < sizes.len() {
            let n = if i == GROUPED_AT { GROUP } else { 1 };
            let bufs: Vec<_> = (i..i + n)
                .map(|k| (base.wrapping_add(k * slot), slot, 5 + k as i32, mh))
                .collect();
            reqs.push((i, n, cx.net.irecv(rc, &bufs)));
            i += n;
        }
        for (first, n, req) in reqs {
            let got = cx.net.wait(req);
            for k in first..first + n {
                assert_eq!(got[k - first], sizes[k] as i32, "size of message {k}");
                let at = k * slot;
                assert!(
                    buf[at..at + sizes[k]] == pattern(300 + k as u64, sizes[k])[..],
                    "payload of message {k}"
                );
                assert!(buf[at + sizes[k]] == 0xa5, "byte past message {k}");
            }
        }
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut bufs: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(k, &s)| pattern(300 + k as u64, s))
            .collect();
        let mhs: Vec<_> = bufs.iter_mut().map(|b| cx.net.reg_mr(sc, b)).collect();
        let reqs: Vec<_> = (0..sizes.len())
            .map(|k| {
                cx.net
                    .isend(sc, bufs[k].as_mut_ptr(), sizes[k], 5 + k as i32, mhs[k])
            })
            .collect();
        for (k, req) in reqs.into_iter().enumerate() {
            assert_eq!(cx.net.wait(req)[0], sizes[k] as i32, "sender's size {k}");
        }
        for mh in mhs {
            cx.net.dereg_mr(sc, mh);
        }
        cx.net.close_send(sc);
    }
}

/// Both ranks post a receive (its answer held) and then spin on a rendezvous-size send to each
/// other, testing nothing else, as a plugin's own test suite may: each send needs the answer
/// the other side holds. The `isend` that finds no CTS is another call, so each side writes
/// what it holds at once, and the watcher, finding nothing held at its ticks, stretches them
/// (80 ms). Had the answers waited for the watcher, every round would wait for one of its
/// ticks (10 ms apart while posts are held): about one wake-up per round. The wake-ups are
/// counted, not the time: on a loaded host 100 rounds took 1.4 s without any held answer
/// waiting (130-215 ms on a quiet one), where a time bound could not tell the two apart.
fn both_sides_spin_on_their_send_while_holding_answers(cx: &mut Cx) {
    const ROUNDS: u64 = 100;
    let (sc, rc) = cx.connect_and_accept();
    let mut out = pattern(400 + cx.rank as u64, RENDEZVOUS);
    let mut inb = vec![0u8; RENDEZVOUS];
    let smh = cx.net.reg_mr(sc, &mut out);
    let rmh = cx.net.reg_mr(rc, &mut inb);
    let (woken, start) = (watcher_wakeups(), Instant::now());
    for _ in 0..ROUNDS {
        let r = cx.net.irecv(rc, &[(inb.as_mut_ptr(), RENDEZVOUS, 1, rmh)]);
        let s = cx.net.isend(sc, out.as_mut_ptr(), RENDEZVOUS, 1, smh);
        assert_eq!(cx.net.wait(s)[0], RENDEZVOUS as i32);
        assert_eq!(cx.net.wait(r)[0], RENDEZVOUS as i32);
        assert!(inb == pattern(400 + (1 - cx.rank) as u64, RENDEZVOUS));
    }
    let (woke, took) = (watcher_wakeups() - woken, start.elapsed());
    println!("NOTE {ROUNDS} rounds in {took:.2?}, the watcher woke {woke} times");
    assert!(
        woke < ROUNDS / 2,
        "the watcher woke {woke} times in {ROUNDS} rounds ({took:?}): held answers waited for it"
    );
    cx.net.dereg_mr(sc, smh);
    cx.net.dereg_mr(rc, rmh);
    cx.net.close_send(sc);
    cx.net.close_recv(rc);
}

/// Rank 0 posts a receive, then stays out of the plugin for `AWAY` (a barrier in another
/// library, say) before it tests it. Its held answer is written by the watcher meanwhile, so
/// rank 1's rendezvous send starts long before rank 0 comes back.
fn a_receiver_that_leaves_the_plugin_still_answers(cx: &mut Cx) {
    const AWAY: Duration = Duration::from_millis(1500);
    let warm = [(1, 8)];
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        crate::recv_each(&cx.net, rc, &warm, 1);
        let mut buf = vec![0u8; RENDEZVOUS];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), RENDEZVOUS, 1, mh)]);
        std::thread::sleep(AWAY);
        assert_eq!(cx.net.wait(req)[0], RENDEZVOUS as i32);
        assert!(buf == pattern(500, RENDEZVOUS));
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        crate::send_each(&cx.net, sc, &warm, 1);
        let mut buf = pattern(500, RENDEZVOUS);
        let mh = cx.net.reg_mr(sc, &mut buf);
        let start = Instant::now();
        let req: *mut c_void = cx.net.isend(sc, buf.as_mut_ptr(), RENDEZVOUS, 1, mh);
        let waited = start.elapsed();
        assert!(
            waited < AWAY / 3,
            "the send started after {waited:?}: the held CTS waited for the receiver's return"
        );
        assert_eq!(cx.net.wait(req)[0], RENDEZVOUS as i32);
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
    }
}

pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "batch/back_to_back_receives_are_answered_byte_exact",
        ranks: 2,
        run: back_to_back_receives_are_answered_byte_exact,
        env: BATCH_ON,
    },
    Scenario {
        name: "batch/both_sides_spin_on_their_send_while_holding_answers",
        ranks: 2,
        run: both_sides_spin_on_their_send_while_holding_answers,
        env: BATCH_ON,
    },
    Scenario {
        name: "batch/a_receiver_that_leaves_the_plugin_still_answers",
        ranks: 2,
        run: a_receiver_that_leaves_the_plugin_still_answers,
        env: BATCH_ON,
    },
    Scenario {
        name: "batch/the_watcher_sleeps_while_its_clients_poll",
        ranks: 2,
        run: crate::eager::the_watcher_sleeps_while_its_clients_poll,
        env: BATCH_ON,
    },
];
