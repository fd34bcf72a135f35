//! The eager path (`core::eager`): small host-memory sends that move before their receive is
//! posted, the receive that copies them, and every case where the rendezvous protocol takes over
//! (over the threshold, CUDA-typed registrations, grouped receives, a peer without the eager
//! path). Each connection first carries one message into a receive whose CTS is there (eager
//! sends follow the tag of the last receive); then rank 0 receives and posts nothing for `LATE`,
//! so the sender's calls in that window cannot have seen a clear-to-send: a request that starts
//! there went eager, a NULL request is the rendezvous protocol waiting for its CTS.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use nccl_net::core::config::DEFAULT_EAGER_SLOTS;
use nccl_net::core::eager::CREDIT_EVERY;
use nccl_net::core::proto::SLOTS;
use nccl_net::driver::NCCL_PTR_CUDA;

use crate::support::net::pattern;
use crate::{Cx, Scenario, recv_each, send_each};

/// How long the receiver stays silent after connecting.
const LATE: Duration = Duration::from_secs(3);
/// The default `NCCL_NET_RS_EAGER_BYTES`.
const THRESHOLD: usize = 4096;

/// Both sides offer quiet receives (`NCCL_NET_RS_QUIET=1` in the scenario's environment).
const QUIET: &[&[(&str, &str)]] = &[&[("NCCL_NET_RS_QUIET", "1")]];

/// Whether this rank's plugin offers quiet receives.
fn quiet_here() -> bool {
    std::env::var("NCCL_NET_RS_QUIET").as_deref() == Ok("1")
}

/// The first message of a connection, for `tag`: by rendezvous, so the sender learns the tag.
fn warm_up(cx: &Cx, comm: *mut c_void, tag: i32) {
    let msg = [(1, 8)];
    if cx.rank == 0 {
        recv_each(&cx.net, comm, &msg, tag);
    } else {
        send_each(&cx.net, comm, &msg, tag);
    }
}

/// One send on `sc`: `size` bytes at `data`, registered under `mh`, for `tag`.
#[derive(Copy, Clone)]
struct Send {
    sc: *mut c_void,
    data: *mut u8,
    size: usize,
    tag: i32,
    mh: *mut c_void,
}

impl Send {
    /// Post once: the request, or NULL (retry later).
    fn once(&self, cx: &Cx) -> *mut c_void {
        let Self {
            sc,
            data,
            size,
            tag,
            mh,
        } = *self;
        cx.net.isend_step(sc, data, size, tag, mh).unwrap()
    }

    /// Post a send that must start at once, without its CTS (`what` names it on failure).
    fn eagerly(&self, cx: &Cx, what: &str) -> *mut c_void {
        let req = self.once(cx);
        assert!(!req.is_null(), "{what} starts without its CTS");
        req
    }

    /// Post a send that must wait for its CTS: NULL at the first call, then retried until it
    /// starts.
    fn after_its_cts(&self, cx: &Cx, what: &str) -> *mut c_void {
        assert!(self.once(cx).is_null(), "{what} waits for its CTS");
        cx.net
            .isend(self.sc, self.data, self.size, self.tag, self.mh)
    }
}

/// Sizes around the threshold: the eager ones start at once, the first one over waits for its
/// CTS; every message arrives byte-exact, and a receive whose message already arrived is done
/// at its first `test`.
fn eager_sends_start_before_the_receive_is_posted(cx: &mut Cx) {
    let eager = [0usize, 1, 8, THRESHOLD - 1, THRESHOLD];
    let msgs: Vec<(u64, usize)> = eager
        .iter()
        .chain(&[THRESHOLD + 1])
        .enumerate()
        .map(|(i, &s)| (40 + i as u64, s))
        .collect();
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        warm_up(cx, rc, 3);
        std::thread::sleep(LATE);
        let mut buf = vec![0xa5u8; 2 * THRESHOLD];
        let mh = cx.net.reg_mr(rc, &mut buf);
        for &(seed, size) in &msgs {
            buf.fill(0xa5);
            let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), buf.len(), 3, mh)]);
            if size <= THRESHOLD {
                let first = cx.net.test_step(req).unwrap();
                assert_eq!(
                    first.map(|s| s[0]),
                    Some(size as i32),
                    "the {size}-byte eager message is copied at irecv"
                );
            } else {
                assert_eq!(cx.net.wait(req)[0], size as i32);
            }
            assert!(
                buf[..size] == pattern(seed, size)[..],
                "{size}-byte payload"
            );
            assert!(
                buf[size..size + 64].iter().all(|&b| b == 0xa5),
                "guard after {size}"
            );
        }
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        warm_up(cx, sc, 3);
        let mut bufs: Vec<Vec<u8>> = msgs
            .iter()
            .map(|&(seed, size)| pattern(seed, size.max(1)))
            .collect();
        let mhs: Vec<*mut c_void> = bufs.iter_mut().map(|b| cx.net.reg_mr(sc, b)).collect();
        let mut reqs = Vec::new();
        for (i, &(_, size)) in msgs.iter().enumerate() {
            let send = Send {
                sc,
                data: bufs[i].as_mut_ptr(),
                size,
                tag: 3,
                mh: mhs[i],
            };
            let what = format!("the {size}-byte send");
            reqs.push(if size <= THRESHOLD {
                send.eagerly(cx, &what)
            } else {
                send.after_its_cts(cx, &what)
            });
        }
        for (req, &(_, size)) in reqs.into_iter().zip(&msgs) {
            assert_eq!(cx.net.wait(req)[0], size as i32, "sender's size of {size}");
        }
        for mh in mhs {
            cx.net.dereg_mr(sc, mh);
        }
        cx.net.close_send(sc);
    }
}

/// Four eager sends met by one grouped receive of four buffers for their tag: the sender takes
/// them back and writes them by rendezvous (from its kept copies: the sends were done once
/// written) into the group's buffers, in sending order. A small send made before the sender
/// saw the grouped receive's CTS goes eagerly too and is taken back with them, for the next
/// receive; every message arrives byte-exact.
fn grouped_receive_after_eager_sends_falls_back_to_rendezvous(cx: &mut Cx) {
    const CAP: usize = 1024;
    let size_of = |i: usize| 100 * (i + 1) + 7;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        warm_up(cx, rc, 0);
        std::thread::sleep(LATE);
        let mut buf = vec![0xa5u8; 4 * CAP];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let bufs: Vec<_> = (0..4)
            .map(|i| (base.wrapping_add(i * CAP), CAP, 0, mh))
            .collect();
        let sizes = cx.net.wait(cx.net.irecv(rc, &bufs));
        for i in 0..4 {
            assert_eq!(sizes[i], size_of(i) as i32, "buffer {i}");
            let got = &buf[i * CAP..i * CAP + size_of(i)];
            assert!(
                got == &pattern(60 + i as u64, size_of(i))[..],
                "buffer {i} holds send {i}"
            );
            assert!(buf[i * CAP + size_of(i)] == 0xa5, "guard after buffer {i}");
        }
        cx.net.dereg_mr(rc, mh);
        std::thread::sleep(LATE);
        recv_each(&cx.net, rc, &[(70, 8), (71, 100_000)], 0);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        warm_up(cx, sc, 0);
        let mut bufs: Vec<Vec<u8>> = (0..4).map(|i| pattern(60 + i as u64, size_of(i))).collect();
        let mhs: Vec<*mut c_void> = bufs.iter_mut().map(|b| cx.net.reg_mr(sc, b)).collect();
        let reqs: Vec<*mut c_void> = (0..4)
            .map(|i| {
                let send = Send {
                    sc,
                    data: bufs[i].as_mut_ptr(),
                    size: size_of(i),
                    tag: 0,
                    mh: mhs[i],
                };
                send.eagerly(cx, &format!("send {i}"))
            })
            .collect();
        for (i, req) in reqs.into_iter().enumerate() {
            assert_eq!(cx.net.wait(req)[0], size_of(i) as i32, "send {i}");
        }
        for mh in mhs {
            cx.net.dereg_mr(sc, mh);
        }
        let mut small = pattern(70, 8);
        let mh = cx.net.reg_mr(sc, &mut small);
        let send = Send {
            sc,
            data: small.as_mut_ptr(),
            size: 8,
            tag: 0,
            mh,
        };
        let req = cx
            .net
            .isend(send.sc, send.data, send.size, send.tag, send.mh);
        assert_eq!(cx.net.wait(req)[0], 8);
        cx.net.dereg_mr(sc, mh);
        send_each(&cx.net, sc, &[(71, 100_000)], 0);
        cx.net.close_send(sc);
    }
}

/// A send from a CUDA-typed registration never goes eager; an eager message that meets a
/// CUDA-typed receive is written again by rendezvous (the copy is never made into GPU memory).
fn cuda_typed_registrations_never_take_the_eager_path(cx: &mut Cx) {
    const LEN: usize = 64;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        warm_up(cx, rc, 1);
        // Message 0 into host memory (its CTS keeps the sender's eager path open), message 1
        // into a CUDA-typed buffer.
        let mut host = vec![0xa5u8; 2 * LEN];
        let mut gpu = vec![0xa5u8; 2 * LEN];
        let hmh = cx.net.reg_mr(rc, &mut host);
        let gmh = cx
            .net
            .0
            .reg_mr_raw(rc, gpu.as_mut_ptr().cast(), gpu.len(), NCCL_PTR_CUDA)
            .unwrap();
        for (seed, buf, mh) in [(80, &mut host, hmh), (81, &mut gpu, gmh)] {
            // Late for each message: message 1 must reach the receiver before its receive.
            std::thread::sleep(LATE);
            let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), LEN, 1, mh)]);
            assert_eq!(cx.net.wait(req)[0], LEN as i32);
            assert!(buf[..LEN] == pattern(seed, LEN)[..], "message {seed}");
            assert!(
                buf[LEN..].iter().all(|&b| b == 0xa5),
                "guard after message {seed}"
            );
        }
        cx.net.dereg_mr(rc, hmh);
        cx.net.dereg_mr(rc, gmh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        warm_up(cx, sc, 1);
        let mut gpu = pattern(80, LEN);
        let gmh = cx
            .net
            .0
            .reg_mr_raw(sc, gpu.as_mut_ptr().cast(), LEN, NCCL_PTR_CUDA)
            .unwrap();
        let send = Send {
            sc,
            data: gpu.as_mut_ptr(),
            size: LEN,
            tag: 1,
            mh: gmh,
        };
        let req = send.after_its_cts(cx, "a CUDA-typed send");
        assert_eq!(cx.net.wait(req)[0], LEN as i32);
        // The receiver posts message 1 a while after message 0: it goes before its CTS, and
        // the receiver refuses to copy it into its CUDA-typed buffer (the sender writes it
        // again by rendezvous).
        let mut host = pattern(81, LEN);
        let hmh = cx.net.reg_mr(sc, &mut host);
        let send = Send {
            data: host.as_mut_ptr(),
            mh: hmh,
            ..send
        };
        let req = send.eagerly(cx, "the host-memory send");
        assert_eq!(cx.net.wait(req)[0], LEN as i32);
        cx.net.dereg_mr(sc, gmh);
        cx.net.dereg_mr(sc, hmh);
        // Done once written: the closed comm writes it again from its copy once the receiver
        // refused it (the process stays up meanwhile).
        cx.net.close_send(sc);
        std::thread::sleep(2 * LATE);
    }
}

/// The bounce ring both sides agree on: `RSIB_EXPECT_BOUNCE_SLOTS` where the scenario sets
/// the two sides' `NCCL_NET_RS_EAGER_SLOTS`, else the default; a whole ring of `SLOTS` with quiet
/// receives.
fn bounce_slots_here() -> usize {
    if quiet_here() {
        return SLOTS;
    }
    std::env::var("RSIB_EXPECT_BOUNCE_SLOTS")
        .map_or(usize::from(DEFAULT_EAGER_SLOTS), |v| v.parse().unwrap())
}

/// Eager messages and no receive: sends start eagerly until the bounce slots run out (one per
/// slot: without quiet receives exactly the ring, the smaller of both sides'
/// `NCCL_NET_RS_EAGER_SLOTS`; with them the credit returns slots every `CREDIT_EVERY` messages,
/// so the last few of the ring before may still be held), then the next send waits until the
/// receiver took messages and its answer or credit arrived. `n` messages in all, every one
/// byte-exact.
fn credits_run_out_after_a_ring_of_eager_messages(cx: &mut Cx) {
    const LEN: usize = 16;
    let ring = bounce_slots_here();
    let n = ring + 1;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        warm_up(cx, rc, 0);
        std::thread::sleep(LATE);
        let msgs: Vec<(u64, usize)> = (0..n).map(|i| (200 + i as u64, LEN)).collect();
        recv_each(&cx.net, rc, &msgs, 0);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        warm_up(cx, sc, 0);
        let mut buf: Vec<u8> = (0..n).flat_map(|i| pattern(200 + i as u64, LEN)).collect();
        let mh = cx.net.reg_mr(sc, &mut buf);
        let base = buf.as_mut_ptr();
        let send = |i: usize| Send {
            sc,
            data: base.wrapping_add(i * LEN),
            size: LEN,
            tag: 0,
            mh,
        };
        let mut reqs: Vec<*mut c_void> = Vec::new();
        while reqs.len() < n {
            let req = send(reqs.len()).once(cx);
            if req.is_null() {
                break;
            }
            reqs.push(req);
        }
        let started = reqs.len();
        let expected = if quiet_here() {
            SLOTS - CREDIT_EVERY as usize..=SLOTS
        } else {
            ring..=ring
        };
        assert!(
            expected.contains(&started),
            "{started} eager sends started before the {ring} bounce slots ran out"
        );
        for req in &reqs {
            assert_eq!(cx.net.wait(*req)[0], LEN as i32, "an eager send completes");
        }
        for i in started..n {
            let req = cx.net.isend(sc, send(i).data, LEN, 0, mh);
            assert_eq!(cx.net.wait(req)[0], LEN as i32);
        }
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
    }
}

/// What the sender of [`truncated_by_rendezvous`] does once its send is done.
#[derive(Copy, Clone, PartialEq, Eq)]
enum SenderThen {
    /// Closes its comm before the receive is posted (and its process stays up).
    Closes,
    /// Makes no call for a while, its comm open, while the receive is posted.
    StaysAway,
}

/// An eager message larger than the receive posted for it is not copied (a copy is only ever
/// of the whole message): the sender writes it again by rendezvous (from NCCL's buffer, or with
/// quiet receives from its kept copy), truncated to the posted size as any send (`ncclIbIsend`
/// clamps to the CTS size), and the receiver reports that size. With quiet receives the
/// sender's request was done once its eager write completed, before the receiver saw the
/// message, so it reports the size it was given (NCCL's own transport, which never sends before
/// the CTS, reports the clamped size on both sides; NCCL's proxy never uses the size a send
/// reports: `sendProxyProgress` in src/transport/net.cc reads it into a local it drops).
fn truncated_by_rendezvous(cx: &mut Cx, then: SenderThen) {
    const SENT: usize = 1000;
    const POSTED: usize = 300;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        warm_up(cx, rc, 4);
        // The eager message lands before its receive is posted.
        std::thread::sleep(match then {
            SenderThen::Closes => LATE,
            SenderThen::StaysAway => LATE / 3,
        });
        let mut buf = vec![0xa5u8; 2 * SENT];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let started = Instant::now();
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), POSTED, 4, mh)]);
        assert_eq!(
            cx.net.wait(req)[0],
            POSTED as i32,
            "the posted size arrived"
        );
        if then == SenderThen::StaysAway {
            assert!(
                started.elapsed() < LATE,
                "the receive completed {:?} after it was posted, while the sender slept {:?}",
                started.elapsed(),
                2 * LATE
            );
        }
        assert!(buf[..POSTED] == pattern(60, SENT)[..POSTED]);
        assert!(
            buf[POSTED..].iter().all(|&b| b == 0xa5),
            "nothing written past the posted buffer"
        );
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        warm_up(cx, sc, 4);
        let mut buf = pattern(60, SENT);
        let mh = cx.net.reg_mr(sc, &mut buf);
        let send = Send {
            sc,
            data: buf.as_mut_ptr(),
            size: SENT,
            tag: 4,
            mh,
        };
        let req = send.eagerly(cx, "a send under the threshold");
        // Quiet: done once written, with its own size; else answered, with the posted size.
        let reported = if quiet_here() { SENT } else { POSTED };
        assert_eq!(cx.net.wait(req)[0], reported as i32);
        if then == SenderThen::StaysAway {
            std::thread::sleep(2 * LATE);
        }
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
        if then == SenderThen::Closes {
            // The closed comm delivers the message from its copy once the receiver refused it.
            std::thread::sleep(2 * LATE);
        }
    }
}

fn an_eager_message_larger_than_its_receive_is_truncated_by_rendezvous(cx: &mut Cx) {
    truncated_by_rendezvous(cx, SenderThen::Closes);
}

/// With quiet receives the refused message is written again even though the sender's client
/// makes no further call on the comm (the watcher thread tends it): the receive completes while
/// the sender sleeps.
fn a_refused_eager_message_is_written_again_while_its_sender_is_away(cx: &mut Cx) {
    truncated_by_rendezvous(cx, SenderThen::StaysAway);
}

/// A peer without the eager path (`NCCL_NET_RS_EAGER_BYTES=0`, which is also what an older
/// plugin's handshake says): small sends wait for their CTS in both directions of the mix, and
/// the data arrives as before.
fn a_peer_without_the_eager_path_gets_rendezvous_only(cx: &mut Cx) {
    const LEN: usize = 8;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        warm_up(cx, rc, 2);
        std::thread::sleep(LATE);
        recv_each(&cx.net, rc, &[(90, LEN), (91, 50_000)], 2);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        warm_up(cx, sc, 2);
        let mut buf = pattern(90, LEN);
        let mh = cx.net.reg_mr(sc, &mut buf);
        let send = Send {
            sc,
            data: buf.as_mut_ptr(),
            size: LEN,
            tag: 2,
            mh,
        };
        let req = send.after_its_cts(cx, "a send to a peer that did not agree on eager messages");
        assert_eq!(cx.net.wait(req)[0], LEN as i32);
        cx.net.dereg_mr(sc, mh);
        send_each(&cx.net, sc, &[(91, 50_000)], 2);
        cx.net.close_send(sc);
    }
}

/// A quiet receive (posted while eager messages flow, no CTS written) whose client then makes
/// no call: when no eager message comes, the plugin writes its CTS anyway (the watcher thread
/// tends the comm), so a send that cannot go eagerly starts and completes while the receiver is
/// away. NCCL's transport writes every CTS inside `irecv`; a client may rely on a posted receive
/// needing no further call to let its send start (the proxy may wait on another comm).
fn a_quiet_receive_is_announced_while_its_client_is_away(cx: &mut Cx) {
    const BIG: usize = 100_000;
    let small = [(2, 8), (3, 16), (4, 8)];
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        warm_up(cx, rc, 0);
        recv_each(&cx.net, rc, &small, 0);
        let mut buf = vec![0xa5u8; BIG];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), BIG, 0, mh)]);
        std::thread::sleep(LATE);
        assert_eq!(cx.net.wait(req)[0], BIG as i32);
        assert!(
            buf == pattern(5, BIG),
            "the large message arrived byte-exact"
        );
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        warm_up(cx, sc, 0);
        send_each(&cx.net, sc, &small, 0);
        let started = Instant::now();
        send_each(&cx.net, sc, &[(5, BIG)], 0);
        assert!(
            started.elapsed() < LATE / 2,
            "the send completed {:?} after it was posted, while the receiver slept {LATE:?}",
            started.elapsed()
        );
        cx.net.close_send(sc);
    }
}

/// How often this process's watcher thread (`rsib-watch`) went to sleep and woke: its voluntary
/// context switches.
pub(crate) fn watcher_wakeups() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    let watcher = tasks
        .map(|t| t.unwrap().path())
        .find(|t| std::fs::read_to_string(t.join("comm")).is_ok_and(|c| c.trim() == "rsib-watch"))
        .expect("the watcher thread runs once a comm is connected");
    let status = std::fs::read_to_string(watcher.join("status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A stream of eager messages whose clients keep polling: the watcher thread, which tends quiet
/// comms and posts held answers for clients that stop calling, leaves these to their clients
/// and stretches its ticks (80 ms), instead of waking every 10 ms and taking the CPU a client
/// polls on. (Run with quiet receives, and with batching: `batch/`.)
pub(crate) fn the_watcher_sleeps_while_its_clients_poll(cx: &mut Cx) {
    const MESSAGES: u64 = 20_000;
    let msgs: Vec<(u64, usize)> = (0..MESSAGES).map(|i| (i, 8)).collect();
    let comm = if cx.rank == 0 {
        cx.accept_pair()
    } else {
        cx.connect_pair()
    };
    warm_up(cx, comm, 0);
    let (woken, started) = (watcher_wakeups(), Instant::now());
    if cx.rank == 0 {
        recv_each(&cx.net, comm, &msgs, 0);
    } else {
        send_each(&cx.net, comm, &msgs, 0);
    }
    let (woke, took) = (watcher_wakeups() - woken, started.elapsed());
    println!("NOTE the watcher woke {woke} times in {took:.2?} of {MESSAGES} messages");
    // At most one wake-up per 50 ms, and a few while the tick stretches (10, 20, 40 ms).
    let most = took.as_millis() as u64 / 50 + 4;
    assert!(
        woke <= most,
        "the watcher woke {woke} times in {took:?} (at most {most})"
    );
    if cx.rank == 0 {
        cx.net.close_recv(comm);
    } else {
        cx.net.close_send(comm);
    }
}

pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "eager/sends_start_before_the_receive_is_posted",
        ranks: 2,
        run: eager_sends_start_before_the_receive_is_posted,
        env: &[],
    },
    Scenario {
        name: "eager/grouped_receive_falls_back_to_rendezvous",
        ranks: 2,
        run: grouped_receive_after_eager_sends_falls_back_to_rendezvous,
        env: &[],
    },
    Scenario {
        name: "eager/cuda_typed_registrations_never_take_it",
        ranks: 2,
        run: cuda_typed_registrations_never_take_the_eager_path,
        env: &[],
    },
    Scenario {
        name: "eager/credits_run_out_after_a_ring_of_messages",
        ranks: 2,
        run: credits_run_out_after_a_ring_of_eager_messages,
        env: &[],
    },
    // The receiver offers 4 bounce slots, the sender 32: both use 4.
    Scenario {
        name: "eager/bounce_ring_is_the_smaller_offer",
        ranks: 2,
        run: credits_run_out_after_a_ring_of_eager_messages,
        env: &[
            &[
                ("NCCL_NET_RS_EAGER_SLOTS", "4"),
                ("RSIB_EXPECT_BOUNCE_SLOTS", "4"),
            ],
            &[
                ("NCCL_NET_RS_EAGER_SLOTS", "32"),
                ("RSIB_EXPECT_BOUNCE_SLOTS", "4"),
            ],
        ],
    },
    // Both offer a whole ring: a slot per message slot, as before 0.3.10.
    Scenario {
        name: "eager/bounce_ring_of_a_slot_per_message_slot",
        ranks: 2,
        run: credits_run_out_after_a_ring_of_eager_messages,
        env: &[&[
            ("NCCL_NET_RS_EAGER_SLOTS", "32"),
            ("RSIB_EXPECT_BOUNCE_SLOTS", "32"),
        ]],
    },
    Scenario {
        name: "eager/larger_than_its_receive_is_truncated_by_rendezvous",
        ranks: 2,
        run: an_eager_message_larger_than_its_receive_is_truncated_by_rendezvous,
        env: &[],
    },
    Scenario {
        name: "eager/receiver_without_it",
        ranks: 2,
        run: a_peer_without_the_eager_path_gets_rendezvous_only,
        env: &[&[("NCCL_NET_RS_EAGER_BYTES", "0")], &[]],
    },
    Scenario {
        name: "eager/sender_without_it",
        ranks: 2,
        run: a_peer_without_the_eager_path_gets_rendezvous_only,
        env: &[&[], &[("NCCL_NET_RS_EAGER_BYTES", "0")]],
    },
    Scenario {
        name: "eager/quiet/sends_start_before_the_receive_is_posted",
        ranks: 2,
        run: eager_sends_start_before_the_receive_is_posted,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/grouped_receive_falls_back_to_rendezvous",
        ranks: 2,
        run: grouped_receive_after_eager_sends_falls_back_to_rendezvous,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/cuda_typed_registrations_never_take_it",
        ranks: 2,
        run: cuda_typed_registrations_never_take_the_eager_path,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/credits_run_out_after_a_ring_of_messages",
        ranks: 2,
        run: credits_run_out_after_a_ring_of_eager_messages,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/larger_than_its_receive_is_truncated_by_rendezvous",
        ranks: 2,
        run: an_eager_message_larger_than_its_receive_is_truncated_by_rendezvous,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/receive_announced_while_its_client_is_away",
        ranks: 2,
        run: a_quiet_receive_is_announced_while_its_client_is_away,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/refused_message_written_again_while_its_sender_is_away",
        ranks: 2,
        run: a_refused_eager_message_is_written_again_while_its_sender_is_away,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/the_watcher_sleeps_while_its_clients_poll",
        ranks: 2,
        run: the_watcher_sleeps_while_its_clients_poll,
        env: QUIET,
    },
    Scenario {
        name: "eager/quiet/offered_by_the_receiver_only",
        ranks: 2,
        run: eager_sends_start_before_the_receive_is_posted,
        env: &[&[("NCCL_NET_RS_QUIET", "1")], &[]],
    },
    Scenario {
        name: "eager/quiet/offered_by_the_sender_only",
        ranks: 2,
        run: eager_sends_start_before_the_receive_is_posted,
        env: &[&[], &[("NCCL_NET_RS_QUIET", "1")]],
    },
    Scenario {
        name: "eager/off_on_several_qps",
        ranks: 2,
        run: a_peer_without_the_eager_path_gets_rendezvous_only,
        env: &[&[("NCCL_IB_QPS_PER_CONNECTION", "2")]],
    },
];
