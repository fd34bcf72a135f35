//! The benchmark's command line on the host: bad arguments give one clear line and exit code 2
//! (clap's usage errors), a run that fails exit code 1.
#![allow(clippy::unwrap_used)] // test code panics with context

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn bench(args: &[&str]) -> (i32, String) {
    let (code, _, err) = bench_env(args, &[]);
    (code, err)
}

/// Exit code, stdout and stderr of the benchmark run with `env` added.
fn bench_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nccl-net-bench"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `tests/c_host/fixture_plugin.c` as a shared object: a v12 plugin that logs unconditionally in
/// init and only becomes usable through the table init rewrites.
fn fixture_plugin() -> PathBuf {
    fixture_plugins()[0].clone()
}

/// The fixture plugin built twice, as two libraries (`dlopen` of a path already open gives the
/// same handle), for runs of two plugins in one process; built once for all tests, so that no
/// test rewrites a library another has loaded.
fn fixture_plugins() -> &'static [PathBuf; 2] {
    static BUILT: OnceLock<[PathBuf; 2]> = OnceLock::new();
    BUILT.get_or_init(|| {
        ["libfixture_plugin.so", "libfixture_plugin_b.so"].map(|name| {
            support::compile_c(
                &support::repo_root().join("tests/c_host/fixture_plugin.c"),
                name,
                &["-shared", "-fPIC"],
            )
        })
    })
}

/// The benchmark with the fixture's library `a` and `--interleave` `b` on its device, and
/// `args`.
fn interleaved(a: &Path, b: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = vec![
        "--plugin",
        a.to_str().unwrap(),
        "--interleave",
        b.to_str().unwrap(),
        "--dev",
        "fixture0",
    ];
    all.extend_from_slice(args);
    bench_env(&all, &[])
}

/// The numbers of a JSON array.
fn numbers(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// The median of four numbers (the mean of the middle two).
fn median_of_four(mut v: Vec<f64>) -> f64 {
    assert_eq!(v.len(), 4, "{v:?}");
    v.sort_by(f64::total_cmp);
    (v[1] + v[2]) / 2.0
}

/// Whether two computed figures agree (serde_json's float parsing and Python's may differ in
/// the last bit).
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs()
}

#[test]
fn missing_plugin_argument_prints_usage() {
    let (code, err) = bench(&[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--plugin <PLUGIN>") && err.contains("Usage:"),
        "{err}"
    );
}

#[test]
fn unknown_arguments_and_bad_sizes_are_rejected() {
    let (code, err) = bench(&["--plugin", "x.so", "--frobnicate"]);
    assert_eq!(code, 2);
    assert!(err.contains("unexpected argument '--frobnicate'"), "{err}");
    let (code, err) = bench(&["--plugin", "x.so", "--min", "1M", "--max", "1K"]);
    assert_eq!(code, 2);
    assert!(err.contains("0 < --min <= --max"), "{err}");
    let (_, err) = bench(&["--plugin", "x.so", "--max", "lots"]);
    assert!(err.contains("'lots' is not a size"), "{err}");
    let (_, err) = bench(&["--plugin", "x.so", "--inflight", "99"]);
    assert!(err.contains("99 is not in 1..=32"), "{err}");
    let (code, err) = bench(&["--plugin", "x.so", "--interleave", "y.so", "--call-times"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("'--interleave <INTERLEAVE>' cannot be used with '--call-times'"),
        "{err}"
    );
    let (_, err) = bench(&["--plugin", "x.so", "--interleave", "y.so", "--blocks", "1"]);
    assert!(err.contains("1 is not in 2..=1000"), "{err}");
    let (_, err) = bench(&["--plugin", "x.so", "--abi", "7"]);
    assert!(err.contains("7 is not in 8..=12"), "{err}");
    let (code, err) = bench(&["--plugin", "x.so", "--comms", "10,0"]);
    assert_eq!(code, 2);
    assert!(err.contains("0 is not in 1..=100000"), "{err}");
    let (code, err) = bench(&["--plugin", "x.so", "--recv-late", "--recv-preposted"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("'--recv-late' cannot be used with '--recv-preposted'"),
        "{err}"
    );
}

#[test]
fn a_library_without_the_symbol_is_named() {
    let (code, err) = bench(&["--plugin", "libc.so.6"]);
    assert_eq!(code, 1);
    assert!(err.contains("exports no ncclNetPlugin_v8 .. v12"), "{err}");
    let (_, err) = bench(&["--plugin", "/nonexistent/libnccl-net.so"]);
    assert!(
        err.contains("cannot load /nonexistent/libnccl-net.so"),
        "{err}"
    );
}

#[test]
fn a_plugin_without_devices_says_so() {
    // On a host without RDMA the plugin loads and reports no device.
    let plugin = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("libnccl_net.so");
    let (code, err) = bench(&["--plugin", plugin.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("device 0 not found; the plugin offers []"),
        "{err}"
    );
}

/// The benchmark drives a plugin as NCCL does: a logger at init (the fixture calls it without a
/// NULL check), entries read through the table after init (the fixture rewrites them there).
#[test]
fn a_plugin_that_logs_in_init_and_rewrites_its_table_runs_under_the_bench() {
    let fixture = fixture_plugin();
    let (code, out, err) = bench_env(
        &[
            "--plugin",
            fixture.to_str().unwrap(),
            "--max",
            "4K",
            "--bytes",
            "64K",
            "--lat-iters",
            "10",
            "--verify",
            "--json",
        ],
        &[("NCCL_DEBUG", "INFO")],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        err.contains("NCCL INFO fixture plugin init for comm"),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (doc["name"].as_str(), doc["abi"].as_u64()),
        (Some("Fixture"), Some(12)),
        "{out}"
    );
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 10, "{out}");
    assert!(results.iter().all(|r| r["verified"] == true), "{out}");
    let (code, err) = bench(&["--plugin", fixture.to_str().unwrap(), "--abi", "8"]);
    assert_eq!(code, 1);
    assert!(err.contains("exports no ncclNetPlugin_v8"), "{err}");
}

/// `--interleave`: two plugins (the fixture's two libraries) connected in the same two
/// processes, every size's phases in blocks, A and B in turn, each block's data verified end to
/// end; the JSON has each plugin's blocks, each plugin's median block and the quartiles of the
/// block pairs' ratios A/B.
#[test]
fn interleaved_plugins_run_in_alternating_blocks_with_verified_data() {
    let [a, b] = fixture_plugins();
    let (code, out, err) = interleaved(a, b, &support::BRIEF_INTERLEAVED);
    assert_eq!(code, 0, "{out}\n{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["a"]["plugin"], a.to_str().unwrap(), "{doc}");
    assert_eq!(doc["b"]["plugin"], b.to_str().unwrap(), "{doc}");
    assert_eq!(doc["b"]["name"], "Fixture", "{doc}");
    assert_eq!(doc["blocks"], 4, "{doc}");
    let rows = doc["results"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, (3..=10).map(|p| 1u64 << p).collect::<Vec<_>>());
    for row in rows {
        assert_eq!(row["verified"], true, "data not verified: {row}");
        for (figure, ratio) in [("bw_mb_per_s", "bw_ratio"), ("lat_us", "lat_ratio")] {
            let blocks = &row["blocks"][figure];
            let [a, b] = [numbers(&blocks[0]), numbers(&blocks[1])];
            assert!(a.iter().chain(&b).all(|&x| x > 0.0), "{figure}: {row}");
            let medians = numbers(&row[figure]);
            assert!(
                same(medians[0], median_of_four(a.clone())),
                "{figure}: {row}"
            );
            assert!(
                same(medians[1], median_of_four(b.clone())),
                "{figure}: {row}"
            );
            let pairs: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x / y).collect();
            let q = &row[ratio];
            let median = q["median"].as_f64().unwrap();
            assert!(same(median, median_of_four(pairs)), "{ratio}: {row}");
            assert!(q["q1"].as_f64().unwrap() <= median && median <= q["q3"].as_f64().unwrap());
        }
    }
    let (code, out, err) = interleaved(a, b, &["--max", "64", "--blocks", "2", "--lat-iters", "4"]);
    assert_eq!(code, 0, "{out}\n{err}");
    for needle in [
        "A = plugin ",
        "B = plugin ",
        "2 blocks per size and phase",
        "bw A/B",
        "lat A/B",
    ] {
        assert!(out.contains(needle), "no '{needle}' in the table:\n{out}");
    }
    assert_eq!(
        out.lines().filter(|l| !l.starts_with('#')).count(),
        1 + 4,
        "{out}"
    );
}

/// `scripts/bench-interleaved.sh`: interleaved runs with the plugins' positions swapped each
/// run, the block pairs' ratios ours/theirs pooled over the runs, each run's median listed (the
/// fixture's two libraries here: the mechanics; docs/performance.md uses the reference plugin).
#[test]
fn interleaved_runs_swap_positions_and_pool_the_block_pairs() {
    let [ours, theirs] = fixture_plugins();
    let script = support::repo_root().join("scripts/bench-interleaved.sh");
    let out = Command::new("bash")
        .arg(script)
        .args([
            "--plugin",
            ours.to_str().unwrap(),
            "--against",
            theirs.to_str().unwrap(),
        ])
        .args([
            "--dev", "fixture0", "--runs", "2", "--min", "16", "--max", "64", "--blocks", "4",
        ])
        .args(["--iters", "64", "--lat-iters", "16", "--json"])
        .args(["--bench", env!("CARGO_BIN_EXE_nccl-net-bench")])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // Run 1 has ours first, run 2 theirs.
    for (run, first) in [(1, ours), (2, theirs)] {
        let line = format!("run {run} of 2, A = {}", first.display());
        assert!(stderr.contains(&line), "no '{line}' in:\n{stderr}");
    }
    let doc: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["runs"], 2, "{doc}");
    assert_eq!(doc["plugin"]["plugin"], ours.to_str().unwrap(), "{doc}");
    assert_eq!(doc["against"]["plugin"], theirs.to_str().unwrap(), "{doc}");
    let rows = doc["results"].as_array().unwrap();
    let sizes: Vec<u64> = rows.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [16, 32, 64]);
    for row in rows {
        for phase in ["bw", "lat"] {
            let p = &row[phase];
            assert!(p["ours"].as_f64().unwrap() > 0.0 && p["theirs"].as_f64().unwrap() > 0.0);
            let runs = numbers(&p["run_medians"]);
            assert!(runs.len() == 2 && runs.iter().all(|&r| r > 0.0), "{row}");
            let q = &p["ratio"];
            let median = q["median"].as_f64().unwrap();
            assert!(q["q1"].as_f64().unwrap() <= median && median <= q["q3"].as_f64().unwrap());
        }
    }
    let out = Command::new("bash")
        .arg(support::repo_root().join("scripts/bench-interleaved.sh"))
        .args(["--plugin", ours.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--against PATH.so is required"), "{stderr}");
}

/// `--comms`: N comm pairs in connect rounds, each moving a verified message, and per pair what
/// they cost. The fixture's comms are one TCP connection each: two descriptors per pair, none
/// left after the close, no thread, no pinned memory.
#[test]
fn comms_mode_opens_n_pairs_in_rounds_and_counts_what_each_costs() {
    let fixture = fixture_plugin();
    let plugin = fixture.to_str().unwrap();
    let args = [
        "--plugin",
        plugin,
        "--dev",
        "fixture0",
        "--comms",
        "1,40",
        "--pending",
        "16",
        "--json",
    ];
    let (code, out, err) = bench_env(&args, &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["mode"], "comms", "{doc}");
    assert_eq!(doc["pending"], 16, "{doc}");
    let runs = doc["runs"].as_array().unwrap();
    let counts: Vec<u64> = runs.iter().map(|r| r["comms"].as_u64().unwrap()).collect();
    assert_eq!(counts, [1, 40], "{doc}");
    for run in runs {
        assert_eq!(run["verified"], true, "{run}");
        assert_eq!(run["plugin"], plugin, "{run}");
        assert_eq!(run["fds_per_pair"].as_f64(), Some(2.0), "{run}");
        assert_eq!(run["threads_added"].as_f64(), Some(0.0), "{run}");
        assert_eq!(run["pinned_kib_per_pair"].as_f64(), Some(0.0), "{run}");
        assert_eq!(run["left_after_close"]["fds"].as_f64(), Some(0.0), "{run}");
        for figure in ["setup_ms_per_comm", "rate_per_s"] {
            assert!(run[figure].as_f64().unwrap() > 0.0, "{figure}: {run}");
        }
        let idle = numbers(&run["idle_cpu_percent"]);
        assert!(idle.iter().all(|&c| (0.0..50.0).contains(&c)), "{run}");
    }
    let table = ["--plugin", plugin, "--dev", "fixture0", "--comms", "3"];
    let (code, out, err) = bench_env(&table, &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("# plugin A: "), "{out}");
    let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 2, "a header and one run:\n{out}");
    assert!(rows[1].trim_start().starts_with("A      3"), "{out}");
    assert!(rows[1].trim_end().ends_with("yes"), "{out}");
}
