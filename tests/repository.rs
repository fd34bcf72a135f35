//! Repository rules that no compiler checks: the README documents every knob and the test
//! command CI runs, and the no-I/O layers stay free of verbs, CUDA and the environment.
#![allow(clippy::unwrap_used)] // test helpers panic with context

use std::fs;
use std::path::Path;

use nccl_net::core::config::{KNOBS, NOT_IMPLEMENTED};

fn read(path: &str) -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn readme_documents_every_environment_variable() {
    let readme = read("README.md");
    let missing: Vec<&str> = KNOBS
        .iter()
        .chain(NOT_IMPLEMENTED)
        .map(|k| k.name)
        .filter(|n| !readme.contains(&format!("`{n}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not document {missing:?} (see src/core/config.rs)"
    );
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = read("README.md");
    assert!(
        readme.contains("scripts/test.sh"),
        "README must name the test command"
    );
    assert!(
        read(".ci/run").contains("scripts/test.sh"),
        ".ci/run must call the README's test command"
    );
}

fn rust_sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((
                path.display().to_string(),
                fs::read_to_string(&path).unwrap(),
            ));
        }
    }
}

#[test]
fn core_and_topology_do_no_verbs_cuda_or_environment_access() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_sources(&root.join("core"), &mut files);
    rust_sources(&root.join("topology"), &mut files);
    assert!(!files.is_empty());
    for (path, text) in files {
        for forbidden in ["rdma_sys", "cudarc", "std::env::var", "env::vars", "\"/sys"] {
            // SysfsRoot's default is the one place the real /sys is named.
            if forbidden == "\"/sys" && path.ends_with("sysfs.rs") {
                continue;
            }
            let offending = text.lines().filter(|l| l.contains(forbidden)).count();
            assert_eq!(
                offending, 0,
                "{path} uses `{forbidden}`: that belongs in verbs/, gpu or plugin.rs"
            );
        }
    }
}
