//! `nccl-net-doctor`'s command line on the host (no RDMA device here): exit codes, the check
//! list, and `--json` valid against the published schema whatever the verdict.
#![allow(clippy::unwrap_used)] // test code panics with context

use std::process::Command;

use serde_json::Value;

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
        out.contains("Exit codes: 0 no FAIL, 1 a FAIL, 2 could not run"),
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
