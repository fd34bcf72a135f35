//! The shared object exports exactly one dynamic symbol of ours, has the soname the install uses,
//! and is NODELETE (NCCL dlcloses plugins and may reopen them).
#![allow(clippy::unwrap_used)] // test helpers panic with context

mod support;

use std::process::Command;

fn tool(name: &str, args: &[&str]) -> String {
    let out = Command::new(name)
        .args(args)
        .arg(support::plugin_path())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {name} (install binutils): {e}"));
    assert!(
        out.status.success(),
        "{name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn only_ncclnetplugin_v8_is_exported() {
    let defined = tool("nm", &["-D", "--defined-only"]);
    let names: Vec<&str> = defined
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(
        names,
        ["ncclNetPlugin_v8"],
        "unexpected dynamic symbols:\n{defined}"
    );
    let kind = defined
        .lines()
        .find_map(|l| l.split_whitespace().nth(1))
        .unwrap();
    assert!(
        matches!(kind, "D" | "R"),
        "ncclNetPlugin_v8 must be a data symbol, nm says '{kind}'"
    );
}

#[test]
fn soname_and_nodelete_are_set() {
    let dynamic = tool("readelf", &["-d", "-W"]);
    assert!(
        dynamic.contains("Library soname: [libnccl-net.so]"),
        "{dynamic}"
    );
    let flags = dynamic
        .lines()
        .find(|l| l.contains("FLAGS_1"))
        .unwrap_or_default();
    assert!(flags.contains("NODELETE"), "missing -z nodelete: '{flags}'");
}
