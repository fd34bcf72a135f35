//! ABI conformance on Soft-RoCE: the built plugin, loaded with dlopen, driven through the
//! `ncclNetPlugin_v8` vtable the way NCCL's proxy threads drive it, across separate processes.
//!
//! Runs inside the VM (`scripts/rdma-vm.sh`); fails, never skips, without rxe0/rxe1. The binary
//! has its own `main`: without arguments it runs every scenario (or those whose name contains
//! the first argument), each as a group of child processes of itself (`--role NAME --rank R
//! --ranks N`). Every child listens once and prints its handle; the parent forwards the handles
//! rank r prints to rank r-1, so rank r connects to rank r+1 (mod N) and accepts from rank r-1.
//! In two-rank scenarios rank 0 receives and rank 1 sends.
#![allow(clippy::unwrap_used)] // test code panics with context

mod support;

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::net::{DEADLINE, Handle, Net, hex, pattern, unhex};

const RC_INTERNAL: i32 = 3;
const RC_SYSTEM: i32 = 2;
const RC_INVALID_USAGE: i32 = 5;
const RC_REMOTE: i32 = 6;

/// What a child process has when its scenario starts.
struct Cx {
    net: Net,
    rank: usize,
    ranks: usize,
    dev: i32,
    lc: *mut c_void,
    stdin: BufReader<std::io::Stdin>,
}

impl Cx {
    /// The next handle forwarded from rank + 1.
    fn peer(&mut self) -> Handle {
        let mut line = String::new();
        self.stdin.read_line(&mut line).unwrap();
        unhex(
            line.trim()
                .strip_prefix("PEER ")
                .unwrap_or_else(|| panic!("expected PEER, got {line:?}")),
        )
    }

    /// Listen again and publish the handle to rank - 1.
    fn publish_listen(&mut self) -> *mut c_void {
        let (handle, lc) = self.net.listen(self.dev);
        println!("HANDLE {}", hex(&handle));
        std::io::stdout().flush().unwrap();
        lc
    }

    /// Rank 0 side of a pair: accept on the startup listen comm and close it.
    fn accept_pair(&mut self) -> *mut c_void {
        let rc = self.net.accept(self.lc);
        self.net.close_listen(self.lc);
        rc
    }

    /// Rank 1 side of a pair: close the startup listen comm without accepting (as NCCL does with
    /// shared connections) and connect to rank 0.
    fn connect_pair(&mut self) -> *mut c_void {
        self.net.close_listen(self.lc);
        let peer = self.peer();
        self.net.connect(self.dev, &peer)
    }

    /// Connect to rank + 1 and accept from rank - 1 at the same time, as NCCL's non-blocking
    /// connect/accept allow.
    fn connect_and_accept(&mut self) -> (*mut c_void, *mut c_void) {
        let peer = self.peer();
        let comms = self.net.connect_and_accept(self.dev, &peer, self.lc);
        self.net.close_listen(self.lc);
        comms
    }
}

/// Call `step` until it returns an error code and return it. Until then every call must report
/// that nothing happened (`Ok(true)`: a NULL comm or request, a request not done), else
/// `nothing_expected` is the assertion message; `limit` bounds the wait.
fn until_error(
    limit: Duration,
    nothing_expected: &str,
    mut step: impl FnMut() -> Result<bool, i32>,
) -> i32 {
    let start = Instant::now();
    loop {
        match step() {
            Ok(nothing) => assert!(nothing, "{nothing_expected}"),
            Err(rc) => return rc,
        }
        assert!(
            start.elapsed() < limit,
            "no error within {limit:?}: {nothing_expected}"
        );
    }
}

/// Send `msgs` (pattern seeds and sizes) one at a time from one registered buffer.
fn send_each(net: &Net, sc: *mut c_void, msgs: &[(u64, usize)], tag: i32) {
    let max = msgs.iter().map(|m| m.1).max().unwrap_or(0).max(1);
    let mut buf = vec![0u8; max];
    let mh = net.reg_mr(sc, &mut buf);
    for &(seed, size) in msgs {
        buf[..size].copy_from_slice(&pattern(seed, size));
        let req = net.isend(sc, buf.as_mut_ptr(), size as i32, tag, mh);
        assert_eq!(
            net.wait(req)[0],
            size as i32,
            "sender reports the bytes sent"
        );
    }
    net.dereg_mr(sc, mh);
}

/// Receive `msgs` one at a time and check every byte and the guard after each message.
fn recv_each(net: &Net, rc: *mut c_void, msgs: &[(u64, usize)], tag: i32) {
    let max = msgs.iter().map(|m| m.1).max().unwrap_or(0);
    let mut buf = vec![0xa5u8; max + 4096];
    let mh = net.reg_mr(rc, &mut buf);
    for &(seed, size) in msgs {
        buf.fill(0xa5);
        let req = net.irecv(rc, &[(buf.as_mut_ptr(), size as i32, tag, mh)]);
        assert_eq!(
            net.wait(req)[0],
            size as i32,
            "received size of a {size}-byte message"
        );
        assert!(
            buf[..size] == pattern(seed, size)[..],
            "payload of the {size}-byte message differs"
        );
        assert!(
            buf[size..size + 64].iter().all(|&b| b == 0xa5),
            "bytes written past a {size}-byte message"
        );
    }
    net.dereg_mr(rc, mh);
}

const SIZES: [usize; 10] = [
    0,
    1,
    7,
    1000,
    4095,
    4096,
    65_537,
    1 << 20,
    (1 << 20) + 3,
    16 << 20,
];

fn sized_messages() -> Vec<(u64, usize)> {
    SIZES
        .iter()
        .enumerate()
        .map(|(i, &s)| (i as u64 + 1, s))
        .collect()
}

fn transfer_sizes(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        recv_each(&cx.net, rc, &sized_messages(), 7);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        send_each(&cx.net, sc, &sized_messages(), 7);
        cx.net.close_send(sc);
    }
}

fn many_messages(cx: &mut Cx) {
    // 40 messages rotate over every QP of the connection and wrap the 32 slots.
    let msgs: Vec<(u64, usize)> = (0..40)
        .map(|i| (100 + i, 1000 + 997 * i as usize))
        .collect();
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        recv_each(&cx.net, rc, &msgs, 0);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        send_each(&cx.net, sc, &msgs, 0);
        cx.net.close_send(sc);
    }
}

fn in_flight_32(cx: &mut Cx) {
    const N: usize = 32;
    const LEN: usize = 4096;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; N * LEN];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let reqs: Vec<*mut c_void> = (0..N)
            .map(|i| {
                // SAFETY: inside `buf`.
                let p = base.wrapping_add(i * LEN);
                let r = cx
                    .net
                    .irecv_step(rc, &[(p, LEN as i32, 0, mh)], std::ptr::null_mut())
                    .unwrap();
                assert!(!r.is_null(), "receive {i} of {N} must start at once");
                r
            })
            .collect();
        let extra = cx
            .net
            .irecv_step(rc, &[(base, LEN as i32, 0, mh)], std::ptr::null_mut())
            .unwrap();
        assert!(
            extra.is_null(),
            "receive 33 must return a NULL request while 32 are in flight"
        );
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!(cx.net.wait(*r)[0], LEN as i32);
            assert!(
                buf[i * LEN..(i + 1) * LEN] == pattern(i as u64, LEN)[..],
                "message {i}"
            );
        }
        cx.net.dereg_mr(rc, mh);
        recv_each(&cx.net, rc, &[(99, 10)], 0);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut buf: Vec<u8> = (0..N).flat_map(|i| pattern(i as u64, LEN)).collect();
        let mh = cx.net.reg_mr(sc, &mut buf);
        let base = buf.as_mut_ptr();
        let reqs: Vec<*mut c_void> = (0..N)
            .map(|i| {
                cx.net
                    .isend(sc, base.wrapping_add(i * LEN), LEN as i32, 0, mh)
            })
            .collect();
        for r in reqs {
            assert_eq!(cx.net.wait(r)[0], LEN as i32);
        }
        cx.net.dereg_mr(sc, mh);
        send_each(&cx.net, sc, &[(99, 10)], 0);
        cx.net.close_send(sc);
    }
}

fn grouped_receive_of_8_matches_tags(cx: &mut Cx) {
    const CAP: usize = 10_000;
    let size_of_tag = |t: usize| 1000 * (t + 1) + 1;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 8 * CAP];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let bufs: Vec<_> = (0..8)
            .map(|t| (base.wrapping_add(t * CAP), CAP as i32, t as i32, mh))
            .collect();
        let sizes = cx.net.wait(cx.net.irecv(rc, &bufs));
        for t in 0..8 {
            assert_eq!(
                sizes[t],
                size_of_tag(t) as i32,
                "size of the buffer tagged {t}"
            );
            let got = &buf[t * CAP..t * CAP + size_of_tag(t)];
            assert!(
                got == &pattern(50 + t as u64, size_of_tag(t))[..],
                "buffer tagged {t} holds another send"
            );
        }
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let order = [5usize, 2, 7, 0, 3, 6, 1, 4];
        let mut bufs: Vec<Vec<u8>> = order
            .iter()
            .map(|&t| pattern(50 + t as u64, size_of_tag(t)))
            .collect();
        let mhs: Vec<*mut c_void> = bufs.iter_mut().map(|b| cx.net.reg_mr(sc, b)).collect();
        let reqs: Vec<*mut c_void> = order
            .iter()
            .zip(bufs.iter_mut())
            .zip(&mhs)
            .map(|((&t, b), &mh)| {
                cx.net
                    .isend(sc, b.as_mut_ptr(), b.len() as i32, t as i32, mh)
            })
            .collect();
        for (r, &t) in reqs.iter().zip(&order) {
            assert_eq!(cx.net.wait(*r)[0], size_of_tag(t) as i32);
        }
        for mh in mhs {
            cx.net.dereg_mr(sc, mh);
        }
        cx.net.close_send(sc);
    }
}

fn sentinel_request_is_overwritten(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 64];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let sentinel = 0x1 as *mut c_void;
        let req = cx
            .net
            .irecv_step(rc, &[(buf.as_mut_ptr(), 64, 3, mh)], sentinel)
            .unwrap();
        assert!(
            req != sentinel && !req.is_null(),
            "irecv must replace the 0x1 sentinel with a request"
        );
        assert_eq!(cx.net.wait(req)[0], 64);
        assert!(buf == pattern(3, 64));
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        send_each(&cx.net, sc, &[(3, 64)], 3);
        cx.net.close_send(sc);
    }
}

fn oversized_send_is_truncated(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0xa5u8; 8192];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), 1000, 1, mh)]);
        assert_eq!(
            cx.net.wait(req)[0],
            1000,
            "the receiver reports the bytes that arrived"
        );
        assert!(buf[..1000] == pattern(9, 4096)[..1000]);
        assert!(
            buf[1000..].iter().all(|&b| b == 0xa5),
            "nothing may be written past the posted buffer"
        );
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut buf = pattern(9, 4096);
        let mh = cx.net.reg_mr(sc, &mut buf);
        let req = cx.net.isend(sc, buf.as_mut_ptr(), 4096, 1, mh);
        assert_eq!(
            cx.net.wait(req)[0],
            1000,
            "the sender completes with the truncated size"
        );
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
    }
}

fn flush_after_receive(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 4096];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), 4096, 0, mh)]);
        assert_eq!(cx.net.wait(req)[0], 4096);
        let flush = cx.net.iflush(rc, &[(buf.as_mut_ptr(), 4096, mh)]);
        assert!(
            !flush.is_null(),
            "a flush of received data returns a request"
        );
        cx.net.wait(flush);
        assert!(
            cx.net.iflush(rc, &[(buf.as_mut_ptr(), 0, mh)]).is_null(),
            "nothing to flush: NULL request"
        );
        assert!(buf == pattern(4, 4096));
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        send_each(&cx.net, sc, &[(4, 4096)], 0);
        cx.net.close_send(sc);
    }
}

fn close_with_requests_in_flight(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 4 * 65536];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let reqs: Vec<_> = (0..4)
            .map(|i| {
                cx.net
                    .irecv(rc, &[(base.wrapping_add(i * 65536), 65536, 0, mh)])
            })
            .collect();
        cx.net.wait(reqs[0]);
        cx.net.close_recv(rc);
        cx.net.dereg_mr(std::ptr::null_mut(), mh);
    } else {
        let sc = cx.connect_pair();
        let mut buf = pattern(1, 65536);
        let mh = cx.net.reg_mr(sc, &mut buf);
        let first = cx.net.isend(sc, buf.as_mut_ptr(), 65536, 0, mh);
        cx.net.wait(first);
        let _in_flight = cx.net.isend(sc, buf.as_mut_ptr(), 65536, 0, mh);
        cx.net.close_send(sc);
        cx.net.dereg_mr(std::ptr::null_mut(), mh);
    }
}

fn both_directions_at_once(cx: &mut Cx) {
    let (sc, rc) = cx.connect_and_accept();
    exchange(cx, sc, rc, 65_536);
}

fn ring_of_three(cx: &mut Cx) {
    let (sc, rc) = cx.connect_and_accept();
    exchange(cx, sc, rc, 1 << 20);
}

/// Send pattern(rank) to rank + 1 while receiving pattern(rank - 1) from rank - 1.
fn exchange(cx: &mut Cx, sc: *mut c_void, rc: *mut c_void, len: usize) {
    let prev = (cx.rank + cx.ranks - 1) % cx.ranks;
    let mut out = pattern(cx.rank as u64, len);
    let mut inb = vec![0u8; len];
    let (smh, rmh) = (cx.net.reg_mr(sc, &mut out), cx.net.reg_mr(rc, &mut inb));
    let rreq = cx
        .net
        .irecv(rc, &[(inb.as_mut_ptr(), len as i32, prev as i32, rmh)]);
    let sreq = cx
        .net
        .isend(sc, out.as_mut_ptr(), len as i32, cx.rank as i32, smh);
    assert_eq!(cx.net.wait(sreq)[0], len as i32);
    assert_eq!(cx.net.wait(rreq)[0], len as i32);
    assert!(inb == pattern(prev as u64, len), "data from rank {prev}");
    cx.net.dereg_mr(sc, smh);
    cx.net.dereg_mr(rc, rmh);
    cx.net.close_send(sc);
    cx.net.close_recv(rc);
}

/// Packets a device's port sent and received so far (rxe's hardware counters).
fn port_packets(dev: &str) -> (u64, u64) {
    let read = |counter: &str| -> u64 {
        let path = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters/{counter}");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .trim()
            .parse()
            .unwrap()
    };
    (read("sent_pkts"), read("rcvd_pkts"))
}

/// Rank 0 sends every size to rank 1, then rank 1 sends them back, each verified byte for byte;
/// afterwards every device in `members` must have sent and received at least `min_packets`
/// more packets than before (so every member of a fused device carried traffic).
fn both_ways_over(cx: &mut Cx, expected_device: &str, members: &[&str], min_packets: u64) {
    assert_eq!(cx.net.device_name(cx.dev), expected_device);
    let before: Vec<(u64, u64)> = members.iter().map(|m| port_packets(m)).collect();
    let (sc, rc) = cx.connect_and_accept();
    let msgs = sized_messages();
    if cx.rank == 0 {
        send_each(&cx.net, sc, &msgs, 3);
        recv_each(&cx.net, rc, &msgs, 3);
    } else {
        recv_each(&cx.net, rc, &msgs, 3);
        send_each(&cx.net, sc, &msgs, 3);
    }
    cx.net.close_send(sc);
    cx.net.close_recv(rc);
    if cx.rank == 0 {
        for (member, (sent0, rcvd0)) in members.iter().zip(before) {
            let (sent, rcvd) = port_packets(member);
            let (sent, rcvd) = (sent - sent0, rcvd - rcvd0);
            println!("NOTE {member}: {sent} packets sent, {rcvd} received");
            assert!(
                sent >= min_packets && rcvd >= min_packets,
                "{member} carried too little of the fused traffic: {sent} sent, {rcvd} received"
            );
        }
    }
}

fn fused_both_ways(cx: &mut Cx) {
    both_ways_over(cx, "rxe0+rxe1", &["rxe0", "rxe1"], 1000);
}

fn fused_against_unfused(cx: &mut Cx) {
    let expected = if cx.rank == 0 { "rxe1+rxe2" } else { "rxe1" };
    both_ways_over(cx, expected, &["rxe1", "rxe2"], 1000);
}

/// The registrations the LD_PRELOAD shim recorded for this process: (verb, access, refused).
fn recorded_registrations() -> Vec<(String, u32, bool)> {
    let path = std::env::var("RSIB_REG_LOG").expect("scenario runs with the registration shim");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .map(|l| {
            let mut words = l.split_whitespace();
            let verb = words.next().unwrap().to_owned();
            let access = words.next().unwrap().strip_prefix("access=0x").unwrap();
            let access = u32::from_str_radix(access, 16).unwrap();
            (verb, access, words.next() == Some("refused"))
        })
        .collect()
}

const ACCESS_RELAXED_ORDERING: u32 = 1 << 20;
const ACCESS_REMOTE_WRITE: u32 = 2;

/// A verified transfer, then what the registrations looked like. Data buffers are registered
/// with remote write and remote read; control rings without remote read.
fn transfer_and_record(cx: &mut Cx) -> (Vec<u32>, Vec<u32>, usize) {
    transfer_sizes(cx);
    let all = recorded_registrations();
    let refused = all.iter().filter(|r| r.2).count();
    let (data, control): (Vec<_>, Vec<_>) = all
        .iter()
        .filter(|r| !r.2)
        .map(|r| r.1)
        .partition(|access| access & 4 != 0 && access & ACCESS_REMOTE_WRITE != 0);
    println!(
        "NOTE {} data and {} control registrations, {refused} refused",
        data.len(),
        control.len()
    );
    assert!(!data.is_empty() && !control.is_empty(), "{all:?}");
    assert!(
        control.iter().all(|a| a & ACCESS_RELAXED_ORDERING == 0),
        "control rings never use relaxed ordering: {all:?}"
    );
    (data, control, refused)
}

fn relaxed_ordering_on_data_only(cx: &mut Cx) {
    let (data, _, refused) = transfer_and_record(cx);
    assert_eq!(refused, 0);
    assert!(
        data.iter().all(|a| a & ACCESS_RELAXED_ORDERING != 0),
        "every data registration asks for relaxed ordering: {data:x?}"
    );
    println!("EXPECT_STDERR rxe0: relaxed ordering on: under a hypervisor");
}

fn relaxed_ordering_off(cx: &mut Cx) {
    let (data, _, _) = transfer_and_record(cx);
    assert!(
        data.iter().all(|a| a & ACCESS_RELAXED_ORDERING == 0),
        "NCCL_IB_PCI_RELAXED_ORDERING=0: no registration asks for it: {data:x?}"
    );
    println!("EXPECT_STDERR rxe0: relaxed ordering off: turned off");
}

fn relaxed_ordering_refused_falls_back_once(cx: &mut Cx) {
    let (data, _, refused) = transfer_and_record(cx);
    assert_eq!(refused, 1, "one refusal, then the port stops asking");
    assert!(
        data.iter().all(|a| a & ACCESS_RELAXED_ORDERING == 0),
        "after the refusal, data registrations go without the flag: {data:x?}"
    );
    println!("EXPECT_STDERR rxe0: registration with relaxed ordering refused");
}

/// Open fds, and this process's PDs, CQs, QPs and MRs as `rdma resource` lists them.
fn resource_counts() -> Vec<(String, usize)> {
    let pid = format!("pid {} ", std::process::id());
    let mut counts = vec![(
        "fd".to_owned(),
        std::fs::read_dir("/proc/self/fd").unwrap().count(),
    )];
    for kind in ["pd", "cq", "qp", "mr"] {
        let out = Command::new("rdma")
            .args(["resource", "show", kind])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rdma resource show {kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let n = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&pid))
            .count();
        counts.push((kind.to_owned(), n));
    }
    counts
}

/// While a connection is open its QPs, CQ and control-ring MRs must show up, or the counts
/// prove nothing.
fn assert_counted(live: &[(String, usize)]) {
    for kind in ["cq", "qp", "mr"] {
        let n = live.iter().find(|(k, _)| k == kind).map_or(0, |(_, n)| *n);
        assert!(
            n > 0,
            "`rdma resource show {kind}` does not list this process's objects: {live:?}"
        );
    }
}

fn thousand_connect_transfer_close_cycles(cx: &mut Cx) {
    const CYCLES: usize = 1000;
    let mut baseline = None;
    for cycle in 0..CYCLES {
        let msg = [(cycle as u64, 1 + cycle % 3000)];
        if cx.rank == 0 {
            let lc = if cycle == 0 {
                cx.lc
            } else {
                cx.publish_listen()
            };
            let rc = cx.net.accept(lc);
            cx.net.close_listen(lc);
            if cycle == 0 {
                assert_counted(&resource_counts());
            }
            recv_each(&cx.net, rc, &msg, 0);
            cx.net.close_recv(rc);
        } else {
            if cycle == 0 {
                cx.net.close_listen(cx.lc);
            }
            let peer = cx.peer();
            let sc = cx.net.connect(cx.dev, &peer);
            if cycle == 0 {
                assert_counted(&resource_counts());
            }
            send_each(&cx.net, sc, &msg, 0);
            cx.net.close_send(sc);
        }
        // The first cycle opens the device context (PD, socket-free); count from there.
        if cycle == 0 {
            baseline = Some(resource_counts());
        }
    }
    let after = resource_counts();
    assert_eq!(
        baseline.unwrap(),
        after,
        "resources after {CYCLES} cycles must be back at their starting counts"
    );
    println!("NOTE resources stable after {CYCLES} cycles: {after:?}");
}

fn connect_to_a_closed_listener_fails_naming_the_peer(cx: &mut Cx) {
    let (mut handle, lc) = cx.net.listen(cx.dev);
    cx.net.close_listen(lc);
    cx.net.close_listen(cx.lc);
    let addr = nccl_net::core::wire::ListenHandle::parse(&handle)
        .unwrap()
        .addr;
    let err = until_error(
        DEADLINE,
        "connect to a closed listener must not succeed",
        || {
            cx.net
                .connect_step(cx.dev, &mut handle)
                .map(|c| c.is_null())
        },
    );
    assert_eq!(err, RC_REMOTE, "a peer that is not there is a remote error");
    println!("EXPECT_STDERR cannot connect to peer {addr}");
}

fn accept_without_peer_times_out_naming_the_listener(cx: &mut Cx) {
    let addr = {
        let (handle, lc) = cx.net.listen(cx.dev);
        cx.net.close_listen(cx.lc);
        cx.lc = lc;
        nccl_net::core::wire::ListenHandle::parse(&handle)
            .unwrap()
            .addr
    };
    let start = Instant::now();
    let err = until_error(
        Duration::from_secs(30),
        "accept must give up at its deadline",
        || cx.net.accept_step(cx.lc).map(|c| c.is_null()),
    );
    assert_eq!(err, RC_REMOTE);
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "not before the deadline"
    );
    cx.net.close_listen(cx.lc);
    println!("EXPECT_STDERR no peer connected to {addr}");
}

fn bad_arguments_are_internal_errors(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 64];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), 64, 0, mh)]);
        cx.net.wait(req);
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
        return;
    }
    let (_, spare) = cx.net.listen(cx.dev);
    let sc = cx.connect_pair();
    let mut buf = vec![0u8; 4096];
    let mh = cx.net.reg_mr(sc, &mut buf);
    let p = buf.as_mut_ptr();
    assert_eq!(
        cx.net.isend_step(std::ptr::null_mut(), p, 8, 0, mh),
        Err(RC_INTERNAL),
        "NULL comm"
    );
    assert_eq!(
        cx.net.isend_step(spare, p, 8, 0, mh),
        Err(RC_INTERNAL),
        "a listen comm is not a send comm"
    );
    assert_eq!(
        cx.net.isend_step(sc, p, 8, 0, spare),
        Err(RC_INTERNAL),
        "a listen comm is not an mhandle"
    );
    assert_eq!(
        cx.net.isend_step(sc, p, 100_000, 0, mh),
        Err(RC_INTERNAL),
        "size beyond the registration"
    );
    assert_eq!(
        cx.net.isend_step(sc, p, -1, 0, mh),
        Err(RC_INTERNAL),
        "negative size"
    );
    assert_eq!(
        cx.net.test_step(std::ptr::null_mut()),
        Err(RC_INTERNAL),
        "NULL request"
    );
    let mut zero: Handle = [0; 128];
    assert_eq!(
        cx.net.connect_step(cx.dev, &mut zero),
        Err(RC_INTERNAL),
        "unknown handle"
    );
    assert_eq!(
        cx.net.reg_mr_dmabuf_step(sc, &mut buf, -1),
        Err(RC_SYSTEM),
        "DMA-BUF with a bad fd"
    );
    println!("EXPECT_STDERR regMrDmaBuf failed: ibv_reg_dmabuf_mr of 4096 bytes");
    cx.net.dereg_mr(sc, std::ptr::null_mut());
    let req = cx.net.isend(sc, p, 64, 0, mh);
    cx.net.wait(req);
    cx.net.dereg_mr(sc, mh);
    cx.net.close_send(sc);
    cx.net.close_listen(spare);
}

fn unknown_tag_is_an_error(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 64];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let _never = cx.net.irecv(rc, &[(buf.as_mut_ptr(), 64, 1, mh)]);
        println!("WAIT_FOR_PEER");
        std::io::stdout().flush().unwrap();
        let _ = cx.peer();
        cx.net.close_recv(rc);
        cx.net.dereg_mr(std::ptr::null_mut(), mh);
    } else {
        let sc = cx.connect_pair();
        let mut buf = vec![0u8; 64];
        let mh = cx.net.reg_mr(sc, &mut buf);
        let rc = until_error(
            DEADLINE,
            "a send with a tag no receive expects must not start",
            || {
                cx.net
                    .isend_step(sc, buf.as_mut_ptr(), 64, 2, mh)
                    .map(|r| r.is_null())
            },
        );
        assert_eq!(rc, RC_INTERNAL);
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
        let (h, lc) = cx.net.listen(cx.dev);
        println!("HANDLE {}", hex(&h));
        std::io::stdout().flush().unwrap();
        cx.net.close_listen(lc);
    }
}

fn gid_mismatch_fails_naming_both_gids(cx: &mut Cx) {
    // Rank 0 uses GID index 0 (link-local IPv6), rank 1 the automatic IPv4 GID.
    if cx.rank == 0 {
        let err = until_error(
            DEADLINE,
            "an incompatible peer must not be accepted",
            || cx.net.accept_step(cx.lc).map(|c| c.is_null()),
        );
        assert_eq!(
            err, RC_INVALID_USAGE,
            "an incompatible GID setup is a configuration error"
        );
        cx.net.close_listen(cx.lc);
        println!("EXPECT_STDERR GID mismatch: local rxe0 GID index 0");
        println!("EXPECT_STDERR remote rxe0 at ");
    } else {
        cx.net.close_listen(cx.lc);
        let mut peer = cx.peer();
        let err = until_error(DEADLINE, "the peer refuses this connection", || {
            cx.net.connect_step(cx.dev, &mut peer).map(|c| c.is_null())
        });
        assert_eq!(
            err, RC_REMOTE,
            "the connecting side sees the peer drop the handshake"
        );
    }
}

fn peer_gone_gives_an_error_in_plain_words(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 2 * 4096];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let first = cx.net.irecv(rc, &[(buf.as_mut_ptr(), 4096, 0, mh)]);
        let _second = cx
            .net
            .irecv(rc, &[(buf.as_mut_ptr().wrapping_add(4096), 4096, 0, mh)]);
        cx.net.wait(first);
        // Tear the receiving end down, then tell the sender (through the handle relay).
        cx.net.close_recv(rc);
        cx.net.dereg_mr(std::ptr::null_mut(), mh);
        let (h, lc) = cx.net.listen(cx.dev);
        println!("HANDLE {}", hex(&h));
        std::io::stdout().flush().unwrap();
        cx.net.close_listen(lc);
    } else {
        let sc = cx.connect_pair();
        let mut buf = vec![7u8; 4096];
        let mh = cx.net.reg_mr(sc, &mut buf);
        let first = cx.net.isend(sc, buf.as_mut_ptr(), 4096, 0, mh);
        cx.net.wait(first);
        let _receiver_gone = cx.peer();
        let second = cx.net.isend(sc, buf.as_mut_ptr(), 4096, 0, mh);
        let err = until_error(DEADLINE, "a send to a destroyed QP cannot complete", || {
            cx.net.test_step(second).map(|done| done.is_none())
        });
        assert_eq!(err, RC_REMOTE, "a vanished peer is a remote error");
        assert_eq!(
            cx.net.test_step(second),
            Err(RC_REMOTE),
            "the comm keeps reporting its failure"
        );
        cx.net.close_send(sc);
        cx.net.dereg_mr(std::ptr::null_mut(), mh);
        println!("EXPECT_STDERR work completion failed: transport retry counter exceeded");
        println!("EXPECT_STDERR likely cause: retry exceeded: the peer stopped answering");
    }
}

type ScenarioFn = fn(&mut Cx);

struct Scenario {
    name: &'static str,
    ranks: usize,
    run: ScenarioFn,
    /// Environment per rank (same for all when one entry).
    env: &'static [&'static [(&'static str, &'static str)]],
}

const SPLIT4: &[(&str, &str)] = &[
    ("NCCL_IB_QPS_PER_CONNECTION", "4"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
];
const ROTATE3: &[(&str, &str)] = &[
    ("NCCL_IB_QPS_PER_CONNECTION", "3"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "0"),
];

const FUSE01: &[(&str, &str)] = &[("NCCL_NET_RS_FUSE", "rxe0+rxe1")];
const FUSE01_SPLIT4: &[(&str, &str)] = &[
    ("NCCL_NET_RS_FUSE", "rxe0+rxe1"),
    ("NCCL_IB_QPS_PER_CONNECTION", "2"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
];

/// Runs the ranks under the registration-recording shim (see `run_scenario`).
const REG_SHIM: (&str, &str) = ("RSIB_REG_SHIM", "1");

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "transfer_sizes_0b_to_16mib_verified",
        ranks: 2,
        run: transfer_sizes,
        env: &[],
    },
    // rxe1 to rxe1 (rxe's own loopback); rxe0 cannot reach rxe1 (packets to local addresses
    // enter on `lo`, where rxe0 takes them), only the veth pair rxe1/rxe2 crosses devices.
    Scenario {
        name: "transfer_on_rxe1",
        ranks: 2,
        run: transfer_sizes,
        env: &[&[("RSIB_TEST_DEV", "1")]],
    },
    Scenario {
        name: "four_qps_split_data",
        ranks: 2,
        run: transfer_sizes,
        env: &[SPLIT4],
    },
    Scenario {
        name: "three_qps_round_robin",
        ranks: 2,
        run: many_messages,
        env: &[ROTATE3],
    },
    Scenario {
        name: "forty_messages_wrap_the_slots",
        ranks: 2,
        run: many_messages,
        env: &[],
    },
    Scenario {
        name: "thirty_two_requests_in_flight",
        ranks: 2,
        run: in_flight_32,
        env: &[],
    },
    Scenario {
        name: "grouped_receive_of_8_matches_tags",
        ranks: 2,
        run: grouped_receive_of_8_matches_tags,
        env: &[],
    },
    Scenario {
        name: "grouped_receive_over_split_qps",
        ranks: 2,
        run: grouped_receive_of_8_matches_tags,
        env: &[SPLIT4],
    },
    Scenario {
        name: "sentinel_request_is_overwritten",
        ranks: 2,
        run: sentinel_request_is_overwritten,
        env: &[],
    },
    Scenario {
        name: "oversized_send_is_truncated",
        ranks: 2,
        run: oversized_send_is_truncated,
        env: &[],
    },
    Scenario {
        name: "flush_after_receive",
        ranks: 2,
        run: flush_after_receive,
        env: &[],
    },
    Scenario {
        name: "close_with_requests_in_flight",
        ranks: 2,
        run: close_with_requests_in_flight,
        env: &[],
    },
    Scenario {
        name: "connect_and_accept_both_directions",
        ranks: 2,
        run: both_directions_at_once,
        env: &[],
    },
    Scenario {
        name: "ring_of_three_processes",
        ranks: 3,
        run: ring_of_three,
        env: &[],
    },
    Scenario {
        name: "bad_arguments_are_internal_errors",
        ranks: 2,
        run: bad_arguments_are_internal_errors,
        env: &[],
    },
    Scenario {
        name: "unknown_tag_is_an_error",
        ranks: 2,
        run: unknown_tag_is_an_error,
        env: &[],
    },
    Scenario {
        name: "connect_to_a_closed_listener_fails_naming_the_peer",
        ranks: 1,
        run: connect_to_a_closed_listener_fails_naming_the_peer,
        env: &[],
    },
    Scenario {
        name: "accept_without_peer_times_out_naming_the_listener",
        ranks: 1,
        run: accept_without_peer_times_out_naming_the_listener,
        env: &[&[("NCCL_NET_RS_CONNECT_TIMEOUT", "2")]],
    },
    Scenario {
        name: "gid_mismatch_fails_naming_both_gids",
        ranks: 2,
        run: gid_mismatch_fails_naming_both_gids,
        env: &[&[("NCCL_IB_GID_INDEX", "0")], &[]],
    },
    Scenario {
        name: "peer_gone_gives_an_error_in_plain_words",
        ranks: 2,
        run: peer_gone_gives_an_error_in_plain_words,
        env: &[&[("NCCL_IB_TIMEOUT", "8"), ("NCCL_IB_RETRY_CNT", "1")]],
    },
    // Fusion: rxe0+rxe1 against rxe0+rxe1 pairs rxe0 with rxe0 and rxe1 with rxe1; a fused
    // rxe1+rxe2 against a lone rxe1 crosses the veth pair (rxe2 to rxe1).
    Scenario {
        name: "fused_rxe0_rxe1_both_directions_use_both_ports",
        ranks: 2,
        run: fused_both_ways,
        env: &[FUSE01],
    },
    Scenario {
        name: "fused_side_against_unfused_peer",
        ranks: 2,
        run: fused_against_unfused,
        env: &[
            &[("NCCL_NET_RS_FUSE", "rxe1+rxe2"), ("RSIB_TEST_DEV", "1")],
            &[("RSIB_TEST_DEV", "1")],
        ],
    },
    Scenario {
        name: "fused_grouped_receive_over_split_qps",
        ranks: 2,
        run: grouped_receive_of_8_matches_tags,
        env: &[FUSE01_SPLIT4],
    },
    Scenario {
        name: "fused_flush_reads_through_every_member",
        ranks: 2,
        run: flush_after_receive,
        env: &[FUSE01],
    },
    // Relaxed ordering, observed through an LD_PRELOAD shim over libibverbs. The VM is a
    // hypervisor guest, so the default (auto) turns it on.
    Scenario {
        name: "relaxed_ordering_on_data_registrations_only",
        ranks: 2,
        run: relaxed_ordering_on_data_only,
        env: &[&[REG_SHIM, ("NCCL_DEBUG", "INFO")]],
    },
    Scenario {
        name: "relaxed_ordering_off_by_variable",
        ranks: 2,
        run: relaxed_ordering_off,
        env: &[&[
            REG_SHIM,
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_IB_PCI_RELAXED_ORDERING", "0"),
        ]],
    },
    Scenario {
        name: "relaxed_ordering_refused_falls_back_once",
        ranks: 2,
        run: relaxed_ordering_refused_falls_back_once,
        env: &[&[
            REG_SHIM,
            ("RSIB_REFUSE_RO", "1"),
            ("NCCL_IB_PCI_RELAXED_ORDERING", "1"),
        ]],
    },
    Scenario {
        name: "thousand_connect_transfer_close_cycles",
        ranks: 2,
        run: thousand_connect_transfer_close_cycles,
        env: &[],
    },
];

/// The registration-recording shim, compiled once.
fn reg_shim() -> std::path::PathBuf {
    static SHIM: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    SHIM.get_or_init(|| {
        support::compile_c(
            &support::repo_root().join("tests/c_host/reg_shim.c"),
            "libreg_shim.so",
            &["-shared", "-fPIC", "-ldl"],
        )
    })
    .clone()
}

fn child(name: &str, rank: usize, ranks: usize) {
    let scenario = SCENARIOS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name}"));
    let net = Net::load(&support::plugin_path());
    let dev: i32 = std::env::var("RSIB_TEST_DEV")
        .ok()
        .and_then(|d| d.parse().ok())
        .unwrap_or(0);
    assert!(net.devices() > dev, "device {dev} missing");
    let (handle, lc) = net.listen(dev);
    println!("HANDLE {}", hex(&handle));
    println!("DEVICE {}", net.device_name(dev));
    std::io::stdout().flush().unwrap();
    let mut cx = Cx {
        net,
        rank,
        ranks,
        dev,
        lc,
        stdin: BufReader::new(std::io::stdin()),
    };
    (scenario.run)(&mut cx);
    println!("DONE");
}

/// Run one scenario's processes; `Err` describes the failure.
fn run_scenario(s: &Scenario) -> Result<(), String> {
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = (0..s.ranks)
        .map(|rank| {
            let env = s
                .env
                .get(rank)
                .or_else(|| s.env.first())
                .copied()
                .unwrap_or(&[]);
            let mut cmd = Command::new(&exe);
            if env.contains(&REG_SHIM) {
                let log = std::env::temp_dir().join(format!("rsib-reg-{}-{rank}.log", s.name));
                let _ = std::fs::remove_file(&log);
                cmd.env("LD_PRELOAD", reg_shim()).env("RSIB_REG_LOG", log);
            }
            cmd.args([
                "--role",
                s.name,
                "--rank",
                &rank.to_string(),
                "--ranks",
                &s.ranks.to_string(),
            ])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let stdins: Vec<Arc<Mutex<std::process::ChildStdin>>> = children
        .iter_mut()
        .map(|c| Arc::new(Mutex::new(c.stdin.take().unwrap())))
        .collect();
    let mut readers = Vec::new();
    for (rank, c) in children.iter_mut().enumerate() {
        // Handles printed by rank r go to rank r - 1, which connects to r.
        let target = Arc::clone(&stdins[(rank + s.ranks - 1) % s.ranks]);
        let out = c.stdout.take().unwrap();
        let err = c.stderr.take().unwrap();
        readers.push(std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(h) = line.strip_prefix("HANDLE ") {
                    let _ = writeln!(target.lock().unwrap(), "PEER {h}");
                }
                lines.push(line);
            }
            lines
        }));
        readers.push(std::thread::spawn(move || {
            BufReader::new(err).lines().map_while(Result::ok).collect()
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut statuses = vec![None; s.ranks];
    while statuses.iter().any(Option::is_none) {
        for (rank, c) in children.iter_mut().enumerate() {
            if statuses[rank].is_none() {
                statuses[rank] = c.try_wait().unwrap();
            }
        }
        if Instant::now() > deadline {
            children.iter_mut().for_each(|c| drop(c.kill()));
            return Err("timed out after 900 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdins);
    let outputs: Vec<Vec<String>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let mut report = String::new();
    let mut failed = false;
    for rank in 0..s.ranks {
        let (out, err) = (&outputs[2 * rank], &outputs[2 * rank + 1]);
        let status = statuses[rank].unwrap();
        let done = out.iter().any(|l| l == "DONE");
        let mut expectation_missed = false;
        for expect in out.iter().filter_map(|l| l.strip_prefix("EXPECT_STDERR ")) {
            if !err.iter().any(|l| l.contains(expect)) {
                report.push_str(&format!("rank {rank}: stderr lacks the line '{expect}'\n"));
                expectation_missed = true;
            }
        }
        for note in out.iter().filter_map(|l| l.strip_prefix("NOTE ")) {
            println!("    rank {rank}: {note}");
        }
        if !status.success() || !done || expectation_missed {
            failed = true;
            report.push_str(&format!(
                "--- rank {rank} ({status}) stdout:\n{}\n--- stderr:\n{}\n",
                out.join("\n"),
                err.join("\n")
            ));
        }
    }
    if failed { Err(report) } else { Ok(()) }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--role") {
        let arg = |flag: &str| {
            args[args.iter().position(|a| a == flag).unwrap() + 1]
                .parse::<usize>()
                .unwrap()
        };
        child(&args[i + 1], arg("--rank"), arg("--ranks"));
        return;
    }
    for dev in ["rxe0", "rxe1", "rxe2"] {
        assert!(
            std::path::Path::new("/sys/class/infiniband")
                .join(dev)
                .exists(),
            "RDMA device {dev} is missing: run this suite through scripts/rdma-vm.sh, which creates rxe0, rxe1 and rxe2"
        );
    }
    let filter = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .cloned()
        .unwrap_or_default();
    let chosen: Vec<&Scenario> = SCENARIOS
        .iter()
        .filter(|s| s.name.contains(&filter))
        .collect();
    println!("\nrunning {} tests", chosen.len());
    let start = Instant::now();
    let mut failures = Vec::new();
    for s in &chosen {
        let t = Instant::now();
        let outcome = run_scenario(s);
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!(
            "test {} ... {verdict} ({:.1}s)",
            s.name,
            t.elapsed().as_secs_f64()
        );
        if let Err(report) = outcome {
            failures.push((s.name, report));
        }
    }
    for (name, report) in &failures {
        println!("\n---- {name} ----\n{report}");
    }
    let passed = chosen.len() - failures.len();
    let result = if failures.is_empty() { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {result}. {passed} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        failures.len(),
        SCENARIOS.len() - chosen.len(),
        start.elapsed().as_secs_f64()
    );
    std::process::exit(i32::from(!failures.is_empty()));
}
