//! Shared by the integration tests: find the built plugin, build the C host that loads it the
//! way NCCL does, run it with a chosen environment and parse what it prints.
// Each test binary uses a different part; helpers panic with context instead of returning errors.
#![allow(dead_code, unused_imports, unreachable_pub, clippy::unwrap_used)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub mod net;

/// The cdylib Cargo built for this test run. `cargo test` leaves it next to the test binary, in
/// `target/<profile>/deps` (not in `target/<profile>`, which may be stale).
pub fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let path = exe.parent().unwrap().join("libnccl_net.so");
    assert!(
        path.exists(),
        "{} is missing: build with `cargo test`",
        path.display()
    );
    path
}

/// The plugin as it ships: `scripts/build-plugin.sh` leaves it in `<target>/plugin/` (the test
/// binary runs from `<target>/<profile>/deps`); `scripts/test.sh` builds it in its install step.
pub fn shipped_plugin_path() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap();
    let path = target.join("plugin").join("libnccl_net.so");
    assert!(
        path.exists(),
        "{} is missing: build it with scripts/build-plugin.sh",
        path.display()
    );
    path
}

/// A brief `nccl-net-bench --interleave` run: 8 B to 1 KiB, 4 block pairs per size and phase of
/// 16 messages and 4 rounds each, every byte verified, JSON.
pub const BRIEF_INTERLEAVED: [&str; 10] = [
    "--max",
    "1K",
    "--blocks",
    "4",
    "--iters",
    "64",
    "--lat-iters",
    "16",
    "--verify",
    "--json",
];

/// Repository root (for `nccl-headers/` and `tests/c_host/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Compile a C program from `tests/c_host/` against `nccl-headers/`; returns the executable.
pub fn compile_c(source: &Path, exe_name: &str, extra_args: &[&str]) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(exe_name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(repo_root().join("nccl-headers"))
        .arg(source)
        .arg("-o")
        .arg(&out)
        .args(extra_args)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler '{cc}': {e}"));
    assert!(status.success(), "compiling {} failed", source.display());
    out
}

fn plugin_host() -> &'static Path {
    static HOST: OnceLock<PathBuf> = OnceLock::new();
    HOST.get_or_init(|| {
        compile_c(
            &repo_root().join("tests/c_host/plugin_host.c"),
            "plugin_host",
            &["-ldl"],
        )
    })
}

/// What the C host printed.
#[derive(Debug)]
pub struct HostRun {
    pub stdout: String,
    pub stderr: String,
}

/// One `key=value ...` line, keyed by its first word (`DEV`, `CALL`, `LOG`, ...).
#[derive(Debug)]
pub struct Fields {
    pub rest: String,
    map: HashMap<String, String>,
}

impl Fields {
    fn parse(rest: &str) -> Self {
        // `msg=` runs to the end of the line; everything before it is space-separated pairs.
        let (pairs, msg) = match rest.find(" msg=") {
            Some(i) => (&rest[..i], Some(&rest[i + 5..])),
            None => (rest, None),
        };
        let mut map: HashMap<String, String> = pairs
            .split(' ')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        if let Some(m) = msg {
            map.insert("msg".into(), m.to_owned());
        }
        Self {
            rest: rest.to_owned(),
            map,
        }
    }

    pub fn get(&self, key: &str) -> &str {
        self.map
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no '{key}' in '{}'", self.rest))
    }

    pub fn int(&self, key: &str) -> i64 {
        let v = self.get(key);
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap() as i64,
            None => v
                .parse()
                .unwrap_or_else(|_| panic!("'{key}={v}' is not a number")),
        }
    }
}

impl HostRun {
    fn lines(&self, kind: &str) -> Vec<Fields> {
        let prefix = format!("{kind} ");
        self.stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(Fields::parse)
            .collect()
    }

    /// Every device reported by `getProperties`, in index order (first load only).
    pub fn devices(&self) -> Vec<Fields> {
        let mut devs = self.lines("DEV");
        if let Some(second) = devs.iter().skip(1).position(|d| d.get("index") == "0") {
            devs.truncate(second + 1);
        }
        devs
    }

    pub fn device_names(&self) -> Vec<String> {
        self.devices()
            .iter()
            .map(|d| d.get("name").to_owned())
            .collect()
    }

    /// Lines delivered to the C logger.
    pub fn logs(&self) -> Vec<Fields> {
        self.lines("LOG")
    }

    /// Result code of the first call named `name` (e.g. `devices`, `init`).
    pub fn rc(&self, name: &str) -> i64 {
        self.calls(name)
            .first()
            .unwrap_or_else(|| panic!("no call '{name}' in:\n{}", self.stdout))
            .int("rc")
    }

    pub fn calls(&self, name: &str) -> Vec<Fields> {
        let prefix = format!("{name} ");
        self.lines("CALL")
            .into_iter()
            .filter(|c| c.rest.starts_with(&prefix))
            .collect()
    }

    /// The plugin's "0 devices" explanations (there should be exactly one when it has none).
    pub fn zero_device_reasons(&self) -> Vec<Fields> {
        self.logs()
            .into_iter()
            .filter(|l| l.get("msg").starts_with("NET/RsIB: 0 devices: "))
            .collect()
    }

    pub fn line(&self, kind: &str) -> Fields {
        self.lines(kind)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("no {kind} line in:\n{}", self.stdout))
    }
}

/// Run the C host on the plugin with NCCL's variables cleared and `env` set.
pub fn run_host(env: &[(&str, &str)], args: &[&str]) -> HostRun {
    let env = env
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
    run_host_with(env.collect(), args)
}

/// `run_host` with values that need not be UTF-8.
pub fn run_host_with(env: Vec<(OsString, OsString)>, args: &[&str]) -> HostRun {
    let mut cmd = Command::new(plugin_host());
    cmd.arg(plugin_path()).args(args);
    for (k, _) in std::env::vars_os().filter(|(k, _)| k.as_encoded_bytes().starts_with(b"NCCL_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env);
    let out = cmd.output().unwrap();
    let run = HostRun {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        out.status.success(),
        "plugin_host failed ({}):\n{}\n{}",
        out.status,
        run.stdout,
        run.stderr
    );
    run
}
