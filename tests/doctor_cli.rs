//! `nccl-net-doctor`'s command line on the host (no RDMA device here): exit codes, the check
//! list, and `--json` valid against the published schema whatever the verdict.
#![allow(clippy::unwrap_used)] // test code panics with context

use std::process::Command;

use serde_json::Value;

mod support;

fn doctor(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nccl-net-doctor"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Validate `doc` against the schema `--schema` prints; panics with every violation.
fn assert_valid(doc: &Value) {
    let (code, schema, _) = doctor(&["--schema"]);
    assert_eq!(code, 0);
    let schema: Value = serde_json::from_str(&schema).unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(doc)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}\n{doc:#}");
}

const SEVERITIES: [&str; 6] = ["FAIL", "WARN", "UNKNOWN", "SKIP", "INFO", "PASS"];

#[test]
fn bad_arguments_exit_2() {
    let (code, _, err) = doctor(&["--frobnicate"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = doctor(&["--serve", "--loopback"]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot be used with"), "{err}");
    let (code, _, err) = doctor(&["--seconds", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("--seconds must be in (0, 600]"), "{err}");
    let (code, out, _) = doctor(&["--help"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(
            "Exit codes: 0 no FAIL, 1 a FAIL (with --strict: or an UNKNOWN), 2 could not run"
        ),
        "{out}"
    );
}

#[test]
fn every_check_id_is_listed() {
    let (code, out, _) = doctor(&["--list-checks"]);
    assert_eq!(code, 0);
    for (id, _) in nccl_net::doctor::CHECKS {
        assert!(
            out.lines().any(|l| l.starts_with(id)),
            "{id} missing:\n{out}"
        );
    }
}

#[test]
fn json_report_follows_the_schema_and_the_exit_code() {
    let (code, out, err) = doctor(&["--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert_valid(&doc);
    assert_eq!(doc["exit_code"], code, "{doc:#}");
    assert_eq!(doc["mode"], "node");
    let findings = doc["findings"].as_array().unwrap();
    let ranks: Vec<usize> = findings
        .iter()
        .map(|f| SEVERITIES.iter().position(|s| f["severity"] == *s).unwrap())
        .collect();
    assert!(
        ranks.windows(2).all(|w| w[0] <= w[1]),
        "not worst first: {ranks:?}"
    );
    for (id, _) in nccl_net::doctor::CHECKS {
        assert!(
            findings.iter().any(|f| f["check"] == *id),
            "{id} said nothing"
        );
    }
    if !std::path::Path::new("/sys/class/infiniband").exists() {
        // This host: no RDMA support in the kernel.
        assert_eq!(code, 1);
        let first = &findings[0];
        assert_eq!(
            (first["severity"].as_str(), first["check"].as_str()),
            (Some("FAIL"), Some("verbs.provider"))
        );
    }
}

#[test]
fn human_report_has_one_line_per_finding_and_a_summary() {
    let (code, out, _) = doctor(&["--color", "never"]);
    let (_, json, _) = doctor(&["--json"]);
    let doc: Value = serde_json::from_str(&json).unwrap();
    let findings = doc["findings"].as_array().unwrap();
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| SEVERITIES.iter().any(|s| l.starts_with(s)))
        .collect();
    assert_eq!(lines.len(), findings.len(), "{out}");
    for (line, f) in lines.iter().zip(findings) {
        let check = f["check"].as_str().unwrap();
        assert!(line.contains(&format!(" {check} ")), "{line} vs {check}");
    }
    assert!(!out.contains('\x1b'), "colour without a terminal");
    let summary = out.lines().last().unwrap();
    assert!(
        summary.starts_with("summary: ") && summary.ends_with(doc["overall"].as_str().unwrap()),
        "{summary}"
    );
    assert_eq!(code, doc["exit_code"].as_i64().unwrap() as i32);
}

#[test]
fn a_peer_that_never_answers_is_exit_2_not_a_verdict() {
    // Port 9 (discard) on localhost: nothing listens.
    let (code, out, err) = doctor(&["--peer", "127.0.0.1:9", "--timeout", "1", "--json"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("could not run: cannot reach the serving doctor at 127.0.0.1:9"),
        "{err}"
    );
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_valid(&doc);
    assert_eq!(
        (doc["exit_code"].as_i64(), doc["overall"].as_str()),
        (Some(2), Some("UNKNOWN"))
    );

    let (code, _, err) = doctor(&["--serve", "127.0.0.1:0", "--timeout", "1"]);
    assert_eq!(code, 2);
    assert!(err.contains("no peer connected to 127.0.0.1:"), "{err}");
}

/// `--serve` without an address listens on the plugin's out-of-band address (here by
/// `NCCL_SOCKET_IFNAME`; without it by NCCL's rule), never on every interface.
#[test]
fn serve_binds_the_out_of_band_address_not_every_interface() {
    let out = Command::new(env!("CARGO_BIN_EXE_nccl-net-doctor"))
        .args(["--serve", "0", "--timeout", "1"])
        .env("NCCL_SOCKET_IFNAME", "=lo")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("serving on the out-of-band address 127.0.0.1 on lo (NCCL_SOCKET_IFNAME==lo)"),
        "{err}"
    );
    assert!(err.contains("no peer connected to 127.0.0.1:"), "{err}");
    let (code, _, err) = doctor(&["--serve", "--timeout", "1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("serving on the out-of-band address "), "{err}");
    assert!(err.contains(":18515 within"), "{err}");
    assert!(!err.contains("0.0.0.0"), "{err}");
}

#[test]
fn a_reader_that_goes_away_does_not_change_the_verdict() {
    // `nccl-net-doctor --list-checks | grep -q ...`: the pipe closes before the doctor writes.
    let mut child = Command::new(env!("CARGO_BIN_EXE_nccl-net-doctor"))
        .arg("--list-checks")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// The doctor's `plugin.load` findings with `env` (and a HOME without a `.nccl.conf`).
fn plugin_load(env: &[(&str, &std::ffi::OsStr)]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_nccl-net-doctor"))
        .arg("--json")
        .env_remove("NCCL_NET_PLUGIN")
        .env_remove("NCCL_NET")
        .env_remove("LD_LIBRARY_PATH")
        .env("HOME", "/nonexistent")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "plugin.load")
        .cloned()
        .collect()
}

/// The real dynamic loader, called as NCCL 2.30 calls it (`src/plugin/plugin_open.cc`): the
/// default name found through LD_LIBRARY_PATH, a bare entry found as `libnccl-net-<entry>.so`
/// after the name itself is not found, and a library whose dependency is missing told apart
/// from one that is absent.
#[test]
fn plugin_load_resolves_the_library_as_nccl_does() {
    let plugin = support::plugin_path();
    let dir = std::env::temp_dir().join(format!("doctor-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&plugin, dir.join("libnccl-net.so")).unwrap();
    std::os::unix::fs::symlink(&plugin, dir.join("libnccl-net-rsib.so")).unwrap();
    let path = dir.as_os_str();

    let found = plugin_load(&[("LD_LIBRARY_PATH", path)]);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0]["severity"], "PASS", "{found:#?}");
    let what = found[0]["what"].as_str().unwrap();
    assert!(
        what.starts_with(&format!(
            "NCCL_NET_PLUGIN unset: NCCL opens libnccl-net.so = {}/libnccl-net.so (RsIB, ncclNet v12, v11, v10, v9, v8)",
            dir.display()
        )),
        "{what}"
    );

    let bare = plugin_load(&[
        ("LD_LIBRARY_PATH", path),
        ("NCCL_NET_PLUGIN", "rsib".as_ref()),
    ]);
    assert_eq!(bare[0]["severity"], "PASS", "{bare:#?}");
    let evidence = bare[0]["evidence"].as_array().unwrap();
    assert_eq!(evidence[0]["source"], "dlopen(rsib)");
    assert!(
        evidence[0]["value"]
            .as_str()
            .unwrap()
            .contains("No such file or directory"),
        "{bare:#?}"
    );
    assert_eq!(evidence[1]["source"], "dlopen(libnccl-net-rsib.so)");

    let absent = plugin_load(&[]);
    assert_eq!(absent[0]["severity"], "FAIL", "{absent:#?}");
    assert!(
        absent[0]["what"]
            .as_str()
            .unwrap()
            .contains("libnccl-net.so not found on the library path"),
        "{absent:#?}"
    );

    // A plugin whose dependency is gone: the loader names the dependency.
    let cc = |args: &[&str]| {
        let ok = Command::new("cc")
            .args(args)
            .current_dir(&dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "cc {args:?}");
    };
    std::fs::write(dir.join("empty.c"), "int rsib_doctor_test;\n").unwrap();
    cc(&["-shared", "-fPIC", "-o", "libgone.so", "empty.c"]);
    // --no-as-needed: the linker would otherwise drop a dependency nothing uses.
    cc(&[
        "-shared",
        "-fPIC",
        "-o",
        "libbroken.so",
        "empty.c",
        "-L.",
        "-Wl,--no-as-needed",
        "-lgone",
    ]);
    std::fs::remove_file(dir.join("libgone.so")).unwrap();
    let broken = plugin_load(&[("NCCL_NET_PLUGIN", dir.join("libbroken.so").as_os_str())]);
    assert_eq!(broken[0]["severity"], "FAIL", "{broken:#?}");
    let what = broken[0]["what"].as_str().unwrap();
    assert!(
        what.contains("libgone.so: cannot open shared object file"),
        "{what}"
    );
    assert!(
        broken[0]["fix"]
            .as_str()
            .unwrap()
            .starts_with("install what the loader names as missing"),
        "{broken:#?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
