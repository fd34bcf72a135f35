//! The benchmark's command line on the host: bad arguments give one clear line and exit code 2
//! (clap's usage errors), a run that fails exit code 1.
#![allow(clippy::unwrap_used)] // test code panics with context

mod support;

use std::path::PathBuf;
use std::process::Command;

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
    support::compile_c(
        &support::repo_root().join("tests/c_host/fixture_plugin.c"),
        "libfixture_plugin.so",
        &["-shared", "-fPIC"],
    )
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
    let (_, err) = bench(&["--plugin", "x.so", "--abi", "7"]);
    assert!(err.contains("7 is not in 8..=12"), "{err}");
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
