//! The shared object exports exactly the five ncclNet tables (v8 to v12) as data symbols, has
//! no soname (see below), and is NODELETE (NCCL dlcloses plugins and may reopen them).
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
fn exactly_the_five_tables_are_exported_as_data() {
    let defined = tool("nm", &["-D", "--defined-only"]);
    let mut symbols: Vec<(&str, &str)> = defined
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace().skip(1);
            Some((words.next()?, words.next()?))
        })
        .collect();
    symbols.sort_by_key(|&(_, name)| name);
    let names: Vec<&str> = symbols.iter().map(|&(_, name)| name).collect();
    assert_eq!(
        names,
        [
            "ncclNetPlugin_v10",
            "ncclNetPlugin_v11",
            "ncclNetPlugin_v12",
            "ncclNetPlugin_v8",
            "ncclNetPlugin_v9"
        ],
        "unexpected dynamic symbols:\n{defined}"
    );
    for (kind, name) in symbols {
        assert!(
            matches!(kind, "D" | "R"),
            "{name} must be a data symbol, nm says '{kind}'"
        );
    }
}

/// The library carries no soname: it is installed as both libnccl-net.so and
/// libnccl-net-rsib.so, and ldconfig caches a library under its soname (the file name when there
/// is none), so one shared soname hid libnccl-net-rsib.so from the cache and NCCL 2.28.9 answered
/// `NCCL_NET_PLUGIN=rsib` with "Could not find: rsib libnccl-net-rsib.so".
#[test]
fn no_soname_and_nodelete_is_set() {
    let dynamic = tool("readelf", &["-d", "-W"]);
    assert!(!dynamic.contains("(SONAME)"), "{dynamic}");
    let flags = dynamic
        .lines()
        .find(|l| l.contains("FLAGS_1"))
        .unwrap_or_default();
    assert!(flags.contains("NODELETE"), "missing -z nodelete: '{flags}'");
}
