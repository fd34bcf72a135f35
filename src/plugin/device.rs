//! The NCCL devices: one port or a fused group each, with what `getProperties` reports and the
//! verbs context their comms share.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::Arc;

use once_cell::sync::{Lazy, OnceCell};
use parking_lot::Mutex;

use super::DeviceVerdict;
use crate::core::config::Config;
use crate::core::error::Result;
use crate::topology::{MemorySupport, SysfsRoot, VirtualDevice};
use crate::transport::DeviceContext;

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
    /// The device `init` (or `makeVDevice`) judged in `verdict`, made of the physical devices
    /// `physical`.
    pub(super) fn new(verdict: DeviceVerdict, physical: Vec<usize>) -> Self {
        let virt = verdict.virt;
        let c_name = intern(virt.name().as_bytes());
        let c_pci_path = virt
            .pci_path()
            .map(|p| intern(p.as_os_str().as_encoded_bytes()));
        Self {
            virt,
            physical,
            c_name,
            c_pci_path,
            memory: verdict.memory,
            relaxed_ordering: verdict.relaxed_ordering.iter().map(|(on, _)| *on).collect(),
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

    /// Open the verbs context now, at `init` (or `makeVDevice`), as NCCL's transport opens its
    /// devices in `init`: the first `listen` or `connect` then finds it ready. A failure is left
    /// for that first use to report, to the call that needs the device.
    pub(super) fn open_early(&self, config: &Config) {
        if let Err(e) = self.context(config) {
            tracing::debug!(
                "NET/{}: {} not opened at init ({e}); its first comm tries again",
                super::PLUGIN_NAME,
                self.virt.name()
            );
        }
    }

    /// `"[2]rxe1:1+rxe2:1/RoCE 20000Mbps host"`: one entry of the init banner.
    pub(super) fn banner_entry(&self, index: usize) -> String {
        let ports: Vec<String> = self
            .virt
            .members
            .iter()
            .map(|n| format!("{}:{}", n.device, n.port))
            .collect();
        format!(
            "[{index}]{}/{} {}Mbps {}",
            ports.join("+"),
            self.virt.first().link_layer,
            self.virt.speed_mbps(),
            self.memory.kinds()
        )
    }
}
