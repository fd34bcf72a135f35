//! How long quiet receives have waited without an eager arrival (see `core::proto`), reading
//! the clock only now and then.

use std::time::{Duration, Instant};

/// The wait of quiet receives since the latest eager arrival. The clock is read only every
/// [`QUIET_POLLS_PER_CLOCK_READ`] polls: where the clock source is not the TSC every read is a
/// system call (HPET in the Soft-RoCE VM, where a read on every poll made the `test` that found
/// a message about 1 µs longer).
#[derive(Debug)]
pub(super) struct QuietWait {
    /// The latest eager arrival when the wait began.
    pub(super) seen: Option<u64>,
    polls: u32,
    /// When the clock was first read in this wait.
    since: Option<Instant>,
}

/// Polls of a quiet wait between two clock reads: a few µs on a hardware NIC, far below the
/// 200 µs default of `NCCL_NET_RS_QUIET_WAIT_US`.
const QUIET_POLLS_PER_CLOCK_READ: u32 = 32;

impl QuietWait {
    pub(super) fn new(seen: Option<u64>) -> Self {
        Self {
            seen,
            polls: 0,
            since: None,
        }
    }

    /// One poll of the wait: whether it has lasted `wait` since its first clock read. `now` is
    /// called only when the clock is due: every [`QUIET_POLLS_PER_CLOCK_READ`] polls, or at
    /// once with `clock_due`.
    pub(super) fn overdue(
        &mut self,
        clock_due: bool,
        wait: Duration,
        now: impl FnOnce() -> Instant,
    ) -> bool {
        self.polls = self.polls.wrapping_add(1);
        if !clock_due && !self.polls.is_multiple_of(QUIET_POLLS_PER_CLOCK_READ) {
            return false;
        }
        let now = now();
        match self.since {
            None => {
                self.since = Some(now);
                false
            }
            Some(since) => now.duration_since(since) >= wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_micros(200);

    /// Polls `n` times at `at`, counting the clock reads; whether the last poll found it overdue.
    fn poll(w: &mut QuietWait, n: u32, clock_due: bool, at: Instant, reads: &mut u32) -> bool {
        (0..n)
            .map(|_| {
                w.overdue(clock_due, WAIT, || {
                    *reads += 1;
                    at
                })
            })
            .last()
            .unwrap_or(false)
    }

    #[test]
    fn the_clients_polls_read_the_clock_every_32nd_time() {
        let t0 = Instant::now();
        let mut w = QuietWait::new(Some(7));
        let mut reads = 0;
        assert!(!poll(&mut w, 100, false, t0, &mut reads));
        assert_eq!(reads, 3, "reads at polls 32, 64 and 96");
    }

    #[test]
    fn the_wait_runs_from_the_first_clock_read() {
        let t0 = Instant::now();
        let mut w = QuietWait::new(None);
        let mut reads = 0;
        assert!(
            !poll(&mut w, 32, false, t0, &mut reads),
            "the first read starts it"
        );
        let almost = t0 + WAIT - Duration::from_micros(1);
        assert!(!poll(&mut w, 32, false, almost, &mut reads));
        assert!(poll(&mut w, 32, false, t0 + WAIT, &mut reads));
        assert_eq!(reads, 3);
    }

    #[test]
    fn the_watchers_ticks_read_the_clock_each_time() {
        let t0 = Instant::now();
        let mut w = QuietWait::new(Some(1));
        let mut reads = 0;
        assert!(
            !poll(&mut w, 1, true, t0, &mut reads),
            "the first tick starts it"
        );
        assert!(poll(
            &mut w,
            1,
            true,
            t0 + Duration::from_millis(10),
            &mut reads
        ));
        assert_eq!(reads, 2);
    }
}
