//! The node's health as a whole: one firmware on every used device, and the kernel's log.

use super::*;

pub(super) fn firmware(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "versions.firmware";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let sysfs = facts.roots.sysfs();
    let mut devices: Vec<&str> = used_ports(facts)
        .iter()
        .map(|(m, _)| m.device.as_str())
        .collect();
    devices.sort_unstable();
    devices.dedup();
    let versions: Vec<(&str, Option<String>)> = devices
        .iter()
        .map(|d| {
            (
                *d,
                sysfs.read_value(&format!("class/infiniband/{d}/fw_ver")),
            )
        })
        .collect();
    let mut by_version: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (d, v) in &versions {
        if let Some(v) = v {
            by_version.entry(v.as_str()).or_default().push(d);
        }
    }
    let listing: Vec<String> = by_version
        .iter()
        .map(|(v, ds)| format!("{v} on {}", ds.join(" ")))
        .collect();
    let f = if by_version.is_empty() {
        Finding::new(
            Severity::Skip,
            CHECK,
            "node",
            "no device reports a firmware version (software devices)",
        )
    } else if by_version.len() > 1 {
        Finding::new(
            Severity::Warn,
            CHECK,
            "node",
            format!("used devices run different firmware: {}", listing.join("; ")),
        )
        .fix("update every NIC to one firmware release (mlxfwmanager / mstflint), then reboot or reset the NICs")
    } else {
        Finding::new(Severity::Pass, CHECK, "node", listing.join("; "))
    };
    vec![versions.iter().fold(f, |f, (d, v)| {
        f.evidence(
            format!("/sys/class/infiniband/{d}/fw_ver"),
            v.clone().unwrap_or_default(),
        )
    })]
}

/// A kind of kernel line that says something is wrong with a NIC or with GPUDirect: every
/// needle (lower case) in the line, what it means, and what to do.
struct KernelSign {
    needles: &'static [&'static str],
    severity: Severity,
    what: &'static str,
    fix: &'static str,
}

/// The lines node-health tools key on (doctor.md: gpud's kmsg matcher, NVSentinel's NIC
/// monitor), first match wins: a timed-out `ACCESS_REG` is a firmware timeout.
const KERNEL_SIGNS: &[KernelSign] = &[
    KernelSign {
        needles: &["will cause a leak of a command resource"],
        severity: Severity::Fail,
        what: "the NIC's firmware stopped answering a command",
        fix: "reboot the node; if it happens again, update the NIC firmware or replace the NIC",
    },
    KernelSign {
        needles: &["health compromised"],
        severity: Severity::Fail,
        what: "the NIC's firmware health monitor declared it compromised",
        fix: "reboot the node (the NIC needs a reset); if it happens again, replace the NIC",
    },
    KernelSign {
        needles: &["insufficient power"],
        severity: Severity::Warn,
        what: "the NIC reports too little power from its PCIe slot",
        fix: "move the NIC to a slot that supplies its rated power, or check the riser and the power supply",
    },
    KernelSign {
        needles: &["high temperature"],
        severity: Severity::Warn,
        what: "the NIC or its cable module reports a high temperature",
        fix: "check the airflow and fans around the NIC and its transceivers",
    },
    KernelSign {
        needles: &["access_reg", "failed"],
        severity: Severity::Warn,
        what: "the NIC's firmware refused a register access",
        fix: "harmless alone on restricted functions (VFs, restricted PFs); with other NIC errors, update the firmware",
    },
    KernelSign {
        needles: &["nvidia-peermem", "invalid context"],
        severity: Severity::Warn,
        what: "nvidia-peermem saw GPU memory released while the NIC still had it registered",
        fix: "usually a job killed during GPUDirect transfers; if it repeats while jobs run, update the NVIDIA driver and nvidia-peermem together, or use DMA-BUF",
    },
];

/// What a kernel line is about: a used device whose PCI function (or its PF) or netdev it
/// names, else a PCI function it names (`false`: not one NCCL uses here), else the node.
fn kernel_line_entity(facts: &NodeFacts, text: &str) -> (String, bool) {
    let mut named_pci = None;
    for word in text.split_whitespace().map(|w| w.trim_end_matches(':')) {
        let address = word.parse::<PciAddress>().ok();
        let used = used_ports(facts).into_iter().find(|(m, _)| {
            m.pci.as_ref().is_some_and(|pci| {
                address.is_some_and(|a| a == pci.address || Some(a) == pci.physfn)
                    || pci.netdevs.iter().any(|n| n == word)
            })
        });
        if let Some((m, _)) = used {
            return (m.device.clone(), true);
        }
        named_pci = named_pci.or(address);
    }
    match named_pci {
        Some(a) => (a.to_string(), false),
        None => ("node".to_owned(), true),
    }
}

pub(super) fn kernel_log(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "kernel.log";
    let log = &facts.kernel_log;
    let records = match &log.records {
        Ok(records) => records,
        Err(why) => {
            return vec![
                Finding::new(Severity::Unknown, CHECK, "node", why.clone())
                    .fix("run the doctor as root on the host")
                    .evidence("/dev/kmsg", why.clone()),
            ];
        }
    };
    // (sign, entity) -> (times, whether NCCL uses the entity, the latest such record)
    let mut seen: BTreeMap<(usize, String), (usize, bool, &KernelRecord)> = BTreeMap::new();
    for record in records {
        let lower = record.text.to_lowercase();
        let Some(sign) = KERNEL_SIGNS
            .iter()
            .position(|s| s.needles.iter().all(|n| lower.contains(n)))
        else {
            continue;
        };
        let (entity, used) = kernel_line_entity(facts, &record.text);
        let entry = seen.entry((sign, entity)).or_insert((0, used, record));
        entry.0 += 1;
        entry.2 = record;
    }
    let user_note = match log.from_user_space {
        0 => String::new(),
        n => format!("; {n} record(s) written from user space not judged"),
    };
    if seen.is_empty() {
        let since = records.first().map_or_else(
            || "empty".to_owned(),
            |r| format!("from {:.1} s after boot", r.micros as f64 / 1e6),
        );
        return vec![
            Finding::new(
                Severity::Pass,
                CHECK,
                "node",
                format!(
                    "no NIC or GPUDirect error among {} kernel records ({since}){user_note}",
                    records.len()
                ),
            )
            .evidence(
                "/dev/kmsg",
                format!(
                    "{} kernel records, {} lost while reading",
                    records.len(),
                    log.lost
                ),
            ),
        ];
    }
    seen.into_iter()
        .map(|((sign, entity), (times, used, last))| {
            let sign = &KERNEL_SIGNS[sign];
            let elsewhere = if used {
                ""
            } else {
                " (a PCI function NCCL does not use here)"
            };
            let shown: String = last.text.chars().take(200).collect();
            Finding::new(
                sign.severity,
                CHECK,
                entity,
                format!(
                    "{}{elsewhere}: {times} time(s) in the log, last at {:.1} s after boot: \"{shown}\"",
                    sign.what,
                    last.micros as f64 / 1e6
                ),
            )
            .fix(sign.fix)
            .evidence(format!("/dev/kmsg record {}", last.seq), last.text.clone())
        })
        .collect()
}
