//! The benchmark, run briefly in the VM against this plugin: every size of the sweep must be in
//! its JSON with data verified end to end and a positive bandwidth and latency.
#![allow(clippy::unwrap_used)] // test code panics with context

mod support;

use std::process::Command;
use std::sync::{PoisonError, RwLock};

/// rxe0 and the VM's two vCPUs: benchmark runs share them (libtest runs tests in parallel), the
/// side-by-side, whose perftest runs fail when other ranks spin beside them (in two full runs its
/// `ib_write_lat` failed at most sizes), has them alone.
static DEVICE: RwLock<()> = RwLock::new(());

/// Run the benchmark, killed after 5 minutes: a hang fails the test instead of stalling the
/// suite.
fn bench(args: &[&str]) -> (bool, String, String) {
    let _shared = DEVICE.read().unwrap_or_else(PoisonError::into_inner);
    run_bench(args, 300)
}

/// The benchmark with `args`, killed after `seconds`; the caller holds [`DEVICE`].
fn run_bench(args: &[&str], seconds: u32) -> (bool, String, String) {
    let out = Command::new("timeout")
        .arg(seconds.to_string())
        .arg(env!("CARGO_BIN_EXE_nccl-net-bench"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A verified sweep on rxe0 with `args` (sizes, counts, modes), in JSON; fails the test with
/// the benchmark's output when it fails (or hangs).
fn verified_sweep(args: &[&str]) -> serde_json::Value {
    verified_sweep_of(&support::plugin_path(), args)
}

/// [`verified_sweep`] of the plugin at `plugin`.
fn verified_sweep_of(plugin: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--plugin", plugin.to_str().unwrap(), "--dev", "rxe0"];
    all.extend_from_slice(args);
    all.extend(["--verify", "--json"]);
    let (ok, stdout, stderr) = bench(&all);
    assert!(
        ok,
        "benchmark failed (a hang is killed after 300 s):\n{stdout}\n{stderr}"
    );
    serde_json::from_str(&stdout).unwrap()
}

/// The rows of a sweep's JSON: `count` of them, each with its data verified and a positive
/// latency; `what` names the run in a failure.
fn verified_rows<'a>(
    doc: &'a serde_json::Value,
    count: usize,
    what: &str,
) -> &'a [serde_json::Value] {
    let rows = doc["results"].as_array().unwrap();
    assert_eq!(rows.len(), count, "{what}: {doc}");
    for row in rows {
        assert_eq!(row["verified"], true, "data not verified ({what}): {row}");
        assert!(row["lat_us"].as_f64().unwrap() > 0.0, "{what}: {row}");
    }
    rows
}

/// The benchmark's ping-pongs: receives posted ahead (the default), late, preposted.
const PING_MODES: [Option<&str>; 3] = [None, Some("--recv-late"), Some("--recv-preposted")];

/// The benchmark's table for this plugin with `args`; fails the test when the run fails.
fn table(args: &[&str]) -> String {
    let plugin = support::plugin_path();
    let mut all = vec!["--plugin", plugin.to_str().unwrap()];
    all.extend_from_slice(args);
    let (ok, stdout, stderr) = bench(&all);
    assert!(ok, "benchmark failed:\n{stdout}\n{stderr}");
    stdout
}

#[test]
fn sweep_reports_every_size_with_verified_data() {
    assert!(
        std::path::Path::new("/sys/class/infiniband/rxe0").exists(),
        "run through scripts/rdma-vm.sh"
    );
    let doc = verified_sweep(&[
        "--min",
        "8",
        "--max",
        "1M",
        "--bytes",
        "2M",
        "--lat-iters",
        "20",
    ]);
    assert_eq!(doc["name"], "RsIB", "{doc}");
    assert!(doc["device"].as_str().unwrap().starts_with("rxe0"), "{doc}");
    let rows = doc["results"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (3..=20).map(|p| 1 << p).collect();
    assert_eq!(
        sizes, expected,
        "one row per power of two from 8 B to 1 MiB"
    );
    for row in rows {
        assert_eq!(row["verified"], true, "data not verified: {row}");
        assert!(row["bw_mb_per_s"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["lat_us"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["iters"].as_u64().unwrap() >= 32, "{row}");
    }
}

/// The library as it ships (`scripts/build-plugin.sh`: the crate alone as a cdylib, with LTO,
/// where every other suite loads the test build): every size from 8 B to 1 MiB in each
/// ping-pong mode, bytes verified, through the eager path and rendezvous.
#[test]
fn the_shipped_build_moves_every_size_verified_in_each_mode() {
    let plugin = support::shipped_plugin_path();
    for mode in PING_MODES {
        let mut args = vec![
            "--min",
            "8",
            "--max",
            "1M",
            "--bytes",
            "1M",
            "--lat-iters",
            "40",
        ];
        args.extend(mode);
        let doc = verified_sweep_of(&plugin, &args);
        assert_eq!(doc["name"], "RsIB", "{doc}");
        verified_rows(&doc, 18, mode.unwrap_or("receives ahead"));
    }
}

/// `--recv-late`: each ping is sent before its receive is posted and each side then waits on its
/// receive only, so small messages go eager and some land after their receive's CTS went out.
/// A send request that needed another `test` on the sender's side before its data moved would
/// hang this ping-pong (it did, while a CTS written first made the sender write again).
#[test]
fn late_receives_ping_pong_through_the_eager_path_without_waiting_on_the_sender() {
    let doc = verified_sweep(&[
        "--min",
        "8",
        "--max",
        "16K",
        "--iters",
        "64",
        "--lat-iters",
        "300",
        "--recv-late",
    ]);
    verified_rows(&doc, 12, "8 B to 16 KiB");
}

/// `--recv-preposted`: batches of 30 rounds whose receives are all posted first (30 receives in
/// flight on each side, a barrier on the control connection, then the rounds), so a lat-iters
/// count that is not a multiple of the batch ends in a short batch.
#[test]
fn preposted_receives_ping_pong_in_batches() {
    let doc = verified_sweep(&[
        "--min",
        "8",
        "--max",
        "64K",
        "--iters",
        "64",
        "--lat-iters",
        "70",
        "--recv-preposted",
    ]);
    assert_eq!(doc["ping"], "preposted", "{doc}");
    verified_rows(&doc, 14, "8 B to 64 KiB");
}

/// A full ring in flight on both sides (32 sends, 32 receives, each completed in order): the
/// receiver copies eager messages and goes round the ring while the sender is still to read
/// their answers, so the receive a ring later writes its CTS over an answer. The sender must
/// take that CTS as the answer; it waited for the overwritten one forever, and the benchmark
/// hung in about half of these runs.
#[test]
fn a_full_ring_in_flight_through_the_eager_path_completes_verified() {
    let doc = verified_sweep(&[
        "--min",
        "8",
        "--max",
        "4K",
        "--inflight",
        "32",
        "--iters",
        "3000",
        "--lat-iters",
        "20",
    ]);
    for row in verified_rows(&doc, 10, "8 B to 4 KiB") {
        assert_eq!(row["iters"], 3000, "{row}");
    }
}

/// The smallest runs each ping-pong can make: one timed round and no warm-up. The default
/// ping-pong keeps two receives posted ahead, so a single round posted one too many and waited
/// on it until the deadline; a warm-up of a tenth of the rounds makes such short ping-pongs
/// too, before every timed one.
#[test]
fn one_round_ping_pongs_without_warmup_complete_in_every_mode() {
    for mode in PING_MODES {
        let mut args = vec!["--min", "8", "--max", "64", "--iters", "8"];
        args.extend(["--lat-iters", "1", "--warmup", "0"]);
        args.extend(mode);
        let doc = verified_sweep(&args);
        assert_eq!(doc["warmup"], 0, "{doc}");
        verified_rows(&doc, 4, &format!("8 B to 64 B, {mode:?}"));
    }
}

/// `--call-times`: each side times the isend and irecv that start a request and the test that
/// finds a receive done, in every ping-pong mode; each mean is positive and shorter than the
/// round trip it is part of, and the table grows their three columns.
#[test]
fn call_times_split_the_round_trip_per_call() {
    for mode in PING_MODES {
        let mut args = vec!["--min", "8", "--max", "1K", "--iters", "16"];
        args.extend(["--lat-iters", "60", "--call-times"]);
        args.extend(mode);
        let doc = verified_sweep(&args);
        assert_eq!(doc["call_times"], true, "{doc}");
        for row in verified_rows(&doc, 8, &format!("8 B to 1 KiB, {mode:?}")) {
            let round_trip = 2.0 * row["lat_us"].as_f64().unwrap();
            for call in ["isend", "irecv", "found_test"] {
                let us = row["call_us"][call].as_f64().unwrap_or(-1.0);
                assert!(us > 0.0, "{call} {us} us ({mode:?}): {row}");
                // Each call lies inside a timed round, so its mean cannot exceed the round's,
                // except receives posted ahead of the rounds (all of them when preposted, the
                // first two by default): one slow post there is not bounded by any round.
                if call != "irecv" || mode == Some("--recv-late") {
                    assert!(us < round_trip, "{call} {us} us ({mode:?}): {row}");
                }
            }
        }
    }
    let stdout = table(&[
        "--min",
        "8",
        "--max",
        "16",
        "--iters",
        "16",
        "--lat-iters",
        "20",
        "--call-times",
    ]);
    let header = stdout.lines().find(|l| l.contains("size(B)")).unwrap_or("");
    assert!(header.ends_with("found"), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("16 "))
        .unwrap_or("");
    assert_eq!(row.split_whitespace().count(), 11, "{stdout}");
}

#[test]
fn table_output_has_a_header_and_a_row_per_size() {
    let stdout = table(&[
        "--min",
        "4K",
        "--max",
        "16K",
        "--bytes",
        "256K",
        "--lat-iters",
        "10",
    ]);
    assert!(
        stdout.contains("# nccl-net-bench: plugin") && stdout.contains("8 in flight"),
        "{stdout}"
    );
    for size in ["4096", "8192", "16384"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(size)),
            "no row for {size}:\n{stdout}"
        );
    }
}

/// `scripts/bench-vs-perftest.sh --against`: perftest and two plugins in one run, in turn,
/// medians, ratios and each run's paired ratios (against perftest and the other plugin) per
/// size in its JSON (here with `--recv-late` and `--plugin-env`). The other plugin here is this
/// one again (the mechanics, not a verdict; docs/performance.md uses the reference plugin).
#[test]
fn side_by_side_against_another_plugin_reports_medians_and_ratios() {
    let _alone = DEVICE.write().unwrap_or_else(PoisonError::into_inner);
    let plugin = support::plugin_path();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench-vs-perftest.sh");
    let out = Command::new("bash")
        .args([
            script,
            "--plugin",
            plugin.to_str().unwrap(),
            "--against",
            plugin.to_str().unwrap(),
        ])
        .args(["--runs", "2", "--max", "4K", "--bytes", "256K", "--json"])
        .args(["--bench", env!("CARGO_BIN_EXE_nccl-net-bench")])
        // This plugin without its eager path against itself with it, late receives: the
        // eager comparison in docs/performance.md.
        .args(["--recv-late", "--plugin-env", "NCCL_NET_RS_EAGER_BYTES=0"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (doc["runs"].as_u64(), doc["against"]["name"].as_str()),
        (Some(2), Some("RsIB"))
    );
    assert_eq!(doc["ping"], "late", "{doc}");
    assert_eq!(doc["plugin_env"][0], "NCCL_NET_RS_EAGER_BYTES=0", "{doc}");
    let rows = doc["results"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, (3..=12).map(|p| 1u64 << p).collect::<Vec<_>>());
    // Each perftest figure with this plugin's ratio to it.
    let perftest = [
        ("ib_write_bw_mb_per_s", "bw_vs_ib_write_bw"),
        ("ib_write_bw_msgs_per_s", "msgs_vs_ib_write_bw"),
        ("ib_write_lat_us", "lat_vs_ib_write_lat"),
    ];
    let with_perftest = rows
        .iter()
        .filter(|r| perftest.iter().all(|(figure, _)| r[*figure].is_f64()))
        .count();
    assert!(with_perftest > 0, "perftest figures in no row: {doc}");
    for row in rows {
        for side in ["plugin", "against"] {
            let m = &row[side];
            for field in [
                "bw_mb_per_s",
                "msgs_per_s",
                "lat_us",
                "cpu_send_us_per_msg",
                "cpu_recv_us_per_msg",
            ] {
                assert!(m[field].as_f64().unwrap() > 0.0, "{side}.{field} in {row}");
                assert_eq!(m["runs"][field].as_array().unwrap().len(), 2, "{row}");
            }
        }
        for ratio in ["bw_vs_against", "lat_vs_against", "msgs_vs_against"] {
            assert!(row[ratio].as_f64().unwrap() > 0.0, "{ratio} in {row}");
        }
        let runs = |side: &str, field: &str| row[side]["runs"][field].as_array().unwrap().clone();
        // Run i of one plugin over run i of the other, one ratio per run, in run order.
        for (paired, field) in [("lat", "lat_us"), ("msgs", "msgs_per_s")] {
            let pairs = runs("plugin", field)
                .iter()
                .zip(runs("against", field))
                .map(|(o, a)| (o.as_f64().unwrap(), Some(a.as_f64().unwrap())))
                .collect();
            assert_paired(&row["paired_vs_against"][paired], pairs, row);
        }
        // perftest on a loaded host sometimes fails a run or prints "inf": the script reports
        // that figure (and its ratio) as null, never as invalid JSON or a made-up number.
        for (figure, ratio) in perftest {
            assert_eq!(
                row[ratio].as_f64().is_some_and(|r| r > 0.0),
                row[figure].as_f64().is_some_and(|v| v > 0.0),
                "{ratio} in {row}"
            );
        }
        // perftest ran once per run, before the plugins' runs; run i of this plugin over run i
        // of perftest, null where perftest gave no figure.
        let perftest_runs = row["perftest_runs"].as_array().unwrap();
        assert_eq!(perftest_runs.len(), 2, "{row}");
        for (paired, field) in [("bw", "bw_mb_per_s"), ("lat", "lat_us")] {
            let pairs = runs("plugin", field)
                .iter()
                .zip(perftest_runs)
                .map(|(o, ib)| (o.as_f64().unwrap(), ib[field].as_f64().filter(|&v| v > 0.0)))
                .collect();
            assert_paired(&row["paired_vs_perftest"][paired], pairs, row);
        }
    }
}

/// A list of paired ratios in `bench-vs-perftest.sh`'s JSON: one per run, in run order, each
/// `ours / theirs` of that run's `(ours, theirs)`, and null where `theirs` is missing.
fn assert_paired(
    ratios: &serde_json::Value,
    pairs: Vec<(f64, Option<f64>)>,
    row: &serde_json::Value,
) {
    let ratios = ratios.as_array().unwrap();
    assert_eq!(ratios.len(), pairs.len(), "{row}");
    for (r, (ours, theirs)) in ratios.iter().zip(pairs) {
        match theirs {
            // (serde_json's float parsing may differ from Python's in the last bit.)
            Some(theirs) => {
                let (r, e) = (r.as_f64().unwrap(), ours / theirs);
                assert!(
                    (r - e).abs() <= 1e-9 * e.abs(),
                    "{r}, expected {e} in {row}"
                );
            }
            None => assert!(r.is_null(), "{r}, expected null in {row}"),
        }
    }
}

/// `--interleave` with this plugin twice over (its own copy: `dlopen` of a path already open
/// gives the same handle), two libraries connected in the same two processes, every block's
/// data verified end to end. (The JSON's shape and figures: bench_cli's fixture tests.)
#[test]
fn this_plugin_interleaved_with_its_copy_moves_verified_data() {
    let plugin = support::plugin_path();
    let copy = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libnccl_net_copy.so");
    std::fs::copy(&plugin, &copy).unwrap();
    let mut args = vec![
        "--plugin",
        plugin.to_str().unwrap(),
        "--interleave",
        copy.to_str().unwrap(),
        "--dev",
        "rxe0",
    ];
    args.extend(support::BRIEF_INTERLEAVED);
    let (ok, stdout, stderr) = bench(&args);
    assert!(ok, "benchmark failed:\n{stdout}\n{stderr}");
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["b"]["plugin"], copy.to_str().unwrap(), "{doc}");
    let rows = doc["results"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "{doc}");
    for row in rows {
        assert_eq!(row["verified"], true, "data not verified: {row}");
        for side in 0..2 {
            assert!(row["lat_us"][side].as_f64().unwrap() > 0.0, "{row}");
            assert!(row["bw_mb_per_s"][side].as_f64().unwrap() > 0.0, "{row}");
        }
    }
}

/// A thousand comm pairs between two processes, connected in NCCL's rounds of 128 and idle
/// together (`--comms`): every comm moves verified data; each pair holds its two QPs, and no
/// CQ, registration or descriptor of its own (the comms of a process share its CQs and the
/// registrations their rings are carved from, the two processes one out-of-band link), and
/// pins exactly what
/// the doctor's memlock estimate counts (`connection_memory`, the same sizes); idle, the
/// processes barely wake; after the close fds, verbs objects and pinned memory are back at
/// their counts.
#[test]
fn a_thousand_comms_move_verified_data_cost_what_the_estimate_says_and_give_it_all_back() {
    use nccl_net::core::config::Config;
    use nccl_net::core::queues::QueueMemory;
    use nccl_net::transport::connection_memory;

    let _alone = DEVICE.write().unwrap_or_else(PoisonError::into_inner);
    let plugin = support::plugin_path();
    let args = [
        "--plugin",
        plugin.to_str().unwrap(),
        "--dev",
        "rxe0",
        // The first run opens the device (its fds, PD and the watcher thread stay for the
        // process): the second is measured.
        "--comms",
        "1,1000",
        "--json",
    ];
    let (ok, stdout, stderr) = run_bench(&args, 900);
    assert!(
        ok,
        "benchmark failed (a hang is killed after 900 s):\n{stdout}\n{stderr}"
    );
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let run = &doc["runs"][1];
    let figure = |path: &[&str]| {
        path.iter()
            .fold(run, |v, k| &v[*k])
            .as_f64()
            .unwrap_or_else(|| panic!("{path:?} missing: {run}"))
    };
    assert_eq!(run["comms"], 1000, "{run}");
    assert_eq!(run["verified"], true, "{run}");
    assert_eq!(figure(&["verbs_per_pair", "qp"]), 2.0, "qp: {run}");
    // The comms share their process's CQs, 16,383 entries each once there are many: the 1,000
    // send comms' room (47 completions each) fits 7 of them (from 511 entries up), the receive
    // comms' (87 each) 10.
    let cqs = figure(&["verbs_per_pair", "cq"]) * 1000.0;
    assert!(
        (2.0..=30.0).contains(&cqs),
        "{cqs} CQs for 1,000 pairs: the comms of a process share a few: {run}"
    );
    // Their rings are carved from registrations of up to 64 rings (each a quarter more than the
    // one before, from 2 rings after the first run's 1): 26 per process.
    let mrs = figure(&["verbs_per_pair", "mr"]) * 1000.0;
    assert!(
        (2.0..=60.0).contains(&mrs),
        "{mrs} MRs for 1,000 pairs: the rings share registrations: {run}"
    );
    // One shared link at each end (NCCL's transport: a socket per comm).
    assert!(
        figure(&["fds_per_pair"]) * 1000.0 <= 2.0 + 1e-9,
        "descriptors grow with peer processes, not comms: {run}"
    );
    let estimate = connection_memory(&Config::default(), 1, QueueMemory::Kernel).pinned();
    let pinned = figure(&["pinned_kib_per_pair"]) * 1024.0;
    assert!(
        (pinned - estimate as f64).abs() <= 0.1 * estimate as f64,
        "VmPin rose {pinned} bytes per pair, the estimate says {estimate}: {run}"
    );
    for rank in 0..2 {
        let cpu = run["idle_cpu_percent"][rank].as_f64().unwrap();
        let wakeups = run["idle_wakeups_per_s"][rank].as_f64().unwrap();
        assert!(
            cpu < 2.0,
            "rank {rank} used {cpu}% of a core with every comm idle: {run}"
        );
        assert!(
            wakeups < 20.0,
            "rank {rank} woke {wakeups} times a second, idle: {run}"
        );
    }
    for kind in ["fds", "pd", "cq", "qp", "mr", "pinned_kib", "threads"] {
        assert_eq!(
            figure(&["left_after_close", kind]),
            0.0,
            "{kind} left: {run}"
        );
    }
}
