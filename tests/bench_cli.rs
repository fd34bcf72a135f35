//! The benchmark's command line on the host: bad input gives one clear line and exit code 1.
#![allow(clippy::unwrap_used)] // test code panics with context

use std::process::Command;

fn bench(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nccl-net-bench"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn missing_plugin_argument_prints_usage() {
    let (code, err) = bench(&[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--plugin is required") && err.contains("usage:"),
        "{err}"
    );
}

#[test]
fn unknown_arguments_and_bad_sizes_are_rejected() {
    let (code, err) = bench(&["--plugin", "x.so", "--frobnicate"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown argument --frobnicate"), "{err}");
    let (_, err) = bench(&["--plugin", "x.so", "--min", "1M", "--max", "1K"]);
    assert!(err.contains("0 < --min <= --max"), "{err}");
    let (_, err) = bench(&["--plugin", "x.so", "--max", "lots"]);
    assert!(err.contains("'lots' is not a size"), "{err}");
    let (_, err) = bench(&["--plugin", "x.so", "--inflight", "99"]);
    assert!(err.contains("--inflight must be 1..=32"), "{err}");
}

#[test]
fn a_library_without_the_symbol_is_named() {
    let (code, err) = bench(&["--plugin", "libc.so.6"]);
    assert_eq!(code, 1);
    assert!(err.contains("exports no ncclNetPlugin_v8"), "{err}");
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
