//! GPUDirect RDMA readiness from sysfs and procfs text: is a peer-memory client registered, does
//! the host run under a hypervisor, and the relaxed-ordering decision that follows. Every
//! verdict carries the reason an operator reads in the log.

use std::fmt;

use super::SysfsRoot;
use crate::core::config::RelaxedOrdering;

/// Paths (under the sysfs root) that prove a peer-memory client for NVIDIA GPUs is registered
/// with the RDMA core, newest first. NCCL ≤ 2.22 probed only the `nv_mem` ones, which is how
/// DGX OS 25.01's switch to `nvidia_peermem` silently disabled GPUDirect (NVIDIA/nccl#1676).
const REGISTERED_PATHS: [&str; 3] = [
    "kernel/mm/memory_peers/nv_mem/version",
    "kernel/mm/memory_peers/nv_mem_nc/version",
    "kernel/mm/memory_peers/nvidia-peermem/version",
];
/// Present whenever the `nvidia_peermem` module is loaded (NCCL ≥ 2.23 accepts it alone).
const MODULE_PATH: &str = "module/nvidia_peermem/version";

/// What the peer-memory probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerMem {
    /// A client is registered: `/sys/<path>` exists.
    Registered {
        /// The path that proved it, relative to the sysfs root.
        path: &'static str,
    },
    /// `nvidia_peermem` is loaded but no client is registered with the peer-memory interface,
    /// so registering GPU memory fails (NVIDIA/nccl#1939).
    LoadedNotRegistered {
        /// Where the module was seen.
        evidence: &'static str,
        /// Whether `/sys/kernel/mm/memory_peers` exists at all.
        interface_present: bool,
    },
    /// No peer-memory module.
    Absent,
}

impl PeerMem {
    /// Probe `sysfs`; `proc_modules` is the text of `/proc/modules` when readable.
    pub fn detect(sysfs: &SysfsRoot, proc_modules: Option<&str>) -> Self {
        if let Some(path) = REGISTERED_PATHS.into_iter().find(|p| sysfs.exists(p)) {
            return Self::Registered { path };
        }
        let listed = proc_modules.is_some_and(|text| {
            text.lines()
                .any(|l| l.split_whitespace().next() == Some("nvidia_peermem"))
        });
        let evidence = if sysfs.exists(MODULE_PATH) {
            Some("seen in /sys/module")
        } else if listed {
            Some("seen in /proc/modules")
        } else {
            None
        };
        match evidence {
            Some(evidence) => Self::LoadedNotRegistered {
                evidence,
                interface_present: sysfs.exists("kernel/mm/memory_peers"),
            },
            None => Self::Absent,
        }
    }

    /// True when GPU memory can be registered through the peer-memory client.
    pub fn usable(&self) -> bool {
        matches!(self, Self::Registered { .. })
    }
}

impl fmt::Display for PeerMem {
    /// The verdict with its reason and, when unusable, the fix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Registered { path } => write!(f, "nvidia peer memory registered (/sys/{path})"),
            Self::LoadedNotRegistered {
                evidence,
                interface_present,
            } => {
                let interface = if *interface_present {
                    "no nv_mem entry in /sys/kernel/mm/memory_peers"
                } else {
                    "no /sys/kernel/mm/memory_peers at all"
                };
                write!(
                    f,
                    "nvidia_peermem is loaded ({evidence}) but not registered with the \
                     peer-memory interface ({interface}); fix: load it after the MOFED/DOCA-OFED \
                     RDMA stack (`modprobe -r nvidia_peermem && modprobe nvidia_peermem`), or use \
                     DMA-BUF (kernel >= 5.12 and NVIDIA's open kernel module)"
                )
            }
            Self::Absent => write!(
                f,
                "no peer-memory module (nvidia_peermem not loaded, no /sys/kernel/mm/memory_peers/nv_mem); \
                 fix: `modprobe nvidia_peermem` (needs MOFED/DOCA-OFED), or use DMA-BUF"
            ),
        }
    }
}

/// Which memory a device can register (NCCL's `ptrSupport`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MemorySupport {
    /// Host memory.
    pub host: bool,
    /// CUDA memory through a peer-memory client.
    pub cuda: bool,
    /// CUDA memory through DMA-BUF.
    pub dmabuf: bool,
}

impl MemorySupport {
    /// `host`, `host+cuda`, `host+cuda+dmabuf`: the kinds a device registers.
    pub fn kinds(&self) -> String {
        [
            (self.host, "host"),
            (self.cuda, "cuda"),
            (self.dmabuf, "dmabuf"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| *name)
        .collect::<Vec<_>>()
        .join("+")
    }
}

/// What the DMA-BUF probe of a device found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DmaBuf {
    /// `NCCL_DMABUF_ENABLE=0`.
    Disabled,
    /// The driver refused: the member and the error.
    Unsupported(String),
    /// `ibv_reg_dmabuf_mr` reached the fd check.
    Supported,
}

impl fmt::Display for DmaBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disabled => write!(f, "DMA-BUF disabled by NCCL_DMABUF_ENABLE=0"),
            Self::Unsupported(why) => write!(
                f,
                "DMA-BUF unsupported ({why}); fix: rdma-core >= 34 with a kernel >= 5.12 and a \
                 driver that implements it (mlx5 does; Soft-RoCE does not)"
            ),
            Self::Supported => write!(f, "DMA-BUF supported"),
        }
    }
}

/// Whether the GPUs export their memory as DMA-BUF. NCCL registers GPU memory through DMA-BUF
/// only on a GPU whose `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` is set (`dmaBufSupported`,
/// NCCL's init.cc), whatever the NIC takes: NVIDIA's open kernel module sets it, the
/// proprietary one does not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuExport {
    /// `exporting` of the `total` GPUs the CUDA driver sees have the attribute set.
    Gpus {
        /// GPUs with the attribute set.
        exporting: u32,
        /// GPUs the driver sees.
        total: u32,
    },
    /// The driver could not be asked: why.
    Unknown(String),
}

impl GpuExport {
    /// At least one GPU exports DMA-BUF.
    pub fn any(&self) -> bool {
        matches!(self, Self::Gpus { exporting, .. } if *exporting > 0)
    }
}

impl fmt::Display for GpuExport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Gpus { total: 0, .. } => write!(f, "no GPU is visible to the CUDA driver"),
            Self::Gpus {
                exporting: 0,
                total,
            } => write!(
                f,
                "none of the {total} GPUs exports it (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0); \
                 fix: NVIDIA's open GPU kernel module (the proprietary one exports no DMA-BUF), \
                 or nvidia_peermem"
            ),
            Self::Gpus { exporting, total } => write!(f, "{exporting} of {total} GPUs export it"),
            Self::Unknown(why) => write!(f, "whether the GPUs export it is unknown ({why})"),
        }
    }
}

/// The DMA-BUF part of a GPUDirect verdict: the NIC's probe and, where the NIC takes it, the
/// GPUs' side.
pub fn dmabuf_both_sides(dmabuf: &DmaBuf, gpus: &GpuExport) -> String {
    if *dmabuf == DmaBuf::Supported {
        format!("DMA-BUF supported by the NIC; {gpus}")
    } else {
        dmabuf.to_string()
    }
}

/// `ptrSupport` and the one line that states the GPUDirect RDMA mode of `device` and, when it is
/// off, why and how to fix it. `cuda` is the CUDA driver check (GPU memory needs a driver);
/// DMA-BUF needs both the NIC (`dmabuf`) and a GPU that exports it (`gpus`).
pub fn gdr_verdict(
    device: &str,
    cuda: &Result<(), String>,
    gpus: &GpuExport,
    peermem: &PeerMem,
    dmabuf: &DmaBuf,
) -> (MemorySupport, String) {
    let driver = cuda.is_ok();
    let nic_dmabuf = *dmabuf == DmaBuf::Supported;
    let memory = MemorySupport {
        host: true,
        cuda: driver && peermem.usable(),
        dmabuf: driver && nic_dmabuf && gpus.any(),
    };
    let both = dmabuf_both_sides(dmabuf, gpus);
    let line = match (cuda, memory.cuda, memory.dmabuf) {
        (Err(why), ..) => format!(
            "{device}: GPUDirect RDMA off: no CUDA driver ({why}), host memory only [{peermem}; {dmabuf}]"
        ),
        (Ok(()), true, true) => format!("{device}: GPUDirect RDMA on: {peermem}; {both}"),
        (Ok(()), true, false) => {
            format!("{device}: GPUDirect RDMA on through peer memory: {peermem} [{both}]")
        }
        (Ok(()), false, true) => {
            format!("{device}: GPUDirect RDMA on through DMA-BUF ({gpus}) [{peermem}]")
        }
        (Ok(()), false, false) => {
            format!("{device}: GPUDirect RDMA off: {peermem}; {both}")
        }
    };
    (memory, line)
}

/// Why the host looks virtualised, or `None` on bare metal. `cpuinfo` is the text of
/// `/proc/cpuinfo` when readable.
pub fn detect_hypervisor(sysfs: &SysfsRoot, cpuinfo: Option<&str>) -> Option<String> {
    let cpu_flag = cpuinfo.is_some_and(|text| {
        text.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|w| w == "hypervisor"))
    });
    if cpu_flag {
        return Some("CPU hypervisor flag".to_owned());
    }
    if let Some(kind) = sysfs.read_value("hypervisor/type") {
        return Some(format!("sysfs hypervisor/type = {kind}"));
    }
    const DMI_MARKS: [&str; 8] = [
        "QEMU",
        "KVM",
        "VMware",
        "VirtualBox",
        "Xen",
        "Virtual Machine",
        "Cloud Hypervisor",
        "Bochs",
    ];
    ["class/dmi/id/sys_vendor", "class/dmi/id/product_name"]
        .into_iter()
        .find_map(|rel| {
            let value = sysfs.read_value(rel)?;
            DMI_MARKS
                .iter()
                .any(|m| value.contains(m))
                .then(|| format!("DMI {} = {value}", rel.rsplit('/').next().unwrap_or(rel)))
        })
}

/// What the relaxed-ordering policy looks at for one port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelaxedOrderingInputs {
    /// The variable.
    pub setting: RelaxedOrdering,
    /// The device is an SR-IOV VF (has a `physfn`).
    pub is_vf: bool,
    /// Why the host looks virtualised, if it does.
    pub hypervisor: Option<String>,
    /// `ibv_reg_mr_iova2` exists in the loaded libibverbs.
    pub reg_mr_iova2: bool,
}

/// Whether data registrations of a port carry `IBV_ACCESS_RELAXED_ORDERING`, and the one line
/// that explains it.
pub fn relaxed_ordering(inputs: &RelaxedOrderingInputs) -> (bool, String) {
    let setting = match inputs.setting {
        RelaxedOrdering::Off => "NCCL_IB_PCI_RELAXED_ORDERING=0",
        RelaxedOrdering::On => "NCCL_IB_PCI_RELAXED_ORDERING=1",
        RelaxedOrdering::Auto => "NCCL_IB_PCI_RELAXED_ORDERING=2 (auto)",
    };
    let function = if inputs.is_vf {
        "SR-IOV VF"
    } else {
        "PF or no PCI parent"
    };
    let host = inputs.hypervisor.as_deref().map_or_else(
        || "bare metal".to_owned(),
        |why| format!("hypervisor ({why})"),
    );
    let verbs = if inputs.reg_mr_iova2 {
        "ibv_reg_mr_iova2 available"
    } else {
        "ibv_reg_mr_iova2 missing (libibverbs older than rdma-core 22)"
    };
    let (on, why) = match inputs.setting {
        RelaxedOrdering::Off => (false, "turned off"),
        _ if !inputs.reg_mr_iova2 => (false, "verbs cannot register with it"),
        RelaxedOrdering::On => (true, "asked for"),
        RelaxedOrdering::Auto if inputs.is_vf => (
            true,
            "a VF's DMA goes through the IOMMU/ATS path where strict ordering costs bandwidth",
        ),
        RelaxedOrdering::Auto if inputs.hypervisor.is_some() => (
            true,
            "under a hypervisor DMA goes through the IOMMU/ATS path where strict ordering costs bandwidth",
        ),
        RelaxedOrdering::Auto => (
            false,
            "bare-metal PF: little to gain, and some root complexes regress",
        ),
    };
    let verdict = if on { "on" } else { "off" };
    (
        on,
        format!("relaxed ordering {verdict}: {why} [{function}; {host}; {verbs}; {setting}]"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdr_mode_follows_driver_peermem_and_dmabuf() {
        let registered = PeerMem::Registered {
            path: REGISTERED_PATHS[0],
        };
        let one_gpu = GpuExport::Gpus {
            exporting: 1,
            total: 1,
        };
        let (m, line) = gdr_verdict("mlx5_0", &Ok(()), &one_gpu, &registered, &DmaBuf::Supported);
        assert_eq!((m.host, m.cuda, m.dmabuf), (true, true, true));
        assert_eq!(
            line,
            "mlx5_0: GPUDirect RDMA on: nvidia peer memory registered \
             (/sys/kernel/mm/memory_peers/nv_mem/version); DMA-BUF supported by the NIC; \
             1 of 1 GPUs export it"
        );
        let (m, line) = gdr_verdict(
            "mlx5_0",
            &Ok(()),
            &one_gpu,
            &PeerMem::Absent,
            &DmaBuf::Supported,
        );
        assert_eq!((m.cuda, m.dmabuf), (false, true));
        assert!(
            line.starts_with(
                "mlx5_0: GPUDirect RDMA on through DMA-BUF (1 of 1 GPUs export it) \
                 [no peer-memory module"
            ),
            "{line}"
        );
        let refused = DmaBuf::Unsupported("rxe0: Operation not supported (os error 95)".into());
        let (m, line) = gdr_verdict("rxe0", &Ok(()), &one_gpu, &PeerMem::Absent, &refused);
        assert_eq!((m.cuda, m.dmabuf), (false, false));
        assert!(
            line.starts_with("rxe0: GPUDirect RDMA off: no peer-memory module"),
            "{line}"
        );
        assert!(
            line.contains("DMA-BUF unsupported (rxe0: Operation not supported"),
            "{line}"
        );
        let (m, line) = gdr_verdict(
            "rxe0",
            &Err("libcuda.so not found".into()),
            &GpuExport::Unknown("libcuda.so not found".into()),
            &registered,
            &DmaBuf::Disabled,
        );
        assert_eq!((m.host, m.cuda, m.dmabuf), (true, false, false));
        assert!(
            line.starts_with(
                "rxe0: GPUDirect RDMA off: no CUDA driver (libcuda.so not found), host memory only"
            ),
            "{line}"
        );
        assert!(
            line.ends_with("DMA-BUF disabled by NCCL_DMABUF_ENABLE=0]"),
            "{line}"
        );
    }

    /// NCCL uses DMA-BUF only for a GPU whose CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is set
    /// (`dmaBufSupported` in init.cc; GPUDirect over the net needs it, graph/topo.cc): a NIC
    /// that takes DMA-BUF next to GPUs that cannot export it gives no GPUDirect RDMA.
    #[test]
    fn a_nic_that_takes_dmabuf_is_not_enough_when_no_gpu_exports_it() {
        let proprietary = GpuExport::Gpus {
            exporting: 0,
            total: 2,
        };
        let (m, line) = gdr_verdict(
            "mlx5_0",
            &Ok(()),
            &proprietary,
            &PeerMem::Absent,
            &DmaBuf::Supported,
        );
        assert_eq!((m.cuda, m.dmabuf), (false, false));
        assert!(
            line.starts_with("mlx5_0: GPUDirect RDMA off: no peer-memory module"),
            "{line}"
        );
        assert!(
            line.ends_with(
                "DMA-BUF supported by the NIC; none of the 2 GPUs exports it \
                 (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0); fix: NVIDIA's open GPU kernel \
                 module (the proprietary one exports no DMA-BUF), or nvidia_peermem"
            ),
            "{line}"
        );
        let registered = PeerMem::Registered {
            path: REGISTERED_PATHS[2],
        };
        let (m, line) = gdr_verdict(
            "mlx5_0",
            &Ok(()),
            &proprietary,
            &registered,
            &DmaBuf::Supported,
        );
        assert_eq!((m.cuda, m.dmabuf), (true, false));
        assert!(
            line.starts_with("mlx5_0: GPUDirect RDMA on through peer memory: nvidia peer memory"),
            "{line}"
        );
        let unknown = GpuExport::Unknown("cuDeviceGetCount failed".into());
        let (m, line) = gdr_verdict(
            "mlx5_0",
            &Ok(()),
            &unknown,
            &PeerMem::Absent,
            &DmaBuf::Supported,
        );
        assert!(!m.dmabuf);
        assert!(
            line.ends_with("whether the GPUs export it is unknown (cuDeviceGetCount failed)"),
            "{line}"
        );
        let none = GpuExport::Gpus {
            exporting: 0,
            total: 0,
        };
        assert_eq!(none.to_string(), "no GPU is visible to the CUDA driver");
        assert!(!none.any());
    }

    #[test]
    fn cpu_flag_is_read_from_the_flags_line_only() {
        let root = SysfsRoot::new("/nonexistent-sysfs");
        let vm = "processor\t: 0\nflags\t\t: fpu vme hypervisor lahf_lm\n";
        assert_eq!(
            detect_hypervisor(&root, Some(vm)).as_deref(),
            Some("CPU hypervisor flag")
        );
        let metal = "model name\t: hypervisor-ready CPU\nflags\t\t: fpu vme\n";
        assert_eq!(detect_hypervisor(&root, Some(metal)), None);
        assert_eq!(detect_hypervisor(&root, None), None);
    }
}
