//! Property tests over everything that parses input from outside the process: the configuration
//! (every knob, `NCCL_IB_HCA`, `NCCL_NET_RS_FUSE`) and the wire formats (listen handle, hello,
//! CTS entry). Arbitrary input never panics; what is accepted round-trips.
#![allow(clippy::unwrap_used)] // test code panics with context

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use nccl_net::core::config::{Config, KNOBS};
use nccl_net::core::wire::{Cts, DATA_PATH_REVISION, Endpoint, Hello, ListenHandle, Role};
use nccl_net::topology::HcaFilter;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

fn knob_name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(KNOBS.iter().map(|k| k.name).collect::<Vec<_>>())
}

/// Values that look like what people type: numbers, names, separators, and noise.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        "[ \\^=a-z0-9_:,;+.-]{0,24}",
        any::<String>(),
    ]
}

proptest! {
    // Replay the saved failures (tests/properties.proptest-regressions): proptest's default
    // looks for lib.rs or main.rs beside the source, which an integration test has not, and then
    // silently replays nothing.
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn config_parsing_never_panics(vars in prop::collection::vec((knob_name(), value()), 0..8)) {
        let _ = Config::from_vars(vars);
    }

    #[test]
    fn numeric_knobs_round_trip(timeout in 1u8..=31, retry in 0u8..=7, qps in 1u32..=16, tc in 0u8..=255) {
        let c = Config::from_vars([
            ("NCCL_IB_TIMEOUT", timeout.to_string()),
            ("NCCL_IB_RETRY_CNT", retry.to_string()),
            ("NCCL_IB_QPS_PER_CONNECTION", qps.to_string()),
            ("NCCL_IB_TC", tc.to_string()),
        ]).unwrap();
        prop_assert_eq!((c.ib_timeout, c.retry_cnt, c.qps_per_connection, c.traffic_class), (timeout, retry, qps, Some(tc)));
    }

    #[test]
    fn accepted_fuse_lists_round_trip(value in value()) {
        if let Ok(c) = Config::from_vars([("NCCL_NET_RS_FUSE", value.as_str())]) {
            let again: Vec<String> = c.fuse.iter().map(|g| g.join("+")).collect();
            let reparsed = Config::from_vars([("NCCL_NET_RS_FUSE", again.join(","))]).unwrap();
            prop_assert_eq!(reparsed.fuse, c.fuse);
        }
    }

    #[test]
    fn accepted_hca_filters_round_trip(value in value(), device in "[a-z]{1,3}[0-9_]{0,3}", port in 1u32..4) {
        if let Ok(f) = HcaFilter::parse(&value) {
            let again = HcaFilter::parse(&f.canonical()).unwrap();
            prop_assert_eq!(again.allows(&device, port), f.allows(&device, port));
            prop_assert_eq!(again.canonical(), f.canonical());
        }
    }

    #[test]
    fn wire_parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1200)) {
        let _ = ListenHandle::parse(&bytes);
        let _ = Hello::parse(&bytes);
        if let Ok(entry) = <&[u8; Cts::LEN]>::try_from(&bytes[..bytes.len().min(Cts::LEN)]) {
            let _ = Cts::parse(entry);
        }
    }

    #[test]
    fn listen_handles_round_trip(ip in any::<[u8; 16]>(), v4 in any::<bool>(), port in 1u16.., nonce in any::<u64>(), members in 1u8..=8, process in any::<u64>()) {
        let ip = if v4 {
            IpAddr::V4(std::net::Ipv4Addr::new(ip[0] | 1, ip[1], ip[2], ip[3]))
        } else {
            IpAddr::V6(Ipv6Addr::from(ip))
        };
        prop_assume!(!ip.is_unspecified() && !ip.is_multicast());
        let h = ListenHandle { addr: SocketAddr::new(ip, port), nonce, members, process };
        let mut b = [0u8; ListenHandle::LEN];
        h.emit(&mut b);
        prop_assert_eq!(ListenHandle::parse(&b).unwrap(), h);
    }

    #[test]
    fn accepted_listen_handles_emit_the_same_bytes(bytes in prop::collection::vec(any::<u8>(), ListenHandle::LEN)) {
        if let Ok(h) = ListenHandle::parse(&bytes) {
            let mut b = [0u8; ListenHandle::LEN];
            h.emit(&mut b);
            prop_assert_eq!(ListenHandle::parse(&b).unwrap(), h);
        }
    }

    #[test]
    fn hellos_round_trip(
        accept in any::<bool>(),
        nonces in any::<(u64, u64)>(),
        members in 1usize..=8,
        per_member in 1usize..=16,
        seed in any::<u32>(),
        ring_addr in any::<u64>(),
        tc_sl in any::<(u8, u8)>(),
        split in any::<bool>(),
    ) {
        let endpoint = |m: usize| Endpoint {
            lid: seed as u16 ^ m as u16,
            port: 1,
            mtu: 5,
            link_layer: 2,
            roce_version: 2,
            gid: [m as u8 ^ seed as u8; 16],
            gid_index: m as u32,
            ring_rkey: seed.rotate_left(m as u32),
            device: format!("mlx5_{m}"),
        };
        let h = Hello {
            role: if accept { Role::Accept } else { Role::Connect },
            listen_nonce: nonces.0,
            connect_nonce: nonces.1,
            qpns: (0..members * per_member).map(|q| seed.wrapping_add(q as u32)).collect(),
            members: (0..members).map(endpoint).collect(),
            ring_addr,
            traffic_class: tc_sl.0,
            service_level: tc_sl.1,
            split_data: split,
            eager_bytes: seed,
            revision: DATA_PATH_REVISION,
            quiet: split,
            failover: !split,
            failover_quiet: accept,
            bounce_slots: 1 << (seed % 6),
            shares_links: seed % 3 == 0,
        };
        prop_assert_eq!(Hello::parse(&h.emit()).unwrap(), h);
    }

    #[test]
    fn cts_entries_round_trip(addr in any::<u64>(), size in any::<u64>(), rkeys in any::<[u32; 8]>(), tag in any::<i32>(), nreqs in any::<u32>(), seq in any::<u64>()) {
        let c = Cts { addr, size, rkeys, tag, nreqs, seq_plus_one: seq };
        prop_assert_eq!(Cts::parse(&c.emit()), c);
    }
}
