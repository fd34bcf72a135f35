//! GPUDirect RDMA: the peer-memory module, DMA-BUF on the NICs and GPUs, and relaxed ordering
//! against the NIC's PCIe Device Control.

use super::*;

pub(super) fn gdr_peermem(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "gdr.peermem";
    let g = &facts.gpu;
    let devices = &facts.survey.devices;
    let dmabuf_anywhere = devices.iter().any(|d| d.memory.dmabuf);
    // Why DMA-BUF cannot stand in for peer memory: nothing to probe, the GPUs, or the NICs.
    let no_dmabuf = if devices.is_empty() {
        format!(
            "DMA-BUF cannot be probed without an RDMA device (see {})",
            no_device_cause(facts)
        )
    } else if devices.iter().any(|d| d.dmabuf == DmaBuf::Supported) {
        dmabuf_both_sides(&DmaBuf::Supported, &g.gpu_export)
    } else {
        "no device takes DMA-BUF (see gdr.dmabuf)".to_owned()
    };
    let evidence = |f: Finding| {
        let f = f.evidence(
            "/sys/kernel/mm/memory_peers, /sys/module/nvidia_peermem, /proc/modules",
            g.peermem.to_string(),
        );
        if g.cuda.is_ok() {
            f.evidence(
                "cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)",
                g.gpu_export.to_string(),
            )
        } else {
            f
        }
    };
    let f = match (&g.cuda, &g.peermem) {
        (Err(why), _) => Finding::new(
            Severity::Skip,
            CHECK,
            "node",
            format!("no CUDA driver ({why}): GPU memory is never registered"),
        ),
        (Ok(()), PeerMem::Registered { .. }) => Finding::new(Severity::Pass, CHECK, "node", g.peermem.to_string()),
        (Ok(()), PeerMem::LoadedNotRegistered { .. }) => Finding::new(
            Severity::Warn,
            CHECK,
            "node",
            if dmabuf_anywhere {
                "nvidia_peermem is loaded but not registered; GPUDirect RDMA goes through DMA-BUF instead".to_owned()
            } else {
                format!("nvidia_peermem is loaded but not registered, and {no_dmabuf}: GPUDirect RDMA is off (NCCL prints \"GPU Direct RDMA Disabled\")")
            },
        )
        .fix("reload it after the RDMA stack (`modprobe -r nvidia_peermem && modprobe nvidia_peermem`), or use DMA-BUF (kernel >= 5.12, NVIDIA open kernel module)"),
        (Ok(()), PeerMem::Absent) if dmabuf_anywhere => Finding::new(
            Severity::Info,
            CHECK,
            "node",
            "no peer-memory module; not needed: GPUDirect RDMA goes through DMA-BUF",
        ),
        (Ok(()), PeerMem::Absent) if devices.is_empty() => Finding::new(
            Severity::Unknown,
            CHECK,
            "node",
            format!("no peer-memory module, and {no_dmabuf}: whether GPUDirect RDMA would work is unknown"),
        )
        .depends_on(no_device_cause(facts)),
        (Ok(()), PeerMem::Absent) => Finding::new(
            Severity::Warn,
            CHECK,
            "node",
            format!("no peer-memory module, and {no_dmabuf}: GPUDirect RDMA is off, NCCL stages through host memory"),
        )
        .fix("`modprobe nvidia_peermem` (needs MOFED/DOCA-OFED), or use DMA-BUF (kernel >= 5.12, NVIDIA open kernel module)"),
    };
    vec![evidence(f)]
}

pub(super) fn gdr_dmabuf(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "gdr.dmabuf";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let peermem = facts.gpu.peermem.usable();
    facts
        .survey
        .devices
        .iter()
        .map(|d| {
            let name = d.virt.name();
            // The plugin's own line, without the device name the entity already shows.
            let line = d.gdr_line.strip_prefix(&format!("{name}: ")).unwrap_or(&d.gdr_line);
            let f = match (&facts.gpu.cuda, &d.dmabuf) {
                (Err(_), _) => Finding::new(Severity::Skip, CHECK, &name, line),
                (Ok(()), _) if d.memory.dmabuf => Finding::new(Severity::Pass, CHECK, &name, line),
                // Off by choice, or not needed: peer memory carries GPUDirect.
                (Ok(()), DmaBuf::Disabled) => Finding::new(Severity::Info, CHECK, &name, line),
                (Ok(()), _) if peermem => Finding::new(Severity::Info, CHECK, &name, line),
                // The NIC takes DMA-BUF but no GPU exports it (see `GpuExport`).
                (Ok(()), DmaBuf::Supported) => Finding::new(Severity::Warn, CHECK, &name, line)
                    .fix("NVIDIA's open GPU kernel module (the proprietary one exports no DMA-BUF), or load nvidia_peermem"),
                (Ok(()), DmaBuf::Unsupported(_)) => Finding::new(Severity::Warn, CHECK, &name, line)
                    .fix("DMA-BUF needs kernel >= 5.12, rdma-core >= 34 and NVIDIA's open kernel module; or load nvidia_peermem"),
            };
            f.evidence("ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd=-1, 0)", d.dmabuf.to_string())
        })
        .collect()
}

pub(super) fn relaxed_ordering(facts: &NodeFacts) -> Vec<Finding> {
    const CHECK: &str = "relaxed.ordering";
    if let Some(skip) = nothing_to_check(CHECK, facts) {
        return skip;
    }
    let virtualised = facts.gpu.hypervisor.is_some();
    facts
        .survey
        .devices
        .iter()
        .flat_map(|d| d.virt.members.iter().zip(&d.relaxed_ordering))
        .map(|(m, (on, line))| {
            let line = line.strip_prefix(&format!("{}: ", m.name)).unwrap_or(line);
            let vf = m.pci.as_ref().is_some_and(|f| f.is_vf());
            let control = m.pci_path.as_ref().map(|dir| {
                std::fs::read(dir.join("config"))
                    .map_err(|e| e.to_string())
                    .and_then(|c| relaxed_ordering_enabled(&c))
            });
            let f = match (on, &control) {
                // No PCIe between the device and memory: the decision stands but means nothing.
                (_, None) => Finding::new(
                    Severity::Info,
                    CHECK,
                    &m.name,
                    format!("software device, no PCIe to order: {line}"),
                ),
                (true, Some(Ok(false))) => Finding::new(
                    Severity::Warn,
                    CHECK,
                    &m.name,
                    format!("{line}; but the function's PCIe Device Control has Enable Relaxed Ordering clear, so the NIC will not use it"),
                )
                .fix("enable relaxed ordering in the NIC (mlxconfig PCI_WR_ORDERING=per_mkey, the default) and, in a VM, let the hypervisor pass it through"),
                (false, _) if vf || virtualised => Finding::new(
                    Severity::Warn,
                    CHECK,
                    &m.name,
                    format!("{line}; a VF or VM without relaxed ordering can run GPUDirect writes at a fraction of line rate"),
                )
                .fix("NCCL_IB_PCI_RELAXED_ORDERING=1 (or 2, the default) with an rdma-core that has ibv_reg_mr_iova2 (>= 22)"),
                _ => Finding::new(Severity::Pass, CHECK, &m.name, line),
            };
            let control_text = match control {
                None => "no PCI function (software device)".to_owned(),
                Some(Ok(bit)) => format!("Enable Relaxed Ordering {}", if bit { "set" } else { "clear" }),
                Some(Err(why)) => why,
            };
            f.evidence(
                m.pci_path.as_ref().map_or("PCI config space".to_owned(), |p| {
                    format!("{}/config Device Control", crate::doctor::facts::shown(p, &facts.roots))
                }),
                control_text,
            )
        })
        .collect()
}
