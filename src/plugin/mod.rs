//! Process-wide plugin state: configuration and the device table, built by the first `init`
//! and read by every later call from any NCCL thread.
//!
//! Lifetime: ncclNet v8 to v10 call `init` once per process and never finalize, so their state
//! lives for the process. v11+ call `init` once per communicator, each returning a
//! [`CommContext`], and `finalize` for each: the state goes with the last context (a later
//! `init` discovers again). Discovery happens once per state, whatever the number of contexts.
//!
//! Device table: under v8 NCCL cannot fuse devices, so the ports of one NIC are fused here at
//! init ([`DeviceModel::Fused`]). From v9 NCCL fuses them itself through `makeVDevice`, so the
//! table starts with one device per port, then the `NCCL_NET_RS_FUSE` groups, and grows with
//! every `makeVDevice` ([`DeviceModel::Ports`]).

mod context;
mod device;
mod survey;

use std::sync::Arc;

use parking_lot::RwLock;

pub use self::context::{CommContext, Flows, NetHints, RawNetAttr, traffic_class_of};
pub use self::device::Device;
pub use self::survey::{
    DeviceModel, DeviceVerdict, DmaBufProbe, GpuFacts, SMALL_VDEVICE_LIMIT, SMALL_VDEVICE_TABLES,
    Survey, fusion_policy, probe_dmabuf_live,
};
use crate::core::config::{Config, not_implemented_set};
use crate::core::error::{Error, Result};
use crate::log::{self, INIT_TARGET};
pub use crate::topology::MemorySupport;
use crate::topology::{
    GidPolicy, LinkLayer, NetDevice, SysfsRoot, VirtualDevice, choose_gid, configured_pkey,
    fuse_listed,
};
use crate::transport::DeviceContext;
use crate::verbs;

/// Name NCCL shows and matches against `NCCL_NET` (case-insensitively).
pub const PLUGIN_NAME: &str = "RsIB";

/// Largest `n` accepted by a grouped `irecv` (NCCL's own IB transport uses 8).
pub const MAX_GROUPED_RECVS: u32 = 8;

/// The initialised plugin.
#[derive(Debug)]
pub struct Plugin {
    config: Config,
    model: DeviceModel,
    /// Ports at the head of the table under [`DeviceModel::Ports`] (what `makeVDevice` fuses).
    ports: Vec<NetDevice>,
    devices: RwLock<Vec<Arc<Device>>>,
    gpu: GpuFacts,
}

/// The current state and who holds it.
#[derive(Debug)]
struct Lifetime {
    plugin: Option<Arc<Plugin>>,
    /// Open v11+ contexts.
    contexts: usize,
    /// A pre-v11 `init` happened: nothing will ever finalize.
    permanent: bool,
}

static LIFETIME: RwLock<Lifetime> = RwLock::new(Lifetime {
    plugin: None,
    contexts: 0,
    permanent: false,
});

impl Plugin {
    /// `init` of ncclNet v8 to v10: build the state if there is none; it stays for the process.
    ///
    /// # Errors
    /// `Config` when a variable has an invalid value (init is retried on the next call).
    pub fn init(model: DeviceModel) -> Result<Arc<Self>> {
        let mut life = LIFETIME.write();
        let plugin = Self::current_or_build(&mut life, model)?;
        life.permanent = true;
        Ok(plugin)
    }

    /// `init` of ncclNet v11+: build the state if there is none and open a context on it.
    ///
    /// # Errors
    /// As [`Plugin::init`], and `Config` for an invalid traffic class.
    pub fn open_context(
        comm_id: u64,
        traffic_class: i32,
        model: DeviceModel,
    ) -> Result<CommContext> {
        let context = CommContext::new(comm_id, traffic_class)?;
        let mut life = LIFETIME.write();
        Self::current_or_build(&mut life, model)?;
        life.contexts += 1;
        Ok(context)
    }

    /// `finalize` of ncclNet v11+: release `context`; the state goes with the last one (unless a
    /// pre-v11 `init` made it permanent). Comms still open keep their devices.
    pub fn close_context(context: CommContext) {
        let mut life = LIFETIME.write();
        life.contexts = life.contexts.saturating_sub(1);
        tracing::debug!(
            "finalize of comm {:#x}: {} contexts open",
            context.comm_id,
            life.contexts
        );
        if life.contexts == 0 && !life.permanent {
            life.plugin = None;
        }
    }

    fn current_or_build(life: &mut Lifetime, model: DeviceModel) -> Result<Arc<Self>> {
        if let Some(plugin) = &life.plugin {
            return Ok(Arc::clone(plugin));
        }
        let config = Config::from_lookup(|name| std::env::var_os(name))?;
        log::set_filter(&config.log_directive);
        let ignored = not_implemented_set(|name| std::env::var_os(name));
        if !ignored.is_empty() {
            tracing::warn!(
                "{}: options of NCCL's internal IB transport that this plugin does not \
                 implement; they have no effect here (nccl-net-doctor's env.config says what each \
                 does there)",
                ignored.join(", ")
            );
        }
        let sysfs = SysfsRoot::default();
        let plugin = Arc::new(Self::discover(config, model, &sysfs));
        plugin.check_port_knobs(&sysfs)?;
        plugin.log_banner();
        for device in plugin.devices.read().iter() {
            device.open_early(&plugin.config);
        }
        life.plugin = Some(Arc::clone(&plugin));
        Ok(plugin)
    }

    /// The plugin, if `init` has run (and the state was not finalized since).
    ///
    /// # Errors
    /// `Misuse` when NCCL calls an entry point before `init` or after the last `finalize`.
    pub fn get() -> Result<Arc<Self>> {
        LIFETIME
            .read()
            .plugin
            .clone()
            .ok_or_else(|| Error::misuse("called before init (or after the last finalize)"))
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// How the device table is made.
    pub fn model(&self) -> DeviceModel {
        self.model
    }

    /// Number of devices NCCL sees.
    pub fn device_count(&self) -> usize {
        self.devices.read().len()
    }

    /// Device `index`.
    ///
    /// # Errors
    /// `Misuse` for an index NCCL was never given.
    pub fn device(&self, index: i32) -> Result<Arc<Device>> {
        let devices = self.devices.read();
        usize::try_from(index)
            .ok()
            .and_then(|i| devices.get(i))
            .cloned()
            .ok_or_else(|| {
                Error::misuse(format!(
                    "device {index} does not exist ({} devices)",
                    devices.len()
                ))
            })
    }

    /// The verbs context of device `index`, opened on first use and shared by its comms.
    ///
    /// # Errors
    /// `Misuse` for an unknown index; whatever opening the device fails with.
    pub fn context(&self, index: i32) -> Result<Arc<DeviceContext>> {
        self.device(index)?.context(&self.config).cloned()
    }

    /// `makeVDevice`: fuse the ports at `members` (indices of physical devices) into a new
    /// device, by the same rules as every other fusion, and return its index; at most
    /// `max_members` (the version's limit). One INFO line says what was decided.
    ///
    /// # Errors
    /// `Config` (NCCL keeps the devices apart) when the rules refuse, with the reason; `Misuse`
    /// for indices that are not ports of this plugin or a table made for ncclNet v8.
    pub fn make_virtual_device(&self, members: &[i32], max_members: usize) -> Result<i32> {
        if self.model == DeviceModel::Fused {
            return Err(Error::misuse(
                "makeVDevice on a device table made for ncclNet v8 (ports already fused at init)",
            ));
        }
        if members.is_empty() || members.len() > max_members {
            return Err(Error::misuse(format!(
                "makeVDevice with {} devices (this ncclNet version allows 1..={max_members})",
                members.len()
            )));
        }
        let mut physical = Vec::with_capacity(members.len());
        for &m in members {
            let i = usize::try_from(m)
                .ok()
                .filter(|&i| i < self.ports.len())
                .ok_or_else(|| {
                    Error::misuse(format!(
                        "makeVDevice member {m} is not a port ({} ports)",
                        self.ports.len()
                    ))
                })?;
            if physical.contains(&i) {
                return Err(Error::misuse(format!("makeVDevice lists device {m} twice")));
            }
            physical.push(i);
        }
        if let [only] = physical[..] {
            // NCCL never asks for a single member (ncclTopoMakeVnic); it is that port.
            return Ok(i32::try_from(only).unwrap_or(i32::MAX));
        }
        let ports: Vec<&NetDevice> = physical.iter().map(|&i| &self.ports[i]).collect();
        let label = ports
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join("+");
        let virt = fuse_listed(
            &ports,
            &fusion_policy(
                &self.config,
                DeviceModel::Ports {
                    devs_per_nic: max_members,
                },
            ),
        )
        .map_err(|why| {
            tracing::info!(target: INIT_TARGET, "NET/{PLUGIN_NAME}: fusion {label} refused: {why}");
            Error::config(format!("makeVDevice {label} refused: {why}"))
        })?;
        tracing::info!(
            target: INIT_TARGET,
            "NET/{PLUGIN_NAME}: fusion: fused {label} ({} Mbps): makeVDevice",
            virt.speed_mbps()
        );
        let verdict = DeviceVerdict::judge(virt, &self.gpu, &self.config, &probe_dmabuf_live);
        verdict.log();
        let device = Arc::new(Device::new(verdict, physical));
        device.open_early(&self.config);
        let mut devices = self.devices.write();
        devices.push(device);
        Ok(i32::try_from(devices.len() - 1).unwrap_or(i32::MAX))
    }

    fn discover(config: Config, model: DeviceModel, sysfs: &SysfsRoot) -> Self {
        let gpu = GpuFacts::probe(sysfs, std::path::Path::new("/proc"));
        let survey = Survey::take(
            &config,
            model,
            sysfs,
            verbs::discover_ports(),
            &gpu,
            &probe_dmabuf_live,
        );
        survey.log(&gpu);
        let mut plugin = Self {
            config,
            model,
            ports: survey.ports,
            devices: RwLock::new(Vec::new()),
            gpu,
        };
        let devices = survey
            .devices
            .into_iter()
            .enumerate()
            .map(|(i, verdict)| {
                let physical = plugin.physical_indices(i, &verdict.virt);
                Arc::new(Device::new(verdict, physical))
            })
            .collect();
        plugin.devices = RwLock::new(devices);
        plugin
    }

    /// The ports a device at `index` is made of, as `vProps` lists them: the ports' own indices
    /// under [`DeviceModel::Ports`]; under v8 the device is its own single member.
    fn physical_indices(&self, index: usize, virt: &VirtualDevice) -> Vec<usize> {
        if self.model == DeviceModel::Fused {
            return vec![index];
        }
        virt.members
            .iter()
            .filter_map(|m| self.ports.iter().position(|p| p.name == m.name))
            .collect()
    }

    /// `NCCL_IB_GID_INDEX` and `NCCL_IB_PKEY` name one table index for every port (the GID
    /// index every RoCE port): refuse them here, naming the variable, when a selected port has
    /// no such entry, rather than at the first `listen`.
    fn check_port_knobs(&self, sysfs: &SysfsRoot) -> Result<()> {
        let config = &self.config;
        let policy = GidPolicy::from_config(config);
        let devices = self.devices.read();
        for port in devices.iter().flat_map(|d| &d.virt.members) {
            let where_ = format!("{}:{}", port.device, port.port);
            if config.gid_index.is_some() && port.link_layer == LinkLayer::Ethernet {
                choose_gid(&sysfs.port_gids(&port.device, port.port), &policy)
                    .chosen
                    .map_err(|why| Error::config(format!("{why} on {where_}")))?;
            }
            if let Some(index) = config.pkey_index {
                configured_pkey(sysfs, &port.device, port.port, index).map_err(Error::config)?;
            }
        }
        Ok(())
    }

    fn log_banner(&self) {
        let devices = self.devices.read();
        if devices.is_empty() {
            return;
        }
        let list: Vec<String> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| d.banner_entry(i))
            .collect();
        let model = match self.model {
            DeviceModel::Fused => "ncclNet v8, ports of a NIC fused here",
            DeviceModel::Ports { .. } => "ncclNet v9+, NCCL fuses ports with makeVDevice",
        };
        tracing::info!(
            target: INIT_TARGET,
            "NET/{PLUGIN_NAME} {} {} ({model}): using {}",
            env!("CARGO_PKG_NAME"),
            env!("CARGO_PKG_VERSION"),
            list.join(" ")
        );
    }
}
