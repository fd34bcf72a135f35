//! Everything `init` decides about the node, with a reason for each decision: discovery,
//! `NCCL_IB_HCA`, port filtering, fusion, and the GPUDirect and relaxed-ordering verdicts of
//! every device. The plugin logs a survey and builds its device table from it; the doctor
//! reports the same survey. What needs hardware (verbs discovery, the CUDA driver, the DMA-BUF
//! probe) comes in as arguments, so tests take surveys of fixture trees.

use std::path::Path;

use super::PLUGIN_NAME;
use crate::core::config::{Config, MAX_FUSED_MEMBERS};
use crate::core::error::Error;
use crate::log::INIT_TARGET;
use crate::topology::{
    DmaBuf, FusionPolicy, GpuExport, HcaFilter, MemorySupport, NetDevice, PeerMem,
    RelaxedOrderingInputs, Selection, SysfsRoot, VirtualDevice, detect_hypervisor, fuse,
    gdr_verdict, physical_then_explicit, relaxed_ordering, select_devices,
};
use crate::verbs::{self, Discovery};

/// How the device table is made (see the module doc of [`crate::plugin`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DeviceModel {
    /// ncclNet v8: the ports of one NIC fused at init.
    Fused,
    /// ncclNet v9+: one device per port; NCCL fuses through `makeVDevice`. `devs_per_nic`
    /// is the most ports the table's properties describe in one device (4 in v9 to v11, 8 in
    /// v12): an `NCCL_NET_RS_FUSE` group larger than that is refused at `init`.
    Ports { devs_per_nic: usize },
}

impl DeviceModel {
    /// The most ports one device of this table may fuse.
    pub fn max_members(self) -> usize {
        match self {
            Self::Fused => MAX_FUSED_MEMBERS,
            Self::Ports { devs_per_nic } => devs_per_nic.min(MAX_FUSED_MEMBERS),
        }
    }

    /// The ncclNet tables, with the NCCL versions that load them, whose devices may have this
    /// many members at most (for the line that refuses a larger group).
    pub fn member_limit_holder(self) -> &'static str {
        match self {
            Self::Ports { devs_per_nic } if devs_per_nic < MAX_FUSED_MEMBERS => {
                SMALL_VDEVICE_TABLES
            }
            _ => "this plugin",
        }
    }
}

/// The tables whose virtual devices list at most 4 ports (`NCCL_NET_MAX_DEVS_PER_NIC_V11`).
pub const SMALL_VDEVICE_TABLES: &str = "ncclNet v9 to v11 (NCCL 2.24 to 2.29)";
/// How many ports their virtual devices list.
pub const SMALL_VDEVICE_LIMIT: usize = 4;

/// What GPUDirect RDMA and relaxed ordering depend on beyond the devices themselves.
#[derive(Clone, Debug)]
pub struct GpuFacts {
    /// The CUDA driver loaded, or why not.
    pub cuda: Result<(), String>,
    /// Which GPUs export DMA-BUF (unknown without a driver).
    pub gpu_export: GpuExport,
    /// Peer-memory module state.
    pub peermem: PeerMem,
    /// Why the host looks virtual, `None` on bare metal.
    pub hypervisor: Option<String>,
    /// libibverbs has `ibv_reg_mr_iova2` (needed for relaxed ordering).
    pub reg_mr_iova2: bool,
}

impl GpuFacts {
    /// Probe this machine: the CUDA driver, `<proc>/modules`, `<proc>/cpuinfo`, libibverbs.
    pub fn probe(sysfs: &SysfsRoot, proc_root: &Path) -> Self {
        let read = |name: &str| std::fs::read_to_string(proc_root.join(name)).ok();
        Self {
            cuda: crate::cuda::driver().map_err(|e| e.to_string()),
            gpu_export: crate::cuda::dmabuf_exporting_gpus()
                .unwrap_or_else(|e| GpuExport::Unknown(e.to_string())),
            peermem: PeerMem::detect(sysfs, read("modules").as_deref()),
            hypervisor: detect_hypervisor(sysfs, read("cpuinfo").as_deref()),
            reg_mr_iova2: verbs::reg_mr_iova2_available(),
        }
    }
}

/// One NCCL device and the verdicts `init` reached on it.
#[derive(Clone, Debug)]
pub struct DeviceVerdict {
    /// The port or fused ports.
    pub virt: VirtualDevice,
    /// DMA-BUF registration, probed on every member.
    pub dmabuf: DmaBuf,
    /// Memory the device registers.
    pub memory: MemorySupport,
    /// The GPUDirect line the plugin logs.
    pub gdr_line: String,
    /// Per member: relaxed ordering on, and the line that says why.
    pub relaxed_ordering: Vec<(bool, String)>,
}

/// Registers a DMA-BUF probe for one port: `Err` says why the port cannot.
pub type DmaBufProbe<'a> = &'a dyn Fn(&NetDevice) -> Result<(), String>;

/// The probe `init` uses: NCCL's `ibv_reg_dmabuf_mr(fd = -1)` on a fresh protection domain.
///
/// # Errors
/// Why the port's device cannot register DMA-BUF memory (or could not be opened).
pub fn probe_dmabuf_live(port: &NetDevice) -> Result<(), String> {
    verbs::Device::open(&port.device)
        .and_then(|device| verbs::ProtectionDomain::new(&device))
        .map_err(|e| e.to_string())
        .and_then(|pd| {
            pd.probe_dmabuf()
                .map_err(|e| format!("ibv_reg_dmabuf_mr: {e}"))
        })
}

impl DeviceVerdict {
    /// Judge `virt`: DMA-BUF on every member (unless disabled), the GPUDirect verdict, and
    /// relaxed ordering per member.
    pub fn judge(
        virt: VirtualDevice,
        gpu: &GpuFacts,
        config: &Config,
        probe_dmabuf: DmaBufProbe<'_>,
    ) -> Self {
        let dmabuf = if config.dmabuf_enabled {
            virt.members
                .iter()
                .find_map(|m| {
                    probe_dmabuf(m)
                        .err()
                        .map(|why| format!("{}: {why}", m.name))
                })
                .map_or(DmaBuf::Supported, DmaBuf::Unsupported)
        } else {
            DmaBuf::Disabled
        };
        let (memory, gdr_line) = gdr_verdict(
            &virt.name(),
            &gpu.cuda,
            &gpu.gpu_export,
            &gpu.peermem,
            &dmabuf,
        );
        let relaxed_ordering = virt
            .members
            .iter()
            .map(|member| {
                let (on, line) = relaxed_ordering(&RelaxedOrderingInputs {
                    setting: config.relaxed_ordering,
                    is_vf: member.pci.as_ref().is_some_and(|f| f.is_vf()),
                    hypervisor: gpu.hypervisor.clone(),
                    reg_mr_iova2: gpu.reg_mr_iova2,
                });
                (on, format!("{}: {line}", member.name))
            })
            .collect();
        Self {
            virt,
            dmabuf,
            memory,
            gdr_line,
            relaxed_ordering,
        }
    }

    /// Log the verdicts as `init` does.
    pub(super) fn log(&self) {
        tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: {}", self.gdr_line);
        for (_, line) in &self.relaxed_ordering {
            tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: {line}");
        }
    }
}

/// The fusion rules in force for `config` under the table `model`.
pub fn fusion_policy(config: &Config, model: DeviceModel) -> FusionPolicy {
    FusionPolicy {
        merge_nics: config.merge_nics,
        merge_vfs: config.merge_vfs,
        explicit: config.fuse.clone(),
        max_members: model.max_members(),
        limit_holder: model.member_limit_holder(),
    }
}

/// What `init` decided, and why.
#[derive(Debug)]
pub struct Survey {
    /// Every port libibverbs reported, or the line that explains why there are none.
    pub discovery: Result<Discovery, String>,
    /// The ports chosen (and passed over, with reasons), or the one line that explains why no
    /// port is usable.
    pub selection: Result<Selection, String>,
    /// The chosen ports in index order: what `makeVDevice` fuses under [`DeviceModel::Ports`].
    pub ports: Vec<NetDevice>,
    /// One line per fusion made or refused.
    pub fusion_decisions: Vec<String>,
    /// One line per `NCCL_NET_RS_FUSE` group larger than the table allows (a WARN).
    pub fusion_warnings: Vec<String>,
    /// The devices NCCL sees, in index order.
    pub devices: Vec<DeviceVerdict>,
}

impl Survey {
    /// Decide as `init` does under `model`, from `discovery` (verbs' answer) and `gpu`.
    pub fn take(
        config: &Config,
        model: DeviceModel,
        sysfs: &SysfsRoot,
        discovery: Result<Discovery, Error>,
        gpu: &GpuFacts,
        probe_dmabuf: DmaBufProbe<'_>,
    ) -> Self {
        let discovery = discovery.map_err(|e| explain_discovery_failure(&e));
        let mut survey = Self {
            selection: Err(String::new()),
            discovery,
            ports: Vec::new(),
            fusion_decisions: Vec::new(),
            fusion_warnings: Vec::new(),
            devices: Vec::new(),
        };
        survey.selection = match &survey.discovery {
            Err(why) => Err(why.clone()),
            Ok(discovery) => select(config, discovery, sysfs),
        };
        let Ok(selection) = &survey.selection else {
            return survey;
        };
        let policy = fusion_policy(config, model);
        let fusion = match model {
            DeviceModel::Fused => fuse(selection.devices.clone(), &policy),
            DeviceModel::Ports { .. } => {
                survey.ports = selection.devices.clone();
                physical_then_explicit(selection.devices.clone(), &policy)
            }
        };
        survey.fusion_decisions = fusion.decisions;
        survey.fusion_warnings = fusion.warnings;
        survey.devices = fusion
            .devices
            .into_iter()
            .map(|virt| DeviceVerdict::judge(virt, gpu, config, probe_dmabuf))
            .collect();
        survey
    }

    /// Log what `init` decided, in the order it decided it.
    pub(super) fn log(&self, gpu: &GpuFacts) {
        if let Err(why) = &gpu.cuda {
            tracing::info!(
                target: INIT_TARGET,
                "NET/{PLUGIN_NAME}: no CUDA driver ({why}): every device registers host memory only"
            );
        }
        if let Ok(discovery) = &self.discovery {
            for problem in &discovery.problems {
                tracing::warn!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: {problem}");
            }
        }
        match &self.selection {
            Err(why) => tracing::warn!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: 0 devices: {why}"),
            Ok(s) if !s.skipped.is_empty() => tracing::info!(
                target: INIT_TARGET,
                "NET/{PLUGIN_NAME}: not used: {}",
                s.skipped.join("; ")
            ),
            Ok(_) => {}
        }
        for warning in &self.fusion_warnings {
            tracing::warn!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: {warning}");
        }
        for decision in &self.fusion_decisions {
            tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: fusion: {decision}");
        }
        for device in &self.devices {
            device.log();
        }
    }
}

/// Apply `NCCL_IB_HCA` and port filtering; `Err` is the one line that explains an empty list.
fn select(config: &Config, discovery: &Discovery, sysfs: &SysfsRoot) -> Result<Selection, String> {
    let filter = config
        .ib_hca
        .as_deref()
        .map(HcaFilter::parse)
        .transpose()
        .map_err(|e| e.to_string())?;
    let selection = select_devices(&discovery.ports, filter.as_ref(), sysfs);
    if selection.devices.is_empty() {
        return Err(explain_empty_selection(
            discovery,
            &selection,
            filter.as_ref(),
        ));
    }
    Ok(selection)
}

fn explain_discovery_failure(error: &Error) -> String {
    let hint = match error.os_error().and_then(std::io::Error::raw_os_error) {
        Some(libc::ENOSYS) => {
            "; this kernel has no RDMA support (no /sys/class/infiniband): load the NIC's RDMA \
             driver (mlx5_ib), or rdma_rxe for Soft-RoCE"
        }
        _ => "",
    };
    format!("no RDMA devices: {error}{hint}")
}

fn explain_empty_selection(
    discovery: &Discovery,
    selection: &Selection,
    filter: Option<&HcaFilter>,
) -> String {
    if discovery.device_count == 0 {
        return "no RDMA devices: libibverbs found none (check `ibv_devices`, the RDMA driver, and \
                that the provider package, e.g. ibverbs-providers, is installed)"
            .to_owned();
    }
    let ports = selection.skipped.join("; ");
    if ports.is_empty() {
        return format!(
            "no port could be queried ({})",
            discovery.problems.join("; ")
        );
    }
    match filter {
        Some(f) => format!(
            "NCCL_IB_HCA='{}' matches no active port ({ports})",
            f.as_str()
        ),
        None => format!("no active IB/RoCE port ({ports})"),
    }
}
