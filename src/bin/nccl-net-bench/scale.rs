//! `--comms N[,N...]`: what a plugin pays per comm when thousands are open, as in a large job's
//! all-to-all. For each N, rank 0 connects N send comms to rank 1's N receive comms in NCCL-like
//! rounds (rank 1 listens once per connection and publishes the handles of a round; rank 0
//! keeps at most `--pending` connects in progress, rank 1 as many accepts, and each listen comm
//! is closed once accepted, as NCCL's proxy does); every comm then moves one verified message.
//! Measured per N, on both processes: setup time, memory (the kernel's slab, vmalloc and page
//! tables, RSS, pinned and locked pages), descriptors, threads and verbs objects (`rdma
//! resource`, where the tool is installed), CPU and wake-ups with all N idle, the 8-byte message
//! rate on one comm while all are open, the time to close them all, and what is left after the
//! close. With `--interleave`, the other plugin runs each N too, in the same two processes, the
//! two taking turns to go first.

use std::process::Command;
use std::time::{Duration, Instant};

use nccl_net::driver::process::cpu_seconds;
use nccl_net::driver::{Driver, Handle, Ptr, fill_pattern, pattern};
use serde_json::json;

use super::{Control, Options, deadline, load};

/// Bytes of the message each comm moves once, verified.
const CHECK_BYTES: usize = 64;
/// How long both processes sleep, with every comm open and idle, to measure background work.
const IDLE: Duration = Duration::from_secs(2);
/// Messages of the rate phase and the requests it keeps in flight.
const RATE_MESSAGES: usize = 4000;
const RATE_WINDOW: usize = 8;
/// How long after the close the leftovers are read (a plugin may free some of it behind a
/// last write or its own thread's tick).
const SETTLE: Duration = Duration::from_secs(1);
/// The resources one process's measurement counts, in this order.
const FIELDS: [&str; 9] = [
    "rss_kib", "pin_kib", "lck_kib", "fds", "threads", "pd", "cq", "qp", "mr",
];

/// One process's resources at a moment (see [`FIELDS`]); verbs objects are NaN without the
/// `rdma` tool.
#[derive(Copy, Clone, Debug)]
struct Usage([f64; 9]);

impl Usage {
    /// The usage now, after handing the allocator's free pages back to the kernel: memory a
    /// plugin run before freed (the other plugin's, an earlier N's) would otherwise be reused
    /// unseen by RSS.
    fn now() -> Self {
        // SAFETY: malloc_trim only releases free memory of glibc's arenas.
        #[allow(unsafe_code)]
        unsafe {
            libc::malloc_trim(0)
        };
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| number_after(&status, name);
        let fds = std::fs::read_dir("/proc/self/fd").map_or(f64::NAN, |d| d.count() as f64);
        let verbs = verbs_objects();
        Self([
            field("VmRSS:"),
            field("VmPin:"),
            field("VmLck:"),
            fds,
            field("Threads:"),
            verbs[0],
            verbs[1],
            verbs[2],
            verbs[3],
        ])
    }

    fn get(&self, name: &str) -> f64 {
        FIELDS
            .iter()
            .position(|f| *f == name)
            .map_or(f64::NAN, |i| self.0[i])
    }

    fn send(&self, ctl: &mut Control) -> Result<(), String> {
        self.0.iter().try_for_each(|x| ctl.send_f64(*x))
    }

    fn recv(ctl: &mut Control) -> Result<Self, String> {
        let mut v = [0.0; 9];
        for x in &mut v {
            *x = ctl.recv_f64()?;
        }
        Ok(Self(v))
    }
}

/// Voluntary and involuntary context switches of every thread of this process: how often its
/// threads woke.
fn context_switches() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// This process's PDs, CQs, QPs and MRs as `rdma resource show` lists them; NaN without the
/// tool.
fn verbs_objects() -> [f64; 4] {
    let pid = format!("pid {} ", std::process::id());
    ["pd", "cq", "qp", "mr"].map(|kind| {
        match Command::new("rdma")
            .args(["resource", "show", kind])
            .output()
        {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.contains(&pid))
                .count() as f64,
            _ => f64::NAN,
        }
    })
}

/// KiB of kernel memory in use (slab, vmalloc, page tables): where a device that keeps its
/// queues in the kernel (rxe) puts them. System-wide: rank 0 reads it for both processes.
fn kernel_kib() -> f64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    ["Slab:", "VmallocUsed:", "PageTables:"]
        .iter()
        .map(|name| number_after(&meminfo, name))
        .sum()
}

/// The number after `name` on its line of a `/proc` file (`VmRSS:   1234 kB`); NaN when absent.
fn number_after(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
}

/// One plugin at one N, as rank 0 reports it: both processes' usage before, with every comm
/// open, during the idle sleep and after the close.
#[derive(Debug)]
pub(super) struct Run {
    plugin: usize,
    comms: usize,
    setup_s: f64,
    close_s: f64,
    rate: f64,
    pub(super) verified: bool,
    /// Rank 0 then rank 1.
    before: [Usage; 2],
    open: [Usage; 2],
    /// CPU seconds and context switches of the idle sleep.
    idle: [(f64, f64); 2],
    after: [Usage; 2],
    kernel: [f64; 3],
}

impl Run {
    /// `name`'s rise from before the setup to `at`, both processes together.
    fn rise(&self, at: &[Usage; 2], name: &str) -> f64 {
        (0..2)
            .map(|r| at[r].get(name) - self.before[r].get(name))
            .sum()
    }

    /// [`Self::rise`] per comm pair.
    fn per_pair(&self, at: &[Usage; 2], name: &str) -> f64 {
        self.rise(at, name) / self.comms as f64
    }

    fn kernel_per_pair(&self) -> f64 {
        (self.kernel[1] - self.kernel[0]) / self.comms as f64
    }

    /// CPU share of one core and wake-ups per second of rank `r` while idle.
    fn idle_of(&self, r: usize) -> (f64, f64) {
        let (cpu, switches) = self.idle[r];
        let s = IDLE.as_secs_f64();
        (100.0 * cpu / s, switches / s)
    }

    /// What is left after the close, both processes: `name` against before the setup.
    fn left(&self, name: &str) -> f64 {
        self.rise(&self.after, name)
    }

    fn json(&self, paths: &[String]) -> serde_json::Value {
        let (cpu0, wake0) = self.idle_of(0);
        let (cpu1, wake1) = self.idle_of(1);
        let left = |name| self.left(name);
        json!({
            "plugin": paths[self.plugin],
            "comms": self.comms,
            "verified": self.verified,
            "setup_ms_per_comm": 1e3 * self.setup_s / self.comms as f64,
            "kernel_kib_per_pair": self.kernel_per_pair(),
            "rss_kib_per_pair": self.per_pair(&self.open, "rss_kib"),
            "pinned_kib_per_pair": self.per_pair(&self.open, "pin_kib"),
            "locked_kib_per_pair": self.per_pair(&self.open, "lck_kib"),
            "fds_per_pair": self.per_pair(&self.open, "fds"),
            "threads_added": self.rise(&self.open, "threads"),
            "verbs_per_pair": {
                "pd": self.per_pair(&self.open, "pd"),
                "cq": self.per_pair(&self.open, "cq"),
                "qp": self.per_pair(&self.open, "qp"),
                "mr": self.per_pair(&self.open, "mr"),
            },
            "idle_cpu_percent": [cpu0, cpu1],
            "idle_wakeups_per_s": [wake0, wake1],
            "rate_per_s": self.rate,
            "close_s": self.close_s,
            "close_ms_per_comm": 1e3 * self.close_s / self.comms as f64,
            "left_after_close": {
                "kernel_kib": self.kernel[2] - self.kernel[0],
                "rss_kib": left("rss_kib"),
                "pinned_kib": left("pin_kib"),
                "fds": left("fds"),
                "threads": left("threads"),
                "pd": left("pd"), "cq": left("cq"), "qp": left("qp"), "mr": left("mr"),
            },
        })
    }
}

/// What rank 0 prints.
#[derive(Debug)]
pub(super) struct Report {
    paths: Vec<String>,
    names: Vec<String>,
    pub(super) runs: Vec<Run>,
}

/// Every N of `--comms`, for this plugin and, with `--interleave`, the other right after it.
pub(super) fn run_rank(
    o: &Options,
    counts: &[u32],
    rank0: bool,
    mut ctl: Control,
) -> Result<Report, String> {
    let mut paths = vec![o.plugin.clone()];
    paths.extend(o.interleave.clone());
    let nets = paths
        .iter()
        .map(|p| load(o, p))
        .collect::<Result<Vec<_>, String>>()?;
    let mut runs = Vec::new();
    for (i, &n) in counts.iter().enumerate() {
        // Alternate which plugin goes first (A B, B A, ...): the first of a pair meets the
        // kernel's caches cold and leaves them grown for the second.
        let mut order: Vec<usize> = (0..nets.len()).collect();
        if i % 2 == 1 {
            order.reverse();
        }
        let first = runs.len();
        for p in order {
            let (net, dev) = &nets[p];
            if rank0 && !o.json {
                eprint!("\r{} comms, {} ...          ", n, paths[p].display());
            }
            let run = run_one(net, *dev, n as usize, o.pending as usize, rank0, &mut ctl)
                .map_err(|e| format!("{} comms, {}: {e}", n, paths[p].display()))?;
            if let Some(mut run) = run {
                run.plugin = p;
                runs.push(run);
            }
        }
        // Reported A first, whichever ran first.
        runs[first..].sort_by_key(|r| r.plugin);
    }
    if rank0 && !o.json {
        eprint!("\r{:60}\r", "");
    }
    Ok(Report {
        paths: paths.iter().map(|p| p.display().to_string()).collect(),
        names: nets.iter().map(|(n, _)| n.name()).collect(),
        runs,
    })
}

fn failed(call: &str) -> impl Fn(i32) -> String + '_ {
    move |rc| format!("{call} failed: ncclResult {rc}")
}

/// One N on one plugin; rank 0 gets the run (rank 1 sends it its numbers).
fn run_one(
    net: &Driver,
    dev: i32,
    n: usize,
    pending: usize,
    rank0: bool,
    ctl: &mut Control,
) -> Result<Option<Run>, String> {
    ctl.barrier()?;
    let before = Usage::now();
    let kernel_before = kernel_kib();
    let t0 = Instant::now();
    let comms = connect_all(net, dev, n, pending.max(1), rank0, ctl)?;
    ctl.barrier()?;
    let setup_s = t0.elapsed().as_secs_f64();
    let verified = check_every_comm(net, &comms, rank0)?;
    ctl.barrier()?;
    let open = Usage::now();
    let kernel_open = kernel_kib();
    ctl.barrier()?;
    // Only the sleep: the snapshots' own work (reading /proc, running `rdma`) stays out.
    let quiet = (cpu_seconds(), context_switches());
    std::thread::sleep(IDLE);
    let idle = (cpu_seconds() - quiet.0, context_switches() - quiet.1);
    ctl.barrier()?;
    let rate = message_rate(net, comms[n - 1], rank0)?;
    ctl.barrier()?;
    let t1 = Instant::now();
    for &c in &comms {
        if rank0 {
            net.close_send(c).map_err(failed("closeSend"))?;
        } else {
            net.close_recv(c).map_err(failed("closeRecv"))?;
        }
    }
    ctl.barrier()?;
    let close_s = t1.elapsed().as_secs_f64();
    std::thread::sleep(SETTLE);
    ctl.barrier()?;
    let after = Usage::now();
    let kernel_after = kernel_kib();
    if !rank0 {
        for u in [before, open, after] {
            u.send(ctl)?;
        }
        ctl.send_f64(idle.0)?;
        ctl.send_f64(idle.1)?;
        ctl.send(&[u8::from(verified)])?;
        return Ok(None);
    }
    let mut peer = [before; 3];
    for u in &mut peer {
        *u = Usage::recv(ctl)?;
    }
    let peer_idle = (ctl.recv_f64()?, ctl.recv_f64()?);
    let peer_verified = ctl.recv::<1>()?[0] == 1;
    Ok(Some(Run {
        plugin: 0,
        comms: n,
        setup_s,
        close_s,
        rate,
        verified: verified && peer_verified,
        before: [before, peer[0]],
        open: [open, peer[1]],
        idle: [idle, peer_idle],
        after: [after, peer[2]],
        kernel: [kernel_before, kernel_open, kernel_after],
    }))
}

/// N comms in rounds of up to `pending`: rank 1 listens once per comm of the round and sends
/// the handles; rank 0 connects to them all at once, rank 1 accepts on each and closes the
/// listen comms once accepted.
fn connect_all(
    net: &Driver,
    dev: i32,
    n: usize,
    pending: usize,
    rank0: bool,
    ctl: &mut Control,
) -> Result<Vec<Ptr>, String> {
    let until = deadline();
    let mut comms = Vec::with_capacity(n);
    while comms.len() < n {
        let round = pending.min(n - comms.len());
        if rank0 {
            let mut handles = (0..round)
                .map(|_| ctl.recv::<128>())
                .collect::<Result<Vec<Handle>, String>>()?;
            let opened = progress_all(round, until, "connect", |i| {
                net.connect_step(dev, &mut handles[i])
                    .map_err(failed("connect"))
            })?;
            comms.extend(opened);
        } else {
            let mut lcs = Vec::with_capacity(round);
            for _ in 0..round {
                let (handle, lc) = net.listen(dev).map_err(failed("listen"))?;
                ctl.send(&handle)?;
                lcs.push(lc);
            }
            let opened = progress_all(round, until, "accept", |i| {
                net.accept_step(lcs[i]).map_err(failed("accept"))
            })?;
            for lc in lcs {
                net.close_listen(lc).map_err(failed("closeListen"))?;
            }
            comms.extend(opened);
        }
    }
    Ok(comms)
}

/// Call `step(i)` for each of `count` calls in progress until each returned a comm.
fn progress_all(
    count: usize,
    until: Instant,
    what: &str,
    mut step: impl FnMut(usize) -> Result<Ptr, String>,
) -> Result<Vec<Ptr>, String> {
    let mut done: Vec<Option<Ptr>> = vec![None; count];
    let mut left = count;
    while left > 0 {
        for (i, slot) in done.iter_mut().enumerate() {
            if slot.is_none() {
                let c = step(i)?;
                if !c.is_null() {
                    *slot = Some(c);
                    left -= 1;
                }
            }
        }
        if Instant::now() > until {
            return Err(format!("{left} of {count} {what} calls still in progress"));
        }
    }
    Ok(done.into_iter().flatten().collect())
}

/// Every comm moves one message of [`CHECK_BYTES`] (its index's pattern), in windows of 128
/// comms; the receiver checks each. Buffers are registered per comm for its message and
/// deregistered after, as NCCL registers per connection.
fn check_every_comm(net: &Driver, comms: &[Ptr], rank0: bool) -> Result<bool, String> {
    const WINDOW: usize = 128;
    let until = deadline();
    let mut verified = true;
    let mut buf = vec![0u8; WINDOW * CHECK_BYTES];
    for (w, window) in comms.chunks(WINDOW).enumerate() {
        let mut reqs = Vec::with_capacity(window.len());
        let mut mhs = Vec::with_capacity(window.len());
        for (i, &c) in window.iter().enumerate() {
            let index = (w * WINDOW + i) as u64;
            let mh = net.reg_mr(c, &mut buf).map_err(failed("regMr"))?;
            let at = buf.as_mut_ptr().wrapping_add(i * CHECK_BYTES);
            let req = if rank0 {
                fill_pattern(index, &mut buf[i * CHECK_BYTES..(i + 1) * CHECK_BYTES]);
                net.until_started("isend", until, || net.isend_step(c, at, CHECK_BYTES, 0, mh))?
            } else {
                net.until_started("irecv", until, || {
                    net.irecv_step(c, &[(at, CHECK_BYTES, 0, mh)])
                })?
            };
            reqs.push(req);
            mhs.push(mh);
        }
        for (i, &r) in reqs.iter().enumerate() {
            let sizes = net.wait(r, until)?;
            if !rank0 {
                let index = (w * WINDOW + i) as u64;
                verified &= sizes[0] == CHECK_BYTES as i32
                    && buf[i * CHECK_BYTES..(i + 1) * CHECK_BYTES]
                        == pattern(index, CHECK_BYTES)[..];
            }
        }
        for (&c, mh) in window.iter().zip(mhs) {
            net.dereg_mr(c, mh).map_err(failed("deregMr"))?;
        }
    }
    Ok(verified)
}

/// 8-byte messages per second on comm `c` ([`RATE_MESSAGES`], [`RATE_WINDOW`] in flight), as
/// rank 0 sees it.
fn message_rate(net: &Driver, c: Ptr, rank0: bool) -> Result<f64, String> {
    let until = deadline();
    let mut buf = vec![0u8; RATE_WINDOW * 8];
    let mh = net.reg_mr(c, &mut buf).map_err(failed("regMr"))?;
    let slots: Vec<*mut u8> = (0..RATE_WINDOW)
        .map(|i| buf.as_mut_ptr().wrapping_add(i * 8))
        .collect();
    let t0 = Instant::now();
    if rank0 {
        net.send_stream(
            c,
            mh,
            &slots,
            8,
            RATE_MESSAGES,
            RATE_WINDOW,
            until,
            |_, _| {},
        )?;
    } else {
        net.recv_stream(
            c,
            mh,
            &slots,
            8,
            RATE_MESSAGES,
            RATE_WINDOW,
            until,
            |_, _, _| Ok(()),
        )?;
    }
    let seconds = t0.elapsed().as_secs_f64();
    net.dereg_mr(c, mh).map_err(failed("deregMr"))?;
    Ok(RATE_MESSAGES as f64 / seconds)
}

impl Report {
    pub(super) fn print_table(&self, o: &Options) {
        println!(
            "# nccl-net-bench --comms: device {}, up to {} connects in progress; per comm pair \
             (a send comm in rank 0, a receive comm in rank 1) unless said",
            o.dev, o.pending
        );
        for (i, (path, name)) in self.paths.iter().zip(&self.names).enumerate() {
            println!("# plugin {}: {path} ({name})", char::from(b'A' + i as u8));
        }
        println!(
            "# mem: kernel (slab + vmalloc + page tables) + both RSS, KiB; pin: VmPin of both; \
             idle: CPU % of a core and wake-ups/s, rank 0/rank 1; left: after the close, both"
        );
        println!(
            "{:>2} {:>6} {:>9} {:>8} {:>8} {:>7} {:>7} {:>5} {:>4} {:>11} {:>11} {:>8} {:>8} {:>24} {:>4}",
            "",
            "comms",
            "setup ms",
            "mem KiB",
            "kern KiB",
            "RSS KiB",
            "pin KiB",
            "fds",
            "QPs",
            "idle CPU %",
            "wakeups/s",
            "msg/s",
            "close s",
            "left: kern/pin KiB, fds",
            "ok"
        );
        for r in &self.runs {
            let (c0, w0) = r.idle_of(0);
            let (c1, w1) = r.idle_of(1);
            let kernel = r.kernel_per_pair();
            let rss = r.per_pair(&r.open, "rss_kib");
            println!(
                "{:>2} {:>6} {:>9.2} {:>8.0} {:>8.0} {:>7.0} {:>7.0} {:>5.2} {:>4.1} {:>5.2}/{:<5.2} {:>5.0}/{:<5.0} {:>8.0} {:>8.2} {:>24} {:>4}",
                char::from(b'A' + r.plugin as u8),
                r.comms,
                1e3 * r.setup_s / r.comms as f64,
                kernel + rss,
                kernel,
                rss,
                r.per_pair(&r.open, "pin_kib"),
                r.per_pair(&r.open, "fds"),
                r.per_pair(&r.open, "qp"),
                c0,
                c1,
                w0,
                w1,
                r.rate,
                r.close_s,
                format!(
                    "{:.0}/{:.0}, {:.0}",
                    r.kernel[2] - r.kernel[0],
                    r.left("pin_kib"),
                    r.left("fds")
                ),
                if r.verified { "yes" } else { "NO" },
            );
        }
    }

    pub(super) fn print_json(&self, o: &Options) {
        let doc = json!({
            "mode": "comms",
            "device": o.dev,
            "pending": o.pending,
            "plugins": self.paths.iter().zip(&self.names)
                .map(|(p, n)| json!({"path": p, "name": n})).collect::<Vec<_>>(),
            "runs": self.runs.iter().map(|r| r.json(&self.paths)).collect::<Vec<_>>(),
        });
        println!("{doc}");
    }
}
