//! Memory registration with a reference-counted cache per port: NCCL registers overlapping
//! ranges and the same range on several comms, so a registration covering the requested pages is
//! shared and deregistered when its last handle goes.
#![allow(unsafe_code)] // registers NCCL memory (see the transport module doc)

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{DeviceContext, PortContext};
use crate::core::config::MAX_FUSED_MEMBERS;
use crate::core::error::{Error, Result};
use crate::core::proto::{RecvBuf, check_message_size};
use crate::verbs::{Access, MemoryRegion};

const PAGE: u64 = 4096;

/// Rights of data registrations: peers write into them, the flush QP reads them.
pub(super) const DATA_ACCESS: Access = Access::LOCAL_WRITE
    .with(Access::REMOTE_WRITE)
    .with(Access::REMOTE_READ);

#[derive(Debug)]
struct CacheEntry {
    start: u64,
    end: u64,
    refs: usize,
    mr: Arc<MemoryRegion>,
}

/// Page-aligned registrations of one device with their reference counts.
#[derive(Debug, Default)]
pub struct MrCache {
    entries: Vec<CacheEntry>,
}

/// One member's share of a handle: a reference to a registration on that member's PD.
#[derive(Debug)]
struct MrPart {
    port: Arc<PortContext>,
    mr: Arc<MemoryRegion>,
    cached: bool,
}

impl Drop for MrPart {
    fn drop(&mut self) {
        if !self.cached {
            return;
        }
        let mut cache = self.port.mrs.lock();
        if let Some(i) = cache
            .entries
            .iter()
            .position(|e| Arc::ptr_eq(&e.mr, &self.mr))
        {
            cache.entries[i].refs -= 1;
            if cache.entries[i].refs == 0 {
                cache.entries.swap_remove(i);
            }
        }
    }
}

/// What NCCL's `mhandle` points at: the range NCCL asked for and one registration of it per
/// member port of the device (peers write through whichever member a QP lives on).
#[derive(Debug)]
pub struct MrHandle {
    /// Held for their lifetime: dropping the handle releases the registrations.
    _parts: Vec<MrPart>,
    /// The parts' keys, read once: every `isend` and `irecv` passes them on.
    lkeys: [u32; MAX_FUSED_MEMBERS],
    rkeys: [u32; MAX_FUSED_MEMBERS],
    addr: u64,
    len: u64,
    /// Registered as host memory (`NCCL_PTR_HOST`): the eager path may read or write it with
    /// the CPU. GPU memory and DMA-BUF registrations never take it.
    host: bool,
}

impl MrHandle {
    fn new(parts: Vec<MrPart>, addr: u64, len: u64, host: bool) -> Self {
        let key = |i: usize, f: fn(&MemoryRegion) -> u32| parts.get(i).map_or(0, |p| f(&p.mr));
        Self {
            lkeys: std::array::from_fn(|i| key(i, MemoryRegion::lkey)),
            rkeys: std::array::from_fn(|i| key(i, MemoryRegion::rkey)),
            _parts: parts,
            addr,
            len,
            host,
        }
    }

    /// Local keys, one per member (unused entries 0).
    pub fn lkeys(&self) -> [u32; MAX_FUSED_MEMBERS] {
        self.lkeys
    }

    /// Remote keys, one per member (unused entries 0).
    pub fn rkeys(&self) -> [u32; MAX_FUSED_MEMBERS] {
        self.rkeys
    }

    /// The receive buffer `addr..addr + size` expecting `tag`, with this registration's keys.
    ///
    /// # Errors
    /// `Misuse` for a buffer larger than a message may be or outside this registration.
    #[inline(always)]
    pub fn recv_buf(&self, addr: u64, size: u64, tag: i32) -> Result<RecvBuf> {
        check_message_size(size, "a receive buffer")?;
        self.check(addr, size)?;
        Ok(RecvBuf {
            addr,
            size,
            rkeys: self.rkeys(),
            tag,
            host: self.host,
        })
    }

    /// Whether the registration is host memory.
    pub fn is_host(&self) -> bool {
        self.host
    }

    /// Check that `addr..addr + len` lies inside the registered range.
    ///
    /// # Errors
    /// `Misuse` naming both ranges.
    pub fn check(&self, addr: u64, len: u64) -> Result<()> {
        let end = addr.checked_add(len);
        if addr >= self.addr && end.is_some_and(|e| e <= self.addr + self.len) {
            return Ok(());
        }
        Err(Error::misuse(format!(
            "buffer {addr:#x}+{len} is outside its registration {:#x}+{}",
            self.addr, self.len
        )))
    }
}

impl DeviceContext {
    /// Register `len` bytes at `addr` (host memory when `host`, else CUDA memory through a
    /// peer-memory module) on every member, reusing cached registrations that cover the same
    /// pages.
    ///
    /// # Safety
    /// `addr..addr + len` must stay mapped until every handle covering it is dropped (NCCL's
    /// contract for regMr/deregMr).
    ///
    /// # Errors
    /// `System` when `ibv_reg_mr` fails on a member.
    pub unsafe fn register(&self, addr: u64, len: u64, host: bool) -> Result<MrHandle> {
        let parts = self
            .ports
            .iter()
            // SAFETY: forwarded from this function's contract.
            .map(|port| unsafe { port.register(addr, len) })
            .collect::<Result<Vec<_>>>()?;
        Ok(MrHandle::new(parts, addr, len, host))
    }

    /// Register a DMA-BUF (`fd`, `offset`) whose memory NCCL addresses as `addr`, on every
    /// member. Not cached: each call has its own registrations (NCCL closes the fd right after
    /// the call).
    ///
    /// # Errors
    /// `System` when `ibv_reg_dmabuf_mr` fails on a member.
    pub fn register_dmabuf(&self, addr: u64, len: u64, offset: u64, fd: i32) -> Result<MrHandle> {
        let size = usize::try_from(len).map_err(|_| Error::misuse("registration too large"))?;
        let parts = self
            .ports
            .iter()
            .map(|port| {
                let mr = port.with_data_access(|access| {
                    port.pd.register_dmabuf(offset, size, addr, fd, access)
                })?;
                Ok(MrPart {
                    port: Arc::clone(port),
                    mr: Arc::new(mr),
                    cached: false,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(MrHandle::new(parts, addr, len, false))
    }
}

impl PortContext {
    /// Run `register` with the data access rights, plus relaxed ordering when this port uses
    /// it. A driver that refuses the flag gets the registration again without it, and the port
    /// stops asking (said once, as a warning: data then moves with strict ordering).
    fn with_data_access(
        &self,
        mut register: impl FnMut(Access) -> Result<MemoryRegion>,
    ) -> Result<MemoryRegion> {
        if !self.relaxed_ordering.load(Ordering::Relaxed) {
            return register(DATA_ACCESS);
        }
        match register(DATA_ACCESS.with(Access::RELAXED_ORDERING)) {
            Ok(mr) => Ok(mr),
            Err(refused) => {
                let mr = register(DATA_ACCESS)?;
                if self.relaxed_ordering.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        target: crate::log::INIT_TARGET,
                        "NET/{}: {}: registration with relaxed ordering refused ({refused}); \
                         registering without it from now on",
                        crate::plugin::PLUGIN_NAME,
                        self.net.name
                    );
                }
                Ok(mr)
            }
        }
    }

    /// # Safety
    /// As [`DeviceContext::register`].
    unsafe fn register(self: &Arc<Self>, addr: u64, len: u64) -> Result<MrPart> {
        let start = addr & !(PAGE - 1);
        let end = addr.saturating_add(len.max(1)).div_ceil(PAGE) * PAGE;
        let mut cache = self.mrs.lock();
        let mr = if let Some(e) = cache
            .entries
            .iter_mut()
            .find(|e| e.start <= start && end <= e.end)
        {
            e.refs += 1;
            Arc::clone(&e.mr)
        } else {
            let size = usize::try_from(end - start)
                .map_err(|_| Error::misuse("registration too large"))?;
            let mr = Arc::new(self.with_data_access(|access| {
                // SAFETY: the pages stay mapped per this function's contract.
                unsafe { self.pd.register(start, size, access) }
            })?);
            cache.entries.push(CacheEntry {
                start,
                end,
                refs: 1,
                mr: Arc::clone(&mr),
            });
            mr
        };
        Ok(MrPart {
            port: Arc::clone(self),
            mr,
            cached: true,
        })
    }
}
