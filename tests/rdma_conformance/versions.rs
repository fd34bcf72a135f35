//! What ncclNet v9 to v12 add, each scenario through the versions it names: `size_t` sizes
//! beyond 2 GiB, per-communicator contexts and their traffic class, `makeVDevice`,
//! `setNetAttr`, and the properties each version reports.

use std::ffi::c_void;
use std::time::Instant;

use nccl_net::abi::types::{NCCL_PROFILE_QP, NCCL_PROFILER_NET_IB_VER, NCCL_PROFILER_NET_TYPE_IB};
use nccl_net::core::proto::MAX_MESSAGE_BYTES;
use nccl_net::driver::profiler::{self, Call};
use nccl_net::driver::{CommAttr, NetAttr, UNSUPPORTED};

use crate::support::net::{fill_pattern_at, pattern, pattern_at};
use crate::{Cx, RC_INTERNAL, RC_INVALID_USAGE, Scenario, recv_each, send_each};

/// Just over 2 GiB: the first size a C `int` cannot hold.
const BIG: usize = (1 << 31) + 4099;
/// Verified in pieces, so no second copy of the message is needed.
const PIECE: usize = 64 << 20;
/// How long the 2 GiB transfer may take in the VM.
const SLOW: std::time::Duration = std::time::Duration::from_secs(600);

/// A message just over 2 GiB through v9's `size_t` sizes, every byte checked against the
/// pattern piece by piece; `test` reports `INT_MAX` (its sizes are C ints in every version).
fn message_beyond_2_gib_is_byte_exact(cx: &mut Cx) {
    let info = cx.net.0.device(cx.dev).unwrap();
    assert_eq!(
        info.max_p2p_bytes,
        Some(MAX_MESSAGE_BYTES as usize),
        "maxP2pBytes is what the engine supports"
    );
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0xa5u8; BIG + 4096];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let start = Instant::now();
        let req = cx.net.irecv(rc, &[(buf.as_mut_ptr(), BIG, 0, mh)]);
        // Filling, pinning and moving 2 GiB under software emulation takes minutes.
        let sizes = cx.net.0.wait(req, start + SLOW).unwrap();
        assert_eq!(sizes[0], i32::MAX, "test's int sizes saturate");
        println!("NOTE {BIG} bytes received in {:?}", start.elapsed());
        for offset in (0..BIG).step_by(PIECE) {
            let end = (offset + PIECE).min(BIG);
            assert!(
                pattern_at(9, offset, &buf[offset..end]),
                "bytes {offset}..{end} differ"
            );
        }
        assert!(
            buf[BIG..].iter().all(|&b| b == 0xa5),
            "nothing past the message"
        );
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut buf = vec![0u8; BIG];
        for (k, piece) in buf.chunks_mut(PIECE).enumerate() {
            fill_pattern_at(9, k * PIECE, piece);
        }
        let mh = cx.net.reg_mr(sc, &mut buf);
        let beyond = MAX_MESSAGE_BYTES as usize + 1;
        assert_eq!(
            cx.net.isend_step(sc, buf.as_mut_ptr(), beyond, 0, mh),
            Err(RC_INTERNAL),
            "a message beyond maxP2pBytes is refused"
        );
        println!(
            "EXPECT_STDERR a send of {beyond} bytes is larger than the {MAX_MESSAGE_BYTES} bytes"
        );
        let req = cx.net.isend(sc, buf.as_mut_ptr(), BIG, 0, mh);
        let sizes = cx.net.0.wait(req, Instant::now() + SLOW).unwrap();
        assert_eq!(sizes[0], i32::MAX);
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
    }
}

/// v10 passes the communicator's traffic class to `connect`, v11+ to `init`: the sender's QPs
/// carry it (queried from the device), unless `NCCL_IB_TC`/`NCCL_IB_SL` are set, and the
/// receiver's QPs take what the sender chose (`RSIB_EXPECT_QOS`), or on RoCE the class of
/// `NCCL_IB_FIFO_TC` (`RSIB_EXPECT_RECEIVER_QOS`), as NCCL's transport sets its receiver's QPs.
fn communicator_traffic_class_reaches_the_qps(cx: &mut Cx) {
    let sender = std::env::var("RSIB_EXPECT_QOS").unwrap();
    let expected = if cx.rank == 0 {
        std::env::var("RSIB_EXPECT_RECEIVER_QOS").unwrap_or(sender)
    } else {
        sender
    };
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        recv_each(&cx.net, rc, &[(1, 4096)], 0);
        cx.net.close_recv(rc);
        println!("EXPECT_STDERR recv comm accepted: ");
    } else {
        let sc = cx.connect_pair();
        send_each(&cx.net, sc, &[(1, 4096)], 0);
        cx.net.close_send(sc);
        println!("EXPECT_STDERR send comm connected: ");
    }
    println!("EXPECT_STDERR {expected}");
}

/// The environment of `profiler_reports_each_requests_qp_events` through v10 and v12.
const PROFILED_V10: &[(&str, &str)] = &[
    ("RSIB_TEST_ABI", "10"),
    ("RSIB_TEST_PROFILER", "1"),
    ("NCCL_IB_QPS_PER_CONNECTION", "2"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
    ("NCCL_NET_RS_EAGER_BYTES", "0"),
];
const PROFILED_V12: &[(&str, &str)] = &[
    ("RSIB_TEST_ABI", "12"),
    ("RSIB_TEST_PROFILER", "1"),
    ("NCCL_IB_QPS_PER_CONNECTION", "2"),
    ("NCCL_IB_SPLIT_DATA_ON_QPS", "1"),
    ("NCCL_NET_RS_EAGER_BYTES", "0"),
];

/// Sizes of the single messages of `profiler_reports_each_requests_qp_events`.
const PROFILED: [usize; 4] = [1, 4096, 65_536 + 3, 1 << 20];

/// v10+: the QP events NCCL's IB transport reports through the profiler callback (net_ib/p2p.cc,
/// built with NCCL_ENABLE_NET_PROFILING): for each request, one event per QP that carries its
/// bytes (a send's write, a receive's posted receive), under the `phandle` passed with it, with an
/// IB descriptor (plugin id IB | 1), stopped when `test` reports the request done. Two QPs with
/// split data, so every request has an event on each; eager messages off, so that every receive
/// posts its own.
fn profiler_reports_each_requests_qp_events(cx: &mut Cx) {
    // The sender's payloads; the receiver's buffers start zeroed.
    let payload = |size: usize| pattern(size as u64, size);
    let mut bufs: Vec<Vec<u8>> = PROFILED
        .iter()
        .chain(&[4096, 4096])
        .map(|&size| {
            if cx.rank == 0 {
                vec![0; size]
            } else {
                payload(size)
            }
        })
        .collect();
    let comm = if cx.rank == 0 {
        cx.accept_pair()
    } else {
        cx.connect_pair()
    };
    let mhs: Vec<_> = bufs.iter_mut().map(|b| cx.net.reg_mr(comm, b)).collect();
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    // The single messages, then two sends of 100 and 300 bytes into one grouped receive.
    let grouped = [(4, 100, 2), (5, 300, 3)];
    let mut sent = PROFILED.to_vec();
    sent.extend(grouped.map(|(_, size, _)| size));
    if cx.rank == 0 {
        for (i, &size) in PROFILED.iter().enumerate() {
            let r = cx.net.irecv(comm, &[(ptrs[i], size, 1, mhs[i])]);
            assert_eq!(cx.net.wait(r)[0], size as i32);
        }
        let group = grouped.map(|(i, _, tag)| (ptrs[i], 4096, tag, mhs[i]));
        let r = cx.net.irecv(comm, &group);
        assert_eq!(cx.net.wait(r)[..2], [100, 300]);
        for (i, (buf, &n)) in bufs.iter().zip(&sent).enumerate() {
            assert!(buf[..n] == payload(buf.len())[..n], "buffer {i}'s bytes");
        }
    } else {
        for (i, &size) in PROFILED.iter().enumerate() {
            let s = cx.net.isend(comm, ptrs[i], size, 1, mhs[i]);
            cx.net.wait(s);
        }
        // A grouped message goes once every send of it was posted.
        let sends = grouped.map(|(i, size, tag)| cx.net.isend(comm, ptrs[i], size, tag, mhs[i]));
        for (s, (_, size, _)) in sends.into_iter().zip(grouped) {
            assert_eq!(cx.net.wait(s)[0], size as i32);
        }
    }
    let calls = profiler::take();
    let starts: Vec<_> = calls
        .iter()
        .enumerate()
        .filter_map(|(at, c)| match *c {
            Call::Start {
                handle,
                parent,
                plugin_id,
                descr,
            } => Some((at, handle, parent, plugin_id, descr)),
            _ => None,
        })
        .collect();
    assert_eq!(
        starts.len(),
        2 * ptrs.len(),
        "two QPs per request: {calls:#?}"
    );
    for &(at, handle, _, plugin_id, descr) in &starts {
        assert_eq!(
            plugin_id,
            NCCL_PROFILER_NET_TYPE_IB | NCCL_PROFILER_NET_IB_VER
        );
        assert_eq!((descr.type_, descr.qp.device), (NCCL_PROFILE_QP, 0));
        assert!(descr.qp.qpNum > 0, "{descr:?}");
        let stops: Vec<usize> = (0..calls.len())
            .filter(|&i| calls[i] == Call::Stop { handle })
            .collect();
        assert!(
            stops.len() == 1 && stops[0] > at,
            "event {handle} stopped once, after its start: {calls:#?}"
        );
    }
    for (i, ptr) in ptrs.iter().enumerate() {
        let mine: Vec<_> = starts
            .iter()
            .filter(|s| s.2 == ptr.addr())
            .map(|s| s.4.qp)
            .collect();
        assert_eq!(mine.len(), 2, "buffer {i}: one event per QP: {calls:#?}");
        assert_ne!(mine[0].qpNum, mine[1].qpNum, "buffer {i}: two QPs");
        if cx.rank == 0 {
            // A posted receive: the buffer's size, taken by a write-with-immediate.
            assert!(
                mine.iter()
                    .all(|q| q.length == bufs[i].len() && q.opcode == 1),
                "buffer {i}: {mine:?}"
            );
        } else {
            assert_eq!(
                mine.iter().map(|q| q.length).sum::<usize>(),
                sent[i],
                "buffer {i}: its bytes over both QPs: {mine:?}"
            );
            // The grouped message's sizes go through the sizes ring: its sends are plain writes.
            let expected: &[i32] = if i >= PROFILED.len() { &[0] } else { &[0, 1] };
            assert!(
                mine.iter().all(|q| expected.contains(&q.opcode)),
                "buffer {i}: {mine:?}"
            );
        }
    }
    for (&mh, _) in mhs.iter().zip(&bufs) {
        cx.net.dereg_mr(comm, mh);
    }
    if cx.rank == 0 {
        cx.net.close_recv(comm);
    } else {
        cx.net.close_send(comm);
    }
}

/// v11+: one context per communicator; the process state lives until the last is finalized,
/// comms made before keep working, and a later `init` discovers again.
fn contexts_come_and_go_with_communicators(cx: &mut Cx) {
    let net = &cx.net.0;
    let second = net.init_context(2, 5).unwrap();
    let devices = net.devices().unwrap();
    let (handle, lc) = cx.net.listen(cx.dev);
    let (sc, rc) = cx.net.connect_and_accept(cx.dev, &handle, lc);
    cx.net.close_listen(lc);
    net.finalize_context(net.context()).unwrap();
    assert_eq!(
        net.devices(),
        Ok(devices),
        "one context left: the state stays"
    );
    net.finalize_context(second).unwrap();
    assert_eq!(
        net.devices(),
        Err(RC_INTERNAL),
        "after the last finalize the state is gone"
    );
    println!("EXPECT_STDERR called before init (or after the last finalize)");
    // Comms made before outlive the contexts.
    let mut out = pattern(3, 65_536);
    let mut inb = vec![0u8; 65_536];
    let (smh, rmh) = (cx.net.reg_mr(sc, &mut out), cx.net.reg_mr(rc, &mut inb));
    let r = cx.net.irecv(rc, &[(inb.as_mut_ptr(), 65_536, 0, rmh)]);
    let s = cx.net.isend(sc, out.as_mut_ptr(), 65_536, 0, smh);
    cx.net.wait(s);
    cx.net.wait(r);
    assert!(inb == out, "a transfer after the last finalize");
    cx.net.dereg_mr(sc, smh);
    cx.net.dereg_mr(rc, rmh);
    cx.net.close_send(sc);
    cx.net.close_recv(rc);
    let third = net.init_context(3, -1).unwrap();
    assert_eq!(net.devices(), Ok(devices), "a new init discovers again");
    // Not compared with `second`: the allocator may hand the freed address out again.
    assert!(!third.is_null(), "a fresh context");
    net.finalize_context(third).unwrap();
    assert_eq!(
        net.init_context(4, 256),
        Err(RC_INVALID_USAGE),
        "a traffic class outside -1..=255"
    );
}

/// v9+: `devices` lists the ports alone; `makeVDevice` fuses the ones listed by the same rules
/// as every fusion, the new device lists them in `vProps` and carries verified data.
fn make_vdevice_fuses_ports(cx: &mut Cx) {
    let net = &cx.net.0;
    let names: Vec<String> = (0..net.devices().unwrap())
        .map(|d| net.device(d).unwrap().name)
        .collect();
    assert_eq!(names, ["rxe0", "rxe1", "rxe2"], "one device per port");
    for d in 0..3 {
        assert_eq!(
            net.device(d).unwrap().members,
            Some(vec![d]),
            "a port is its own member"
        );
    }
    let (rxe1, rxe2) = (net.device(1).unwrap(), net.device(2).unwrap());
    let fused = net.make_vdevice(&[1, 2]).unwrap();
    assert_eq!(fused, 3, "the new device comes after the ports");
    assert_eq!(net.devices(), Ok(4));
    let info = net.device(fused).unwrap();
    assert_eq!(info.name, "rxe1+rxe2");
    assert_eq!(info.members, Some(vec![1, 2]));
    assert_eq!(info.speed_mbps, rxe1.speed_mbps + rxe2.speed_mbps);
    println!("EXPECT_STDERR fusion: fused rxe1+rxe2 (");
    assert_eq!(
        net.make_vdevice(&[0, 9]),
        Err(RC_INTERNAL),
        "9 is not a port"
    );
    assert_eq!(
        net.make_vdevice(&[3, 0]),
        Err(RC_INTERNAL),
        "3 is a virtual device"
    );
    assert_eq!(
        net.make_vdevice(&[0, 1, 2, 0, 1]),
        Err(UNSUPPORTED),
        "v9 lists at most 4 members"
    );
    // Traffic over the new device, both ends in this process.
    let (handle, lc) = cx.net.listen(fused);
    let (sc, rc) = cx.net.connect_and_accept(fused, &handle, lc);
    cx.net.close_listen(lc);
    let mut out = pattern(4, 1 << 20);
    let mut inb = vec![0u8; 1 << 20];
    let (smh, rmh) = (cx.net.reg_mr(sc, &mut out), cx.net.reg_mr(rc, &mut inb));
    let r = cx.net.irecv(rc, &[(inb.as_mut_ptr(), 1 << 20, 0, rmh)]);
    let s = cx.net.isend(sc, out.as_mut_ptr(), 1 << 20, 0, smh);
    cx.net.wait(s);
    assert_eq!(cx.net.wait(r)[0], 1 << 20);
    assert!(inb == out, "payload over the fused device");
    cx.net.dereg_mr(sc, smh);
    cx.net.dereg_mr(rc, rmh);
    cx.net.close_send(sc);
    cx.net.close_recv(rc);
    cx.net.close_listen(cx.lc);
}

/// `NCCL_IB_MERGE_NICS=0`: `makeVDevice` refuses, so NCCL keeps the devices apart.
fn make_vdevice_refused_when_merging_is_off(cx: &mut Cx) {
    assert_eq!(cx.net.0.make_vdevice(&[1, 2]), Err(RC_INVALID_USAGE));
    assert_eq!(cx.net.0.devices(), Ok(3), "no device was added");
    println!("EXPECT_STDERR fusion rxe1+rxe2 refused: NCCL_IB_MERGE_NICS=0 turns fusion off");
    cx.net.close_listen(cx.lc);
}

/// An `NCCL_NET_RS_FUSE` group against the most ports the loaded table's virtual devices list
/// (`NCCL_NET_MAX_DEVS_PER_NIC`: 4 in v9 to v11, 8 in v12): within it, one more device with
/// every member in its properties; above it, refused at `init` with one WARN naming the
/// variable, the group and the limit, and every port still a device whose properties NCCL can
/// read (before, `getProperties` failed for such a group and NCCL 2.24 to 2.29 aborted).
fn fuse_group_against_the_tables_limit(cx: &mut Cx) {
    let group = std::env::var("NCCL_NET_RS_FUSE").unwrap();
    let members = group.split('+').count();
    let abi = crate::support::net::test_abi().unwrap();
    let limit = if (9..=11).contains(&abi) { 4 } else { 8 };
    let devices: Vec<_> = (0..cx.net.devices())
        .map(|d| {
            cx.net
                .0
                .device(d)
                .unwrap_or_else(|rc| panic!("getProperties({d}): {rc}"))
        })
        .collect();
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names[..8], PORTS, "every port is a device of its own");
    if members <= limit {
        assert_eq!(names[8..], [group.as_str()], "the group is one more device");
        let listed = devices[8].members.as_ref().unwrap();
        assert_eq!(
            listed,
            &[0, 1, 2, 3, 4, 5, 6, 7][8 - members..],
            "{names:?}"
        );
    } else {
        assert_eq!(names.len(), 8, "no device for the refused group: {names:?}");
        println!(
            "EXPECT_STDERR NCCL_NET_RS_FUSE group {group} refused: {members} ports, more than \
             the 4 one device of ncclNet v9 to v11 (NCCL 2.24 to 2.29) may have; its ports stay \
             separate devices"
        );
    }
    cx.net.close_listen(cx.lc);
}

/// The test bed's ports with the extra ones ([`crate::EXTRA_PORTS`]), in index order.
const PORTS: [&str; 8] = [
    "rxe0", "rxe1", "rxe2", "rxe5", "rxe6", "rxe7", "rxe8", "rxe9",
];
const FUSE4: (&str, &str) = ("NCCL_NET_RS_FUSE", "rxe6+rxe7+rxe8+rxe9");
const FUSE5: (&str, &str) = ("NCCL_NET_RS_FUSE", "rxe5+rxe6+rxe7+rxe8+rxe9");
const FUSE8: (&str, &str) = (
    "NCCL_NET_RS_FUSE",
    "rxe0+rxe1+rxe2+rxe5+rxe6+rxe7+rxe8+rxe9",
);

/// v11+ `setNetAttr`: any thread, any time; validated; recorded and logged at TRACE.
fn set_net_attr_is_validated_and_recorded(cx: &mut Cx) {
    let net = &cx.net.0;
    let ctx = net.context();
    let unset = CommAttr {
        max_peers: -1,
        min_peers: -1,
        max_flows: -1,
        min_flows: -1,
    };
    let hint = NetAttr {
        send: CommAttr {
            max_peers: 2,
            min_peers: 2,
            max_flows: 4,
            min_flows: 4,
        },
        recv: unset,
        op: 1 << 6,
        algo: u32::MAX,
        proto: u32::MAX,
    };
    // From another thread while this one moves data, as NCCL's progress thread does.
    let ctx_addr = ctx as usize;
    let (handle, lc) = cx.net.listen(cx.dev);
    let (sc, rc) = cx.net.connect_and_accept(cx.dev, &handle, lc);
    std::thread::scope(|scope| {
        let hinting = scope.spawn(|| {
            for _ in 0..200 {
                assert_eq!(
                    net.set_net_attr(ctx_addr as *mut c_void, Some(hint)),
                    Ok(())
                );
            }
        });
        let mut out = pattern(6, 8192);
        let mut inb = vec![0u8; 8192];
        let (smh, rmh) = (cx.net.reg_mr(sc, &mut out), cx.net.reg_mr(rc, &mut inb));
        for _ in 0..20 {
            let r = cx.net.irecv(rc, &[(inb.as_mut_ptr(), 8192, 0, rmh)]);
            let s = cx.net.isend(sc, out.as_mut_ptr(), 8192, 0, smh);
            cx.net.wait(s);
            cx.net.wait(r);
        }
        assert!(inb == out);
        hinting.join().unwrap();
        cx.net.dereg_mr(sc, smh);
        cx.net.dereg_mr(rc, rmh);
    });
    println!("EXPECT_STDERR setNetAttr for comm ");
    println!(
        "EXPECT_STDERR send peers 2-2 flows 4-4, recv peers *-* flows *-*, op 0x40 algo * proto *"
    );
    assert_eq!(
        net.set_net_attr(ctx, None),
        Err(RC_INTERNAL),
        "NULL attributes"
    );
    let bad = [
        NetAttr {
            op: 1 << 20,
            ..hint
        },
        NetAttr { proto: 8, ..hint },
        NetAttr {
            recv: CommAttr {
                max_flows: 1,
                min_flows: 3,
                ..unset
            },
            ..hint
        },
        NetAttr {
            send: CommAttr {
                max_peers: -7,
                ..unset
            },
            ..hint
        },
    ];
    for attr in bad {
        assert_eq!(
            net.set_net_attr(ctx, Some(attr)),
            Err(RC_INTERNAL),
            "{attr:?}"
        );
    }
    assert_eq!(
        net.set_net_attr(std::ptr::null_mut(), Some(hint)),
        Err(RC_INTERNAL),
        "a NULL context"
    );
    cx.net.close_send(sc);
    cx.net.close_recv(rc);
    cx.net.close_listen(lc);
    cx.net.close_listen(cx.lc);
}

/// Each version's properties: v9+ add `forceFlush` 0, `vProps` and 4 GiB sizes; v11+
/// `maxMultiRequestSize` 1; v12 rail and plane unknown.
fn properties_match_the_version(cx: &mut Cx) {
    let net = &cx.net.0;
    let version = net.version();
    let info = net.device(cx.dev).unwrap();
    assert_eq!(info.name, "rxe0");
    assert_eq!(info.ptr_support, 1, "host memory on rxe");
    if version >= 9 {
        assert_eq!(info.force_flush, Some(0));
        assert_eq!(info.members, Some(vec![cx.dev]));
        assert_eq!(info.max_p2p_bytes, Some(MAX_MESSAGE_BYTES as usize));
        assert_eq!(info.max_coll_bytes, Some(MAX_MESSAGE_BYTES as usize));
    }
    assert_eq!(info.max_multi_request, (version >= 11).then_some(1));
    assert_eq!(info.rail_plane, (version == 12).then_some((-1, -1)));
    // And every table moves data.
    let (handle, lc) = cx.net.listen(cx.dev);
    let (sc, rc) = cx.net.connect_and_accept(cx.dev, &handle, lc);
    let mut out = pattern(u64::from(version), 100_000);
    let mut inb = vec![0u8; 100_000];
    let (smh, rmh) = (cx.net.reg_mr(sc, &mut out), cx.net.reg_mr(rc, &mut inb));
    let r = cx.net.irecv(rc, &[(inb.as_mut_ptr(), 100_000, 7, rmh)]);
    let s = cx.net.isend(sc, out.as_mut_ptr(), 100_000, 7, smh);
    assert_eq!(cx.net.wait(s)[0], 100_000);
    assert_eq!(cx.net.wait(r)[0], 100_000);
    assert!(inb == out, "payload through ncclNet v{version}");
    cx.net.dereg_mr(sc, smh);
    cx.net.dereg_mr(rc, rmh);
    cx.net.close_send(sc);
    cx.net.close_recv(rc);
    cx.net.close_listen(lc);
    cx.net.close_listen(cx.lc);
}

pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "v8/properties",
        ranks: 1,
        run: properties_match_the_version,
        env: &[&[("RSIB_TEST_ABI", "8")]],
    },
    Scenario {
        name: "v9/properties",
        ranks: 1,
        run: properties_match_the_version,
        env: &[&[("RSIB_TEST_ABI", "9")]],
    },
    Scenario {
        name: "v10/properties",
        ranks: 1,
        run: properties_match_the_version,
        env: &[&[("RSIB_TEST_ABI", "10")]],
    },
    Scenario {
        name: "v11/properties",
        ranks: 1,
        run: properties_match_the_version,
        env: &[&[("RSIB_TEST_ABI", "11")]],
    },
    Scenario {
        name: "v12/properties",
        ranks: 1,
        run: properties_match_the_version,
        env: &[&[("RSIB_TEST_ABI", "12")]],
    },
    Scenario {
        name: "v9/message_beyond_2_gib_is_byte_exact",
        ranks: 2,
        run: message_beyond_2_gib_is_byte_exact,
        env: &[&[("RSIB_TEST_ABI", "9")]],
    },
    Scenario {
        name: "v10/connect_config_traffic_class_reaches_the_qps",
        ranks: 2,
        run: communicator_traffic_class_reaches_the_qps,
        env: &[&[
            ("RSIB_TEST_ABI", "10"),
            ("RSIB_TEST_TC", "5"),
            ("NCCL_DEBUG", "TRACE"),
            (
                "RSIB_EXPECT_QOS",
                "traffic class 5, service level 5; the QP reports traffic class 5",
            ),
        ]],
    },
    Scenario {
        name: "v11/init_config_traffic_class_reaches_the_qps",
        ranks: 2,
        run: communicator_traffic_class_reaches_the_qps,
        env: &[&[
            ("RSIB_TEST_ABI", "11"),
            ("RSIB_TEST_TC", "3"),
            ("NCCL_DEBUG", "TRACE"),
            (
                "RSIB_EXPECT_QOS",
                "traffic class 3, service level 3; the QP reports traffic class 3",
            ),
        ]],
    },
    Scenario {
        name: "v12/nccl_ib_tc_wins_over_the_communicator",
        ranks: 2,
        run: communicator_traffic_class_reaches_the_qps,
        env: &[&[
            ("RSIB_TEST_ABI", "12"),
            ("RSIB_TEST_TC", "3"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_DEBUG", "TRACE"),
            (
                "RSIB_EXPECT_QOS",
                "traffic class 106, service level 3; the QP reports traffic class 106",
            ),
        ]],
    },
    Scenario {
        name: "v12/nccl_ib_fifo_tc_is_the_receivers_class",
        ranks: 2,
        run: communicator_traffic_class_reaches_the_qps,
        env: &[&[
            ("RSIB_TEST_ABI", "12"),
            ("RSIB_TEST_TC", "3"),
            ("NCCL_IB_TC", "106"),
            ("NCCL_IB_FIFO_TC", "46"),
            ("NCCL_DEBUG", "TRACE"),
            (
                "RSIB_EXPECT_QOS",
                "traffic class 106, service level 3; the QP reports traffic class 106",
            ),
            (
                "RSIB_EXPECT_RECEIVER_QOS",
                "traffic class 46, service level 3; the QP reports traffic class 46 \
                 (NCCL_IB_FIFO_TC; the sender's is 106)",
            ),
        ]],
    },
    Scenario {
        name: "v10/profiler_reports_each_requests_qp_events",
        ranks: 2,
        run: profiler_reports_each_requests_qp_events,
        env: &[PROFILED_V10],
    },
    Scenario {
        name: "v12/profiler_reports_each_requests_qp_events",
        ranks: 2,
        run: profiler_reports_each_requests_qp_events,
        env: &[PROFILED_V12],
    },
    Scenario {
        name: "v11/contexts_come_and_go_with_communicators",
        ranks: 1,
        run: contexts_come_and_go_with_communicators,
        env: &[&[("RSIB_TEST_ABI", "11")]],
    },
    Scenario {
        name: "v9/make_vdevice_fuses_ports",
        ranks: 1,
        run: make_vdevice_fuses_ports,
        env: &[&[("RSIB_TEST_ABI", "9"), ("NCCL_DEBUG", "INFO")]],
    },
    Scenario {
        name: "v12/make_vdevice_refused_when_merging_is_off",
        ranks: 1,
        run: make_vdevice_refused_when_merging_is_off,
        env: &[&[
            ("RSIB_TEST_ABI", "12"),
            ("NCCL_IB_MERGE_NICS", "0"),
            ("NCCL_DEBUG", "INFO"),
        ]],
    },
    Scenario {
        name: "v12/set_net_attr_is_validated_and_recorded",
        ranks: 1,
        run: set_net_attr_is_validated_and_recorded,
        env: &[&[("RSIB_TEST_ABI", "12"), ("NCCL_DEBUG", "TRACE")]],
    },
    Scenario {
        name: "v9/fuse_group_of_4_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "9"), FUSE4, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v9/fuse_group_of_5_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "9"), FUSE5, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v9/fuse_group_of_8_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "9"), FUSE8, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v11/fuse_group_of_4_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "11"), FUSE4, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v11/fuse_group_of_5_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "11"), FUSE5, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v11/fuse_group_of_8_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "11"), FUSE8, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v12/fuse_group_of_4_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "12"), FUSE4, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v12/fuse_group_of_5_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "12"), FUSE5, crate::EXTRA_PORTS]],
    },
    Scenario {
        name: "v12/fuse_group_of_8_against_the_tables_limit",
        ranks: 1,
        run: fuse_group_against_the_tables_limit,
        env: &[&[("RSIB_TEST_ABI", "12"), FUSE8, crate::EXTRA_PORTS]],
    },
];
