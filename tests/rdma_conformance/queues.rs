//! Send queues sized for the usual load (`transport::conn::SEND_QP_CAPS`: four posts per message
//! slot), under a load that needs more: 32 grouped receives of 8 buffers in flight, each message
//! ten posts on one QP (eight writes, the sizes write, the closing write-with-immediate). What a
//! full queue refuses waits in the lane's queue and goes as completions make room; every byte
//! and size arrives as sent.

use crate::support::net::pattern;
use crate::{Cx, Scenario};

const MESSAGES: usize = 32;
const GROUP: usize = 8;
/// Over the adaptive-routing threshold of the second run: each send's data then goes as a plain
/// write and its message's close as a zero-byte write-with-immediate.
const LEN: usize = 8193;

fn seed(message: usize, tag: usize) -> u64 {
    (message * GROUP + tag) as u64
}

fn grouped_receives_beyond_the_send_queue(cx: &mut Cx) {
    if cx.rank == 0 {
        let rc = cx.accept_pair();
        let mut buf = vec![0u8; MESSAGES * GROUP * LEN];
        let mh = cx.net.reg_mr(rc, &mut buf);
        let base = buf.as_mut_ptr();
        let reqs: Vec<_> = (0..MESSAGES)
            .map(|m| {
                let bufs: Vec<_> = (0..GROUP)
                    .map(|t| (base.wrapping_add((m * GROUP + t) * LEN), LEN, t as i32, mh))
                    .collect();
                cx.net.irecv(rc, &bufs)
            })
            .collect();
        for (m, r) in reqs.into_iter().enumerate() {
            let sizes = cx.net.wait(r);
            for (t, &size) in sizes.iter().enumerate().take(GROUP) {
                assert_eq!(size, LEN as i32, "message {m}, tag {t}");
                let at = (m * GROUP + t) * LEN;
                assert!(
                    buf[at..at + LEN] == pattern(seed(m, t), LEN)[..],
                    "message {m}, tag {t} holds other bytes"
                );
            }
        }
        cx.net.dereg_mr(rc, mh);
        cx.net.close_recv(rc);
    } else {
        let sc = cx.connect_pair();
        let mut buf: Vec<u8> = (0..MESSAGES)
            .flat_map(|m| (0..GROUP).flat_map(move |t| pattern(seed(m, t), LEN)))
            .collect();
        let mh = cx.net.reg_mr(sc, &mut buf);
        let base = buf.as_mut_ptr();
        // Every send posted before any is tested: nothing polls the CQ meanwhile.
        let reqs: Vec<_> = (0..MESSAGES * GROUP)
            .map(|k| {
                cx.net
                    .isend(sc, base.wrapping_add(k * LEN), LEN, (k % GROUP) as i32, mh)
            })
            .collect();
        for (k, r) in reqs.into_iter().enumerate() {
            assert_eq!(cx.net.wait(r)[0], LEN as i32, "send {k}");
        }
        cx.net.dereg_mr(sc, mh);
        cx.net.close_send(sc);
    }
}

pub(crate) const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "grouped_receives_beyond_the_send_queue",
        ranks: 2,
        run: grouped_receives_beyond_the_send_queue,
        env: &[],
    },
    Scenario {
        name: "grouped_receives_beyond_the_send_queue_split_by_adaptive_routing",
        ranks: 2,
        run: grouped_receives_beyond_the_send_queue,
        env: &[&[
            ("NCCL_IB_ADAPTIVE_ROUTING", "1"),
            ("NCCL_IB_AR_THRESHOLD", "4096"),
        ]],
    },
    Scenario {
        name: "grouped_receives_beyond_the_send_queue_fused",
        ranks: 2,
        run: grouped_receives_beyond_the_send_queue,
        env: &[&[
            ("NCCL_NET_RS_FUSE", "rxe0+rxe1"),
            ("RSIB_TEST_DEV", "rxe0+rxe1"),
        ]],
    },
];
