//! Data-path scenarios: transfers of every size and layout, grouped receives, truncation,
//! flush, fused devices and relaxed ordering.

use std::ffi::c_void;
use std::time::{Duration, Instant};

use crate::support::net::{DEADLINE, pattern};
use crate::{Cx, REG_SHIM, Scenario, exchange, port_packets, recv_each, send_each, sized_messages};

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

/// `transfer_sizes` over the GID `NCCL_IB_ADDR_RANGE=::1/128` picks on rxe0 (IPv6 loopback,
/// not its first choice by default), the port's INFO line naming it.
fn transfer_over_the_gid_in_range(cx: &mut Cx) {
    println!("EXPECT_STDERR rxe0:1 uses GID index ");
    println!("EXPECT_STDERR  ::1 (RoCE v2), MTU code");
    transfer_sizes(cx);
}

/// A range no GID of rxe0 is in: the best other GID (its IPv4 one) and a WARN line saying what
/// it misses, where NCCL's transport would take index 0 (link-local) silently.
fn transfer_outside_any_range(cx: &mut Cx) {
    println!(
        "EXPECT_STDERR :127.0.0.1 (RoCE v2) (best available: outside NCCL_IB_ADDR_RANGE 10.9.0.0/16)"
    );
    transfer_sizes(cx);
}

/// Options of NCCL's internal IB transport that the plugin does not implement: `init` names
/// those set (an empty value is unset) in one WARN line, and transfers are as without them.
fn transfer_with_nccl_transport_options_set(cx: &mut Cx) {
    println!(
        "EXPECT_STDERR NCCL_IB_OOO_RQ=1, NCCL_IB_SUBNET_AWARE_ROUTING=1: options of NCCL's \
         internal IB transport that this plugin does not implement; they have no effect here"
    );
    transfer_sizes(cx);
}

/// `NCCL_IB_PKEY` set: the key at that index is checked and named, every QP joins it.
fn transfer_in_the_named_partition(cx: &mut Cx) {
    println!("EXPECT_STDERR , P_Key 0xffff (full member) at index 0, MTU code");
    transfer_sizes(cx);
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
                    .irecv_step(rc, &[(p, LEN, 0, mh)], std::ptr::null_mut())
                    .unwrap();
                assert!(!r.is_null(), "receive {i} of {N} must start at once");
                r
            })
            .collect();
        let extra = cx
            .net
            .irecv_step(rc, &[(base, LEN, 0, mh)], std::ptr::null_mut())
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
            .map(|i| cx.net.isend(sc, base.wrapping_add(i * LEN), LEN, 0, mh))
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
            .map(|t| (base.wrapping_add(t * CAP), CAP, t as i32, mh))
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
            .map(|((&t, b), &mh)| cx.net.isend(sc, b.as_mut_ptr(), b.len(), t as i32, mh))
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
        let sentinel = std::ptr::without_provenance_mut::<c_void>(0x1);
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

/// The receive comms of a process flush through one QP per port (pins the plugin's own design:
/// NCCL's transport builds a flush QP per comm, `ncclIbIflush` reads through it): three comms
/// in one process with 32 flushes each in flight, 96 reads against the port QP's 63, so reads
/// wait for room and one comm's `test` counts down another's; every flush completes, each
/// once, and every byte arrived.
fn flushes_of_many_comms_share_their_port(cx: &mut Cx) {
    const COMMS: usize = 3;
    const FLUSHES: usize = 32;
    const SIZE: usize = 4096;
    let pairs: Vec<_> = (0..COMMS)
        .map(|_| {
            let (handle, lc) = cx.net.listen(cx.dev);
            let pair = cx.net.connect_and_accept(cx.dev, &handle, lc);
            cx.net.close_listen(lc);
            pair
        })
        .collect();
    cx.net.close_listen(cx.lc);
    let mut received: Vec<Vec<u8>> = (0..COMMS).map(|_| vec![0u8; SIZE]).collect();
    let mut recv_mrs = Vec::new();
    for (i, (&(sc, rc), buf)) in pairs.iter().zip(&mut received).enumerate() {
        let mh = cx.net.reg_mr(rc, buf);
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), SIZE, 0, mh)]);
        send_each(&cx.net, sc, &[(10 + i as u64, SIZE)], 0);
        assert_eq!(cx.net.wait(req)[0], SIZE as i32);
        recv_mrs.push(mh);
    }
    let flushes: Vec<_> = (0..FLUSHES)
        .flat_map(|_| 0..COMMS)
        .map(|i| {
            let (rc, buf) = (pairs[i].1, &mut received[i]);
            let req = cx
                .net
                .iflush(rc, &[(buf.as_mut_ptr(), SIZE as i32, recv_mrs[i])]);
            assert!(!req.is_null(), "a flush of received data returns a request");
            req
        })
        .collect();
    // Wait for the last comm's flushes first: the reads of the others come back meanwhile.
    for &req in flushes.iter().rev() {
        cx.net.wait(req);
    }
    for (i, buf) in received.iter().enumerate() {
        assert!(*buf == pattern(10 + i as u64, SIZE), "comm {i}'s bytes");
    }
    for (&(sc, rc), mh) in pairs.iter().zip(recv_mrs) {
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
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

/// NCCL's transport returns a NULL request when the tag matches no unmatched entry of the
/// message at the head of the CTS ring (`ncclIbIsend`, net_ib/p2p.cc): retry later, not an error.
fn tag_miss_is_retry_later(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        recv_each(&cx.net, rc, &[(11, 64)], 1);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut buf = pattern(11, 64);
        let mh = cx.net.reg_mr(sc, &mut buf);
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(500) {
            let req = cx.net.isend_step(sc, buf.as_mut_ptr(), 64, 2, mh);
            assert_eq!(
                req,
                Ok(std::ptr::null_mut()),
                "tag 2 is never posted: NULL, not an error"
            );
        }
        let req = cx.net.isend(sc, buf.as_mut_ptr(), 64, 1, mh);
        assert_eq!(cx.net.wait(req)[0], 64);
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
    }
}

/// The receiver posts `irecv(n=1, tags={8})`, then `irecv(n=8, tags={0..7})`; the sender offers
/// tags 0, 8, 1, ..., 7 round-robin and retries every NULL, as clients of NCCL's transport do.
fn sends_retried_round_robin_find_their_receive(cx: &mut Cx) {
    const CAP: usize = 10_000;
    let size_of_tag = |t: usize| 700 * (t + 1) + 3;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 9 * CAP];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let single = cx
            .net
            .irecv(rc, &[(base.wrapping_add(8 * CAP), CAP, 8, mh)]);
        let group: Vec<_> = (0..8)
            .map(|t| (base.wrapping_add(t * CAP), CAP, t as i32, mh))
            .collect();
        let grouped = cx.net.irecv(rc, &group);
        assert_eq!(cx.net.wait(single)[0], size_of_tag(8) as i32);
        let sizes = cx.net.wait(grouped);
        for t in 0..9 {
            if t < 8 {
                assert_eq!(
                    sizes[t],
                    size_of_tag(t) as i32,
                    "size of the buffer tagged {t}"
                );
            }
            let got = &buf[t * CAP..t * CAP + size_of_tag(t)];
            assert!(
                got == &pattern(60 + t as u64, size_of_tag(t))[..],
                "buffer tagged {t}"
            );
        }
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut bufs: Vec<Vec<u8>> = (0..9)
            .map(|t| pattern(60 + t as u64, size_of_tag(t)))
            .collect();
        let mhs: Vec<*mut c_void> = bufs.iter_mut().map(|b| cx.net.reg_mr(sc, b)).collect();
        let mut waiting: std::collections::VecDeque<usize> = [0, 8, 1, 2, 3, 4, 5, 6, 7].into();
        let mut reqs = Vec::new();
        let (start, mut nulls) = (Instant::now(), 0);
        while let Some(t) = waiting.pop_front() {
            let b = &mut bufs[t];
            let req = cx
                .net
                .isend_step(sc, b.as_mut_ptr(), b.len(), t as i32, mhs[t])
                .unwrap();
            if req.is_null() {
                nulls += 1;
                waiting.push_back(t);
            } else {
                reqs.push((t, req));
            }
            assert!(
                start.elapsed() < DEADLINE,
                "sends never matched: {waiting:?}"
            );
        }
        assert!(
            nulls > 0,
            "tag 0 cannot match while the tag-8 receive is at the head"
        );
        for (t, req) in reqs {
            assert_eq!(cx.net.wait(req)[0], size_of_tag(t) as i32);
        }
        for mh in mhs {
            cx.net.dereg_mr(sc, mh);
        }
        cx.net.close_send(sc);
    }
}

/// A grouped receive whose entries all carry one tag is filled in posting order.
fn equal_tags_fill_a_group_in_posting_order(cx: &mut Cx) {
    const CAP: usize = 4096;
    let size_of = |i: usize| 1000 + 333 * i;
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; 4 * CAP];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let group: Vec<_> = (0..4)
            .map(|i| (base.wrapping_add(i * CAP), CAP, 5, mh))
            .collect();
        let sizes = cx.net.wait(cx.net.irecv(rc, &group));
        for i in 0..4 {
            assert_eq!(sizes[i], size_of(i) as i32, "buffer {i} takes send {i}");
            assert!(buf[i * CAP..i * CAP + size_of(i)] == pattern(70 + i as u64, size_of(i))[..]);
        }
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut bufs: Vec<Vec<u8>> = (0..4).map(|i| pattern(70 + i as u64, size_of(i))).collect();
        let mhs: Vec<*mut c_void> = bufs.iter_mut().map(|b| cx.net.reg_mr(sc, b)).collect();
        let reqs: Vec<_> = bufs
            .iter_mut()
            .zip(&mhs)
            .map(|(b, &mh)| cx.net.isend(sc, b.as_mut_ptr(), b.len(), 5, mh))
            .collect();
        for (i, req) in reqs.into_iter().enumerate() {
            assert_eq!(cx.net.wait(req)[0], size_of(i) as i32);
        }
        for mh in mhs {
            cx.net.dereg_mr(sc, mh);
        }
        cx.net.close_send(sc);
    }
}

const SPLIT4: &[(&str, &str)] = &[
    ("NCCL_IB_QPS_PER_CONNECTION", "4"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
];
const ROTATE3: &[(&str, &str)] = &[
    ("NCCL_IB_QPS_PER_CONNECTION", "3"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "0"),
];

/// Adaptive routing forced on (rxe is RoCE, where NCCL's default leaves it off), splitting
/// sends over 4 KiB: the data as a plain write, then a zero-byte write-with-immediate, as NCCL's
/// transport posts them on InfiniBand (`p2p.cc`). The receiver needs nothing of it.
const AR4K: &[(&str, &str)] = &[
    ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
    ("NCCL_IB_AR_THRESHOLD", "4096"),
];
const AR4K_SPLIT4: &[(&str, &str)] = &[
    ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
    ("NCCL_IB_AR_THRESHOLD", "4096"),
    ("NCCL_IB_QPS_PER_CONNECTION", "4"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
];

const FUSE01: &[(&str, &str)] = &[
    ("NCCL_NET_RS_FUSE", "rxe0+rxe1"),
    ("RSIB_TEST_DEV", "rxe0+rxe1"),
];
const FUSE01_SPLIT4: &[(&str, &str)] = &[
    ("NCCL_NET_RS_FUSE", "rxe0+rxe1"),
    ("RSIB_TEST_DEV", "rxe0+rxe1"),
    ("NCCL_IB_QPS_PER_CONNECTION", "2"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
];

pub(crate) const SCENARIOS: &[Scenario] = &[
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
        env: &[&[("RSIB_TEST_DEV", "rxe1")]],
    },
    Scenario {
        name: "four_qps_split_data",
        ranks: 2,
        run: transfer_sizes,
        env: &[SPLIT4],
    },
    Scenario {
        name: "adaptive_routing_splits_sends_verified",
        ranks: 2,
        run: transfer_sizes,
        env: &[AR4K],
    },
    // Rank 1 sends: a receiver that does not split (an older build) takes split sends.
    Scenario {
        name: "adaptive_routing_on_the_sender_only",
        ranks: 2,
        run: transfer_sizes,
        env: &[&[], AR4K],
    },
    Scenario {
        name: "adaptive_routing_over_four_split_qps",
        ranks: 2,
        run: transfer_sizes,
        env: &[AR4K_SPLIT4],
    },
    Scenario {
        name: "adaptive_routing_with_grouped_receives",
        ranks: 2,
        run: grouped_receive_of_8_matches_tags,
        env: &[AR4K],
    },
    Scenario {
        name: "nccl_transport_options_are_named_and_change_nothing",
        ranks: 2,
        run: transfer_with_nccl_transport_options_set,
        env: &[&[
            ("NCCL_IB_OOO_RQ", "1"),
            ("NCCL_IB_USE_INLINE", ""),
            ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
        ]],
    },
    // Addressing knobs (NCCL_IB_ADDR_RANGE picks the GID; NCCL_IB_PKEY the partition).
    Scenario {
        name: "addr_range_picks_the_gid_inside_it",
        ranks: 2,
        run: transfer_over_the_gid_in_range,
        env: &[&[
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_IB_ADDR_FAMILY", "AF_INET6"),
            ("NCCL_IB_ADDR_RANGE", "::1/128"),
        ]],
    },
    Scenario {
        name: "addr_range_matching_nothing_keeps_the_best_gid_and_warns",
        ranks: 2,
        run: transfer_outside_any_range,
        env: &[&[("NCCL_IB_ADDR_RANGE", "10.9.0.0/16")]],
    },
    Scenario {
        name: "pkey_index_names_the_partition",
        ranks: 2,
        run: transfer_in_the_named_partition,
        env: &[&[("NCCL_DEBUG", "INFO"), ("NCCL_IB_PKEY", "0")]],
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
        name: "tag_miss_is_retry_later",
        ranks: 2,
        run: tag_miss_is_retry_later,
        env: &[],
    },
    Scenario {
        name: "sends_retried_round_robin_find_their_receive",
        ranks: 2,
        run: sends_retried_round_robin_find_their_receive,
        env: &[],
    },
    Scenario {
        name: "equal_tags_fill_a_group_in_posting_order",
        ranks: 2,
        run: equal_tags_fill_a_group_in_posting_order,
        env: &[],
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
        name: "flushes_of_many_comms_share_their_port",
        ranks: 1,
        run: flushes_of_many_comms_share_their_port,
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
            &[
                ("NCCL_NET_RS_FUSE", "rxe1+rxe2"),
                ("RSIB_TEST_DEV", "rxe1+rxe2"),
            ],
            &[("RSIB_TEST_DEV", "rxe1")],
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
];
