//! Process-wide plugin state: configuration and the device table, built once by the first
//! `init` and read by every later call from any NCCL thread.

use std::ffi::CString;
use std::sync::Arc;

use once_cell::sync::OnceCell;

use crate::core::config::{Config, MAX_FUSED_MEMBERS};
use crate::core::error::{Error, Result};
use crate::log::{self, INIT_TARGET};
pub use crate::topology::MemorySupport;
use crate::topology::{
    DmaBuf, FusionPolicy, HcaFilter, LinkLayer, PeerMem, RelaxedOrderingInputs, Selection,
    SysfsRoot, VirtualDevice, detect_hypervisor, fuse, gdr_verdict, relaxed_ordering,
    select_devices, select_gid,
};
use crate::transport::DeviceContext;
use crate::verbs::{self, Discovery};

/// Name NCCL shows and matches against `NCCL_NET` (case-insensitively).
pub const PLUGIN_NAME: &str = "RsIB";

/// Largest `n` accepted by a grouped `irecv` (NCCL's own IB transport uses 8).
pub const MAX_GROUPED_RECVS: u32 = 8;

/// One NCCL device with the C strings its properties point at (they live as long as the process,
/// as NCCL requires).
#[derive(Debug)]
pub struct Device {
    /// What topology chose: one port, or the fused member ports.
    pub virt: VirtualDevice,
    /// `name` as a C string.
    pub c_name: CString,
    /// `pciPath` as a C string; `None` reports NULL.
    pub c_pci_path: Option<CString>,
    /// Memory this device can register.
    pub memory: MemorySupport,
    /// Per member: data registrations carry relaxed ordering.
    pub relaxed_ordering: Vec<bool>,
    context: OnceCell<Arc<DeviceContext>>,
}

/// The initialised plugin.
#[derive(Debug)]
pub struct Plugin {
    config: Config,
    devices: Vec<Device>,
}

static PLUGIN: OnceCell<Plugin> = OnceCell::new();

impl Plugin {
    /// Initialise once per process from the environment; later calls return the same plugin
    /// (NCCL may call `init` again, and may dlclose and reopen the library).
    ///
    /// # Errors
    /// `Config` when a variable has an invalid value (init is retried on the next call).
    pub fn init() -> Result<&'static Self> {
        PLUGIN.get_or_try_init(|| {
            let config = Config::from_lookup(|name| std::env::var_os(name))?;
            log::set_filter(&config.log_directive);
            let sysfs = SysfsRoot::default();
            let plugin = Self::discover(config, &sysfs);
            plugin.check_gid_index(&sysfs)?;
            plugin.log_banner();
            Ok(plugin)
        })
    }

    /// The plugin, if `init` has run.
    ///
    /// # Errors
    /// `Misuse` when NCCL calls an entry point before `init`.
    pub fn get() -> Result<&'static Self> {
        PLUGIN
            .get()
            .ok_or_else(|| Error::misuse("called before init"))
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The devices NCCL sees, in index order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Device `index`.
    ///
    /// # Errors
    /// `Misuse` for an index NCCL was never given.
    pub fn device(&self, index: i32) -> Result<&Device> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or_else(|| {
                Error::misuse(format!(
                    "device {index} does not exist ({} devices)",
                    self.devices.len()
                ))
            })
    }

    /// The verbs context of device `index`, opened on first use and shared by its comms.
    ///
    /// # Errors
    /// `Misuse` for an unknown index; whatever opening the device fails with.
    pub fn context(&self, index: i32) -> Result<&Arc<DeviceContext>> {
        let device = self.device(index)?;
        device.context.get_or_try_init(|| {
            DeviceContext::open(
                &device.virt,
                &device.relaxed_ordering,
                &self.config,
                &SysfsRoot::default(),
            )
        })
    }

    fn discover(config: Config, sysfs: &SysfsRoot) -> Self {
        let devices = match Self::select(&config, sysfs) {
            Ok(selection) => {
                let fusion = fuse(
                    selection.devices,
                    &FusionPolicy {
                        merge_nics: config.merge_nics,
                        merge_vfs: config.merge_vfs,
                        explicit: config.fuse.clone(),
                        max_members: MAX_FUSED_MEMBERS,
                    },
                );
                for decision in &fusion.decisions {
                    tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: fusion: {decision}");
                }
                let gpu = GpuContext::probe(sysfs);
                fusion
                    .devices
                    .into_iter()
                    .map(|virt| Device::new(virt, &gpu, &config))
                    .collect()
            }
            Err(why) => {
                tracing::warn!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: 0 devices: {why}");
                Vec::new()
            }
        };
        Self { config, devices }
    }

    /// Discover and select; `Err` carries the one line that explains an empty device list.
    fn select(config: &Config, sysfs: &SysfsRoot) -> std::result::Result<Selection, String> {
        let filter = match config.ib_hca.as_deref().map(HcaFilter::parse).transpose() {
            Ok(f) => f,
            Err(e) => return Err(e.to_string()),
        };
        let discovery = verbs::discover_ports().map_err(|e| explain_discovery_failure(&e))?;
        for problem in &discovery.problems {
            tracing::warn!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: {problem}");
        }
        let selection = select_devices(&discovery.ports, filter.as_ref(), sysfs);
        if selection.devices.is_empty() {
            return Err(explain_empty_selection(
                &discovery,
                &selection,
                filter.as_ref(),
            ));
        }
        if !selection.skipped.is_empty() {
            tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: not used: {}", selection.skipped.join("; "));
        }
        Ok(selection)
    }

    /// `NCCL_IB_GID_INDEX` names one GID index for every RoCE port: refuse it here, naming the
    /// variable, when a selected port has no such GID, rather than at the first `listen`.
    fn check_gid_index(&self, sysfs: &SysfsRoot) -> Result<()> {
        let Some(index) = self.config.gid_index else {
            return Ok(());
        };
        let roce_ports = self
            .devices
            .iter()
            .flat_map(|d| &d.virt.members)
            .filter(|m| m.link_layer == LinkLayer::Ethernet);
        for port in roce_ports {
            let gids = sysfs.port_gids(&port.device, port.port);
            let config = &self.config;
            select_gid(&gids, Some(index), config.addr_family, config.roce_version)
                .map_err(|why| Error::config(format!("{why} on {}:{}", port.device, port.port)))?;
        }
        Ok(())
    }

    fn log_banner(&self) {
        if self.devices.is_empty() {
            return;
        }
        let list: Vec<String> = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let ports: Vec<String> = d
                    .virt
                    .members
                    .iter()
                    .map(|n| format!("{}:{}", n.device, n.port))
                    .collect();
                let m = d.memory;
                let memory = [(m.host, "host"), (m.cuda, "cuda"), (m.dmabuf, "dmabuf")]
                    .iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, name)| *name)
                    .collect::<Vec<_>>()
                    .join("+");
                format!(
                    "[{i}]{}/{} {}Mbps {memory}",
                    ports.join("+"),
                    d.virt.first().link_layer,
                    d.virt.speed_mbps()
                )
            })
            .collect();
        tracing::info!(
            target: INIT_TARGET,
            "NET/{PLUGIN_NAME} {} {} (ncclNet v8): using {}",
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION"),
            list.join(" ")
        );
    }
}

/// What GPUDirect RDMA and relaxed ordering depend on beyond the device itself, probed once.
struct GpuContext {
    cuda: std::result::Result<(), String>,
    peermem: PeerMem,
    hypervisor: Option<String>,
    reg_mr_iova2: bool,
}

impl GpuContext {
    fn probe(sysfs: &SysfsRoot) -> Self {
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

impl Device {
    fn new(virt: VirtualDevice, gpu: &GpuContext, config: &Config) -> Self {
        // Device names and sysfs paths never contain NUL; a name that did would be unusable anyway.
        let c_name = CString::new(virt.name()).unwrap_or_default();
        let c_pci_path = virt
            .pci_path()
            .and_then(|p| CString::new(p.as_os_str().as_encoded_bytes()).ok());
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
            c_name,
            c_pci_path,
            memory,
            relaxed_ordering,
            context: OnceCell::new(),
        }
    }
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
    match filter {
        Some(f) => format!(
            "NCCL_IB_HCA='{}' matches no active port ({ports})",
            f.as_str()
        ),
        None => format!("no active IB/RoCE port ({ports})"),
    }
}
