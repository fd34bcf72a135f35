//! nccl-net-bench: measure any ncclNet plugin (v8 to v12) the way NCCL drives it.
//!
//! Two processes (rank 0 sends in the bandwidth phase and prints; rank 1 receives), connected
//! through the plugin in both directions after a TCP rendezvous that carries the listen handles.
//! For each size of the sweep: bandwidth with a fixed number of requests in flight over buffers
//! registered once, the message rate of that run, ping-pong latency, and CPU time per GB on both
//! sides; optionally every byte is verified.
//!
//! ```text
//! nccl-net-bench --plugin PATH [--abi 8..12] [--dev INDEX|NAME] [--min BYTES] [--max BYTES]
//!                [--inflight N] [--bytes BYTES] [--iters N] [--lat-iters N] [--verify] [--json]
//!                [--role both|server|client] [--rendezvous HOST:PORT]
//! ```
//! The plugin is driven through `nccl_net::driver`: the highest ncclNet version it exports
//! (or `--abi N`), with a logger at `init`, as NCCL does.
//! `--role both` (default) runs rank 1 as a child process on this node over loopback. On two
//! nodes: `--role server --rendezvous 0.0.0.0:18515` on one, `--role client --rendezvous
//! SERVER:18515` on the other.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use nccl_net::driver::{Driver, Handle, LoadOptions, Ptr, fill_pattern};

#[derive(Clone, Debug)]
struct Options {
    plugin: PathBuf,
    abi: Option<u8>,
    dev: String,
    min: usize,
    max: usize,
    inflight: usize,
    bytes_per_size: usize,
    iters: Option<usize>,
    lat_iters: Option<usize>,
    verify: bool,
    json: bool,
    role: String,
    rendezvous: String,
}

const USAGE: &str = "usage: nccl-net-bench --plugin PATH [--abi 8..12] [--dev INDEX|NAME] [--min BYTES] [--max BYTES] \
[--inflight N] [--bytes BYTES] [--iters N] [--lat-iters N] [--verify] [--json] \
[--role both|server|client] [--rendezvous HOST:PORT]";

fn parse_size(s: &str) -> Result<usize, String> {
    let (digits, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<usize>()
        .map(|d| d * mult)
        .map_err(|_| format!("'{s}' is not a size (e.g. 8, 64K, 16M)"))
}

fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut o = Options {
        plugin: PathBuf::new(),
        abi: None,
        dev: "0".into(),
        min: 8,
        max: 64 << 20,
        inflight: 8,
        bytes_per_size: 256 << 20,
        iters: None,
        lat_iters: None,
        verify: false,
        json: false,
        role: "both".into(),
        rendezvous: "127.0.0.1:0".into(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--plugin" => o.plugin = PathBuf::from(value()?),
            "--abi" => {
                o.abi = Some(
                    value()?
                        .parse()
                        .ok()
                        .filter(|v| (8..=12).contains(v))
                        .ok_or("--abi takes a version from 8 to 12")?,
                )
            }
            "--dev" => o.dev = value()?,
            "--min" => o.min = parse_size(&value()?)?,
            "--max" => o.max = parse_size(&value()?)?,
            "--inflight" => {
                o.inflight = value()?.parse().map_err(|_| "--inflight takes a number")?
            }
            "--bytes" => o.bytes_per_size = parse_size(&value()?)?,
            "--iters" => o.iters = Some(value()?.parse().map_err(|_| "--iters takes a number")?),
            "--lat-iters" => {
                o.lat_iters = Some(value()?.parse().map_err(|_| "--lat-iters takes a number")?)
            }
            "--verify" => o.verify = true,
            "--json" => o.json = true,
            "--role" => o.role = value()?,
            "--rendezvous" => o.rendezvous = value()?,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    if o.plugin.as_os_str().is_empty() {
        return Err(format!("--plugin is required\n{USAGE}"));
    }
    if o.min == 0 || o.min > o.max || o.max > i32::MAX as usize {
        return Err("sizes must satisfy 0 < --min <= --max < 2 GiB".into());
    }
    if !(1..=32).contains(&o.inflight) {
        return Err("--inflight must be 1..=32 (NCCL_NET_MAX_REQUESTS)".into());
    }
    if !["both", "server", "client"].contains(&o.role.as_str()) {
        return Err(format!("--role must be both, server or client\n{USAGE}"));
    }
    Ok(o)
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
        .unwrap_or_else(|| (o.bytes_per_size / size).clamp(4 * o.inflight, 2000))
}

fn lat_iters(o: &Options, size: usize) -> usize {
    o.lat_iters
        .unwrap_or_else(|| ((16 << 20) / size).clamp(4, 200))
}

/// CPU seconds (user + system) this process has used.
#[allow(unsafe_code)] // one getrusage call
fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: a valid out-pointer; RUSAGE_SELF always succeeds.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    // SAFETY: zero-initialised plain C data, filled by getrusage.
    let ru = unsafe { ru.assume_init() };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
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
    verified: Option<bool>,
}

impl Row {
    fn mb_per_s(&self) -> f64 {
        (self.size * self.iters) as f64 / self.seconds / 1e6
    }
    fn msg_rate(&self) -> f64 {
        self.iters as f64 / self.seconds
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

fn setup(o: &Options, ctl: &mut Control) -> Result<Endpoint, String> {
    let net = Driver::load(
        &o.plugin,
        LoadOptions {
            version: o.abi,
            ..LoadOptions::default()
        },
    )?;
    let dev = device_index(&net, &o.dev)?;
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
    let slots = if o.verify { o.inflight } else { 1 };
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
    fn send_ptr(&mut self, i: usize, verify: bool) -> *mut u8 {
        let at = if verify { i * self.slot } else { 0 };
        self.sbuf[at..].as_mut_ptr()
    }
    fn recv_ptr(&mut self, i: usize, verify: bool) -> *mut u8 {
        let at = if verify { i * self.slot } else { 0 };
        self.rbuf[at..].as_mut_ptr()
    }

    /// Bandwidth phase, sending side: keep `inflight` sends posted, complete in order.
    fn send_stream(
        &mut self,
        o: &Options,
        size: usize,
        iters: usize,
        seed: u64,
    ) -> Result<(), String> {
        let mut pending: std::collections::VecDeque<Ptr> = std::collections::VecDeque::new();
        let d = deadline();
        for i in 0..iters {
            if pending.len() == o.inflight {
                let r = pending.pop_front().unwrap_or(std::ptr::null_mut());
                self.net.wait(r, d)?;
            }
            let slot = i % o.inflight;
            if o.verify {
                let at = slot * self.slot;
                fill_pattern(seed + i as u64, &mut self.sbuf[at..at + size]);
            }
            let p = self.send_ptr(slot, o.verify);
            let (net, sc, smh) = (&self.net, self.sc, self.smh);
            pending
                .push_back(net.until_started("isend", d, || net.isend_step(sc, p, size, 0, smh))?);
        }
        for r in pending {
            self.net.wait(r, d)?;
        }
        Ok(())
    }

    /// Bandwidth phase, receiving side; returns whether every byte matched (when verifying).
    fn recv_stream(
        &mut self,
        o: &Options,
        size: usize,
        iters: usize,
        seed: u64,
    ) -> Result<bool, String> {
        let mut pending: std::collections::VecDeque<(usize, Ptr)> =
            std::collections::VecDeque::new();
        let d = deadline();
        let mut good = true;
        let mut expected = vec![0u8; if o.verify { size } else { 0 }];
        let mut complete = |ep: &mut Self, i: usize, r: Ptr| -> Result<(), String> {
            let sizes = ep.net.wait(r, d)?;
            good &= sizes[0] == size as i32;
            if o.verify {
                fill_pattern(seed + i as u64, &mut expected);
                let at = (i % o.inflight) * ep.slot;
                good &= ep.rbuf[at..at + size] == expected[..];
            }
            Ok(())
        };
        for i in 0..iters {
            if pending.len() == o.inflight {
                let (j, r) = pending.pop_front().unwrap_or((0, std::ptr::null_mut()));
                complete(self, j, r)?;
            }
            let p = self.recv_ptr(i % o.inflight, o.verify);
            let (net, rc, rmh) = (&self.net, self.rc, self.rmh);
            pending.push_back((
                i,
                net.until_started("irecv", d, || net.irecv_step(rc, &[(p, size, 0, rmh)]))?,
            ));
        }
        for (j, r) in pending {
            complete(self, j, r)?;
        }
        Ok(good)
    }

    /// Ping-pong: rank 0 pings, rank 1 answers; returns rank 0's mean one-way latency in µs.
    /// Each side keeps its next receive posted ahead (as NCCL keeps receives posted for the
    /// coming steps), so the clear-to-send travels while the previous message is in flight.
    fn ping_pong(&mut self, rank0: bool, size: usize, iters: usize) -> Result<f64, String> {
        let d = deadline();
        let (net, sc, rc, smh, rmh) = (&self.net, self.sc, self.rc, self.smh, self.rmh);
        let (sp, rp) = (self.sbuf.as_mut_ptr(), self.rbuf.as_mut_ptr());
        let post_recv =
            || net.until_started("irecv", d, || net.irecv_step(rc, &[(rp, size, 1, rmh)]));
        let send = || net.until_started("isend", d, || net.isend_step(sc, sp, size, 1, smh));
        let mut posted: std::collections::VecDeque<Ptr> = [post_recv()?, post_recv()?].into();
        let mut sends: std::collections::VecDeque<Ptr> = std::collections::VecDeque::new();
        let start = Instant::now();
        if rank0 {
            sends.push_back(send()?);
        }
        for i in 0..iters {
            let r = posted.pop_front().unwrap_or(std::ptr::null_mut());
            net.wait(r, d)?;
            // Answer (rank 1) or ping again (rank 0) first; re-posting the receive comes after,
            // off the critical path.
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
        Ok(elapsed.as_secs_f64() * 1e6 / iters as f64 / 2.0)
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
    let mut ep = setup(o, &mut ctl)?;
    let mut rows = Vec::new();
    let all = sizes(o);
    for (k, &size) in all.iter().enumerate() {
        let iters = bw_iters(o, size);
        let seed = (k as u64) << 32;
        if rank0 && !o.json {
            eprint!("\r[{}/{}] {size} B ...          ", k + 1, all.len());
        }
        // Warm-up: fill the pipeline once.
        ctl.barrier()?;
        if rank0 {
            ep.send_stream(o, size, o.inflight, seed)?
        } else {
            ep.recv_stream(o, size, o.inflight, seed).map(|_| ())?
        };
        ctl.barrier()?;
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        let verified = if rank0 {
            ep.send_stream(o, size, iters, seed).map(|()| true)?
        } else {
            ep.recv_stream(o, size, iters, seed)?
        };
        let seconds = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        ctl.barrier()?;
        let lat_us = ep.ping_pong(rank0, size, lat_iters(o, size))?;
        if rank0 {
            let cpu_recv = ctl.recv_f64()?;
            let recv_ok = ctl.recv::<1>()?[0] == 1;
            rows.push(Row {
                size,
                iters,
                seconds,
                lat_us,
                cpu_send: cpu,
                cpu_recv,
                verified: o.verify.then_some(verified && recv_ok),
            });
        } else {
            ctl.send_f64(cpu)?;
            ctl.send(&[u8::from(verified)])?;
        }
    }
    if rank0 && !o.json {
        eprint!("\r{:40}\r", "");
    }
    let _ = (
        ep.net.dereg_mr(ep.sc, ep.smh),
        ep.net.dereg_mr(ep.rc, ep.rmh),
    );
    let _ = (ep.net.close_send(ep.sc), ep.net.close_recv(ep.rc));
    Ok(Report {
        name: ep.net.name(),
        abi: ep.net.version(),
        device: ep.device,
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
        "# {} in flight, buffers registered once, {} bytes per size (iterations below), verify {}",
        o.inflight,
        o.bytes_per_size,
        if o.verify { "on" } else { "off" }
    );
    println!(
        "{:>10} {:>7} {:>12} {:>12} {:>12} {:>11} {:>11} {:>8}",
        "size(B)", "iters", "bw(MB/s)", "msgs/s", "lat(us)", "cpu-send", "cpu-recv", "verified"
    );
    println!(
        "{:>10} {:>7} {:>12} {:>12} {:>12} {:>11} {:>11} {:>8}",
        "", "", "", "", "", "(s/GB)", "(s/GB)", ""
    );
    for r in &report.rows {
        let v = match r.verified {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        println!(
            "{:>10} {:>7} {:>12.2} {:>12.0} {:>12.2} {:>11.2} {:>11.2} {:>8}",
            r.size,
            r.iters,
            r.mb_per_s(),
            r.msg_rate(),
            r.lat_us,
            r.cpu_per_gb(r.cpu_send),
            r.cpu_per_gb(r.cpu_recv),
            v
        );
    }
}

fn print_json(o: &Options, report: &Report) {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let results: Vec<String> = report
        .rows
        .iter()
        .map(|r| {
            format!(
                "{{\"size\":{},\"iters\":{},\"seconds\":{:.6},\"bw_mb_per_s\":{:.3},\"msgs_per_s\":{:.1},\"lat_us\":{:.3},\"cpu_send_s_per_gb\":{:.4},\"cpu_recv_s_per_gb\":{:.4},\"verified\":{}}}",
                r.size,
                r.iters,
                r.seconds,
                r.mb_per_s(),
                r.msg_rate(),
                r.lat_us,
                r.cpu_per_gb(r.cpu_send),
                r.cpu_per_gb(r.cpu_recv),
                r.verified.map_or("null".to_owned(), |v| v.to_string())
            )
        })
        .collect();
    println!(
        "{{\"plugin\":\"{}\",\"name\":\"{}\",\"abi\":{},\"device\":\"{}\",\"inflight\":{},\"results\":[{}]}}",
        esc(&o.plugin.display().to_string()),
        esc(&report.name),
        report.abi,
        esc(&report.device),
        o.inflight,
        results.join(",")
    );
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
    if o.role == "client" {
        let stream = connect_with_retry(&o.rendezvous)?;
        run_rank(o, false, Control(stream))?;
        return Ok(());
    }
    let listener = TcpListener::bind(&o.rendezvous)
        .map_err(|e| format!("rendezvous bind {}: {e}", o.rendezvous))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let mut child = if o.role == "both" {
        Some(spawn_client(port)?)
    } else {
        None
    };
    if child.is_none() {
        eprintln!("waiting for the client on port {port}");
    }
    let stream = accept_client(&listener, child.as_mut())?;
    let outcome = run_rank(o, true, Control(stream));
    if let Some(c) = child.as_mut() {
        let status = c.wait().map_err(|e| e.to_string())?;
        if !status.success() && outcome.is_ok() {
            return Err(format!("the receiving process failed ({status})"));
        }
    }
    let report = outcome?;
    if o.json {
        print_json(o, &report)
    } else {
        print_table(o, &report)
    }
    if report.rows.iter().any(|r| r.verified == Some(false)) {
        return Err("data verification failed".into());
    }
    Ok(())
}

/// Wait for the client; when it is our own child, stop waiting if it exits first.
fn accept_client(
    listener: &TcpListener,
    mut child: Option<&mut Child>,
) -> Result<TcpStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(stream);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    return Err(format!(
                        "the receiving process exited before connecting ({status})"
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(format!("rendezvous accept: {e}")),
        }
    }
}

fn connect_with_retry(addr: &str) -> Result<TcpStream, String> {
    let start = Instant::now();
    loop {
        match TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if start.elapsed() > Duration::from_secs(60) => {
                return Err(format!("rendezvous connect {addr}: {e}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let outcome = parse_args(&args).and_then(|o| run(&o));
    if let Err(e) = outcome {
        eprintln!("nccl-net-bench: {e}");
        std::process::exit(1);
    }
}
