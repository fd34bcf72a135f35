//! Comms torn down with work outstanding, then built again in the same process, as NCCL does
//! when it aborts or destroys a communicator (elastic restarts) and builds the next one. The
//! pattern of aws-ofi-nccl's functional test `inflight_close`: in each round every thread
//! listens, swaps handles with its peer thread, connects a send comm and accepts a receive comm;
//! the sender posts eight 1 MiB sends and the receiver eight receives, and both deregister every
//! buffer and close every comm (send, receive, listen) with all of it in flight, and free the
//! buffers. The sender's writes then land in buffers its peer has already deregistered.
//!
//! Pins NCCL's behaviour (src/transport/net_ib/p2p.cc): `ncclIbIsend` and `ncclIbIrecv` never
//! poll a CQ, so a failed completion never fails them; it surfaces only through `ncclIbTest`.
//! A peer that deregistered or closed must never break comms created afterwards: after ten such
//! rounds every thread's new comms move verified data both ways, and the process's fds and
//! verbs objects are back at their counts after the first round.

use std::time::{Duration, Instant};

use crate::support::net::{Handle, pattern};
use crate::{Cx, Net, Scenario, resource_counts};

const ROUNDS: usize = 10;
const MESSAGES: usize = 8;
const MESSAGE: usize = 1 << 20;
/// How long closed comms may take to let go of their verbs objects (a receive comm's last
/// write, a watcher's tick).
const RELEASE_LIMIT: Duration = Duration::from_secs(20);

/// One thread's comms for a round: its listen comm, and the send and receive comms connected
/// through it and its peer's.
struct Comms {
    lc: usize,
    sc: usize,
    rc: usize,
}

/// Each thread's listen comm and its peer thread's handle, swapped in thread order.
fn swap_handles(cx: &mut Cx, threads: usize) -> Vec<(usize, Handle)> {
    let lcs: Vec<usize> = (0..threads).map(|_| cx.publish_listen() as usize).collect();
    lcs.into_iter().map(|lc| (lc, cx.peer())).collect()
}

fn connect(net: &Net, dev: i32, (lc, peer): &(usize, Handle)) -> Comms {
    let (sc, rc) = net.connect_and_accept(dev, peer, *lc as *mut _);
    Comms {
        lc: *lc,
        sc: sc as usize,
        rc: rc as usize,
    }
}

fn close(net: &Net, c: &Comms) {
    net.close_send(c.sc as *mut _);
    net.close_recv(c.rc as *mut _);
    net.close_listen(c.lc as *mut _);
}

/// One thread's round: post everything, deregister, close, free. Rank 1 sends, rank 0 receives.
fn abandoned_round(net: &Net, dev: i32, ends: &(usize, Handle), sender: bool) {
    let c = connect(net, dev, ends);
    let comm = if sender { c.sc } else { c.rc } as *mut _;
    let mut bufs: Vec<Vec<u8>> = (0..MESSAGES)
        .map(|i| pattern(i as u64 + 1, MESSAGE))
        .collect();
    let mrs: Vec<_> = bufs.iter_mut().map(|b| net.reg_mr(comm, b)).collect();
    for (buf, &mh) in bufs.iter_mut().zip(&mrs) {
        if sender {
            net.isend(comm, buf.as_mut_ptr(), MESSAGE, 0, mh);
        } else {
            net.irecv(comm, &[(buf.as_mut_ptr(), MESSAGE, 0, mh)]);
        }
    }
    for mh in mrs {
        net.dereg_mr(comm, mh);
    }
    close(net, &c);
    drop(bufs);
}

/// One thread's last round: new comms, every byte checked both ways, closed cleanly.
fn verified_round(net: &Net, dev: i32, ends: &(usize, Handle), thread: usize) {
    let c = connect(net, dev, ends);
    let (sc, rc) = (c.sc as *mut _, c.rc as *mut _);
    let seed = 1000 + thread as u64;
    let mut out = pattern(seed, MESSAGE);
    let mut inb = vec![0u8; MESSAGE];
    let (smh, rmh) = (net.reg_mr(sc, &mut out), net.reg_mr(rc, &mut inb));
    let rreq = net.irecv(rc, &[(inb.as_mut_ptr(), MESSAGE, 0, rmh)]);
    let sreq = net.isend(sc, out.as_mut_ptr(), MESSAGE, 0, smh);
    assert_eq!(
        net.wait(sreq)[0],
        MESSAGE as i32,
        "thread {thread}: bytes sent"
    );
    assert_eq!(
        net.wait(rreq)[0],
        MESSAGE as i32,
        "thread {thread}: bytes received"
    );
    // Both ranks number their threads alike, so thread i's peer sent pattern(seed).
    assert!(
        inb == pattern(seed, MESSAGE),
        "thread {thread}: the payload after {ROUNDS} abandoned rounds differs"
    );
    net.dereg_mr(sc, smh);
    net.dereg_mr(rc, rmh);
    close(net, &c);
}

/// Both ranks: `threads` threads run [`ROUNDS`] abandoned rounds at once, then a verified one.
fn abandon_and_rebuild(cx: &mut Cx, threads: usize) {
    // Every round listens anew, as the test this follows does.
    cx.net.close_listen(cx.lc);
    let _startup = cx.peer();
    let sender = cx.rank == 1;
    let mut baseline = None;
    for round in 0..=ROUNDS {
        let ends = swap_handles(cx, threads);
        let (net, dev) = (&cx.net, cx.dev);
        std::thread::scope(|s| {
            for (thread, ends) in ends.iter().enumerate() {
                s.spawn(move || {
                    if round < ROUNDS {
                        abandoned_round(net, dev, ends, sender);
                    } else {
                        verified_round(net, dev, ends, thread);
                    }
                });
            }
        });
        // The first round opens the device context; count from there.
        if round == 0 {
            baseline = Some(settled_counts(None));
        }
    }
    let baseline = baseline.unwrap();
    let after = settled_counts(Some(&baseline));
    assert_eq!(
        baseline, after,
        "fds and verbs objects after {ROUNDS} abandoned rounds and a verified one must be back \
         at their counts after the first round"
    );
    println!("NOTE {threads} thread(s), {ROUNDS} abandoned rounds: resources back at {after:?}");
}

/// The process's resource counts once closed comms let go of theirs: equal to `want` (or,
/// without one, unchanged between two reads) within [`RELEASE_LIMIT`].
fn settled_counts(want: Option<&[(String, usize)]>) -> Vec<(String, usize)> {
    let start = Instant::now();
    let mut last = resource_counts();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = resource_counts();
        let settled = match want {
            Some(want) => now == want,
            None => now == last,
        };
        if settled || start.elapsed() > RELEASE_LIMIT {
            return now;
        }
        last = now;
    }
}

fn one_thread(cx: &mut Cx) {
    abandon_and_rebuild(cx, 1);
}

fn four_threads(cx: &mut Cx) {
    abandon_and_rebuild(cx, 4);
}

const FAILOVER_OFF: (&str, &str) = ("NCCL_IB_RESILIENCY_PORT_FAILOVER", "0");
const FUSED: [(&str, &str); 2] = [
    ("NCCL_NET_RS_FUSE", "rxe0+rxe1"),
    ("RSIB_TEST_DEV", "rxe0+rxe1"),
];

/// Run once each (not per table): what they pin is the comm's own, alike in every version.
pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "abandoned_rounds_then_new_comms_one_thread",
        ranks: 2,
        run: one_thread,
        env: &[],
    },
    Scenario {
        name: "abandoned_rounds_then_new_comms_four_threads",
        ranks: 2,
        run: four_threads,
        env: &[],
    },
    Scenario {
        name: "abandoned_rounds_then_new_comms_one_thread_failover_off",
        ranks: 2,
        run: one_thread,
        env: &[&[FAILOVER_OFF]],
    },
    Scenario {
        name: "abandoned_rounds_then_new_comms_four_threads_failover_off",
        ranks: 2,
        run: four_threads,
        env: &[&[FAILOVER_OFF]],
    },
    Scenario {
        name: "abandoned_rounds_then_new_comms_fused_one_thread",
        ranks: 2,
        run: one_thread,
        env: &[&FUSED],
    },
    Scenario {
        name: "abandoned_rounds_then_new_comms_fused_four_threads",
        ranks: 2,
        run: four_threads,
        env: &[&FUSED],
    },
    Scenario {
        name: "abandoned_rounds_then_new_comms_fused_one_thread_failover_off",
        ranks: 2,
        run: one_thread,
        env: &[&[FUSED[0], FUSED[1], FAILOVER_OFF]],
    },
    Scenario {
        name: "abandoned_rounds_then_new_comms_fused_four_threads_failover_off",
        ranks: 2,
        run: four_threads,
        env: &[&[FUSED[0], FUSED[1], FAILOVER_OFF]],
    },
];
