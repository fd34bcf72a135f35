//! Memory registration with a reference-counted cache per device: NCCL registers overlapping
//! ranges and the same range on several comms, so a registration covering the requested pages is
//! shared and deregistered when its last handle goes.
#![allow(unsafe_code)] // registers NCCL memory (see the transport module doc)

use std::sync::Arc;

use super::DeviceContext;
use crate::core::error::{Error, Result};
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

/// What NCCL's `mhandle` points at: one reference to a registration and the range NCCL asked for.
#[derive(Debug)]
pub struct MrHandle {
    ctx: Arc<DeviceContext>,
    mr: Arc<MemoryRegion>,
    cached: bool,
    addr: u64,
    len: u64,
}

impl MrHandle {
    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
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

impl Drop for MrHandle {
    fn drop(&mut self) {
        if !self.cached {
            return;
        }
        let mut cache = self.ctx.mrs.lock();
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

impl DeviceContext {
    /// Register `len` bytes at `addr` (host memory, or CUDA memory through a peer-memory module),
    /// reusing a cached registration that covers the same pages.
    ///
    /// # Safety
    /// `addr..addr + len` must stay mapped until every handle covering it is dropped (NCCL's
    /// contract for regMr/deregMr).
    ///
    /// # Errors
    /// `System` when `ibv_reg_mr` fails.
    pub unsafe fn register(self: &Arc<Self>, addr: u64, len: u64) -> Result<MrHandle> {
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
            // SAFETY: the pages stay mapped per this function's contract.
            let mr = Arc::new(unsafe { self.pd.register(start, size, DATA_ACCESS) }?);
            cache.entries.push(CacheEntry {
                start,
                end,
                refs: 1,
                mr: Arc::clone(&mr),
            });
            mr
        };
        Ok(MrHandle {
            ctx: Arc::clone(self),
            mr,
            cached: true,
            addr,
            len,
        })
    }

    /// Register a DMA-BUF (`fd`, `offset`) whose memory NCCL addresses as `addr`. Not cached:
    /// each call has its own registration (NCCL closes the fd right after the call).
    ///
    /// # Errors
    /// `System` when `ibv_reg_dmabuf_mr` fails.
    pub fn register_dmabuf(
        self: &Arc<Self>,
        addr: u64,
        len: u64,
        offset: u64,
        fd: i32,
    ) -> Result<MrHandle> {
        let size = usize::try_from(len).map_err(|_| Error::misuse("registration too large"))?;
        let mr = Arc::new(
            self.pd
                .register_dmabuf(offset, size, addr, fd, DATA_ACCESS)?,
        );
        Ok(MrHandle {
            ctx: Arc::clone(self),
            mr,
            cached: false,
            addr,
            len,
        })
    }
}
