//! The NCCL devices: one port or a fused group each, with what `getProperties` reports and the
//! verbs context their comms share; the GPUDirect facts probed once for all of them.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::Arc;

use once_cell::sync::{Lazy, OnceCell};
use parking_lot::Mutex;

use super::PLUGIN_NAME;
use crate::core::config::Config;
use crate::core::error::Result;
use crate::log::INIT_TARGET;
use crate::topology::{
    DmaBuf, MemorySupport, PeerMem, RelaxedOrderingInputs, SysfsRoot, VirtualDevice,
    detect_hypervisor, gdr_verdict, relaxed_ordering,
};
use crate::transport::DeviceContext;
use crate::verbs;

/// One NCCL device. Its strings are interned: NCCL keeps the pointers `getProperties` returned
/// for the life of the process, even across a `finalize` that drops the device table.
#[derive(Debug)]
pub struct Device {
    /// What topology chose: one port, or the fused member ports.
    pub virt: VirtualDevice,
    /// Indices of the physical devices (ports) it is made of: `vProps` in v9+ properties.
    pub physical: Vec<usize>,
    /// `name` as a C string.
    pub c_name: &'static CStr,
    /// `pciPath` as a C string; `None` reports NULL.
    pub c_pci_path: Option<&'static CStr>,
    /// Memory this device can register.
    pub memory: MemorySupport,
    /// Per member: data registrations carry relaxed ordering.
    pub relaxed_ordering: Vec<bool>,
    context: OnceCell<Arc<DeviceContext>>,
}

/// `s` as a C string that lives for the rest of the process; each distinct string is leaked once
/// (device names and PCI paths: a handful).
fn intern(s: &[u8]) -> &'static CStr {
    static STRINGS: Lazy<Mutex<HashMap<Vec<u8>, &'static CStr>>> = Lazy::new(Mutex::default);
    let mut strings = STRINGS.lock();
    if let Some(c) = strings.get(s) {
        return c;
    }
    // Device names and sysfs paths never contain NUL; one that did would be unusable anyway.
    let c: &'static CStr = Box::leak(CString::new(s).unwrap_or_default().into_boxed_c_str());
    strings.insert(s.to_vec(), c);
    c
}

impl Device {
    /// Describe `virt`, made of the physical devices `physical`, probing DMA-BUF on its members
    /// and logging its GPUDirect and relaxed-ordering verdicts.
    pub(super) fn new(
        virt: VirtualDevice,
        physical: Vec<usize>,
        gpu: &GpuContext,
        config: &Config,
    ) -> Self {
        let c_name = intern(virt.name().as_bytes());
        let c_pci_path = virt
            .pci_path()
            .map(|p| intern(p.as_os_str().as_encoded_bytes()));
        let dmabuf = probe_dmabuf(&virt, config);
        let (memory, line) = gdr_verdict(&virt.name(), gpu.cuda.clone(), &gpu.peermem, &dmabuf);
        tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: {line}");
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
                tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: {}: {line}", member.name);
                on
            })
            .collect();
        Self {
            virt,
            physical,
            c_name,
            c_pci_path,
            memory,
            relaxed_ordering,
            context: OnceCell::new(),
        }
    }

    /// The verbs context of this device, opened on first use and shared by its comms.
    ///
    /// # Errors
    /// Whatever opening a member fails with.
    pub fn context(&self, config: &Config) -> Result<&Arc<DeviceContext>> {
        self.context.get_or_try_init(|| {
            DeviceContext::open(
                &self.virt,
                &self.relaxed_ordering,
                config,
                &SysfsRoot::default(),
            )
        })
    }

    /// `"[2]rxe1:1+rxe2:1/RoCE 20000Mbps host"`: one entry of the init banner.
    pub(super) fn banner_entry(&self, index: usize) -> String {
        let ports: Vec<String> = self
            .virt
            .members
            .iter()
            .map(|n| format!("{}:{}", n.device, n.port))
            .collect();
        let m = self.memory;
        let memory = [(m.host, "host"), (m.cuda, "cuda"), (m.dmabuf, "dmabuf")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| *name)
            .collect::<Vec<_>>()
            .join("+");
        format!(
            "[{index}]{}/{} {}Mbps {memory}",
            ports.join("+"),
            self.virt.first().link_layer,
            self.virt.speed_mbps()
        )
    }
}

/// What GPUDirect RDMA and relaxed ordering depend on beyond the device itself, probed once.
#[derive(Debug)]
pub(super) struct GpuContext {
    cuda: std::result::Result<(), String>,
    peermem: PeerMem,
    hypervisor: Option<String>,
    reg_mr_iova2: bool,
}

impl GpuContext {
    pub(super) fn probe(sysfs: &SysfsRoot) -> Self {
        let cuda = crate::cuda::driver().map_err(|e| e.to_string());
        if let Err(why) = &cuda {
            tracing::info!(
                target: INIT_TARGET,
                "NET/{PLUGIN_NAME}: no CUDA driver ({why}): every device registers host memory only"
            );
        }
        let read = |path: &str| std::fs::read_to_string(path).ok();
        Self {
            cuda,
            peermem: PeerMem::detect(sysfs, read("/proc/modules").as_deref()),
            hypervisor: detect_hypervisor(sysfs, read("/proc/cpuinfo").as_deref()),
            reg_mr_iova2: verbs::reg_mr_iova2_available(),
        }
    }
}

/// Probe DMA-BUF registration on every member: the device supports it when all members do.
fn probe_dmabuf(virt: &VirtualDevice, config: &Config) -> DmaBuf {
    if !config.dmabuf_enabled {
        return DmaBuf::Disabled;
    }
    for member in &virt.members {
        let probed = verbs::Device::open(&member.device)
            .and_then(|device| verbs::ProtectionDomain::new(&device))
            .map_err(|e| e.to_string())
            .and_then(|pd| {
                pd.probe_dmabuf()
                    .map_err(|e| format!("ibv_reg_dmabuf_mr: {e}"))
            });
        if let Err(why) = probed {
            return DmaBuf::Unsupported(format!("{}: {why}", member.name));
        }
    }
    DmaBuf::Supported
}
