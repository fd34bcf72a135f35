//! ABI conformance on Soft-RoCE: the built plugin, loaded with dlopen, driven through its
//! ncclNet tables the way NCCL's proxy threads drive them, across separate processes. Every
//! common scenario runs through v8 and through v12 (`vN/name`), with the same expectations;
//! `versions.rs` adds what v9 to v11 change.
//!
//! Runs inside the VM (`scripts/rdma-vm.sh`); fails, never skips, without rxe0/rxe1. The binary
//! has its own `main`: without arguments it runs every scenario (or those whose name contains
//! the first argument), each as a group of child processes of itself (`--role NAME --rank R
//! --ranks N`). Every child listens once and prints its handle; the parent forwards the handles
//! rank r prints to rank r-1, so rank r connects to rank r+1 (mod N) and accepts from rank r-1.
//! In two-rank scenarios rank 0 receives and rank 1 sends.
#![allow(clippy::unwrap_used)] // test code panics with context

#[path = "../support/mod.rs"]
mod support;

mod abandon;
mod batch;
mod connections;
mod data_path;
mod eager;
mod failover;
mod faults;
mod queues;
mod scale;
mod versions;

use std::ffi::c_void;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::net::{Handle, Net, hex, pattern, unhex};

const RC_INTERNAL: i32 = 3;
const RC_SYSTEM: i32 = 2;
const RC_INVALID_USAGE: i32 = 5;
const RC_REMOTE: i32 = 6;

/// How long one scenario may run.
const SCENARIO_LIMIT: Duration = Duration::from_secs(900);
/// How long the other ranks may go on after one failed (what they wait for may never come).
const PEER_GRACE: Duration = Duration::from_secs(30);

/// What a child process has when its scenario starts.
struct Cx {
    net: Net,
    rank: usize,
    ranks: usize,
    dev: i32,
    lc: *mut c_void,
    /// The relay's lines (handles, KILLED); `None` once `await_kill` took it over.
    stdin: Option<BufReader<std::io::Stdin>>,
}

impl Cx {
    /// The next handle forwarded from rank + 1.
    fn peer(&mut self) -> Handle {
        let mut line = String::new();
        self.stdin
            .as_mut()
            .expect("await_kill took stdin over: read every peer handle before it")
            .read_line(&mut line)
            .unwrap();
        unhex(
            line.trim()
                .strip_prefix("PEER ")
                .unwrap_or_else(|| panic!("expected PEER, got {line:?}")),
        )
    }

    /// Ask the runner to SIGKILL this process, and wait for it.
    fn kill_me(&self) -> ! {
        println!("KILL_ME");
        std::io::stdout().flush().unwrap();
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Start watching stdin for the runner's `KILLED` (another rank was just killed); the
    /// returned cell holds the moment it arrived.
    fn await_kill(&mut self) -> Arc<std::sync::OnceLock<Instant>> {
        let seen: Arc<std::sync::OnceLock<Instant>> = Arc::default();
        let set = Arc::clone(&seen);
        let stdin = self.stdin.take().expect("await_kill called twice");
        std::thread::spawn(move || {
            for line in stdin.lines().map_while(Result::ok) {
                if line == "KILLED" {
                    let _ = set.set(Instant::now());
                }
            }
        });
        seen
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
        let req = net.isend(sc, buf.as_mut_ptr(), size, tag, mh);
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
        let req = net.irecv(rc, &[(buf.as_mut_ptr(), size, tag, mh)]);
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

/// Send pattern(rank) to rank + 1 while receiving pattern(rank - 1) from rank - 1.
fn exchange(cx: &mut Cx, sc: *mut c_void, rc: *mut c_void, len: usize) {
    let prev = (cx.rank + cx.ranks - 1) % cx.ranks;
    let mut out = pattern(cx.rank as u64, len);
    let mut inb = vec![0u8; len];
    let (smh, rmh) = (cx.net.reg_mr(sc, &mut out), cx.net.reg_mr(rc, &mut inb));
    let rreq = cx
        .net
        .irecv(rc, &[(inb.as_mut_ptr(), len, prev as i32, rmh)]);
    let sreq = cx.net.isend(sc, out.as_mut_ptr(), len, cx.rank as i32, smh);
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

/// Descriptors a device's listen comms hold while any is open: the listening socket they share
/// and its epoll set. Closing the last one (as an accept of the startup listen comm does) gives
/// both back.
const LISTENING_FDS: usize = 2;

type ScenarioFn = fn(&mut Cx);

struct Scenario {
    name: &'static str,
    ranks: usize,
    run: ScenarioFn,
    /// Environment per rank (same for all when one entry).
    env: &'static [&'static [(&'static str, &'static str)]],
}

/// Runs the ranks under the registration-recording shim (see `run_scenario`).
const REG_SHIM: (&str, &str) = ("RSIB_REG_SHIM", "1");

/// In a scenario's environment: the runner makes the test bed's second path (veth2/veth3 with
/// rxe3/rxe4) before its ranks start and removes it after they end.
const SECOND_PATH: (&str, &str) = ("RSIB_SECOND_PATH", "1");

/// In a scenario's environment, `"rxe1,rxe3"`: each rank fuses those ports with `makeVDevice`
/// (v9 and later) and uses the new device.
const VDEVICE: &str = "RSIB_TEST_VDEVICE";

/// In a scenario's environment: the runner makes rxe5 to rxe9 (on dummy netdevs, reaching
/// nothing) before its ranks start and removes them after they end, so that up to eight ports
/// can be fused.
const EXTRA_PORTS: (&str, &str) = ("RSIB_EXTRA_PORTS", "1");

/// What the runner adds to the test bed when a scenario's environment names it: the entry, and
/// `vm-guest.sh`'s option that makes (`up`) and removes (`down`) it.
const ADDITIONS: [((&str, &str), &str); 2] = [
    (SECOND_PATH, "--second-path"),
    (EXTRA_PORTS, "--extra-ports"),
];

/// In a scenario's environment: the ranks load the plugin as it ships (optimized,
/// `scripts/build-plugin.sh`) instead of the test build, for scenarios that time what the plugin
/// does at scale.
const SHIPPED: (&str, &str) = ("RSIB_TEST_SHIPPED", "1");

/// `(NON_UTF8, NAME)` in a scenario's environment sets the variable NAME to the bytes `ff fe`.
const NON_UTF8: &str = "RSIB_NON_UTF8";

/// A rank that prints `KILL_ME` is killed with SIGKILL at once; then every other rank reads
/// `KILLED` on its stdin (see `Cx::await_kill`). A killed rank needs no `DONE`.
fn kill_and_tell(pid: u32, rank: usize, stdins: &[Mutex<std::process::ChildStdin>]) {
    // The child is alive (it waits to be killed), so the pid is still its own.
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "SIGKILL of rank {rank}");
    for (other, stdin) in stdins.iter().enumerate() {
        if other != rank {
            let _ = writeln!(stdin.lock().unwrap(), "KILLED");
        }
    }
}

/// Every scenario.
fn scenarios() -> impl Iterator<Item = &'static Scenario> {
    data_path::SCENARIOS
        .iter()
        .chain(connections::SCENARIOS)
        .chain(faults::SCENARIOS)
        .chain(failover::SCENARIOS)
        .chain(failover::ONCE)
        .chain(versions::SCENARIOS)
        .chain(eager::SCENARIOS)
        .chain(batch::SCENARIOS)
        .chain(abandon::SCENARIOS)
        .chain(queues::SCENARIOS)
        .chain(scale::SCENARIOS)
}

/// The ncclNet versions the common scenarios run through: the oldest and the newest table,
/// every scenario with the same expectations. `versions.rs` covers what v9 to v11 add.
const ABIS: [u8; 2] = [8, 12];

/// What runs, in order: `(display name, scenario, version)`.
fn runs() -> Vec<(String, &'static Scenario, Option<u8>)> {
    let common = data_path::SCENARIOS
        .iter()
        .chain(connections::SCENARIOS)
        .chain(faults::SCENARIOS)
        .chain(failover::SCENARIOS);
    let mut runs: Vec<_> = ABIS
        .iter()
        .flat_map(|&abi| {
            common
                .clone()
                .map(move |s| (format!("v{abi}/{}", s.name), s, Some(abi)))
        })
        .collect();
    runs.extend(
        failover::ONCE
            .iter()
            .chain(versions::SCENARIOS)
            .chain(eager::SCENARIOS)
            .chain(batch::SCENARIOS)
            .chain(abandon::SCENARIOS)
            .chain(queues::SCENARIOS)
            .chain(scale::SCENARIOS)
            .map(|s| (s.name.to_owned(), s, None)),
    );
    runs
}

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
    let scenario = scenarios()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name}"));
    let plugin = if std::env::var_os(SHIPPED.0).is_some() {
        support::shipped_plugin_path()
    } else {
        support::plugin_path()
    };
    let net = Net::load(&plugin);
    let dev = match std::env::var(VDEVICE) {
        // As NCCL does on v9 and later: fuse the ports itself.
        Ok(ports) => {
            let members: Vec<i32> = ports.split(',').map(|p| net.device_named(p)).collect();
            net.0.make_vdevice(&members).expect("makeVDevice")
        }
        Err(_) => {
            net.device_named(&std::env::var("RSIB_TEST_DEV").unwrap_or_else(|_| "rxe0".into()))
        }
    };
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
        stdin: Some(BufReader::new(std::io::stdin())),
    };
    (scenario.run)(&mut cx);
    println!("DONE");
}

/// Helper of `failed_accept_leaves_the_listen_comm_usable`: connect to `handle` until the hello
/// (which proves the handle) has gone out, then exit without answering the listener's reply.
fn half_connect(handle: &str, dev: &str) {
    let net = Net::load(&support::plugin_path());
    let mut handle = unhex(handle);
    let dev = dev.parse().unwrap();
    assert!(net.connect_step(dev, &mut handle).unwrap().is_null());
    std::thread::sleep(Duration::from_millis(200));
    std::process::exit(0);
}

/// Run one scenario's processes, through ncclNet `abi` (or what the scenario's environment
/// says); `Err` describes the failure.
fn run_scenario(s: &Scenario, abi: Option<u8>) -> Result<(), String> {
    let wanted: Vec<&str> = ADDITIONS
        .iter()
        .filter(|(entry, _)| s.env.iter().any(|env| env.contains(entry)))
        .map(|&(_, option)| option)
        .collect();
    for option in &wanted {
        test_bed(option, "up")?;
    }
    let outcome = run_ranks(s, abi);
    wanted.iter().rev().fold(outcome, |outcome, option| {
        test_bed(option, "down").and(outcome)
    })
}

fn test_bed(option: &str, state: &str) -> Result<(), String> {
    let script = support::repo_root().join("scripts/vm-guest.sh");
    let ok = Command::new("bash")
        .arg(&script)
        .args([option, state])
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(())
        .ok_or_else(|| format!("vm-guest.sh {option} {state} failed"))
}

/// [`run_scenario`]'s processes.
fn run_ranks(s: &Scenario, abi: Option<u8>) -> Result<(), String> {
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
            if let Some((_, name)) = env.iter().find(|(k, _)| *k == NON_UTF8) {
                use std::os::unix::ffi::OsStringExt;
                cmd.env(name, std::ffi::OsString::from_vec(vec![0xff, 0xfe]));
            }
            if env.contains(&REG_SHIM) {
                let log = std::env::temp_dir().join(format!("rsib-reg-{}-{rank}.log", s.name));
                let _ = std::fs::remove_file(&log);
                cmd.env("LD_PRELOAD", reg_shim()).env("RSIB_REG_LOG", log);
            }
            if let Some(abi) = abi {
                cmd.env("RSIB_TEST_ABI", abi.to_string());
            }
            cmd.args([
                "--role",
                s.name,
                "--rank",
                &rank.to_string(),
                "--ranks",
                &s.ranks.to_string(),
            ])
            .envs(env.iter().copied().filter(|(k, _)| *k != NON_UTF8))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let stdins: Arc<Vec<Mutex<std::process::ChildStdin>>> = Arc::new(
        children
            .iter_mut()
            .map(|c| Mutex::new(c.stdin.take().unwrap()))
            .collect(),
    );
    let killed: Arc<Mutex<Vec<usize>>> = Arc::default();
    let mut readers = Vec::new();
    for (rank, c) in children.iter_mut().enumerate() {
        // Handles printed by rank r go to rank r - 1, which connects to r.
        let target = (rank + s.ranks - 1) % s.ranks;
        let stdins = Arc::clone(&stdins);
        let killed = Arc::clone(&killed);
        let pid = c.id();
        let out = c.stdout.take().unwrap();
        let err = c.stderr.take().unwrap();
        readers.push(std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(h) = line.strip_prefix("HANDLE ") {
                    let _ = writeln!(stdins[target].lock().unwrap(), "PEER {h}");
                }
                if line == "KILL_ME" {
                    kill_and_tell(pid, rank, &stdins);
                    killed.lock().unwrap().push(rank);
                }
                lines.push(line);
            }
            lines
        }));
        readers.push(std::thread::spawn(move || {
            BufReader::new(err).lines().map_while(Result::ok).collect()
        }));
    }
    let mut deadline = Instant::now() + SCENARIO_LIMIT;
    let mut statuses = vec![None; s.ranks];
    let mut timed_out = false;
    // A rank that failed leaves its peers waiting for it (a handle, a reply) until the deadline:
    // they get `PEER_GRACE` more, so one failure costs seconds, not the suite's time limit.
    let mut rank_failed = false;
    while statuses.iter().any(Option::is_none) {
        if timed_out && Instant::now() > deadline + Duration::from_secs(30) {
            return Err("timed out, and a rank did not die when killed".into());
        }
        for (rank, c) in children.iter_mut().enumerate() {
            if statuses[rank].is_none() {
                statuses[rank] = c.try_wait().unwrap();
            }
        }
        let failure = statuses.iter().enumerate().any(|(rank, st)| {
            st.is_some_and(|st| !st.success()) && !killed.lock().unwrap().contains(&rank)
        });
        if failure && !rank_failed {
            rank_failed = true;
            deadline = deadline.min(Instant::now() + PEER_GRACE);
        }
        if !timed_out && Instant::now() > deadline {
            // Kill the ranks still running and report what every rank printed.
            timed_out = true;
            children.iter_mut().for_each(|c| drop(c.kill()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdins);
    let outputs: Vec<Vec<String>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    let mut report = String::new();
    let mut failed = timed_out;
    if timed_out && rank_failed {
        report.push_str(&format!(
            "a rank failed; the others were stopped {} s later\n",
            PEER_GRACE.as_secs()
        ));
    } else if timed_out {
        report.push_str(&format!("timed out after {} s\n", SCENARIO_LIMIT.as_secs()));
    }
    for rank in 0..s.ranks {
        let (out, err) = (&outputs[2 * rank], &outputs[2 * rank + 1]);
        let status = statuses[rank].unwrap();
        let was_killed = killed.lock().unwrap().contains(&rank);
        let done = was_killed || out.iter().any(|l| l == "DONE");
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
        if !(status.success() || was_killed) || !done || expectation_missed || timed_out {
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
    if let Some(i) = args.iter().position(|a| a == "--half-connect") {
        half_connect(&args[i + 1], &args[i + 3]);
        return;
    }
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
    let all = runs();
    let chosen: Vec<_> = all.iter().filter(|r| r.0.contains(&filter)).collect();
    println!("\nrunning {} tests", chosen.len());
    let start = Instant::now();
    let mut failures = Vec::new();
    for (name, s, abi) in &chosen {
        let t = Instant::now();
        let outcome = run_scenario(s, *abi);
        let verdict = if outcome.is_ok() { "ok" } else { "FAILED" };
        println!(
            "test {name} ... {verdict} ({:.1}s)",
            t.elapsed().as_secs_f64()
        );
        if let Err(report) = outcome {
            failures.push((name, report));
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
        all.len() - chosen.len(),
        start.elapsed().as_secs_f64()
    );
    std::process::exit(i32::from(!failures.is_empty()));
}
