//! The plugin as NCCL will see it: the configuration it reads, whether NCCL loads it, and the
//! devices it gives NCCL.

use super::*;

pub(super) fn env_config(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "env.config";
    let e = &facts.effective;
    let mut findings = Vec::new();
    if let Err(err) = &e.parsed {
        findings.push(
            Finding::new(
                Severity::Fail,
                CHECK,
                "plugin",
                format!("init would refuse: {err}"),
            )
            .fix("correct or unset the variable; every variable's default and range is in the plugin's docs/configuration.md (/usr/share/doc/nccl-net-rsib/docs/ with the package)"),
        );
    }
    if let (Some(hca), Err(why)) = (&facts.config.ib_hca, &facts.survey.selection)
        && facts.survey.discovery.is_ok()
    {
        findings.push(
            Finding::new(Severity::Fail, CHECK, "NCCL_IB_HCA", why.clone())
                .fix(format!("list the active ports (`ibv_devinfo`) and set NCCL_IB_HCA to match them, or unset it (was '{hca}')")),
        );
    }
    for file in &e.files {
        for note in &file.notes {
            findings.push(
                Finding::new(Severity::Warn, CHECK, file.path.clone(), note.clone())
                    .fix("write NAME=value with no spaces around '='"),
            );
        }
    }
    for knob in NOT_IMPLEMENTED {
        let Some(s) = e.not_implemented.iter().find(|s| s.name == knob.name) else {
            continue;
        };
        findings.push(
            Finding::new(
                Severity::Warn,
                CHECK,
                knob.name,
                format!(
                    "{}={} ({}) has no effect: this plugin does not implement it; in NCCL's \
                     internal IB transport (default {}) it is for: {}",
                    s.name,
                    s.value.as_deref().unwrap_or(""),
                    s.origin,
                    knob.default,
                    knob.meaning
                ),
            )
            .fix(format!(
                "unset {} where this plugin carries the traffic (it only matters to NCCL's internal IB transport)",
                knob.name
            )),
        );
    }
    let set: Vec<String> = e
        .settings
        .iter()
        .filter(|s| s.origin != Origin::Default)
        .map(|s| {
            format!(
                "{}={} ({})",
                s.name,
                s.value.as_deref().unwrap_or(""),
                s.origin
            )
        })
        .collect();
    let files: Vec<String> = e
        .files
        .iter()
        .map(|f| format!("{}{}", f.path, if f.present { "" } else { " (absent)" }))
        .collect();
    let what = if set.is_empty() {
        format!(
            "all {} variables at their defaults; read {}",
            e.settings.len(),
            files.join(", ")
        )
    } else {
        format!(
            "{}; {} others at their defaults; read {}",
            set.join(", "),
            e.settings.len() - set.len(),
            files.join(", ")
        )
    };
    let info = e.settings.iter().fold(
        Finding::new(Severity::Info, CHECK, "plugin", what),
        |f, s| {
            f.evidence(
                s.name,
                match &s.value {
                    Some(v) => format!("{v} ({})", s.origin),
                    None => format!("unset (default {})", s.default),
                },
            )
        },
    );
    findings.push(info);
    findings
}

/// `v12, v11, ...`: the ncclNet tables a library exports.
fn versions(x: &Exports) -> String {
    let listed: Vec<String> = x.versions.iter().map(|v| format!("v{v}")).collect();
    listed.join(", ")
}

/// What an opened library is to NCCL, in the words of the evidence and the FAIL line.
fn describe_opened(opened: &Opened) -> String {
    match opened {
        Opened::Loaded(x) if x.versions.is_empty() => format!(
            "{} exports no ncclNetPlugin_v6 .. v12 (NCCL skips it as unsupported)",
            x.path
        ),
        Opened::Loaded(x) => format!(
            "{} ({}, ncclNet {})",
            x.path,
            x.name.as_deref().unwrap_or("no name"),
            versions(x)
        ),
        Opened::NotFound(e) | Opened::Failed(e) => e.clone(),
        Opened::InApplication => {
            "STATIC_PLUGIN: looked up in the application itself, which the doctor cannot see".into()
        }
    }
}

const PLUGIN_LOAD: &str = "plugin.load";

/// NCCL's variables as `plugin.load` words and weighs them.
struct NcclChoice<'a> {
    /// `NCCL_NET_PLUGIN=... (origin)`, or that it is unset.
    asked: String,
    /// `NCCL_NET`.
    net: Option<&'a str>,
    /// `NCCL_IB_DISABLE`, when it turns NCCL's internal IB transport off.
    ib_disable: Option<&'a str>,
}

impl NcclChoice<'_> {
    /// Whether `NCCL_NET` names this plugin.
    fn names_us(&self) -> bool {
        self.net
            .is_some_and(|n| n.eq_ignore_ascii_case(PLUGIN_NAME))
    }

    /// Whether NCCL may use plugin `x`: a ncclNet table, and the name `NCCL_NET` asks for
    /// (compared as NCCL does, ignoring case).
    fn may_use(&self, x: &Exports) -> bool {
        !x.versions.is_empty()
            && self
                .net
                .is_none_or(|n| x.name.as_deref().is_some_and(|m| m.eq_ignore_ascii_case(n)))
    }
}

/// The library an entry loaded, under the name that loaded it.
fn loaded(entry: &PluginEntry) -> Option<(&str, &Exports)> {
    match entry.outcome() {
        Some((name, Opened::Loaded(x))) => Some((name.as_str(), x)),
        _ => None,
    }
}

/// `f` with every name NCCL would open and what it gave.
fn with_route_evidence(facts: &NodeFacts, f: Finding) -> Finding {
    facts
        .plugin_route
        .iter()
        .flat_map(|entry| &entry.tried)
        .fold(f, |f, (name, opened)| {
            f.evidence(format!("dlopen({name})"), describe_opened(opened))
        })
}

/// Whether NCCL would find this plugin: the library it opens (`NCCL_NET_PLUGIN`'s entries in
/// order, else `libnccl-net.so`, through the dynamic loader as NCCL calls it), and whether
/// `NCCL_NET` lets NCCL use it. NCCL says none of this above its INFO level: a plugin that
/// does not load leaves the job on NCCL's internal transport without a warning.
pub(super) fn plugin_load(facts: &NodeFacts) -> Vec<Finding> {
    let e = &facts.effective;
    let choice = NcclChoice {
        asked: match e.nccl.iter().find(|s| s.name == "NCCL_NET_PLUGIN") {
            Some(Setting {
                value: Some(v),
                origin,
                ..
            }) => format!("NCCL_NET_PLUGIN={v} ({origin})"),
            _ => "NCCL_NET_PLUGIN unset".to_owned(),
        },
        net: e.value("NCCL_NET"),
        ib_disable: e
            .value("NCCL_IB_DISABLE")
            .filter(|v| v.trim().parse::<i64>().is_ok_and(|n| n != 0)),
    };
    let mut findings = Vec::new();
    if let Some(n) = choice.net
        && !choice.names_us()
    {
        findings.push(
            Finding::new(
                Severity::Fail,
                PLUGIN_LOAD,
                "NCCL_NET",
                format!("NCCL_NET={n}: NCCL uses only the network named '{n}', never this plugin ({PLUGIN_NAME})"),
            )
            .fix(format!("unset NCCL_NET, or set NCCL_NET={PLUGIN_NAME}")),
        );
    }
    let ours = facts
        .plugin_route
        .iter()
        .enumerate()
        .find_map(|(i, entry)| {
            loaded(entry)
                .filter(|(_, x)| x.name.as_deref() == Some(PLUGIN_NAME) && !x.versions.is_empty())
                .map(|(name, x)| (i, name, x))
        });
    match ours {
        Some((i, name, x)) => findings.extend(plugin_found(facts, &choice, i, name, x)),
        None => findings.push(plugin_missing(facts, &choice)),
    }
    findings
}

/// `plugin.load` when NCCL opens this plugin from entry `at` (as `name`): PASS, or WARN when an
/// earlier entry is a plugin NCCL would try first; INFO on `NCCL_IB_DISABLE`.
fn plugin_found(
    facts: &NodeFacts,
    choice: &NcclChoice<'_>,
    at: usize,
    name: &str,
    ours: &Exports,
) -> Vec<Finding> {
    let ahead: Vec<String> = facts.plugin_route[..at]
        .iter()
        .filter_map(loaded)
        .filter(|(_, x)| choice.may_use(x))
        .map(|(name, x)| format!("{name} ({})", x.name.as_deref().unwrap_or("no name")))
        .collect();
    let opens = if ours.path == name {
        name.to_owned()
    } else {
        format!("{name} = {}", ours.path)
    };
    let line = format!(
        "{}: NCCL opens {opens} ({PLUGIN_NAME}, ncclNet {}){}",
        choice.asked,
        versions(ours),
        if choice.names_us() {
            ", which NCCL_NET selects"
        } else {
            ""
        }
    );
    let verdict = if ahead.is_empty() {
        Finding::new(Severity::Pass, PLUGIN_LOAD, "plugin", line)
    } else {
        Finding::new(
            Severity::Warn,
            PLUGIN_LOAD,
            "plugin",
            format!(
                "{line}; but NCCL_NET_PLUGIN lists {} before it, which NCCL uses whenever its init finds a device",
                ahead.join(", ")
            ),
        )
        .fix(format!(
            "list this plugin first in NCCL_NET_PLUGIN, or set NCCL_NET={PLUGIN_NAME}"
        ))
    };
    let mut findings = vec![with_route_evidence(facts, verdict)];
    if let Some(v) = choice.ib_disable {
        findings.push(
            Finding::new(
                Severity::Info,
                PLUGIN_LOAD,
                "NCCL_IB_DISABLE",
                format!("NCCL_IB_DISABLE={v} turns off NCCL's internal IB transport only: this plugin is external and still carries the traffic"),
            )
            .fix("to run on sockets instead, set NCCL_NET=Socket"),
        );
    }
    findings
}

/// `plugin.load` when no entry is this plugin: FAIL with each entry's outcome and what NCCL
/// does instead; UNKNOWN when NCCL looks in the application itself.
fn plugin_missing(facts: &NodeFacts, choice: &NcclChoice<'_>) -> Finding {
    let route = &facts.plugin_route;
    let why = if route.is_empty() {
        "it opens no external plugin".to_owned()
    } else {
        let outcomes: Vec<String> = route
            .iter()
            .filter_map(|entry| {
                let (name, opened) = entry.outcome()?;
                Some(match opened {
                    Opened::NotFound(_) if name.contains('/') => format!("{name} not found"),
                    Opened::NotFound(_) => format!("{name} not found on the library path"),
                    Opened::Loaded(x) if !x.versions.is_empty() => {
                        format!("{name} = {}: another plugin", describe_opened(opened))
                    }
                    _ => format!("{name}: {}", describe_opened(opened)),
                })
            })
            .collect();
        outcomes.join("; ")
    };
    let other = route
        .iter()
        .filter_map(loaded)
        .find(|(_, x)| choice.may_use(x));
    let then = if choice.names_us() {
        "with NCCL_NET selecting this plugin, NCCL then fails to start (\"Failed to initialize any NET plugin\")".to_owned()
    } else if let Some((_, x)) = other {
        format!(
            "NCCL uses {} instead when its init finds a device",
            x.name.as_deref().unwrap_or("that plugin")
        )
    } else if let Some(v) = choice.ib_disable {
        format!("NCCL falls back to sockets (NCCL_IB_DISABLE={v})")
    } else {
        "NCCL falls back to its internal IB transport, then to sockets".to_owned()
    };
    let any_outcome = |kind: fn(&Opened) -> bool| {
        route
            .iter()
            .any(|entry| entry.outcome().is_some_and(|(_, o)| kind(o)))
    };
    let asked = &choice.asked;
    // The application's own symbols may be this plugin: only NCCL's log can tell.
    let finding = if any_outcome(|o| matches!(o, Opened::InApplication)) {
        Finding::new(
            Severity::Unknown,
            PLUGIN_LOAD,
            "plugin",
            format!("{asked}: cannot tell whether NCCL loads this plugin: {why}"),
        )
        .fix(format!("run the application with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET and look for \"Initialized NET plugin {PLUGIN_NAME}\""))
    } else {
        Finding::new(
            Severity::Fail,
            PLUGIN_LOAD,
            "plugin",
            format!("{asked}: NCCL does not load this plugin: {why}; {then}"),
        )
        .fix(if any_outcome(|o| matches!(o, Opened::Failed(_))) {
            "install what the loader names as missing (or put its directory on LD_LIBRARY_PATH)"
        } else {
            "install this plugin as libnccl-net.so in a directory on the library path (scripts/install.sh PREFIX puts it in PREFIX/lib), or set NCCL_NET_PLUGIN to the full path of its library"
        })
    };
    with_route_evidence(facts, finding).evidence(
        "LD_LIBRARY_PATH",
        facts.library_path.as_deref().unwrap_or("unset"),
    )
}

pub(super) fn plugin_devices(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "plugin.devices";
    let s = &facts.survey;
    match &s.selection {
        Err(_) if s.discovery.is_err() => vec![
            Finding::new(
                Severity::Fail,
                CHECK,
                "plugin",
                "NCCL would get 0 devices and fall back to sockets (see verbs.provider)",
            )
            .depends_on("verbs.provider"),
        ],
        Err(why) => vec![
            Finding::new(
                Severity::Fail,
                CHECK,
                "plugin",
                format!("NCCL would get 0 devices and fall back to sockets: {why}"),
            )
            .fix("see the port.state, verbs.provider and env.config lines above"),
        ],
        Ok(selection) => {
            let list: Vec<String> = s
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    format!(
                        "[{i}] {} ({} {})",
                        d.virt.name(),
                        d.virt.first().link_layer,
                        gbps(d.virt.speed_mbps().into())
                    )
                })
                .collect();
            let mut what = format!(
                "NCCL gets {} device(s): {}",
                s.devices.len(),
                list.join(", ")
            );
            if !selection.skipped.is_empty() {
                what.push_str(&format!("; not used: {}", selection.skipped.join("; ")));
            }
            let f = Finding::new(Severity::Pass, CHECK, "plugin", what);
            let f = s
                .fusion_decisions
                .iter()
                .fold(f, |f, d| f.evidence("fusion", d.clone()));
            let listed = s.devices.iter().fold(f, |f, d| {
                f.evidence(
                    format!("device {}", d.virt.name()),
                    format!(
                        "speed {} Mbps, pciPath {}, guid {:#x}, maxComms {}, memory {}",
                        d.virt.speed_mbps(),
                        d.virt.pci_path().map_or("NULL".to_owned(), |p| {
                            crate::doctor::facts::shown(p, &facts.roots)
                        }),
                        d.virt.first().guid,
                        d.virt.max_comms(),
                        d.memory.kinds()
                    ),
                )
            });
            std::iter::once(listed)
                .chain(degraded(facts))
                .chain(too_large_for_older_tables(facts))
                .collect()
        }
    }
}

/// A WARN for each `NCCL_NET_RS_FUSE` group with more ports than ncclNet v9 to v11 describe in
/// one device: the plugin refuses it at their `init` (the doctor cannot tell which NCCL the job
/// loads), so under NCCL 2.24 to 2.29 its ports stay separate devices.
fn too_large_for_older_tables(facts: &NodeFacts) -> Vec<Finding> {
    facts
        .config
        .fuse
        .iter()
        .filter(|group| group.len() > SMALL_VDEVICE_LIMIT)
        .map(|group| {
            Finding::new(
                Severity::Warn,
                "plugin.devices",
                group.join("+"),
                format!(
                    "NCCL_NET_RS_FUSE group of {} ports: {SMALL_VDEVICE_TABLES} describe at most \
                     {SMALL_VDEVICE_LIMIT} ports per device, so under those NCCL versions the \
                     plugin refuses the group at init and its ports stay separate devices; NCCL \
                     2.20 to 2.23 and 2.30 or later fuse it",
                    group.len()
                ),
            )
            .fix(format!(
                "split it into groups of at most {SMALL_VDEVICE_LIMIT} ports where jobs run NCCL \
                 2.24 to 2.29"
            ))
        })
        .collect()
}

/// A WARN for each fused device that runs on fewer members than it has (see
/// [`degraded_devices`]).
fn degraded(facts: &NodeFacts) -> Vec<Finding> {
    degraded_devices(facts)
        .iter()
        .map(|d| {
            let up: Vec<String> = d.up.iter().map(|m| format!("{}:{}", m.device, m.port)).collect();
            let down: Vec<String> = d.down.iter().map(|p| format!("{}:{}", p.device, p.port)).collect();
            let states: Vec<String> = d
                .down
                .iter()
                .zip(&down)
                .map(|(p, name)| {
                    format!(
                        "{name} is {} (phys {})",
                        port_state_name(p.state),
                        phys_state_name(p.phys_state)
                    )
                })
                .collect();
            let left: u64 = d.up.iter().map(|m| u64::from(m.speed_mbps)).sum();
            Finding::new(
                Severity::Warn,
                "plugin.devices",
                d.name.clone(),
                format!(
                    "degraded: {}; NCCL gets {} of its {} members ({}, {})",
                    states.join(", "),
                    d.up.len(),
                    d.up.len() + d.down.len(),
                    up.join(", "),
                    gbps(left)
                ),
            )
            .fix(format!(
                "bring {} back (see port.state); a job started now runs on the members left, and uses every member only once restarted",
                down.join(", ")
            ))
        })
        .collect()
}
