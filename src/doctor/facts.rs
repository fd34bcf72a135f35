//! What the doctor knows about a node before it judges anything: the configuration as NCCL
//! would hand it to the plugin (and where each value came from), the plugin's survey, the
//! process's locked-memory limit, the device nodes the plugin would open, and whether this is a
//! container or a VM. Files are read under [`Roots`], so tests use fixture trees.

use std::ffi::OsString;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::core::config::{Config, KNOBS, NOT_IMPLEMENTED};
use crate::core::error::Error;
use crate::core::queues::QueueMemory;
use crate::driver::Exports;
use crate::plugin::{DeviceModel, DmaBufProbe, GpuFacts, Survey};
use crate::topology::{HcaFilter, SysfsRoot};
use crate::transport::connection_memory;
use crate::verbs::Discovery;

/// The filesystem root everything is read under: `/` on a node, a fixture tree in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roots {
    /// Directory that holds `sys/`, `proc/`, `dev/` and `etc/`.
    pub fs: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self { fs: "/".into() }
    }
}

impl Roots {
    /// `path` (absolute, as on the node) under the root.
    pub fn at(&self, path: &str) -> PathBuf {
        self.fs.join(path.trim_start_matches('/'))
    }

    /// The sysfs tree.
    pub fn sysfs(&self) -> SysfsRoot {
        SysfsRoot::new(self.at("/sys"))
    }

    /// The text of `path` under the root, trimmed; `None` when unreadable or empty.
    pub fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(self.at(path))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    }
}

/// Where a variable's value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The process environment.
    Environment,
    /// A configuration file NCCL reads (`/etc/nccl.conf`, `~/.nccl.conf`, `NCCL_CONF_FILE`).
    File {
        /// The file, as named on the node.
        path: String,
        /// 1-based line.
        line: usize,
    },
    /// Unset: the plugin's default applies.
    Default,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Environment => f.write_str("environment"),
            Self::File { path, line } => write!(f, "{path}:{line}"),
            Self::Default => f.write_str("default"),
        }
    }
}

/// One variable the plugin reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The variable.
    pub name: &'static str,
    /// Its value, lossily decoded; `None` when unset.
    pub value: Option<String>,
    /// Where the value came from.
    pub origin: Origin,
    /// The plugin's default.
    pub default: &'static str,
}

/// A configuration file NCCL would read, and the lines it would ignore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfFile {
    /// As named on the node.
    pub path: String,
    /// Whether it exists.
    pub present: bool,
    /// `line N: why` for each line NCCL skips or reads differently than it looks.
    pub notes: Vec<String>,
}

/// The configuration as NCCL hands it to the plugin, with the origin of every value.
#[derive(Debug)]
pub struct EffectiveConfig {
    /// One entry per variable the plugin reads ([`KNOBS`]), in that order.
    pub settings: Vec<Setting>,
    /// The configuration files, in the order NCCL reads them.
    pub files: Vec<ConfFile>,
    /// The plugin's own parse of the values: what `init` would decide or refuse.
    pub parsed: Result<Config, Error>,
    /// NCCL's own variables the doctor weighs ([`NCCL_VARIABLES`]), resolved alike.
    pub nccl: Vec<Setting>,
    /// The variables of NCCL's IB transport that this plugin does not implement
    /// ([`NOT_IMPLEMENTED`]) and that are set, resolved alike.
    pub not_implemented: Vec<Setting>,
}

/// NCCL's own variables the doctor weighs, with what NCCL does when they are unset: those that
/// choose the network before the plugin is asked anything (`plugin.load`), the size of NCCL's
/// staging buffers and the connections NCCL opens per peer (`memlock`).
pub const NCCL_VARIABLES: [(&str, &str); 5] = [
    ("NCCL_NET_PLUGIN", "libnccl-net.so"),
    ("NCCL_NET", "the first network that starts"),
    ("NCCL_IB_DISABLE", "0"),
    ("NCCL_BUFFSIZE", "4194304"),
    ("NCCL_NCHANNELS_PER_NET_PEER", "2"),
];

/// `NAME=value` entries of one configuration file, as NCCL's `setEnvFile` reads them: lines
/// starting with `#` are comments, the name is everything before the first `=` (spaces
/// included), the value everything after it; CR/LF are stripped.
fn read_conf(text: &str) -> (Vec<(String, String, usize)>, Vec<String>) {
    let mut entries = Vec::new();
    let mut notes = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_end_matches('\r');
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            notes.push(format!("line {}: no '=', ignored by NCCL", i + 1));
            continue;
        };
        if name != name.trim() {
            notes.push(format!(
                "line {}: '{name}' has spaces around the name, NCCL sets a variable of that \
                 exact name (so '{}' stays unset by this line)",
                i + 1,
                name.trim()
            ));
        }
        entries.push((name.to_owned(), value.to_owned(), i + 1));
    }
    (entries, notes)
}

impl EffectiveConfig {
    /// Resolve every variable as NCCL does before it loads the plugin: the process environment
    /// wins; then the user file (`NCCL_CONF_FILE`, or `$HOME/.nccl.conf` without it), then
    /// `/etc/nccl.conf`; within and across files the first definition wins (NCCL's `setenv`
    /// never overwrites). Files are read under `roots`.
    pub fn resolve(env: &dyn Fn(&str) -> Option<OsString>, roots: &Roots) -> Self {
        let text = |v: OsString| v.to_string_lossy().into_owned();
        let user_file = match env("NCCL_CONF_FILE").map(text).filter(|f| !f.is_empty()) {
            Some(file) => Some(file),
            None => env("HOME").map(|home| format!("{}/.nccl.conf", text(home))),
        };
        let mut files = Vec::new();
        let mut from_files: Vec<(String, String, Origin)> = Vec::new();
        for path in user_file.into_iter().chain(["/etc/nccl.conf".to_owned()]) {
            let content = std::fs::read_to_string(roots.at(&path)).ok();
            let (entries, notes) = content.as_deref().map(read_conf).unwrap_or_default();
            for (name, value, line) in entries {
                if !from_files.iter().any(|(n, ..)| *n == name) {
                    let origin = Origin::File {
                        path: path.clone(),
                        line,
                    };
                    from_files.push((name, value, origin));
                }
            }
            files.push(ConfFile {
                path,
                present: content.is_some(),
                notes,
            });
        }
        let lookup = |name: &str| -> Option<(OsString, Origin)> {
            if let Some(v) = env(name) {
                return Some((v, Origin::Environment));
            }
            from_files
                .iter()
                .find(|(n, ..)| n == name)
                .map(|(_, v, origin)| (OsString::from(v), origin.clone()))
        };
        let setting = |name: &'static str, default: &'static str| {
            let found = lookup(name);
            Setting {
                name,
                value: found.as_ref().map(|(v, _)| text(v.clone())),
                origin: found.map_or(Origin::Default, |(_, o)| o),
                default,
            }
        };
        let settings = KNOBS
            .iter()
            .map(|knob| setting(knob.name, knob.default))
            .collect();
        let nccl = NCCL_VARIABLES
            .iter()
            .map(|&(name, default)| setting(name, default))
            .collect();
        let not_implemented = NOT_IMPLEMENTED
            .iter()
            .map(|knob| setting(knob.name, knob.default))
            .filter(|s| s.value.as_deref().is_some_and(|v| !v.trim().is_empty()))
            .collect();
        let parsed = Config::from_lookup(|name| lookup(name).map(|(v, _)| v));
        Self {
            settings,
            files,
            parsed,
            nccl,
            not_implemented,
        }
    }

    /// The value of `name` (one of [`KNOBS`] or [`NCCL_VARIABLES`]) as NCCL would see it.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .chain(&self.nccl)
            .find(|s| s.name == name)
            .and_then(|s| s.value.as_deref())
    }
}

/// What opening one library name gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opened {
    /// It loaded: what it exports.
    Loaded(Exports),
    /// Not on the library path (NCCL's "Could not find", from the loader's ENOENT for the name
    /// itself).
    NotFound(String),
    /// It exists but did not load: the loader's message (a missing dependency, a wrong ELF).
    Failed(String),
    /// `STATIC_PLUGIN`: NCCL looks in the application itself, which the doctor is not.
    InApplication,
}

/// One entry of `NCCL_NET_PLUGIN` (or the default): each name NCCL opens for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginEntry {
    /// The names opened, in NCCL's order (the entry as written first), up to the first that
    /// loaded.
    pub tried: Vec<(String, Opened)>,
}

impl PluginEntry {
    /// The outcome that counts: the library that loaded, else the last failure.
    pub fn outcome(&self) -> Option<&(String, Opened)> {
        self.tried
            .iter()
            .find(|(_, o)| matches!(o, Opened::Loaded(_)))
            .or(self.tried.last())
    }
}

/// The library names NCCL opens for a net plugin, as `src/plugin/net.cc` and
/// `src/plugin/plugin_open.cc` (2.30) pick them: the entries of `NCCL_NET_PLUGIN` in order
/// (comma-separated, empty ones skipped, `none` = no entry), each opened as written and then, when it
/// is neither a path nor a `lib*.so` name, as `libnccl-net-<entry>.so`; `libnccl-net.so` when
/// the variable is unset. `open` is the loader (`dlopen` on a node, a table in tests); an entry
/// that prefixes `STATIC_PLUGIN` (case-insensitively) names the application itself.
fn plugin_route(
    setting: Option<&str>,
    open: &dyn Fn(&str) -> Result<Exports, String>,
) -> Vec<PluginEntry> {
    let entries: Vec<&str> = match setting {
        None => vec!["libnccl-net.so"],
        Some(v) if v.eq_ignore_ascii_case("none") => Vec::new(),
        Some(v) => v.split(',').filter(|e| !e.is_empty()).collect(),
    };
    entries
        .into_iter()
        .map(|entry| {
            let mut names = vec![entry.to_owned()];
            let library_name = entry.starts_with("lib") && entry.ends_with(".so");
            if setting.is_some() && !entry.contains('/') && !library_name {
                names.push(format!("libnccl-net-{entry}.so"));
            }
            let mut tried = Vec::new();
            for name in names {
                let opened = if "static_plugin".starts_with(&name.to_ascii_lowercase()) {
                    Opened::InApplication
                } else {
                    match open(&name) {
                        Ok(exports) => Opened::Loaded(exports),
                        Err(e) if e.contains(&name) && e.contains("No such file or directory") => {
                            Opened::NotFound(e)
                        }
                        Err(e) => Opened::Failed(e),
                    }
                };
                let done = matches!(opened, Opened::Loaded(_) | Opened::InApplication);
                tried.push((name, opened));
                if done {
                    break;
                }
            }
            PluginEntry { tried }
        })
        .collect()
}

/// The locked-memory limit of this process and whether it applies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Memlock {
    /// Soft limit in bytes; `None` = unlimited; `Err` = unreadable.
    pub soft: Result<Option<u64>, String>,
    /// Hard limit in bytes; `None` = unlimited.
    pub hard: Option<u64>,
    /// CAP_IPC_LOCK is effective: the kernel does not apply the limit to registrations.
    pub cap_ipc_lock: bool,
    /// The `Max locked memory` line of `/proc/self/limits`.
    pub evidence: String,
}

impl Memlock {
    /// Read `/proc/self/limits` and the effective capabilities in `/proc/self/status`.
    pub fn read(roots: &Roots) -> Self {
        let limits = std::fs::read_to_string(roots.at("/proc/self/limits")).unwrap_or_default();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max locked memory"))
            .map(str::to_owned);
        let parse = |field: Option<&str>| -> Result<Option<u64>, String> {
            match field {
                Some("unlimited") => Ok(None),
                Some(n) => n
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("'{n}' is not a size")),
                None => Err("no 'Max locked memory' line in /proc/self/limits".to_owned()),
            }
        };
        let fields: Vec<&str> = line
            .as_deref()
            .map(|l| l["Max locked memory".len()..].split_whitespace().collect())
            .unwrap_or_default();
        let status = std::fs::read_to_string(roots.at("/proc/self/status")).unwrap_or_default();
        const CAP_IPC_LOCK: u32 = 14;
        let cap_ipc_lock = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0);
        Self {
            soft: parse(fields.first().copied()),
            hard: parse(fields.get(1).copied()).ok().flatten(),
            cap_ipc_lock,
            evidence: line.unwrap_or_default(),
        }
    }
}

/// How many connections one process is expected to hold, as the operator said it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Peer connections (a send and a receive comm each): `--connections`.
    Connections(u64),
    /// Peers of an all-to-all: `--peers`, times the channels NCCL opens per network peer
    /// (`NCCL_NCHANNELS_PER_NET_PEER`).
    Peers(u64),
}

/// What the plugin and NCCL pin in host memory for the expected number of connections.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Peer connections (a send and a receive comm each) one process is expected to hold.
    pub connections: u64,
    /// When given as peers: the peers and the channels per peer they were multiplied by.
    pub peers: Option<(u64, u64)>,
    /// The plugin's own pinned bytes per connection: its rings, and its queues where the
    /// provider pins them (`transport::connection_memory`, for the device that pins most).
    pub plugin_bytes: u64,
    /// NCCL's staging buffers per connection that sit in host memory (two `NCCL_BUFFSIZE`
    /// buffers when GPUDirect RDMA is off, none when it is on).
    pub nccl_bytes: u64,
}

impl MemoryBudget {
    /// Total bytes.
    pub fn total(&self) -> u64 {
        self.connections
            .saturating_mul(self.plugin_bytes.saturating_add(self.nccl_bytes))
    }
}

/// NCCL's default `NCCL_NCHANNELS_PER_NET_PEER`: the connections (send and receive comm) it
/// opens to each network peer of point-to-point operations.
const NCCL_DEFAULT_CHANNELS_PER_NET_PEER: u64 = 2;

/// NCCL's default `NCCL_BUFFSIZE` (the SIMPLE protocol's buffer per connection and direction).
const NCCL_DEFAULT_BUFFSIZE: u64 = 4 << 20;

/// A `/dev/infiniband/uverbsN` node the plugin would open, and whether it opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DevNode {
    /// RDMA device it belongs to.
    pub device: String,
    /// `uverbsN`, `None` when sysfs shows no verbs node for the device (ib_uverbs missing).
    pub node: Option<String>,
    /// The path as on the node.
    pub path: String,
    /// Opening it read-write (as libibverbs does): `Err((errno, message))`.
    pub open: Result<(), (i32, String)>,
}

/// One record of the kernel's log ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRecord {
    /// The ring's sequence number.
    pub seq: u64,
    /// Microseconds since boot.
    pub micros: u64,
    /// The message, as `/dev/kmsg` escapes it.
    pub text: String,
}

/// The kernel's log ring as `/dev/kmsg` hands it out: what the kernel itself said since boot
/// (or since the oldest record the ring still holds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelLog {
    /// The kernel's own records (facility 0), oldest first; `Err`: why none could be read.
    pub records: Result<Vec<KernelRecord>, String>,
    /// Records written into the log from user space (any other facility: `echo > /dev/kmsg`,
    /// init systems): counted, never judged, as anyone may write them.
    pub from_user_space: usize,
    /// Records the kernel overwrote while they were being read (`EPIPE`).
    pub lost: usize,
}

impl KernelLog {
    /// Records kept at most; a ring holds a few thousand.
    const MAX_RECORDS: usize = 200_000;

    /// Read `/dev/kmsg` under `roots` to its end without waiting: one record per `read` on the
    /// device (a fixture's regular file gives many per read, split at newlines alike).
    pub fn read(roots: &Roots) -> Self {
        let mut log = Self {
            records: Ok(Vec::new()),
            from_user_space: 0,
            lost: 0,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(roots.at("/dev/kmsg"));
        let mut file = match file {
            Ok(f) => f,
            Err(e) => {
                log.records = Err(Self::unreadable(&e));
                return log;
            }
        };
        let mut records = Vec::new();
        let mut buf = vec![0u8; 16 << 10];
        let mut partial = Vec::new();
        while records.len() < Self::MAX_RECORDS {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {
                    log.lost += 1;
                    continue;
                }
                Err(e) => {
                    log.records = Err(Self::unreadable(&e));
                    return log;
                }
            }
            let complete = partial
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            for line in String::from_utf8_lossy(&partial[..complete]).lines() {
                // Continuation lines (` SUBSYSTEM=...`) carry a record's dictionary.
                if line.starts_with(' ') || line.is_empty() {
                    continue;
                }
                match parse_kmsg(line) {
                    Some((0, record)) => records.push(record),
                    Some(_) => log.from_user_space += 1,
                    None => {}
                }
            }
            partial.drain(..complete);
        }
        log.records = Ok(records);
        log
    }

    fn unreadable(e: &std::io::Error) -> String {
        match e.raw_os_error() {
            Some(libc::ENOENT) => {
                "no /dev/kmsg (containers usually have none: run the doctor on the host)".to_owned()
            }
            Some(libc::EPERM | libc::EACCES) => format!(
                "/dev/kmsg: {e}: reading the kernel log needs root (or CAP_SYSLOG with \
                 kernel.dmesg_restrict=1)"
            ),
            _ => format!("/dev/kmsg: {e}"),
        }
    }
}

/// `PRI,SEQ,MICROS,FLAGS[,...];TEXT` (a `/dev/kmsg` record) as its facility and the record.
fn parse_kmsg(line: &str) -> Option<(u32, KernelRecord)> {
    let (head, text) = line.split_once(';')?;
    let mut fields = head.split(',');
    let priority: u32 = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    let micros = fields.next()?.parse().ok()?;
    let record = KernelRecord {
        seq,
        micros,
        text: text.to_owned(),
    };
    Some((priority >> 3, record))
}

/// Where the doctor runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunContext {
    /// Why this looks like a container, `None` otherwise.
    pub container: Option<String>,
    /// Why this looks like a VM, `None` on bare metal.
    pub vm: Option<String>,
}

impl RunContext {
    /// `host`, `container`, `vm` or `vm+container`.
    pub fn kind(&self) -> &'static str {
        match (&self.container, &self.vm) {
            (None, None) => "host",
            (Some(_), None) => "container",
            (None, Some(_)) => "vm",
            (Some(_), Some(_)) => "vm+container",
        }
    }

    fn detect(roots: &Roots, hypervisor: Option<String>) -> Self {
        let marker = ["/.dockerenv", "/run/.containerenv"]
            .into_iter()
            .find(|m| roots.at(m).exists())
            .map(|m| format!("{m} exists"));
        let cgroup = || {
            let text = std::fs::read_to_string(roots.at("/proc/1/cgroup")).ok()?;
            ["kubepods", "docker", "containerd", "libpod", "lxc"]
                .into_iter()
                .find(|k| text.contains(k))
                .map(|k| format!("/proc/1/cgroup mentions {k}"))
        };
        Self {
            container: marker.or_else(cgroup),
            vm: hypervisor,
        }
    }
}

/// Everything the node checks judge.
#[derive(Debug)]
pub struct NodeFacts {
    /// Where files were read.
    pub roots: Roots,
    /// The configuration with origins, and the plugin's parse of it.
    pub effective: EffectiveConfig,
    /// The parsed configuration, or the defaults when it did not parse (the survey still runs
    /// so the other checks have something to say).
    pub config: Config,
    /// CUDA, peer memory, hypervisor, verbs entry points.
    pub gpu: GpuFacts,
    /// The plugin's decisions (under ncclNet v8's model, where the plugin fuses itself).
    pub survey: Survey,
    /// The locked-memory limit.
    pub memlock: Memlock,
    /// What the expected connections pin.
    pub budget: MemoryBudget,
    /// The verbs nodes of the devices the plugin would open.
    pub dev_nodes: Vec<DevNode>,
    /// Container or VM.
    pub context: RunContext,
    /// The kernel's log.
    pub kernel_log: KernelLog,
    /// The libraries NCCL would open as its net plugin, in its order, with what each gave.
    pub plugin_route: Vec<PluginEntry>,
    /// `LD_LIBRARY_PATH`, where the loader looks first for a bare name.
    pub library_path: Option<String>,
}

impl NodeFacts {
    /// Gather the facts: `env` looks up the process environment, `discovery` is verbs' answer
    /// (the live one, or a fixture's ports), `probe_dmabuf` the DMA-BUF probe, `open_library`
    /// the loader NCCL would open its net plugin with, `expected` the peer connections one
    /// process is expected to hold.
    pub fn gather(
        roots: Roots,
        env: &dyn Fn(&str) -> Option<OsString>,
        discovery: Result<Discovery, Error>,
        gpu: GpuFacts,
        probe_dmabuf: DmaBufProbe<'_>,
        open_library: &dyn Fn(&str) -> Result<Exports, String>,
        expected: Expected,
    ) -> Self {
        let effective = EffectiveConfig::resolve(env, &roots);
        let plugin_route = plugin_route(effective.value("NCCL_NET_PLUGIN"), open_library);
        let config = effective.parsed.as_ref().cloned().unwrap_or_default();
        let sysfs = roots.sysfs();
        let survey = Survey::take(
            &config,
            DeviceModel::Fused,
            &sysfs,
            discovery,
            &gpu,
            probe_dmabuf,
        );
        let plugin_bytes = survey
            .devices
            .iter()
            .map(|d| {
                let memory = QueueMemory::of_device(
                    d.virt.members.first().map_or("", |m| m.device.as_str()),
                );
                connection_memory(&config, d.virt.members.len(), memory).pinned()
            })
            .max()
            .unwrap_or_else(|| connection_memory(&config, 1, QueueMemory::Pinned).pinned());
        let gdr = survey
            .devices
            .iter()
            .any(|d| d.memory.cuda || d.memory.dmabuf);
        // NCCL's integer variables, as set (the environment or its configuration files).
        let number = |name| {
            effective
                .value(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let buffsize = number("NCCL_BUFFSIZE").unwrap_or(NCCL_DEFAULT_BUFFSIZE);
        let channels = number("NCCL_NCHANNELS_PER_NET_PEER")
            .filter(|&c| c > 0)
            .unwrap_or(NCCL_DEFAULT_CHANNELS_PER_NET_PEER);
        let (connections, peers) = match expected {
            Expected::Connections(n) => (n, None),
            Expected::Peers(p) => (p.saturating_mul(channels), Some((p, channels))),
        };
        let budget = MemoryBudget {
            connections,
            peers,
            plugin_bytes,
            nccl_bytes: if gdr { 0 } else { 2 * buffsize },
        };
        let dev_nodes = dev_nodes(&roots, &config);
        let context = RunContext::detect(&roots, gpu.hypervisor.clone());
        Self {
            memlock: Memlock::read(&roots),
            kernel_log: KernelLog::read(&roots),
            roots,
            effective,
            config,
            gpu,
            survey,
            budget,
            dev_nodes,
            context,
            plugin_route,
            library_path: env("LD_LIBRARY_PATH").map(|v| v.to_string_lossy().into_owned()),
        }
    }
}

/// `NCCL_IB_HCA` as a filter; `None` when unset or unparsable (env.config reports the latter).
pub(super) fn hca_filter(config: &Config) -> Option<HcaFilter> {
    config
        .ib_hca
        .as_deref()
        .and_then(|v| HcaFilter::parse(v).ok())
}

/// The RDMA devices in sysfs (with their ports) that have at least one port `filter` allows:
/// those the plugin would open.
pub(super) fn candidate_devices(
    roots: &Roots,
    filter: Option<&HcaFilter>,
) -> Vec<(String, Vec<u32>)> {
    let class = roots.at("/sys/class/infiniband");
    let mut devices: Vec<(String, Vec<u32>)> = std::fs::read_dir(class)
        .map(|listing| {
            listing
                .filter_map(|e| {
                    let entry = e.ok()?;
                    let name = entry.file_name().into_string().ok()?;
                    let mut ports: Vec<u32> = std::fs::read_dir(entry.path().join("ports"))
                        .map(|p| {
                            p.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                                .collect()
                        })
                        .unwrap_or_default();
                    ports.sort_unstable();
                    Some((name, ports))
                })
                .collect()
        })
        .unwrap_or_default();
    devices.retain(|(name, ports)| filter.is_none_or(|f| ports.iter().any(|&p| f.allows(name, p))));
    devices.sort();
    devices
}

/// The verbs node of every candidate device, opened read-write as libibverbs opens it.
fn dev_nodes(roots: &Roots, config: &Config) -> Vec<DevNode> {
    let verbs_class = roots.at("/sys/class/infiniband_verbs");
    let nodes: Vec<(String, String)> = std::fs::read_dir(&verbs_class)
        .map(|listing| {
            listing
                .filter_map(|e| {
                    let node = e.ok()?.file_name().into_string().ok()?;
                    let ibdev =
                        std::fs::read_to_string(verbs_class.join(&node).join("ibdev")).ok()?;
                    Some((ibdev.trim().to_owned(), node))
                })
                .collect()
        })
        .unwrap_or_default();
    candidate_devices(roots, hca_filter(config).as_ref())
        .into_iter()
        .map(|(device, _)| {
            let node = nodes
                .iter()
                .find(|(ibdev, _)| *ibdev == device)
                .map(|(_, n)| n.clone());
            let path = format!("/dev/infiniband/{}", node.as_deref().unwrap_or("uverbs?"));
            let open = match &node {
                None => Err((
                    libc::ENODEV,
                    "no verbs node in /sys/class/infiniband_verbs".to_owned(),
                )),
                Some(_) => std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(roots.at(&path))
                    .map(drop)
                    .map_err(|e| (e.raw_os_error().unwrap_or(0), e.to_string())),
            };
            DevNode {
                device,
                node,
                path,
                open,
            }
        })
        .collect()
}

/// The filesystem path of `path` (an absolute path on the node) under `roots`.
pub(super) fn shown(path: &Path, roots: &Roots) -> String {
    path.strip_prefix(&roots.fs).map_or_else(
        |_| path.display().to_string(),
        |rel| format!("/{}", rel.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loader that knows `present` (each loads as a plugin named after it) and says what
    /// glibc says for anything else.
    fn loader(present: &'static [&'static str]) -> impl Fn(&str) -> Result<Exports, String> {
        move |name: &str| {
            if present.contains(&name) {
                Ok(Exports {
                    path: format!("/opt/{name}"),
                    versions: vec![12],
                    name: Some(name.to_owned()),
                })
            } else {
                Err(format!(
                    "{name}: cannot open shared object file: No such file or directory"
                ))
            }
        }
    }

    fn names(route: &[PluginEntry]) -> Vec<Vec<&str>> {
        route
            .iter()
            .map(|e| e.tried.iter().map(|(n, _)| n.as_str()).collect())
            .collect()
    }

    /// NCCL 2.30's `initPluginLibsOnceFunc` and `openPluginLib`: the list, `none`, and when the
    /// `libnccl-net-<entry>.so` name is tried.
    #[test]
    fn the_names_nccl_opens() {
        let none = loader(&[]);
        assert_eq!(
            names(&plugin_route(None, &none)),
            [vec!["libnccl-net.so"]],
            "unset: the default name only"
        );
        assert!(plugin_route(Some("NoNe"), &none).is_empty());
        assert_eq!(
            names(&plugin_route(
                Some("rsib,,/opt/x.so,libfoo.so,lib,libbar.so.1"),
                &none
            )),
            [
                vec!["rsib", "libnccl-net-rsib.so"],
                vec!["/opt/x.so"],
                vec!["libfoo.so"],
                vec!["lib", "libnccl-net-lib.so"],
                vec!["libbar.so.1", "libnccl-net-libbar.so.1.so"],
            ],
            "a path or a lib*.so name is opened as written only; empty entries are skipped"
        );
    }

    #[test]
    fn an_entry_stops_at_the_first_name_that_loads() {
        let route = plugin_route(Some("rsib,libnccl-net-rsib.so"), &loader(&["rsib"]));
        assert_eq!(names(&route), [vec!["rsib"], vec!["libnccl-net-rsib.so"]]);
        assert!(matches!(route[0].outcome(), Some((_, Opened::Loaded(_)))));
        let route = plugin_route(Some("rsib"), &loader(&["libnccl-net-rsib.so"]));
        assert!(matches!(&route[0].tried[0].1, Opened::NotFound(_)));
        assert!(
            matches!(route[0].outcome(), Some((n, Opened::Loaded(_))) if n == "libnccl-net-rsib.so")
        );
    }

    #[test]
    fn a_missing_dependency_is_a_failure_not_an_absence() {
        // glibc names the dependency, not the library asked for: NCCL logs it apart from its
        // "Could not find" list.
        let broken = |_: &str| -> Result<Exports, String> {
            Err("libibverbs.so.1: cannot open shared object file: No such file or directory".into())
        };
        let route = plugin_route(Some("/opt/libnccl-net.so"), &broken);
        assert!(matches!(&route[0].tried[0].1, Opened::Failed(e) if e.starts_with("libibverbs")));
    }

    #[test]
    fn a_prefix_of_static_plugin_names_the_application() {
        for entry in ["STATIC_PLUGIN", "static", "s"] {
            let route = plugin_route(Some(entry), &loader(&[]));
            assert_eq!(route[0].tried, [(entry.to_owned(), Opened::InApplication)]);
        }
        let route = plugin_route(Some("static_plugins"), &loader(&[]));
        assert!(matches!(&route[0].tried[0].1, Opened::NotFound(_)));
    }
}
