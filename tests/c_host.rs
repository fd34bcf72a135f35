//! The plugin as NCCL loads it, on the host (no RDMA): a C program dlopens the built library,
//! resolves `ncclNetPlugin_v8`, and drives init/devices/getProperties with a variadic logger.
#![allow(clippy::unwrap_used)] // test helpers panic with context

mod support;

use support::run_host;

const NCCL_SUCCESS: i64 = 0;
const NCCL_INTERNAL_ERROR: i64 = 3;

#[test]
fn table_has_name_and_every_mandatory_entry() {
    let run = run_host(&[], &[]);
    assert_eq!(run.line("NAME").rest, "RsIB");
    let entries = run.line("ENTRIES");
    for entry in entries.rest.split(' ') {
        assert!(entry.ends_with("=1"), "v8 entry is NULL: {entry}");
    }
}

#[test]
fn no_rdma_kernel_gives_zero_devices_and_one_reason() {
    // The dev and CI hosts run a kernel without RDMA (nccl-net-abi.md / rust-stack.md §1.1).
    let run = run_host(&[("NCCL_DEBUG", "WARN")], &[]);
    assert_eq!(run.rc("init"), NCCL_SUCCESS);
    assert_eq!(run.rc("devices"), NCCL_SUCCESS);
    assert_eq!(run.calls("devices")[0].int("ndev"), 0);
    let reasons = run.zero_device_reasons();
    assert_eq!(
        reasons.len(),
        1,
        "expected one line saying why:\n{}",
        run.stdout
    );
    let msg = reasons[0].get("msg");
    assert!(
        msg.contains("no RDMA devices") && msg.contains("ibv_get_device_list"),
        "{msg}"
    );
    assert!(
        msg.contains("rdma_rxe"),
        "the line should say how to fix it: {msg}"
    );
    assert_eq!(reasons[0].int("level"), 2, "WARN level");
    assert_eq!(reasons[0].int("flags"), 1 | 16, "INIT|NET subsystems");
}

#[test]
fn misuse_is_an_internal_error_not_a_crash() {
    let run = run_host(&[], &["--misuse"]);
    assert_eq!(run.rc("getProperties(out-of-range)"), NCCL_INTERNAL_ERROR);
    assert_eq!(run.rc("getProperties(NULL)"), NCCL_INTERNAL_ERROR);
    assert_eq!(run.rc("devices(NULL)"), NCCL_INTERNAL_ERROR);
    let warned = run.logs().iter().any(|l| {
        l.get("msg")
            .contains("getProperties failed: device 0 does not exist")
    });
    assert!(warned, "misuse must be logged:\n{}", run.stdout);
}

#[test]
fn dlclose_and_reopen_keeps_the_same_table_and_init_is_idempotent() {
    let run = run_host(&[], &["--reload"]);
    assert_eq!(
        run.line("RELOAD").int("same_address"),
        1,
        "library must be NODELETE"
    );
    let inits = run.calls("init");
    assert_eq!(inits.len(), 2);
    assert!(inits.iter().all(|c| c.int("rc") == NCCL_SUCCESS));
    let counts: Vec<i64> = run
        .calls("devices")
        .iter()
        .filter(|c| c.rest.contains("ndev"))
        .map(|c| c.int("ndev"))
        .collect();
    assert_eq!(counts, [0, 0]);
}

#[test]
fn logs_go_to_stderr_without_an_nccl_logger_only_when_null() {
    // With a logger, nothing of ours reaches stderr.
    let run = run_host(&[("NCCL_DEBUG", "INFO")], &[]);
    assert!(
        !run.stderr.contains("nccl-net-rsib"),
        "stderr: {}",
        run.stderr
    );
}

fn non_utf8() -> std::ffi::OsString {
    use std::os::unix::ffi::OsStringExt;
    std::ffi::OsString::from_vec(vec![0xff, 0xfe])
}

#[test]
fn an_unrelated_non_utf8_variable_leaves_init_working() {
    let run = support::run_host_with(vec![("RSIB_UNRELATED".into(), non_utf8())], &[]);
    assert_eq!(run.rc("init"), NCCL_SUCCESS, "{}", run.stdout);
    assert!(!run.stdout.contains("panic"), "{}", run.stdout);
}

#[test]
fn a_non_utf8_value_of_our_own_variable_is_refused_naming_it() {
    let run = support::run_host_with(vec![("NCCL_IB_HCA".into(), non_utf8())], &[]);
    assert_eq!(run.rc("init"), 5, "ncclInvalidUsage");
    assert!(
        run.logs()
            .iter()
            .any(|l| l.get("msg").starts_with("init failed: NCCL_IB_HCA=")
                && l.get("msg").contains("not UTF-8")),
        "{}",
        run.stdout
    );
}
