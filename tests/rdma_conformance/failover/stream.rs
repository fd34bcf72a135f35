//! The streams the failover scenarios run (verified messages, a window in flight on each
//! side) and what they measure: when traffic came back over a member, the longest wait.

use std::time::{Duration, Instant};

use super::super::faults::ip_batch;
use super::super::*;

/// Messages in flight on each side while a path fails.
pub(super) const WINDOW: usize = 32;
pub(super) const MESSAGE: usize = 64 << 10;
/// How soon after its port is up again a member must carry traffic.
const RECOVERY_LIMIT: Duration = Duration::from_secs(5);

/// How long a sender streams.
#[derive(Copy, Clone)]
pub(super) enum Length {
    Messages(usize),
    For(Duration),
    /// This many messages, with a pause of the given length and no call on the comm after
    /// the first of them (once every one of those completed).
    Pausing(usize, usize, Duration),
}

/// A stream ends with `WINDOW` messages of this size, one for every receive the receiver may
/// have posted beyond the last message (no message of a stream has it).
const END: usize = 3;

/// Every message of a stream has `MESSAGE` bytes.
pub(super) fn whole(_: usize) -> usize {
    MESSAGE
}

/// Message sizes that take every path of a single-QP connection: eager (up to 4 KiB by
/// default) and rendezvous, empty and odd.
pub(super) fn mixed(i: usize) -> usize {
    [8, 4096, MESSAGE, 0, 1000, 4097, 60_001][i % 7]
}

/// Receive a stream of `MESSAGE`-byte messages, `WINDOW` receives in flight, and verify each
/// as it completes (message `i` carries `pattern(i)`); `at(i)` runs after message `i` completed,
/// with the receives after it still in flight. Returns how many messages came.
pub(super) fn stream_recv(cx: &Cx, rc: *mut c_void, at: impl FnMut(usize)) -> usize {
    stream_recv_sized(cx, rc, whole, at)
}

/// [`stream_recv`] of messages of `size(i)` bytes.
pub(super) fn stream_recv_sized(
    cx: &Cx,
    rc: *mut c_void,
    size_of: fn(usize) -> usize,
    mut at: impl FnMut(usize),
) -> usize {
    let mut bufs = vec![0u8; WINDOW * MESSAGE];
    let mh = cx.net.reg_mr(rc, &mut bufs);
    let base = bufs.as_mut_ptr();
    let slot = |i: usize| base.wrapping_add((i % WINDOW) * MESSAGE);
    let mut reqs: std::collections::VecDeque<_> = (0..WINDOW)
        .map(|i| cx.net.irecv(rc, &[(slot(i), MESSAGE, 0, mh)]))
        .collect();
    let mut count = None;
    for i in 0.. {
        let Some(req) = reqs.pop_front() else { break };
        let size = cx.net.wait(req)[0] as usize;
        if size == END || count.is_some() {
            assert_eq!(
                size, END,
                "after the first end of stream, message {i} is one too"
            );
            count.get_or_insert(i);
            continue;
        }
        assert_eq!(size, size_of(i), "size of message {i}");
        let from = (i % WINDOW) * MESSAGE;
        assert!(
            bufs[from..from + size] == pattern(i as u64, size)[..],
            "bytes of message {i}"
        );
        at(i);
        reqs.push_back(cx.net.irecv(rc, &[(slot(i + WINDOW), MESSAGE, 0, mh)]));
    }
    cx.net.dereg_mr(rc, mh);
    count.expect("the stream ended")
}

/// The sending rank of a stream: connect, send messages of `size_of(i)` bytes (message `i`
/// carrying `pattern(i)`, `WINDOW` in flight) and the stream's end, close. Returns how many
/// messages went.
pub(super) fn sender(cx: &mut Cx, length: Length, size_of: fn(usize) -> usize) -> usize {
    let sc = cx.connect_pair();
    let sent = stream_send(cx, sc, length, size_of);
    cx.net.close_send(sc);
    sent
}

fn stream_send(cx: &Cx, sc: *mut c_void, length: Length, size_of: fn(usize) -> usize) -> usize {
    let mut bufs = vec![0u8; WINDOW * MESSAGE];
    let mh = cx.net.reg_mr(sc, &mut bufs);
    let base = bufs.as_mut_ptr();
    let mut reqs = std::collections::VecDeque::new();
    let start = Instant::now();
    let more = |i: usize| match length {
        Length::Messages(n) | Length::Pausing(n, ..) => i < n,
        Length::For(d) => start.elapsed() < d,
    };
    let mut count = 0;
    while more(count) {
        if let Length::Pausing(_, at, pause) = length
            && count == at
        {
            for (req, size) in reqs.drain(..) {
                assert_eq!(cx.net.wait(req)[0], size as i32);
            }
            std::thread::sleep(pause);
        }
        if reqs.len() == WINDOW {
            let (req, size) = reqs.pop_front().unwrap();
            assert_eq!(cx.net.wait(req)[0], size as i32);
        }
        let (at, size) = ((count % WINDOW) * MESSAGE, size_of(count));
        bufs[at..at + size].copy_from_slice(&pattern(count as u64, size));
        reqs.push_back((cx.net.isend(sc, base.wrapping_add(at), size, 0, mh), size));
        count += 1;
    }
    for (req, size) in reqs {
        assert_eq!(cx.net.wait(req)[0], size as i32);
    }
    let ends: Vec<_> = (0..WINDOW)
        .map(|_| cx.net.isend(sc, base, END, 0, mh))
        .collect();
    for req in ends {
        assert_eq!(cx.net.wait(req)[0], END as i32);
    }
    cx.net.dereg_mr(sc, mh);
    count
}

/// Bring the links back (the lines of [`veth_restore_batch`], in a thread of its own: the
/// caller goes on polling its comm meanwhile, as a job would) and return once every one of
/// `devs`' ports is ACTIVE: the moment to measure a comeback from, and the restore's thread.
pub(crate) fn bring_up(
    devs: &'static [&'static str],
    batch: String,
) -> (Comeback, std::thread::JoinHandle<()>) {
    let before = devs.iter().map(|d| port_packets(d)).collect();
    let restore = std::thread::spawn(move || ip_batch(&batch));
    let start = Instant::now();
    for dev in devs {
        let path = format!("/sys/class/infiniband/{dev}/ports/1/state");
        while !std::fs::read_to_string(&path).unwrap().contains("ACTIVE") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{dev} not ACTIVE within 10 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let comeback = Comeback {
        devs,
        since: Instant::now(),
        before,
        after: None,
    };
    (comeback, restore)
}

/// Packets received on `dev` since `before`.
pub(super) fn received_since(dev: &str, before: (u64, u64)) -> u64 {
    port_packets(dev).1 - before.1
}

/// When traffic over `devs` resumed: the first moment, after `since` (their ports ACTIVE
/// again), at which every one of them has received packets since `before`.
#[derive(Clone)]
pub(crate) struct Comeback {
    devs: &'static [&'static str],
    since: Instant,
    before: Vec<(u64, u64)>,
    after: Option<Duration>,
}

impl Comeback {
    /// Look again (after each message).
    pub(crate) fn check(&mut self) {
        if self.after.is_none()
            && self
                .devs
                .iter()
                .zip(&self.before)
                .all(|(d, b)| received_since(d, *b) > 0)
        {
            self.after = Some(self.since.elapsed());
        }
    }

    /// How long it took, asserted under `RECOVERY_LIMIT`.
    pub(crate) fn within_limit(&self) -> Duration {
        let after = self.after.unwrap_or_else(|| {
            panic!(
                "{:?} carried traffic again before the stream ended",
                self.devs
            )
        });
        assert!(
            after < RECOVERY_LIMIT,
            "{:?} back within {RECOVERY_LIMIT:?}: {after:?}",
            self.devs
        );
        after
    }
}

/// The longest wait between two messages, overall and in a window of interest.
#[derive(Default)]
pub(super) struct Stalls {
    last: Option<Instant>,
    pub(super) longest: Duration,
}

impl Stalls {
    pub(super) fn message(&mut self) -> Duration {
        let gap = self.last.map_or(Duration::ZERO, |t| t.elapsed());
        self.last = Some(Instant::now());
        self.longest = self.longest.max(gap);
        gap
    }
}
