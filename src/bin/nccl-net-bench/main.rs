//! nccl-net-bench: measure any ncclNet plugin (v8 to v12) the way NCCL drives it.
//!
//! Two processes (rank 0 sends in the bandwidth phase and prints; rank 1 receives), connected
//! through the plugin in both directions after a TCP rendezvous that carries the listen handles.
//! For each size of the sweep: bandwidth with a fixed number of requests in flight over buffers
//! registered once, the message rate of that run, ping-pong latency, and CPU time per GB on both
//! sides; optionally every byte is verified.
//!
//! `nccl-net-bench --help` lists the options.
//! The plugin is driven through `nccl_net::driver`: the highest ncclNet version it exports
//! (or `--abi N`), with a logger at `init`, as NCCL does.
//! `--role both` (default) runs rank 1 as a child process on this node over loopback. On two
//! nodes: `--role server --rendezvous 0.0.0.0:18515` on one, `--role client --rendezvous
//! SERVER:18515` on the other.

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

mod interleave;
mod scale;

use clap::{Parser, ValueEnum};
use nccl_net::driver::process::{cpu_seconds, raise_open_file_limit};
use nccl_net::driver::{Driver, Handle, LoadOptions, Ptr, fill_pattern, rendezvous};
use serde_json::json;

/// Measure any ncclNet plugin (v8 to v12) the way NCCL drives it.
#[derive(Clone, Debug, Parser)]
#[command(name = "nccl-net-bench", version)]
struct Options {
    /// The plugin library to load (libnccl-net.so of any ncclNet plugin).
    #[arg(long)]
    plugin: PathBuf,
    /// ncclNet version to drive; default: the highest the library exports.
    #[arg(long, value_parser = clap::value_parser!(u8).range(8..=12))]
    abi: Option<u8>,
    /// Plugin device, by index or name.
    #[arg(long, default_value = "0")]
    dev: String,
    /// Smallest message (8, 64K, 16M).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    min: usize,
    /// Largest message.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    max: usize,
    /// Requests in flight in the bandwidth phase (1..=32, NCCL_NET_MAX_REQUESTS).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=32))]
    inflight: u32,
    /// Bytes moved per size (sets the iteration count).
    #[arg(long = "bytes", default_value = "256M", value_parser = parse_size)]
    bytes_per_size: usize,
    /// Fixed bandwidth iterations per size.
    #[arg(long)]
    iters: Option<usize>,
    /// Fixed ping-pong iterations per size.
    #[arg(long)]
    lat_iters: Option<usize>,
    /// Untimed messages before each size's timed phases, at most a tenth of the timed ones:
    /// streamed before the bandwidth phase (at least one window), and as many ping-pong rounds
    /// before the latency, so that neither times first-use costs (page faults, lazily built
    /// state, an emulated CPU translating code), which otherwise land on the first size.
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// Check every received byte.
    #[arg(long)]
    verify: bool,
    /// Ping-pong with each receive posted only when its message is awaited (after this side's
    /// own send), as at the first step of an operation or behind a busy proxy: the
    /// clear-to-send is then on the critical path unless the plugin sends without it.
    #[arg(long, conflicts_with = "recv_preposted")]
    recv_late: bool,
    /// Ping-pong in batches of up to PREPOSTED_ROUNDS rounds whose receives both sides post
    /// before the batch (outside the timed rounds): no clear-to-send travels while the rounds
    /// run, which shows what the per-message clear-to-send costs on this device.
    #[arg(long)]
    recv_preposted: bool,
    /// Time every call of the latency phase's timed rounds and report, as the mean of both
    /// sides, how long the isend and the irecv that started a request and the test that found
    /// a receive done took (µs): where a round's time goes, in the plugin and the device's
    /// post, or between the calls. The clock reads lengthen the latency itself: compare plugins
    /// with the flag on for both.
    #[arg(long)]
    call_times: bool,
    /// A second plugin, measured in the same two processes in blocks that alternate with the
    /// first's (A B, B A, A B, ...), so that both meet the same moments of a noisy host; the
    /// table gives each plugin's median block and the median of the per-pair ratios A/B.
    /// The process's environment (LD_PRELOAD included) serves both plugins.
    #[arg(long, conflicts_with = "call_times")]
    interleave: Option<PathBuf>,
    /// Blocks per size and phase with --interleave; the iterations of a phase (--iters,
    /// --lat-iters or their defaults) are split over them, per plugin.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(2..=1000))]
    blocks: u32,
    /// Scale mode instead of the sweep: for each N of the list, N comm pairs between the two
    /// processes, connected in NCCL-like rounds, each moving one verified message; per comm the
    /// setup time, memory, descriptors, threads, idle CPU and wake-ups, the 8-byte message rate
    /// on one comm while all N are open, and the close time. With --interleave, the other
    /// plugin runs each N too, the two taking turns to go first.
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',',
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    comms: Option<Vec<u32>>,
    /// Scale mode: connects (and accepts) in progress at once, as NCCL's connect rounds (128
    /// peers per round by default).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pending: u32,
    /// One JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// `both` runs the receiver as a child process on this node.
    #[arg(long, value_enum, default_value_t = Role::Both)]
    role: Role,
    /// TCP address of the rendezvous (server: bind; client: connect).
    #[arg(long, default_value = "127.0.0.1:0")]
    rendezvous: String,
}

/// How the ping-pong posts its receives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Ping {
    /// One receive posted ahead on each side, re-posted after each answer, as NCCL does.
    Ahead,
    /// `--recv-late`.
    Late,
    /// `--recv-preposted`.
    Preposted,
}

impl Ping {
    /// How the table and the JSON name the ping-pong's receive posting.
    fn name(self) -> &'static str {
        match self {
            Self::Ahead => "ahead",
            Self::Late => "late",
            Self::Preposted => "preposted",
        }
    }
}

/// Rounds per batch of `--recv-preposted`: the receives of a batch are in flight together,
/// within NCCL_NET_MAX_REQUESTS (32) per comm.
const PREPOSTED_ROUNDS: usize = 30;

/// The calls `--call-times` times.
#[derive(Copy, Clone, Debug)]
enum Call {
    /// An isend that started a request.
    Isend,
    /// An irecv that started a request.
    Irecv,
    /// The test that found a receive done.
    Found,
}

/// Per [`Call`], the total seconds and the number of calls timed; off unless `--call-times`.
#[derive(Debug, Default)]
struct CallClock {
    on: bool,
    sums: Cell<[(f64, u32); 3]>,
}

impl CallClock {
    fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }

    /// Run `f`; when on, add its time to `call` if `counts` says the call is one of that kind
    /// (it started a request, it found the receive done).
    fn time<T>(&self, call: Call, f: impl FnOnce() -> T, counts: impl FnOnce(&T) -> bool) -> T {
        if !self.on {
            return f();
        }
        let start = Instant::now();
        let out = f();
        let took = start.elapsed().as_secs_f64();
        if counts(&out) {
            let mut sums = self.sums.get();
            let (total, n) = &mut sums[call as usize];
            *total += took;
            *n += 1;
            self.sums.set(sums);
        }
        out
    }

    /// Mean µs per timed call of each kind, in [`Call`] order (0 for a kind never timed).
    fn means_us(&self) -> [f64; 3] {
        self.sums.get().map(|(total, n)| {
            if n == 0 {
                0.0
            } else {
                total * 1e6 / f64::from(n)
            }
        })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Both,
    Server,
    Client,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (digits, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|d| d.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size (e.g. 8, 64K, 16M)"))
}

impl Options {
    fn check(self) -> Result<Self, String> {
        if self.min == 0 || self.min > self.max || self.max > i32::MAX as usize {
            return Err("sizes must satisfy 0 < --min <= --max < 2 GiB".into());
        }
        Ok(self)
    }

    fn window(&self) -> usize {
        self.inflight as usize
    }

    fn ping(&self) -> Ping {
        match (self.recv_late, self.recv_preposted) {
            (true, _) => Ping::Late,
            (_, true) => Ping::Preposted,
            _ => Ping::Ahead,
        }
    }
}

fn sizes(o: &Options) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = o.min;
    while s <= o.max {
        v.push(s);
        s = s.saturating_mul(2);
    }
    v
}

fn bw_iters(o: &Options, size: usize) -> usize {
    o.iters
        .unwrap_or_else(|| (o.bytes_per_size / size).clamp(4 * o.window(), 2000))
}

fn lat_iters(o: &Options, size: usize) -> usize {
    o.lat_iters
        .unwrap_or_else(|| ((16 << 20) / size).clamp(4, 1000))
}

/// Rank 0's progress line on stderr (not with `--json`): `Some((k, sizes, size))` shows size
/// `k` of `sizes`, `None` clears the line.
fn progress(o: &Options, rank0: bool, step: Option<(usize, usize, usize)>) {
    if !rank0 || o.json {
        return;
    }
    match step {
        Some((k, n, size)) => eprint!("\r[{}/{n}] {size} B ...          ", k + 1),
        None => eprint!("\r{:40}\r", ""),
    }
}

/// The table's `verified` cell: `yes`, `NO`, or `-` when not verifying.
fn verified_cell(verified: Option<bool>) -> &'static str {
    match verified {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    }
}

/// Set in the pattern seeds of warm-up messages, which the timed ones never use (their seeds
/// are the size's index in the high half and the message's in the low bits).
const WARMUP_SEED: u64 = 1 << 31;

/// Untimed messages before a phase of `timed` messages: `--warmup`, at most a tenth of them.
fn warmup(o: &Options, timed: usize) -> usize {
    o.warmup.min(timed / 10)
}

/// The rendezvous stream: handles, barriers and rank 1's numbers.
struct Control(TcpStream);

impl Control {
    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.0
            .write_all(bytes)
            .map_err(|e| format!("rendezvous write: {e}"))
    }
    fn recv<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut b = [0u8; N];
        self.0
            .read_exact(&mut b)
            .map_err(|e| format!("rendezvous read: {e}"))?;
        Ok(b)
    }
    fn barrier(&mut self) -> Result<(), String> {
        self.send(&[0xb])?;
        self.recv::<1>().map(|_| ())
    }
    fn send_f64(&mut self, x: f64) -> Result<(), String> {
        self.send(&x.to_le_bytes())
    }
    fn recv_f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.recv::<8>()?))
    }
}

/// One row of results.
#[derive(Debug)]
struct Row {
    size: usize,
    iters: usize,
    seconds: f64,
    lat_us: f64,
    cpu_send: f64,
    cpu_recv: f64,
    /// `--call-times`: mean µs of the timed isend, irecv and found test, both sides averaged.
    call_us: Option<[f64; 3]>,
    verified: Option<bool>,
}

impl Row {
    fn mb_per_s(&self) -> f64 {
        (self.size * self.iters) as f64 / self.seconds / 1e6
    }
    fn msg_rate(&self) -> f64 {
        self.iters as f64 / self.seconds
    }
    /// CPU microseconds one message cost a side in the bandwidth phase.
    fn cpu_us_per_msg(&self, cpu: f64) -> f64 {
        cpu * 1e6 / self.iters as f64
    }
    fn cpu_per_gb(&self, cpu: f64) -> f64 {
        cpu / ((self.size * self.iters) as f64 / 1e9)
    }
}

struct Endpoint {
    net: Driver,
    /// "name (speed Mbps)" of the plugin device in use, for the report header.
    device: String,
    sc: Ptr,
    rc: Ptr,
    sbuf: Vec<u8>,
    rbuf: Vec<u8>,
    smh: Ptr,
    rmh: Ptr,
    slot: usize,
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(600)
}

/// The plugin device `--dev` names (an index or a device name).
fn device_index(net: &Driver, dev: &str) -> Result<i32, String> {
    let ndev = net
        .devices()
        .map_err(|rc| format!("devices failed: ncclResult {rc}"))?;
    let names: Vec<String> = (0..ndev)
        .filter_map(|i| net.device(i).ok().map(|d| d.name))
        .collect();
    let index = match dev.parse::<i32>() {
        Ok(i) if (0..ndev).contains(&i) => Some(i),
        Ok(_) => None,
        Err(_) => names
            .iter()
            .position(|n| n == dev)
            .and_then(|i| i32::try_from(i).ok()),
    };
    index.ok_or_else(|| {
        format!("device {dev} not found; the plugin offers {names:?} (its log says why)")
    })
}

/// Load `plugin` (at `--abi`, with a logger, as NCCL does) and find `--dev` in it.
fn load(o: &Options, plugin: &Path) -> Result<(Driver, i32), String> {
    let net = Driver::load(
        plugin,
        LoadOptions {
            version: o.abi,
            ..LoadOptions::default()
        },
    )?;
    let dev = device_index(&net, &o.dev)?;
    Ok((net, dev))
}

/// Load `plugin`, connect to the peer's instance of it both ways and register the buffers.
fn setup(o: &Options, plugin: &Path, ctl: &mut Control) -> Result<Endpoint, String> {
    let (net, dev) = load(o, plugin)?;
    let info = net
        .device(dev)
        .map_err(|rc| format!("getProperties failed: ncclResult {rc}"))?;
    let device = format!("{} ({} Mbps)", info.name, info.speed_mbps);
    let (handle, lc) = net
        .listen(dev)
        .map_err(|rc| format!("listen failed: ncclResult {rc}"))?;
    ctl.send(&handle)?;
    let peer: Handle = ctl.recv()?;
    let (sc, rc) = net.connect_and_accept(dev, &peer, lc, deadline())?;
    net.close_listen(lc)
        .map_err(|rc| format!("closeListen failed: {rc}"))?;
    // NCCL-like: buffers registered once; one slot per request in flight when verifying.
    let slots = if o.verify { o.window() } else { 1 };
    let slot = o.max;
    let mut sbuf = vec![0u8; slot * slots];
    let mut rbuf = vec![0u8; slot * slots];
    let smh = net
        .reg_mr(sc, &mut sbuf)
        .map_err(|rc| format!("regMr failed: {rc}"))?;
    let rmh = net
        .reg_mr(rc, &mut rbuf)
        .map_err(|rc| format!("regMr failed: {rc}"))?;
    Ok(Endpoint {
        net,
        device,
        sc,
        rc,
        sbuf,
        rbuf,
        smh,
        rmh,
        slot,
    })
}

impl Endpoint {
    /// Deregister and close; the plugin's name, ncclNet version and device, for the report.
    fn close(self) -> (String, u8, String) {
        let _ = (
            self.net.dereg_mr(self.sc, self.smh),
            self.net.dereg_mr(self.rc, self.rmh),
        );
        let _ = (self.net.close_send(self.sc), self.net.close_recv(self.rc));
        (self.net.name(), self.net.version(), self.device)
    }

    /// The buffer slots of one side: one per request in flight when verifying (each message
    /// keeps its bytes until it completes), else one shared slot.
    fn slots(buf: &mut [u8], o: &Options, slot: usize) -> Vec<*mut u8> {
        let n = if o.verify { o.window() } else { 1 };
        (0..n).map(|i| buf[i * slot..].as_mut_ptr()).collect()
    }

    /// Bandwidth phase, sending side: `inflight` sends posted, completed in order.
    fn send_stream(
        &mut self,
        o: &Options,
        size: usize,
        iters: usize,
        seed: u64,
    ) -> Result<(), String> {
        let slots = Self::slots(&mut self.sbuf, o, self.slot);
        let (sbuf, slot_bytes) = (&mut self.sbuf, self.slot);
        self.net.send_stream(
            self.sc,
            self.smh,
            &slots,
            size,
            iters,
            o.window(),
            deadline(),
            |i, slot| {
                if o.verify {
                    let at = slot * slot_bytes;
                    fill_pattern(seed + i as u64, &mut sbuf[at..at + size]);
                }
            },
        )
    }

    /// Bandwidth phase, receiving side; returns whether every message had its size and (when
    /// verifying) its bytes.
    fn recv_stream(
        &mut self,
        o: &Options,
        size: usize,
        iters: usize,
        seed: u64,
    ) -> Result<bool, String> {
        let slots = Self::slots(&mut self.rbuf, o, self.slot);
        let (rbuf, slot_bytes) = (&self.rbuf, self.slot);
        let mut good = true;
        let mut expected = vec![0u8; if o.verify { size } else { 0 }];
        self.net.recv_stream(
            self.rc,
            self.rmh,
            &slots,
            size,
            iters,
            o.window(),
            deadline(),
            |i, slot, received| {
                good &= received == size;
                if o.verify {
                    fill_pattern(seed + i as u64, &mut expected);
                    let at = slot * slot_bytes;
                    good &= rbuf[at..at + size] == expected[..];
                }
                Ok(())
            },
        )?;
        Ok(good)
    }

    /// The bandwidth phase's stream of `count` messages, each side its half; whether every
    /// message arrived whole (the sender answers true).
    fn stream(
        &mut self,
        o: &Options,
        rank0: bool,
        size: usize,
        count: usize,
        seed: u64,
    ) -> Result<bool, String> {
        if rank0 {
            self.send_stream(o, size, count, seed).map(|()| true)
        } else {
            self.recv_stream(o, size, count, seed)
        }
    }

    /// The untimed stream before a bandwidth phase of `timed` messages (at least one window),
    /// with payloads of its own: a timed message then never finds its bytes already in place.
    fn warm_up(
        &mut self,
        o: &Options,
        rank0: bool,
        size: usize,
        timed: usize,
        seed: u64,
    ) -> Result<(), String> {
        let count = warmup(o, timed).max(o.window());
        self.stream(o, rank0, size, count, seed | WARMUP_SEED)
            .map(|_| ())
    }

    /// Ping-pong: rank 0 pings, rank 1 answers; returns rank 0's mean one-way latency in µs.
    /// Each side keeps its next receive posted ahead (as NCCL keeps receives posted for the
    /// coming steps), so the clear-to-send travels while the previous message is in flight;
    /// with `--recv-late` each side posts a receive only when it awaits that message: rank 0
    /// right after its ping, rank 1 at the start of each round. With `--recv-preposted` the
    /// rounds go in batches of [`PREPOSTED_ROUNDS`]: both sides post a batch's receives, meet
    /// at a barrier on the control connection (every clear-to-send has then been written), and
    /// only the rounds are timed.
    fn ping_pong(
        &mut self,
        rank0: bool,
        size: usize,
        iters: usize,
        ping: Ping,
        clock: &CallClock,
        ctl: &mut Control,
    ) -> Result<f64, String> {
        let d = deadline();
        let (net, sc, rc, smh, rmh) = (&self.net, self.sc, self.rc, self.smh, self.rmh);
        let (sp, rp) = (self.sbuf.as_mut_ptr(), self.rbuf.as_mut_ptr());
        let started = |r: &Result<Ptr, i32>| matches!(r, Ok(p) if !p.is_null());
        let post_recv = || {
            net.until_started("irecv", d, || {
                clock.time(
                    Call::Irecv,
                    || net.irecv_step(rc, &[(rp, size, 1, rmh)]),
                    started,
                )
            })
        };
        let send = || {
            net.until_started("isend", d, || {
                clock.time(
                    Call::Isend,
                    || net.isend_step(sc, sp, size, 1, smh),
                    started,
                )
            })
        };
        // Wait for a receive (a send's wait is not timed).
        let received = |r: Ptr| {
            let found = |t: &Result<Option<_>, i32>| matches!(t, Ok(Some(_)));
            net.wait_with(d, || clock.time(Call::Found, || net.test_step(r), found))
                .map(|_| ())
        };
        // One round on receive `r`, or on a receive posted when awaited.
        let round = |r: Option<Ptr>| -> Result<(), String> {
            if rank0 {
                let s = send()?;
                received(r.map_or_else(post_recv, Ok)?)?;
                net.wait(s, d)?;
            } else {
                received(r.map_or_else(post_recv, Ok)?)?;
                net.wait(send()?, d)?;
            }
            Ok(())
        };
        let one_way_us = |elapsed: Duration| elapsed.as_secs_f64() * 1e6 / iters as f64 / 2.0;
        match ping {
            Ping::Late => {
                let start = Instant::now();
                for _ in 0..iters {
                    round(None)?;
                }
                Ok(one_way_us(start.elapsed()))
            }
            Ping::Preposted => {
                let mut timed = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let rounds = PREPOSTED_ROUNDS.min(iters - done);
                    let recvs = (0..rounds)
                        .map(|_| post_recv())
                        .collect::<Result<Vec<_>, _>>()?;
                    ctl.barrier()?;
                    let start = Instant::now();
                    for r in recvs {
                        round(Some(r))?;
                    }
                    timed += start.elapsed();
                    done += rounds;
                }
                Ok(one_way_us(timed))
            }
            Ping::Ahead => {
                // Two ahead (one round needs one).
                let mut posted = (0..iters.min(2))
                    .map(|_| post_recv())
                    .collect::<Result<std::collections::VecDeque<Ptr>, _>>()?;
                let mut sends: std::collections::VecDeque<Ptr> = std::collections::VecDeque::new();
                let start = Instant::now();
                if rank0 {
                    sends.push_back(send()?);
                }
                for i in 0..iters {
                    let r = posted.pop_front().unwrap_or(std::ptr::null_mut());
                    received(r)?;
                    // Answer (rank 1) or ping again (rank 0) first; re-posting the receive comes
                    // after, off the critical path.
                    if !rank0 || i + 1 < iters {
                        sends.push_back(send()?);
                    }
                    if i + 2 < iters {
                        posted.push_back(post_recv()?);
                    }
                    while sends.len() > 1 {
                        let s = sends.pop_front().unwrap_or(std::ptr::null_mut());
                        net.wait(s, d)?;
                    }
                }
                let elapsed = start.elapsed();
                for r in sends.into_iter().chain(posted) {
                    net.wait(r, d)?;
                }
                Ok(one_way_us(elapsed))
            }
        }
    }
}

/// What rank 0 prints: the plugin, its device, one row per size.
struct Report {
    name: String,
    abi: u8,
    device: String,
    rows: Vec<Row>,
}

fn run_rank(o: &Options, rank0: bool, mut ctl: Control) -> Result<Report, String> {
    let mut ep = setup(o, &o.plugin, &mut ctl)?;
    let mut rows = Vec::new();
    let all = sizes(o);
    for (k, &size) in all.iter().enumerate() {
        let iters = bw_iters(o, size);
        let seed = (k as u64) << 32;
        progress(o, rank0, Some((k, all.len(), size)));
        ctl.barrier()?;
        ep.warm_up(o, rank0, size, iters, seed)?;
        ctl.barrier()?;
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        let verified = ep.stream(o, rank0, size, iters, seed)?;
        let seconds = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        ctl.barrier()?;
        let rounds = lat_iters(o, size);
        let ping_warmup = warmup(o, rounds);
        if ping_warmup > 0 {
            let untimed = CallClock::default();
            ep.ping_pong(rank0, size, ping_warmup, o.ping(), &untimed, &mut ctl)?;
        }
        let clock = CallClock::new(o.call_times);
        let lat_us = ep.ping_pong(rank0, size, rounds, o.ping(), &clock, &mut ctl)?;
        let mine = clock.means_us();
        if rank0 {
            let cpu_recv = ctl.recv_f64()?;
            let recv_ok = ctl.recv::<1>()?[0] == 1;
            let call_us = if o.call_times {
                let mut both = mine;
                for mean in &mut both {
                    *mean = (*mean + ctl.recv_f64()?) / 2.0;
                }
                Some(both)
            } else {
                None
            };
            rows.push(Row {
                size,
                iters,
                seconds,
                lat_us,
                cpu_send: cpu,
                cpu_recv,
                call_us,
                verified: o.verify.then_some(verified && recv_ok),
            });
        } else {
            ctl.send_f64(cpu)?;
            ctl.send(&[u8::from(verified)])?;
            if o.call_times {
                mine.iter().try_for_each(|&mean| ctl.send_f64(mean))?;
            }
        }
    }
    progress(o, rank0, None);
    let (name, abi, device) = ep.close();
    Ok(Report {
        name,
        abi,
        device,
        rows,
    })
}

fn print_table(o: &Options, report: &Report) {
    println!(
        "# nccl-net-bench: plugin {} ({}, ncclNet v{}), device {}",
        o.plugin.display(),
        report.name,
        report.abi,
        report.device
    );
    println!(
        "# {} in flight, buffers registered once, {} bytes per size (iterations below), verify {}, \
         ping-pong receives {}, warm-up up to {} untimed{}",
        o.inflight,
        o.bytes_per_size,
        if o.verify { "on" } else { "off" },
        o.ping().name(),
        o.warmup,
        if o.call_times {
            "; the latency phase's calls timed (mean of both sides; the clock reads lengthen lat)"
        } else {
            ""
        }
    );
    let calls = |cells: [&str; 3]| {
        if o.call_times {
            format!(" {:>9} {:>9} {:>9}", cells[0], cells[1], cells[2])
        } else {
            String::new()
        }
    };
    println!(
        "{:>10} {:>7} {:>12} {:>12} {:>12} {:>11} {:>11} {:>8}{}",
        "size(B)",
        "iters",
        "bw(MB/s)",
        "msgs/s",
        "lat(us)",
        "cpu-send",
        "cpu-recv",
        "verified",
        calls(["isend", "irecv", "found"])
    );
    println!(
        "{:>10} {:>7} {:>12} {:>12} {:>12} {:>11} {:>11} {:>8}{}",
        "",
        "",
        "",
        "",
        "",
        "(s/GB)",
        "(s/GB)",
        "",
        calls(["(us)", "(us)", "(us)"])
    );
    for r in &report.rows {
        let v = verified_cell(r.verified);
        let means = r.call_us.map(|m| m.map(|us| format!("{us:.2}")));
        println!(
            "{:>10} {:>7} {:>12.2} {:>12.0} {:>12.2} {:>11.2} {:>11.2} {:>8}{}",
            r.size,
            r.iters,
            r.mb_per_s(),
            r.msg_rate(),
            r.lat_us,
            r.cpu_per_gb(r.cpu_send),
            r.cpu_per_gb(r.cpu_recv),
            v,
            means
                .as_ref()
                .map_or_else(String::new, |m| calls([&m[0], &m[1], &m[2]]))
        );
    }
}

fn print_json(o: &Options, report: &Report) {
    let results: Vec<serde_json::Value> = report
        .rows
        .iter()
        .map(|r| {
            json!({
                "size": r.size,
                "iters": r.iters,
                "seconds": r.seconds,
                "bw_mb_per_s": r.mb_per_s(),
                "msgs_per_s": r.msg_rate(),
                "lat_us": r.lat_us,
                "cpu_send_s_per_gb": r.cpu_per_gb(r.cpu_send),
                "cpu_recv_s_per_gb": r.cpu_per_gb(r.cpu_recv),
                "cpu_send_us_per_msg": r.cpu_us_per_msg(r.cpu_send),
                "cpu_recv_us_per_msg": r.cpu_us_per_msg(r.cpu_recv),
                "verified": r.verified,
                "call_us": r.call_us.map(|[isend, irecv, found]| json!({
                    "isend": isend,
                    "irecv": irecv,
                    "found_test": found,
                })),
            })
        })
        .collect();
    let doc = json!({
        "plugin": o.plugin.display().to_string(),
        "name": report.name,
        "abi": report.abi,
        "device": report.device,
        "inflight": o.inflight,
        "ping": o.ping().name(),
        "warmup": o.warmup,
        "call_times": o.call_times,
        "results": results,
    });
    println!("{doc}");
}

fn spawn_client(port: u16) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.extend([
        "--role".into(),
        "client".into(),
        "--rendezvous".into(),
        format!("127.0.0.1:{port}"),
    ]);
    Command::new(exe)
        .args(args)
        .spawn()
        .map_err(|e| format!("cannot start the receiving process: {e}"))
}

fn run(o: &Options) -> Result<(), String> {
    if o.role == Role::Client {
        let stream = rendezvous::connect(&o.rendezvous, deadline())
            .map_err(|e| format!("rendezvous connect {}: {e}", o.rendezvous))?;
        run_ranks(o, false, Control(stream))?;
        return Ok(());
    }
    let listener = TcpListener::bind(&o.rendezvous)
        .map_err(|e| format!("rendezvous bind {}: {e}", o.rendezvous))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let mut child = if o.role == Role::Both {
        Some(spawn_client(port)?)
    } else {
        None
    };
    if child.is_none() {
        eprintln!("waiting for the client on port {port}");
    }
    // When the client is our own child, stop waiting if it exits first.
    let stream = rendezvous::accept(&listener, deadline(), || {
        let status = child.as_mut()?.try_wait().ok()??;
        Some(format!(
            "the receiving process exited before connecting ({status})"
        ))
    })
    .map_err(|e| format!("rendezvous accept: {e}"))?;
    let outcome = run_ranks(o, true, Control(stream));
    if let Some(c) = child.as_mut() {
        let status = c.wait().map_err(|e| e.to_string())?;
        if !status.success() && outcome.is_ok() {
            return Err(format!("the receiving process failed ({status})"));
        }
    }
    let verified = match outcome? {
        Outcome::Sweep(report) => {
            if o.json {
                print_json(o, &report)
            } else {
                print_table(o, &report)
            }
            report.rows.iter().all(|r| r.verified != Some(false))
        }
        Outcome::Interleaved(report) => {
            if o.json {
                report.print_json(o)
            } else {
                report.print_table(o)
            }
            report.rows.iter().all(|r| r.verified != Some(false))
        }
        Outcome::Scale(report) => {
            if o.json {
                report.print_json(o)
            } else {
                report.print_table(o)
            }
            report.runs.iter().all(|r| r.verified)
        }
    };
    if !verified {
        return Err("data verification failed".into());
    }
    Ok(())
}

/// What rank 0 prints.
enum Outcome {
    Sweep(Report),
    Interleaved(interleave::Report),
    Scale(scale::Report),
}

/// One rank's run: the sweep of one plugin, or with `--interleave` of two in alternating blocks.
fn run_ranks(o: &Options, rank0: bool, ctl: Control) -> Result<Outcome, String> {
    if let Some(counts) = &o.comms {
        return scale::run_rank(o, counts, rank0, ctl).map(Outcome::Scale);
    }
    match &o.interleave {
        Some(other) => interleave::run_rank(o, other, rank0, ctl).map(Outcome::Interleaved),
        None => run_rank(o, rank0, ctl).map(Outcome::Sweep),
    }
}

fn main() {
    let options = Options::parse().check().unwrap_or_else(|e| {
        // A usage error, like clap's own.
        eprintln!("nccl-net-bench: {e}");
        std::process::exit(2);
    });
    // As NCCL: a limit it cannot raise stays as it was (a plugin that reaches it says so).
    let _ = raise_open_file_limit();
    if let Err(e) = run(&options) {
        eprintln!("nccl-net-bench: {e}");
        std::process::exit(1);
    }
}
