//! Fault scenarios, each with its deadline asserted: strangers on the listen port, peers that
//! echo or replay the handshake, forged handles, killed peers, an odd environment, and a network
//! device taken down under a fused member.

use std::ffi::c_void;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use nccl_net::core::wire::{DATA_PATH_REVISION, Endpoint, Hello, ListenHandle, Role};

use crate::support::net::{Handle, hex};
use crate::{
    Cx, NON_UTF8, RC_REMOTE, Scenario, assert_counted, recv_each, resource_counts, send_each,
    until_error,
};

/// How long a connect with intruders around may take: far below the listener's 10 s hello
/// deadline, so a silent intruder must not be what the real peer waits for.
const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// How soon a survivor must learn that its peer died.
const DEATH_NOTICE: Duration = Duration::from_secs(2);

fn addr_of(handle: &Handle) -> SocketAddr {
    ListenHandle::parse(handle).unwrap().addr
}

/// `handle` with its address replaced.
fn redirect(handle: &Handle, addr: SocketAddr) -> Handle {
    let mut h = ListenHandle::parse(handle).unwrap();
    h.addr = addr;
    // The stranger at `addr` is no process of ours: it speaks the per-comm wire (no link).
    h.process = 0;
    let mut out = [0u8; 128];
    let mut wire = [0u8; ListenHandle::LEN];
    h.emit(&mut wire);
    out[..ListenHandle::LEN].copy_from_slice(&wire);
    out
}

#[derive(Copy, Clone, Debug)]
enum Intruder {
    /// Connects and closes at once (a port scanner, a TCP health check).
    Closes,
    /// Sends 1 KiB of noise and closes.
    Noise,
    /// Sends a hello's length of garbage and stays.
    Garbage,
    /// Sends a well-formed hello for another listener (another job's handle) and stays.
    OtherListener,
    /// Connects and says nothing.
    Silent,
}

const INTRUDERS: [Intruder; 5] = [
    Intruder::Closes,
    Intruder::Noise,
    Intruder::Garbage,
    Intruder::OtherListener,
    Intruder::Silent,
];

/// Reach the listener at `addr` as `kind` would; the returned stream (if any) stays open.
fn intrude(kind: Intruder, addr: SocketAddr) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).unwrap();
    match kind {
        Intruder::Closes => None,
        Intruder::Noise => {
            s.write_all(&crate::support::net::pattern(77, 1024))
                .unwrap();
            None
        }
        Intruder::Garbage => {
            s.write_all(&crate::support::net::pattern(78, Hello::LEN))
                .unwrap();
            Some(s)
        }
        Intruder::OtherListener => {
            let hello = Hello {
                role: Role::Connect,
                listen_nonce: 0x0bad_cafe_dead_beef,
                connect_nonce: 1,
                qpns: vec![0x11],
                members: vec![Endpoint {
                    lid: 0,
                    port: 1,
                    mtu: 3,
                    link_layer: 2,
                    roce_version: 2,
                    gid: [0; 16],
                    gid_index: 1,
                    ring_rkey: 1,
                    device: "mlx5_9".into(),
                }],
                ring_addr: 0x1000,
                traffic_class: 0,
                service_level: 0,
                split_data: false,
                eager_bytes: 0,
                revision: DATA_PATH_REVISION,
                quiet: false,
                failover: false,
                failover_quiet: false,
                bounce_slots: 0,
                shares_links: false,
            };
            s.write_all(&hello.emit()).unwrap();
            Some(s)
        }
        Intruder::Silent => Some(s),
    }
}

/// The listening side of the intruder scenarios: `rounds` real connections, each accepted within
/// the limit and carrying its verified message.
fn accept_real_peers(cx: &mut Cx, rounds: u64) {
    for round in 0..rounds {
        let start = Instant::now();
        let rc = cx.net.accept(cx.lc);
        assert!(
            start.elapsed() < CONNECT_LIMIT,
            "accept {round} took {:?}",
            start.elapsed()
        );
        recv_each(&cx.net, rc, &[(100 + round, 3000)], 0);
        cx.net.close_recv(rc);
    }
    cx.net.close_listen(cx.lc);
}

fn stray_connections_before_the_real_peer(cx: &mut Cx) {
    if cx.rank == 0 {
        // One real peer after each kind of stranger.
        accept_real_peers(cx, INTRUDERS.len() as u64);
        println!("EXPECT_STDERR dropped a connection: peer 127.0.0.1:");
        println!("EXPECT_STDERR closed the connection during the handshake");
        println!("EXPECT_STDERR sent an unknown handshake message");
        println!("EXPECT_STDERR presented a handle for another listener");
    } else {
        cx.net.close_listen(cx.lc);
        let peer = cx.peer();
        for (round, kind) in INTRUDERS.iter().enumerate() {
            connect_among(cx, &peer, &[*kind], &[], 100 + round as u64);
        }
    }
}

/// Connect to `peer` for real (timed) with `before` intruders arriving first and `during`
/// intruders while the connect is under way, then send one verified message.
fn connect_among(cx: &mut Cx, peer: &Handle, before: &[Intruder], during: &[Intruder], seed: u64) {
    let addr = addr_of(peer);
    let mut kept: Vec<TcpStream> = before.iter().filter_map(|&k| intrude(k, addr)).collect();
    let start = Instant::now();
    let mut handle = *peer;
    let mut sc = cx.net.connect_step(cx.dev, &mut handle).unwrap();
    kept.extend(during.iter().filter_map(|&k| intrude(k, addr)));
    while sc.is_null() {
        sc = cx.net.connect_step(cx.dev, &mut handle).unwrap();
        assert!(
            start.elapsed() < CONNECT_LIMIT,
            "intruders {before:?}/{during:?} held up the real connect"
        );
    }
    println!(
        "NOTE connected past {} intruders before and {} during the connect in {:?}",
        before.len(),
        during.len(),
        start.elapsed()
    );
    send_each(&cx.net, sc, &[(seed, 3000)], 0);
    cx.net.close_send(sc);
    drop(kept);
}

/// One real connection with intruders `before` and `during` it.
fn one_real_peer_among(cx: &mut Cx, before: &[Intruder], during: &[Intruder]) {
    if cx.rank == 0 {
        accept_real_peers(cx, 1);
    } else {
        cx.net.close_listen(cx.lc);
        let peer = cx.peer();
        connect_among(cx, &peer, before, during, 100);
    }
}

fn stray_connections_during_a_real_connect(cx: &mut Cx) {
    one_real_peer_among(cx, &[], &INTRUDERS);
}

fn thirty_two_silent_intruders_at_once(cx: &mut Cx) {
    one_real_peer_among(cx, &[Intruder::Silent; 32], &[]);
}

/// A "listener" that returns every byte it receives.
fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 || s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Connect with `handle` until it fails; it must fail (never yield a comm) within `limit`.
fn connect_fails(cx: &Cx, mut handle: Handle, limit: Duration) -> i32 {
    let start = Instant::now();
    let err = until_error(limit, "this connect must not yield a comm", || {
        cx.net
            .connect_step(cx.dev, &mut handle)
            .map(|c| c.is_null())
    });
    println!("NOTE refused after {:?}", start.elapsed());
    err
}

fn echo_server_is_not_a_peer(cx: &mut Cx) {
    let echo = echo_server();
    let handle = redirect(&cx.net.listen(cx.dev).0, echo);
    assert_eq!(connect_fails(cx, handle, CONNECT_LIMIT), RC_REMOTE);
    cx.net.close_listen(cx.lc);
    println!("EXPECT_STDERR peer {echo} answered with a connector's hello instead of a reply");
}

/// Forward one connection to `target`, keeping the first `Hello::LEN` bytes the target sends.
fn recording_proxy(target: SocketAddr) -> (SocketAddr, std::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = TcpStream::connect(target).unwrap();
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || std::io::copy(&mut c_in, &mut s_out));
        let (mut s_in, mut c_out) = (server, client);
        let mut reply = vec![0u8; Hello::LEN];
        s_in.read_exact(&mut reply).unwrap();
        c_out.write_all(&reply).unwrap();
        tx.send(reply).unwrap();
        let _ = std::io::copy(&mut s_in, &mut c_out);
    });
    (addr, rx)
}

/// A server that answers every hello with `reply`.
fn replay_server(reply: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().map_while(Result::ok) {
            let mut hello = vec![0u8; Hello::LEN];
            if s.read_exact(&mut hello).is_ok() {
                let _ = s.write_all(&reply);
                std::thread::sleep(Duration::from_secs(30));
            }
        }
    });
    addr
}

fn replayed_reply_is_refused(cx: &mut Cx) {
    if cx.rank == 0 {
        accept_real_peers(cx, 1);
        return;
    }
    cx.net.close_listen(cx.lc);
    let peer = cx.peer();
    // A real connection through a proxy that records the listener's reply...
    let (proxy, recorded) = recording_proxy(addr_of(&peer));
    let sc = cx.net.connect(cx.dev, &redirect(&peer, proxy));
    send_each(&cx.net, sc, &[(100, 3000)], 0);
    cx.net.close_send(sc);
    // ...then that reply played back to a new connect for the same listener.
    let replay = replay_server(recorded.recv().unwrap());
    assert_eq!(
        connect_fails(cx, redirect(&peer, replay), CONNECT_LIMIT),
        RC_REMOTE
    );
    println!("EXPECT_STDERR peer {replay} answered with a reply to another connect");
}

/// Every single-bit flip of the wire handle, the old in-process marker with pointer values,
/// and foreign bytes: none may crash the process or yield a comm, and nothing may leak.
fn forged_and_mutated_handles_never_yield_a_comm(cx: &mut Cx) {
    let (real, lc) = cx.net.listen(cx.dev);
    let baseline = resource_counts();
    let mut handles: Vec<Handle> = Vec::new();
    for byte in 0..ListenHandle::LEN {
        for bit in 0..8 {
            let mut h = real;
            h[byte] ^= 1 << bit;
            handles.push(h);
        }
    }
    for pointer in [
        0x4141_4141_4141_4141_u64,
        0x10,
        0xdead_beef,
        u64::MAX,
        0x7fff_0000_0000,
    ] {
        let mut h = real;
        h[96..104].copy_from_slice(b"RSIBCONN");
        h[104..112].copy_from_slice(&pointer.to_le_bytes());
        handles.push(h);
    }
    handles.push([0; 128]);
    handles.push([0xff; 128]);
    for seed in 0..8 {
        let bytes = crate::support::net::pattern(seed, 128);
        handles.push(bytes.try_into().unwrap());
    }
    let start = Instant::now();
    let mut pending: Vec<(usize, Handle)> = handles.into_iter().enumerate().collect();
    let mut refused = 0;
    while !pending.is_empty() {
        pending.retain_mut(|(i, h)| match cx.net.connect_step(cx.dev, h) {
            Ok(c) if c.is_null() => true,
            Ok(_) => panic!("forged handle {i} yielded a comm"),
            Err(_) => {
                refused += 1;
                false
            }
        });
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{} forged connects still pending",
            pending.len()
        );
    }
    println!(
        "NOTE {refused} forged or mutated handles refused in {:?}",
        start.elapsed()
    );
    assert_eq!(
        resource_counts(),
        baseline,
        "failed connects must leave nothing behind"
    );
    cx.net.close_listen(lc);
    cx.net.close_listen(cx.lc);
}

/// Loop `step` (Ok(true) = nothing yet) until it errors; the error must come after the peer was
/// killed and within `DEATH_NOTICE` of it.
fn error_after_kill(
    killed: &std::sync::OnceLock<Instant>,
    what: &str,
    mut step: impl FnMut() -> Result<bool, i32>,
) {
    let err = until_error(Duration::from_secs(60), what, &mut step);
    let at = Instant::now();
    // The transport may notice the death (say, the dead process's registrations vanishing)
    // before the runner's KILLED line arrives; it must arrive soon after, though.
    while killed.get().is_none() && at.elapsed() < DEATH_NOTICE {
        std::thread::sleep(Duration::from_millis(1));
    }
    let kill = killed
        .get()
        .unwrap_or_else(|| panic!("{what}: failed ({err}) while the peer was alive"));
    let notice = at.saturating_duration_since(*kill);
    println!("NOTE {what}: ncclResult {err} {notice:?} after the kill");
    assert_eq!(err, RC_REMOTE, "{what}");
    assert!(notice < DEATH_NOTICE, "{what}: took {notice:?}");
}

fn receiver_learns_of_a_killed_sender(cx: &mut Cx) {
    if cx.rank == 1 {
        let sc = cx.connect_pair();
        send_each(&cx.net, sc, &[(1, 4096)], 0);
        cx.kill_me();
    }
    let killed = cx.await_kill();
    let rc = cx.accept_pair();
    recv_each(&cx.net, rc, &[(1, 4096)], 0);
    let mut buf = vec![0u8; 4096];
    let mh = cx.net.reg_mr(rc, &mut buf);
    let pending = cx.net.irecv(rc, &[(buf.as_mut_ptr(), 4096, 0, mh)]);
    error_after_kill(&killed, "test on the pending receive", || {
        cx.net.test_step(pending).map(|done| done.is_none())
    });
    println!("EXPECT_STDERR closed its connection (process exited or was killed)");
    cx.net.close_recv(rc);
    cx.net.dereg_mr(std::ptr::null_mut(), mh);
}

fn sender_learns_of_a_killed_receiver(cx: &mut Cx) {
    const BIG: usize = 128 << 20;
    // Buffers are registered before the first message: pinning 128 MiB takes a while in the VM.
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; BIG];
        let mh = cx.net.reg_mr(rc, &mut buf);
        recv_each(&cx.net, rc, &[(1, 4096)], 0);
        let _big = cx.net.irecv(rc, &[(buf.as_mut_ptr(), BIG, 0, mh)]);
        // Long enough for the sender to start the transfer, far shorter than it takes.
        std::thread::sleep(Duration::from_millis(300));
        cx.kill_me();
    }
    let sc = cx.connect_pair();
    let killed = cx.await_kill();
    let mut buf = vec![3u8; BIG];
    let mh = cx.net.reg_mr(sc, &mut buf);
    send_each(&cx.net, sc, &[(1, 4096)], 0);
    let req = cx.net.isend(sc, buf.as_mut_ptr(), BIG, 0, mh);
    assert!(
        killed.get().is_none(),
        "the big send started before the kill"
    );
    error_after_kill(&killed, "test on the posted send", || {
        cx.net.test_step(req).map(|done| done.is_none())
    });
    cx.net.close_send(sc);
    cx.net.dereg_mr(std::ptr::null_mut(), mh);
}

fn survivor_of_a_killed_idle_peer_errors(cx: &mut Cx) {
    let (sc, rc) = cx.connect_and_accept();
    if cx.rank == 1 {
        cx.kill_me();
    }
    let killed = cx.await_kill();
    let mut buf = vec![0u8; 64];
    let mh = cx.net.reg_mr(rc, &mut buf);
    let p = buf.as_mut_ptr();
    let mut recv: *mut c_void = std::ptr::null_mut();
    error_after_kill(&killed, "irecv/test on the receive comm", || {
        if recv.is_null() {
            recv = cx
                .net
                .irecv_step(rc, &[(p, 64, 0, mh)], std::ptr::null_mut())?;
            return Ok(true);
        }
        cx.net.test_step(recv).map(|d| d.is_none())
    });
    let mut out = vec![0u8; 64];
    let smh = cx.net.reg_mr(sc, &mut out);
    error_after_kill(&killed, "isend on the send comm", || {
        cx.net
            .isend_step(sc, out.as_mut_ptr(), 64, 0, smh)
            .map(|r| r.is_null())
    });
    cx.net.close_recv(rc);
    cx.net.close_send(sc);
    cx.net.dereg_mr(std::ptr::null_mut(), mh);
    cx.net.dereg_mr(std::ptr::null_mut(), smh);
}

fn unrelated_non_utf8_variable_leaves_init_working(cx: &mut Cx) {
    let raw = std::env::var_os("RSIB_UNRELATED").expect("the runner sets RSIB_UNRELATED");
    assert!(
        raw.to_str().is_none(),
        "RSIB_UNRELATED must hold non-UTF-8 bytes"
    );
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        recv_each(&cx.net, rc, &[(5, 65_536)], 0);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        send_each(&cx.net, sc, &[(5, 65_536)], 0);
        cx.net.close_send(sc);
    }
}

/// After a comm failed on both sides: wait for the sender to be done (its `HANDLE` line),
/// bring the links back, and check that every fd and verbs object of the comm is gone.
pub(crate) fn after_both_failed(cx: &mut Cx, baseline: &[(String, usize)]) {
    let _sender_done = cx.peer();
    restore_veth();
    assert_eq!(
        resource_counts(),
        baseline,
        "after the failure every object is gone"
    );
}

/// Every veth end up, with its routes and neighbours back (the kernel drops them when an end
/// goes down; on a real network ARP would find the peer again).
pub(crate) fn restore_veth() {
    ip_batch(&veth_restore_batch());
}

/// The `ip -batch` lines that bring every veth end back (`vm-guest.sh --veth-restore-batch`):
/// read ahead by a test that times an outage, so that ending it starts one process.
pub(crate) fn veth_restore_batch() -> String {
    let out = Command::new("bash")
        .arg(crate::support::repo_root().join("scripts/vm-guest.sh"))
        .arg("--veth-restore-batch")
        .output()
        .unwrap();
    assert!(out.status.success(), "vm-guest.sh --veth-restore-batch");
    String::from_utf8(out.stdout).unwrap()
}

/// `ip link set DEV STATE`.
pub(crate) fn set_link(dev: &str, state: &str) {
    set_links(&[dev], state);
}

/// `ip link set DEV STATE` for every one of `devs`, in one process.
pub(crate) fn set_links(devs: &[&str], state: &str) {
    let batch: String = devs
        .iter()
        .map(|dev| format!("link set {dev} {state}\n"))
        .collect();
    ip_batch(&batch);
}

/// `ip -batch -` with `commands`.
pub(crate) fn ip_batch(commands: &str) {
    let mut ip = Command::new("ip")
        .args(["-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    ip.stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let status = ip.wait().unwrap();
    assert!(status.success(), "ip -batch:\n{commands}");
}

/// A fused rxe1+rxe2 connection loses veth1 (rxe2's netdev) mid-stream, which takes both
/// members down (the veth pair goes down as one): no member is left, so once the retry budget
/// of `NCCL_IB_TIMEOUT`/`NCCL_IB_RETRY_CNT` has passed the comm fails naming the ports (port
/// failover waits that long for one to come back), both sides get an error in bounded time,
/// every close returns, and fds and verbs objects are back at their counts.
fn netdev_down_under_a_fused_member(cx: &mut Cx) {
    assert_eq!(cx.net.device_name(cx.dev), "rxe1+rxe2");
    if cx.rank == 0 {
        let rc = cx.net.accept(cx.lc);
        assert_counted(&resource_counts());
        recv_each(&cx.net, rc, &[(1, 65_536)], 0);
        cx.net.close_recv(rc);
        let baseline = resource_counts();
        let rc = cx.net.accept(cx.lc);
        recv_each(&cx.net, rc, &[(2, 65_536)], 0);
        let mut buf = vec![0u8; 2 * 65_536];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let p = buf.as_mut_ptr();
        let pending = cx.net.irecv(rc, &[(p, 65_536, 0, mh)]);
        set_link("veth1", "down");
        println!("HANDLE {}", hex(&[0u8; 128]));
        std::io::stdout().flush().unwrap();
        // This receive's clear-to-send cannot get through: the comm fails, and so does the
        // receive the sender will never complete.
        let start = Instant::now();
        let after = cx.net.irecv_step(
            rc,
            &[(p.wrapping_add(65_536), 65_536, 0, mh)],
            std::ptr::null_mut(),
        );
        let err = match after {
            Err(rc) => rc,
            Ok(_) => until_error(Duration::from_secs(30), "the cut-off receive", || {
                cx.net.test_step(pending).map(|d| d.is_none())
            }),
        };
        println!("NOTE receiver failed after {:?}", start.elapsed());
        assert_eq!(err, RC_REMOTE);
        println!(
            "EXPECT_STDERR no member of the connection came back within the retry budget \
             (NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT): ports down: "
        );
        cx.net.close_recv(rc);
        cx.net.dereg_mr(std::ptr::null_mut(), mh);
        after_both_failed(cx, &baseline);
        cx.net.close_listen(cx.lc);
    } else {
        cx.net.close_listen(cx.lc);
        let peer = cx.peer();
        let sc = cx.net.connect(cx.dev, &peer);
        send_each(&cx.net, sc, &[(1, 65_536)], 0);
        cx.net.close_send(sc);
        let baseline = resource_counts();
        let sc = cx.net.connect(cx.dev, &peer);
        send_each(&cx.net, sc, &[(2, 65_536)], 0);
        let mut buf = vec![9u8; 65_536];
        let mh = cx.net.reg_mr(sc, &mut buf);
        let _link_down = cx.peer();
        let start = Instant::now();
        let err = until_error(Duration::from_secs(30), "a send over the cut link", || {
            let r = cx.net.isend_step(sc, buf.as_mut_ptr(), 65_536, 0, mh)?;
            if r.is_null() {
                return Ok(true);
            }
            until_error(Duration::from_secs(30), "the send's completion", || {
                cx.net.test_step(r).map(|d| d.is_none())
            });
            Err(RC_REMOTE)
        });
        println!("NOTE sender failed after {:?}", start.elapsed());
        assert_eq!(err, RC_REMOTE);
        cx.net.close_send(sc);
        cx.net.dereg_mr(std::ptr::null_mut(), mh);
        assert_eq!(
            resource_counts(),
            baseline,
            "after the failure every object is gone"
        );
        println!("HANDLE {}", hex(&[0u8; 128]));
        std::io::stdout().flush().unwrap();
    }
}

/// Tests that wait for a transport error: rxe treats NCCL's default retry count 7 as "retry
/// forever", and a short timeout keeps the wait to a fraction of a second.
const FINITE_RETRIES: (&str, &str) = ("NCCL_IB_RETRY_CNT", "6");

pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "stray_connections_before_the_real_peer",
        ranks: 2,
        run: stray_connections_before_the_real_peer,
        env: &[&[("NCCL_DEBUG", "INFO")]],
    },
    Scenario {
        name: "stray_connections_during_a_real_connect",
        ranks: 2,
        run: stray_connections_during_a_real_connect,
        env: &[],
    },
    Scenario {
        name: "thirty_two_silent_intruders_at_once",
        ranks: 2,
        run: thirty_two_silent_intruders_at_once,
        env: &[],
    },
    Scenario {
        name: "echo_server_is_not_a_peer",
        ranks: 1,
        run: echo_server_is_not_a_peer,
        env: &[],
    },
    Scenario {
        name: "replayed_reply_is_refused",
        ranks: 2,
        run: replayed_reply_is_refused,
        env: &[],
    },
    Scenario {
        name: "forged_and_mutated_handles_never_yield_a_comm",
        ranks: 1,
        run: forged_and_mutated_handles_never_yield_a_comm,
        env: &[&[("NCCL_NET_RS_CONNECT_TIMEOUT", "3")]],
    },
    Scenario {
        name: "receiver_learns_of_a_killed_sender",
        ranks: 2,
        run: receiver_learns_of_a_killed_sender,
        env: &[&[FINITE_RETRIES]],
    },
    Scenario {
        name: "sender_learns_of_a_killed_receiver",
        ranks: 2,
        run: sender_learns_of_a_killed_receiver,
        env: &[&[FINITE_RETRIES]],
    },
    Scenario {
        name: "survivor_of_a_killed_idle_peer_errors",
        ranks: 2,
        run: survivor_of_a_killed_idle_peer_errors,
        env: &[&[FINITE_RETRIES]],
    },
    Scenario {
        name: "unrelated_non_utf8_variable_leaves_init_working",
        ranks: 2,
        run: unrelated_non_utf8_variable_leaves_init_working,
        env: &[&[(NON_UTF8, "RSIB_UNRELATED")]],
    },
    Scenario {
        name: "netdev_down_under_a_fused_member",
        ranks: 2,
        run: netdev_down_under_a_fused_member,
        env: &[&[
            ("NCCL_NET_RS_FUSE", "rxe1+rxe2"),
            ("RSIB_TEST_DEV", "rxe1+rxe2"),
            FINITE_RETRIES,
            ("NCCL_IB_TIMEOUT", "12"),
        ]],
    },
];
