//! Device enumeration, opening and queries: `ibv_get_device_list`, `ibv_open_device`,
//! `ibv_query_device`, `ibv_query_port`.

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys as sys;

use crate::core::error::{Error, Result};
use crate::topology::{GidEntry, HcaPort, LinkLayer};

/// Every port of every RDMA device libibverbs knows, plus what could not be queried.
#[derive(Clone, Debug, Default)]
pub struct Discovery {
    /// All ports, active or not; the topology layer decides which to use.
    pub ports: Vec<HcaPort>,
    /// Devices seen by libibverbs (even those whose ports could not be queried).
    pub device_count: usize,
    /// One line per device or port that failed to answer a query.
    pub problems: Vec<String>,
}

/// Enumerate every port of every RDMA device.
///
/// # Errors
/// `ibv_get_device_list` failing, e.g. `ENOSYS` on a kernel without RDMA support.
pub fn discover_ports() -> Result<Discovery> {
    let list = DeviceList::new().map_err(|e| Error::system("ibv_get_device_list failed", e))?;
    let mut discovery = Discovery {
        device_count: list.len(),
        ..Discovery::default()
    };
    for index in 0..list.len() {
        let name = list.name(index);
        let context = match list.open(index) {
            Ok(c) => c,
            Err(e) => {
                discovery
                    .problems
                    .push(format!("{name}: ibv_open_device failed: {e}"));
                continue;
            }
        };
        let attr = match context.query_device() {
            Ok(a) => a,
            Err(e) => {
                discovery
                    .problems
                    .push(format!("{name}: ibv_query_device failed: {e}"));
                continue;
            }
        };
        for port in 1..=u32::from(attr.phys_port_cnt) {
            match context.query_port(port) {
                Ok(p) => discovery.ports.push(HcaPort {
                    device: name.clone(),
                    port,
                    state: p.state,
                    link_layer: LinkLayer::from_code(p.link_layer),
                    active_speed: u32::from(p.active_speed),
                    active_width: p.active_width,
                    phys_state: p.phys_state,
                    active_mtu: p.active_mtu,
                    max_mtu: p.max_mtu,
                    lid: p.lid,
                    sm_lid: p.sm_lid,
                    sys_image_guid: u64::from_be(attr.sys_image_guid),
                    max_qp: u32::try_from(attr.max_qp).unwrap_or(0),
                }),
                Err(e) => discovery
                    .problems
                    .push(format!("{name}:{port}: ibv_query_port failed: {e}")),
            }
        }
    }
    Ok(discovery)
}

/// The array `ibv_get_device_list` returns; freed on drop.
struct DeviceList {
    raw: NonNull<*mut sys::ibv_device>,
    len: usize,
}

impl DeviceList {
    fn new() -> io::Result<Self> {
        let mut n: i32 = 0;
        // SAFETY: `n` is a valid out-pointer; the call has no other precondition.
        let raw = unsafe { sys::ibv_get_device_list(&mut n) };
        let raw = NonNull::new(raw).ok_or_else(io::Error::last_os_error)?;
        Ok(Self {
            raw,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    fn len(&self) -> usize {
        self.len
    }

    fn device(&self, index: usize) -> *mut sys::ibv_device {
        assert!(index < self.len, "device index {index} out of range");
        // SAFETY: the list holds `len` valid device pointers followed by NULL; `index < len`.
        let slot = unsafe { self.raw.as_ptr().add(index) };
        // SAFETY: `slot` points at an initialised entry of the live list (see above).
        unsafe { *slot }
    }

    fn name(&self, index: usize) -> String {
        // SAFETY: `device` is a live entry of the list; libibverbs returns a NUL-terminated name
        // owned by the device, valid while the list is.
        let name = unsafe { sys::ibv_get_device_name(self.device(index)) };
        if name.is_null() {
            return format!("device{index}");
        }
        // SAFETY: non-NULL, NUL-terminated and alive for this borrow (see above).
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// Open a device; the context stays valid after the list is freed (libibverbs keeps a
    /// reference on opened devices).
    fn open(&self, index: usize) -> io::Result<Device> {
        // SAFETY: the device pointer comes from this live list.
        let raw = unsafe { sys::ibv_open_device(self.device(index)) };
        let name = self.name(index);
        NonNull::new(raw)
            .map(|raw| Device { raw, name })
            .ok_or_else(io::Error::last_os_error)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ibv_get_device_list` and is freed exactly once.
        unsafe { sys::ibv_free_device_list(self.raw.as_ptr()) };
    }
}

/// An open RDMA device (`ibv_context`); closed on drop, after every object created on it (they
/// hold an `Arc` of it).
#[derive(Debug)]
pub struct Device {
    raw: NonNull<sys::ibv_context>,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread (rdma-core documents verbs calls as
// thread-safe); the pointer is only freed in `Drop`.
unsafe impl Send for Device {}
// SAFETY: as above; `&Device` only allows thread-safe verbs calls.
unsafe impl Sync for Device {}

/// What a connection needs to know about its port.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PortState {
    /// `IBV_PORT_*` state (4 = ACTIVE).
    pub state: u32,
    /// Local ID (InfiniBand).
    pub lid: u16,
    /// Active MTU (`ibv_mtu` code).
    pub active_mtu: u8,
    /// Link layer code.
    pub link_layer: u8,
    /// The port is reached by GID only (`IBV_QPF_GRH_REQUIRED`: a virtual HCA on InfiniBand,
    /// such as an SR-IOV function in a VM): its QPs send a global route header.
    pub grh_required: bool,
}

/// `ibv_port_attr::flags` bit of a port that requires a global route header.
const IBV_QPF_GRH_REQUIRED: u8 = 1;

/// The fields of `ibv_device_attr` discovery needs.
struct DeviceAttr {
    sys_image_guid: u64,
    max_qp: i32,
    max_cqe: i32,
    phys_port_cnt: u8,
}

// libibverbs' entry point behind the `ibv_query_gid_table` inline (symbol version IBVERBS_1.11,
// older than the `ibv_reg_dmabuf_mr` of rdma-core 34 the plugin links anyway); rdma-sys binds
// its struct, not the function.
unsafe extern "C" {
    fn _ibv_query_gid_table(
        context: *mut sys::ibv_context,
        entries: *mut sys::ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> isize;
}

const IBV_GID_TYPE_ROCE_V2: u32 = 2;

/// The fields of `ibv_port_attr` discovery needs.
struct PortAttr {
    state: u32,
    lid: u16,
    active_mtu: u8,
    link_layer: u8,
    active_speed: u8,
    active_width: u8,
    phys_state: u8,
    max_mtu: u8,
    sm_lid: u16,
    grh_required: bool,
    gid_tbl_len: i32,
}

impl Device {
    /// Open the device called `name`.
    ///
    /// # Errors
    /// `System` when libibverbs lists no such device or cannot open it.
    pub fn open(name: &str) -> Result<Arc<Self>> {
        let list = DeviceList::new().map_err(|e| Error::system("ibv_get_device_list failed", e))?;
        let index = (0..list.len())
            .find(|&i| list.name(i) == name)
            .ok_or_else(|| {
                Error::system(
                    format!("RDMA device {name} is gone"),
                    io::Error::from_raw_os_error(libc::ENODEV),
                )
            })?;
        let device = list
            .open(index)
            .map_err(|e| Error::system(format!("ibv_open_device({name}) failed"), e))?;
        Ok(Arc::new(device))
    }

    /// The device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn raw(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }

    /// Current state of `port`.
    ///
    /// # Errors
    /// `System` when `ibv_query_port` fails.
    pub fn port_state(&self, port: u32) -> Result<PortState> {
        let p = self.query_port(port).map_err(|e| {
            Error::system(format!("ibv_query_port({}:{port}) failed", self.name), e)
        })?;
        Ok(PortState {
            state: p.state,
            lid: p.lid,
            active_mtu: p.active_mtu,
            link_layer: p.link_layer,
            grh_required: p.grh_required,
        })
    }

    /// The most entries one CQ of this device may have.
    ///
    /// # Errors
    /// `System` when `ibv_query_device` fails.
    pub fn max_cqe(&self) -> Result<u32> {
        let attr = self
            .query_device()
            .map_err(|e| Error::system(format!("ibv_query_device on {} failed", self.name), e))?;
        Ok(u32::try_from(attr.max_cqe).unwrap_or(0))
    }

    fn query_device(&self) -> io::Result<DeviceAttr> {
        let context = self.raw.as_ptr();
        let query = |attr| {
            // SAFETY: `context` is open and `attr` points at a writable `ibv_device_attr`.
            unsafe { sys::ibv_query_device(context, attr) }
        };
        // SAFETY: an all-zero `ibv_device_attr` is valid plain C data.
        let attr = unsafe { query_into(query) }?;
        Ok(DeviceAttr {
            sys_image_guid: attr.sys_image_guid,
            max_qp: attr.max_qp,
            max_cqe: attr.max_cqe,
            phys_port_cnt: attr.phys_port_cnt,
        })
    }

    fn query_port(&self, port: u32) -> io::Result<PortAttr> {
        let port_num =
            u8::try_from(port).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let context = self.raw.as_ptr();
        let query = |attr| {
            // SAFETY: `context` is open and `attr` points at a writable `ibv_port_attr`.
            unsafe { sys::___ibv_query_port(context, port_num, attr) }
        };
        // SAFETY: an all-zero `ibv_port_attr` is valid plain C data. Zeroing matters here: the
        // compatibility path of ___ibv_query_port does not clear the struct (rust-stack.md §1.1).
        let attr = unsafe { query_into(query) }?;
        Ok(PortAttr {
            state: attr.state,
            lid: attr.lid,
            active_mtu: u8::try_from(attr.active_mtu).unwrap_or(0),
            link_layer: attr.link_layer,
            active_speed: attr.active_speed,
            active_width: attr.active_width,
            phys_state: attr.phys_state,
            max_mtu: u8::try_from(attr.max_mtu).unwrap_or(0),
            sm_lid: attr.sm_lid,
            grh_required: attr.flags & IBV_QPF_GRH_REQUIRED != 0,
            gid_tbl_len: attr.gid_tbl_len,
        })
    }

    /// The valid entries of `port`'s GID table, in index order, in one query
    /// (`ibv_query_gid_table`): reading sysfs takes a file per entry, and rxe's table has 1,024
    /// of them (0.8 s on the emulated test bed). The RoCE version and interface are those sysfs
    /// shows (`IB/RoCE v1` reads as version 1).
    ///
    /// # Errors
    /// `System` when a query fails (a kernel or provider that does not answer the table query).
    pub fn gid_table(&self, port: u32) -> Result<Vec<GidEntry>> {
        let failed = |e| Error::system(format!("ibv_query_gid_table({})", self.name), e);
        let ports = usize::from(self.query_device().map_err(failed)?.phys_port_cnt);
        let len = usize::try_from(self.query_port(port).map_err(failed)?.gid_tbl_len).unwrap_or(0);
        let capacity = (len * ports).max(1);
        // SAFETY: all-zero is a valid ibv_gid_entry (plain C data).
        let mut entries: Vec<sys::ibv_gid_entry> = (0..capacity)
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        // SAFETY: an open context and room for `capacity` entries of the size passed.
        let n = unsafe {
            _ibv_query_gid_table(
                self.raw.as_ptr(),
                entries.as_mut_ptr(),
                capacity,
                0,
                size_of::<sys::ibv_gid_entry>(),
            )
        };
        let n = usize::try_from(n).map_err(|_| {
            let errno = i32::try_from(-n).unwrap_or(libc::EINVAL);
            failed(io::Error::from_raw_os_error(errno))
        })?;
        let mut table: Vec<GidEntry> = entries
            .iter()
            .take(n)
            .filter(|e| e.port_num == port)
            .map(|e| GidEntry {
                index: e.gid_index,
                // SAFETY: `raw` is the union's byte view, valid for any GID.
                gid: unsafe { e.gid.raw },
                roce_version: Some(if e.gid_type == IBV_GID_TYPE_ROCE_V2 {
                    2
                } else {
                    1
                }),
                netdev: interface_name(e.ndev_ifindex),
            })
            .collect();
        table.sort_by_key(|e| e.index);
        Ok(table)
    }
}

/// The name of interface `index` (`None` for 0, no interface, or one gone).
fn interface_name(index: u32) -> Option<String> {
    if index == 0 {
        return None;
    }
    let mut name = [0 as std::ffi::c_char; libc::IF_NAMESIZE];
    // SAFETY: a buffer of IF_NAMESIZE bytes, as if_indextoname requires.
    let got = unsafe { libc::if_indextoname(index, name.as_mut_ptr()) };
    if got.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name into `name`.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// Run a verbs query that fills a C struct and returns 0 or an errno.
///
/// # Safety
/// `query` must only write a valid `T` through the pointer it gets, and an all-zero `T` must be a
/// valid value (plain C data), since the struct starts zeroed and may be partly filled.
unsafe fn query_into<T>(query: impl FnOnce(*mut T) -> std::ffi::c_int) -> io::Result<T> {
    let mut value = MaybeUninit::<T>::zeroed();
    let rc = query(value.as_mut_ptr());
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: zero-initialised plain C data (caller's contract) that the query filled in.
    Ok(unsafe { value.assume_init() })
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `ibv_open_device` and is closed exactly once.
        let rc = unsafe { sys::ibv_close_device(self.raw.as_ptr()) };
        if rc != 0 {
            tracing::warn!(
                "ibv_close_device failed: {}",
                io::Error::from_raw_os_error(rc)
            );
        }
    }
}
