//! Access to the devices: libibverbs lists and opens them (`verbs.provider`), their device
//! nodes open (`dev.nodes`), and the locked-memory limit covers what will be pinned (`memlock`).

use super::*;

pub(super) fn verbs_provider(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "verbs.provider";
    let in_sysfs: Vec<String> = candidate_devices(&facts.roots, None)
        .into_iter()
        .map(|(d, _)| d)
        .collect();
    let discovery = match &facts.survey.discovery {
        Err(why) => {
            return vec![
                Finding::new(Severity::Fail, CHECK, "node", why.clone())
                    .fix("`ibv_devices` must list the NIC: check `lsmod | grep ib_` and `dmesg` for its RDMA driver")
                    .evidence("ibv_get_device_list()", why.clone()),
            ];
        }
        Ok(d) => d,
    };
    if discovery.device_count == 0 {
        let what = if in_sysfs.is_empty() {
            "no RDMA device: /sys/class/infiniband is empty and libibverbs lists none".to_owned()
        } else {
            format!(
                "sysfs shows {} but libibverbs lists no device: no provider library matches them",
                in_sysfs.join(", ")
            )
        };
        let fix = if in_sysfs.is_empty() {
            "load the NIC's RDMA driver (mlx5_ib), or rdma_rxe for Soft-RoCE"
        } else {
            "install the rdma-core provider for the driver (ibverbs-providers, libmlx5) matching the \
             host's kernel; in a container use the same rdma-core generation as the host"
        };
        return vec![
            Finding::new(Severity::Fail, CHECK, "node", what)
                .fix(fix)
                .evidence("/sys/class/infiniband", in_sysfs.join(" "))
                .evidence("ibv_get_device_list()", "0 devices"),
        ];
    }
    let mut findings: Vec<Finding> = discovery
        .problems
        .iter()
        .map(|problem| {
            let device = problem.split(':').next().unwrap_or("node").to_owned();
            Finding::new(Severity::Fail, CHECK, device, problem.clone())
                .fix("see dev.nodes for the device node; check that the provider matches the kernel driver")
                .evidence("ibv_open_device / ibv_query_device / ibv_query_port", problem.clone())
        })
        .collect();
    if findings.is_empty() {
        let mut names: Vec<&str> = discovery.ports.iter().map(|p| p.device.as_str()).collect();
        names.dedup();
        findings.push(
            Finding::new(
                Severity::Pass,
                CHECK,
                "node",
                format!(
                    "libibverbs lists {} device(s) and opens them: {}",
                    discovery.device_count,
                    names.join(", ")
                ),
            )
            .evidence("/sys/class/infiniband", in_sysfs.join(" "))
            .evidence(
                "ibv_get_device_list()",
                format!("{} devices", discovery.device_count),
            ),
        );
    }
    findings
}

/// The effective user id, from `/proc/self/status`.
fn uid(facts: &NodeFacts) -> String {
    facts
        .roots
        .read("/proc/self/status")
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_else(|| "?".to_owned())
}

pub(super) fn dev_nodes(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "dev.nodes";
    if facts.dev_nodes.is_empty() {
        return vec![
            Finding::new(
                Severity::Skip,
                CHECK,
                "node",
                "no RDMA device the plugin would open (none in sysfs, or NCCL_IB_HCA selects none)",
            )
            .depends_on("verbs.provider"),
        ];
    }
    facts
        .dev_nodes
        .iter()
        .map(|n| {
            let f = match &n.open {
                Ok(()) => Finding::new(
                    Severity::Pass,
                    CHECK,
                    &n.device,
                    format!("{} opens read-write", n.path),
                ),
                Err((errno, msg)) => {
                    let (what, fix) = match *errno {
                        libc::ENOENT => (
                            format!("{} is missing (the container has no /dev/infiniband)", n.path),
                            "expose the device: docker/podman `--device=/dev/infiniband`, Kubernetes \
                             the RDMA device plugin's resource (e.g. rdma/rdma_shared_device_a), or \
                             `--privileged` for a test"
                                .to_owned(),
                        ),
                        libc::EACCES | libc::EPERM => (
                            format!(
                                "{} cannot be opened read-write by uid {} ({msg})",
                                n.path,
                                uid(facts)
                            ),
                            format!(
                                "give the user access: `chmod 666 {}` or rdma-core's udev rule \
                                 (MODE=\"0666\" for uverbs), or a group the node belongs to",
                                n.path
                            ),
                        ),
                        libc::ENODEV => (
                            "no verbs node: ib_uverbs is not loaded".to_owned(),
                            "modprobe ib_uverbs".to_owned(),
                        ),
                        _ => (format!("{} cannot be opened: {msg}", n.path), "check the device node".to_owned()),
                    };
                    Finding::new(Severity::Fail, CHECK, &n.device, what).fix(fix)
                }
            };
            f.evidence(
                format!("open({}, O_RDWR)", n.path),
                match &n.open {
                    Ok(()) => "ok".to_owned(),
                    Err((_, m)) => m.clone(),
                },
            )
        })
        .collect()
}

pub(super) fn memlock(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "memlock";
    let m = &facts.memlock;
    let b = facts.budget;
    let need = b.total();
    let nccl_part = if b.nccl_bytes == 0 {
        "NCCL's buffers are in GPU memory".to_owned()
    } else {
        format!(
            "NCCL 2 x {} NCCL_BUFFSIZE in host memory",
            bytes(b.nccl_bytes / 2)
        )
    };
    let counted = match b.peers {
        Some((peers, channels)) => format!(
            "{} connections ({peers} peers x {channels} per peer, NCCL_NCHANNELS_PER_NET_PEER)",
            b.connections
        ),
        None => format!("{} connections", b.connections),
    };
    let need_text = format!(
        "{} needed for {counted} (plugin {} + {nccl_part}, each)",
        bytes(need),
        bytes(b.plugin_bytes)
    );
    let f = if m.cap_ipc_lock {
        Finding::new(
            Severity::Pass,
            CHECK,
            "process",
            format!("CAP_IPC_LOCK is effective, so the limit does not apply; {need_text}"),
        )
    } else {
        match &m.soft {
            Err(why) => Finding::new(
                Severity::Unknown,
                CHECK,
                "process",
                format!("limit unreadable: {why}"),
            ),
            Ok(None) => Finding::new(
                Severity::Pass,
                CHECK,
                "process",
                format!("unlimited; {need_text}"),
            ),
            Ok(Some(limit)) if *limit >= need => Finding::new(
                Severity::Info,
                CHECK,
                "process",
                format!(
                    "limit {} covers {need_text}; more ranks per process need more",
                    bytes(*limit)
                ),
            ),
            Ok(Some(limit)) => {
                let hard = match m.hard {
                    None => "the hard limit is unlimited, so `ulimit -l unlimited` in the job script works".to_owned(),
                    Some(h) => format!("the hard limit is {}", bytes(h)),
                };
                Finding::new(
                    Severity::Fail,
                    CHECK,
                    "process",
                    format!(
                        "locked-memory limit {} < {need_text}: registrations fail with ENOMEM",
                        bytes(*limit)
                    ),
                )
                .fix(format!(
                    "raise it where the job starts: docker `--ulimit memlock=-1`, Kubernetes via \
                     the container runtime's LimitMEMLOCK=infinity, Slurm `PropagateResourceLimits` \
                     and slurmd's LimitMEMLOCK=infinity, /etc/security/limits.conf `* - memlock \
                     unlimited`; {hard}"
                ))
            }
        }
    };
    vec![
        f.evidence("/proc/self/limits", m.evidence.clone())
            .evidence(
                "/proc/self/status CapEff CAP_IPC_LOCK",
                m.cap_ipc_lock.to_string(),
            )
            .evidence("budget bytes", need.to_string()),
    ]
}
