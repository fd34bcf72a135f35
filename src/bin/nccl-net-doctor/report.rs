//! Output: a short device table, then one line per finding, worst first, then a summary line;
//! or one JSON object (`--json`) following `report.schema.json`.

use std::io::IsTerminal;

use nccl_net::doctor::{Finding, NodeFacts, Severity};
use serde_json::{Value, json};

use crate::card::{CardDevice, NodeCard};

/// Bumped when a field changes meaning (additions keep it).
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// The published schema of `--json`.
pub(crate) const SCHEMA: &str = include_str!("report.schema.json");

/// Whether to colour the severities.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Colour {
    /// Only on a terminal, and not when `NO_COLOR` is set.
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

impl Colour {
    fn enabled(self) -> bool {
        match self {
            Self::Always => true,
            Self::Never => false,
            Self::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }
}

fn paint(severity: Severity, text: &str, colour: bool) -> String {
    if !colour {
        return text.to_owned();
    }
    let code = match severity {
        Severity::Fail => "1;31",
        Severity::Warn => "33",
        Severity::Unknown => "35",
        Severity::Skip | Severity::Info => "2",
        Severity::Pass => "32",
    };
    format!("\x1b[{code}m{text}\x1b[0m")
}

/// The verdict: FAIL, WARN or UNKNOWN when any finding has it (in that order), else PASS
/// (SKIP and INFO say nothing about health).
pub(crate) fn overall(findings: &[Finding]) -> Severity {
    [Severity::Fail, Severity::Warn, Severity::Unknown]
        .into_iter()
        .find(|s| findings.iter().any(|f| f.severity == *s))
        .unwrap_or(Severity::Pass)
}

/// 0 without a FAIL, 1 with one (or, `strict`, with an UNKNOWN).
pub(crate) fn exit_code(findings: &[Finding], strict: bool) -> i32 {
    let fails = |s: Severity| s == Severity::Fail || (strict && s == Severity::Unknown);
    i32::from(findings.iter().any(|f| fails(f.severity)))
}

/// `FAIL 1, WARN 2, ...`: counts per severity, worst first.
fn summary(findings: &[Finding]) -> String {
    let counts: Vec<String> = Severity::WORST_FIRST
        .iter()
        .map(|s| {
            format!(
                "{} {}",
                findings.iter().filter(|f| f.severity == *s).count(),
                s.name()
            )
        })
        .collect();
    counts.join(", ")
}

fn cell<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The device table: one row per member port.
fn table(devices: &[CardDevice]) -> String {
    let mut rows = vec![
        [
            "dev", "name", "port", "link", "state", "rate", "MTU", "GID", "NUMA", "PCIe", "fw",
            "memory", "RO",
        ]
        .map(str::to_owned),
    ];
    for d in devices {
        for (i, m) in d.members.iter().enumerate() {
            let first = i == 0;
            rows.push([
                if first {
                    d.index.to_string()
                } else {
                    String::new()
                },
                if first { d.name.clone() } else { String::new() },
                format!("{}:{}", m.device, m.port),
                m.link_layer.clone(),
                m.state.clone(),
                format!("{}G", m.speed_mbps / 1000),
                format!("{}/{}", m.active_mtu, m.max_mtu),
                match (&m.gid, &m.gid_error) {
                    (Some(g), _) => format!("{} {} v{}", g.index, g.address, cell(g.roce_version)),
                    (None, Some(_)) => "none".to_owned(),
                    (None, None) => format!("LID {}", m.lid),
                },
                cell(m.numa),
                m.pcie.clone().map_or_else(
                    || "-".to_owned(),
                    |p| p.split(" (").next().unwrap_or("").to_owned(),
                ),
                cell(m.fw_ver.clone()),
                if first {
                    d.memory.clone()
                } else {
                    String::new()
                },
                if m.relaxed_ordering { "on" } else { "off" }.to_owned(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            cells.join("  ").trim_end().to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The human report.
pub(crate) fn human(
    header: &str,
    card: &NodeCard,
    peer: Option<&NodeCard>,
    findings: &[Finding],
    colour: Colour,
) -> String {
    let colour = colour.enabled();
    let mut out = String::new();
    out.push_str(header);
    out.push('\n');
    if card.devices.is_empty() {
        out.push_str("no devices for NCCL\n");
    } else {
        out.push_str(&table(&card.devices));
        out.push('\n');
    }
    if let Some(peer) = peer {
        out.push_str(&format!(
            "peer {} ({}, doctor {}):\n",
            peer.host, peer.context, peer.tool_version
        ));
        out.push_str(&table(&peer.devices));
        out.push('\n');
    }
    out.push('\n');
    for f in findings {
        let line = f.line();
        let (word, rest) = line.split_at(f.severity.name().len());
        out.push_str(&paint(f.severity, word, colour));
        out.push_str(rest);
        out.push('\n');
    }
    let worst = overall(findings);
    out.push_str(&format!(
        "\nsummary: {} -> {}\n",
        summary(findings),
        paint(worst, worst.name(), colour)
    ));
    out
}

fn finding_json(f: &Finding) -> Value {
    json!({
        "severity": f.severity.name(),
        "check": f.check,
        "entity": f.entity,
        "what": f.what,
        "fix": f.fix,
        "depends_on": f.depends_on,
        "evidence": f.evidence.iter().map(|e| json!({"source": e.source, "value": e.value})).collect::<Vec<_>>(),
    })
}

/// The JSON report.
pub(crate) fn json(
    mode: &str,
    facts: &NodeFacts,
    card: &NodeCard,
    peer: Option<&NodeCard>,
    findings: &[Finding],
    strict: bool,
) -> Value {
    let kernel = facts.roots.read("/proc/sys/kernel/osrelease");
    json!({
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "nccl-net-doctor", "version": env!("CARGO_PKG_VERSION")},
        "plugin": {"name": nccl_net::plugin::PLUGIN_NAME, "version": env!("CARGO_PKG_VERSION")},
        "mode": mode,
        "context": {
            "kind": facts.context.kind(),
            "host": card.host,
            "container": facts.context.container,
            "vm": facts.context.vm,
            "kernel": kernel,
        },
        "overall": overall(findings).name(),
        "exit_code": exit_code(findings, strict),
        "devices": serde_json::to_value(&card.devices).unwrap_or(Value::Null),
        "peer": peer.map(|p| serde_json::to_value(p).unwrap_or(Value::Null)),
        "findings": findings.iter().map(finding_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/doctor.md: UNKNOWN is never counted as a pass where the gate asks (`--strict`);
    /// without it only a FAIL keeps the node out.
    #[test]
    fn unknown_fails_the_gate_only_when_strict() {
        let finding = |s| Finding::new(s, "memlock", "process", "x");
        let unknown = [finding(Severity::Warn), finding(Severity::Unknown)];
        assert_eq!(exit_code(&unknown, false), 0);
        assert_eq!(exit_code(&unknown, true), 1);
        let failed = [finding(Severity::Fail)];
        assert_eq!(
            (exit_code(&failed, false), exit_code(&failed, true)),
            (1, 1)
        );
        let clean = [finding(Severity::Pass), finding(Severity::Skip)];
        assert_eq!(exit_code(&clean, true), 0);
    }
}
