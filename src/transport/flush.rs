//! The flush QPs of a process: one loopback QP per member port, which every receive comm on the
//! port reads through for `iflush`. An RDMA read through a QP connected to itself cannot pass
//! the NIC's earlier writes into the receive buffers, so its completion proves the data is
//! visible (to a GPU too). One per port rather than per comm: a process with thousands of
//! receive comms keeps one small QP and CQ per port for them, not thousands.
//!
//! Reads carry a slot of the port's table of reads in flight as `wr_id`; the completion of a
//! slot counts down the [`FlushTicket`] of the `iflush` that posted it, whichever comm polls.
//! A read the send queue has no room for waits, in order, until a completion makes room. A
//! failed read fails its ticket and puts the QP in error, which fails the reads behind it:
//! once they are all back the QP is replaced at the next read.
#![allow(unsafe_code)] // posts reads from NCCL's receive buffers to the NIC

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::PortContext;
use super::conn::path_params;
use crate::core::config::{Config, Traffic};
use crate::core::error::{Error, Kind, Result};
use crate::core::queues::QpCaps;
use crate::verbs::{
    Access, CompletionQueue, HostRegion, Op, PostRefused, QueuePair, RemoteEndpoint, Sge,
    WorkRequest,
};

/// Reads a port's flush QP keeps in flight, for every receive comm on the port together: a
/// flush waits for its reads only, so more in flight would not make one finish sooner. One
/// less than a power of two: rxe and mlx5 round a queue up to the next one above its depth.
const READS_IN_FLIGHT: u32 = 63;

/// The flush QP's queues: reads only.
pub(super) const FLUSH_QP_CAPS: QpCaps = QpCaps {
    max_send_wr: READS_IN_FLIGHT,
    max_recv_wr: 0,
    max_inline: 0,
};

/// One `iflush`: how many of its reads (one per member) are still out, and why one failed.
#[derive(Debug)]
pub(super) struct FlushTicket {
    outstanding: AtomicUsize,
    failure: Mutex<Option<String>>,
}

impl FlushTicket {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            outstanding: AtomicUsize::new(0),
            failure: Mutex::new(None),
        })
    }

    /// Every read came back; `Err` names the first that failed.
    pub(super) fn done(&self) -> Option<std::result::Result<(), String>> {
        if self.outstanding.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.failure.lock().clone().map_or(Ok(()), Err))
    }

    fn finish(&self, failure: Option<String>) {
        if let Some(why) = failure {
            self.failure.lock().get_or_insert(why);
        }
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A member port's flush QP, built at the first read through it.
#[derive(Debug, Default)]
pub(super) struct PortFlush(Mutex<Option<FlushQueue>>);

#[derive(Debug)]
struct FlushQueue {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    scratch: HostRegion,
    /// The ticket of each read in flight, by `wr_id`.
    in_flight: Vec<Option<Arc<FlushTicket>>>,
    free: Vec<u64>,
    /// Reads the send queue had no room for: the ticket, the address and the rkey.
    waiting: VecDeque<(Arc<FlushTicket>, u64, u32)>,
    /// A read failed: the QP is in error, and is replaced once its reads are back.
    broken: bool,
}

impl PortFlush {
    /// Read one byte at `addr` (registered under `rkey` on `port`'s PD) for `ticket`, through
    /// `port`'s flush QP, built first if this is the first read or the QP failed.
    ///
    /// # Errors
    /// `System` when the QP cannot be built or the post fails; the ticket does not count the
    /// read then.
    pub(super) fn read(
        &self,
        port: &PortContext,
        config: &Config,
        ticket: &Arc<FlushTicket>,
        (addr, rkey): (u64, u32),
    ) -> Result<()> {
        let mut slot = self.0.lock();
        let queue = match replace_drained(&mut slot, port, config)? {
            Some(q) => q,
            None => slot.insert(FlushQueue::new(port, config)?),
        };
        ticket.outstanding.fetch_add(1, Ordering::AcqRel);
        if queue.broken || !queue.waiting.is_empty() || queue.free.is_empty() {
            queue.waiting.push_back((Arc::clone(ticket), addr, rkey));
            return Ok(());
        }
        queue.post(Arc::clone(ticket), addr, rkey).inspect_err(|_| {
            ticket.outstanding.fetch_sub(1, Ordering::AcqRel);
        })
    }

    /// Take the completions of the port's reads, count down their tickets, and post what waits
    /// as far as there is room.
    ///
    /// # Errors
    /// `System` when polling the CQ fails or a failed QP cannot be replaced.
    pub(super) fn progress(&self, port: &PortContext, config: &Config) -> Result<()> {
        let mut slot = self.0.lock();
        if let Some(queue) = slot.as_mut() {
            while queue.poll(port)? > 0 {}
        }
        if let Some(queue) = replace_drained(&mut slot, port, config)? {
            queue.post_waiting();
        }
        Ok(())
    }
}

/// The port's queue, replaced by a new one (with what waited) where it failed and all its
/// reads are back; `None` where there is none.
///
/// # Errors
/// `System` when the new QP cannot be built: what waited fails with it.
fn replace_drained<'a>(
    slot: &'a mut Option<FlushQueue>,
    port: &PortContext,
    config: &Config,
) -> Result<Option<&'a mut FlushQueue>> {
    if !slot
        .as_ref()
        .is_some_and(|q| q.broken && q.free.len() == q.in_flight.len())
    {
        return Ok(slot.as_mut());
    }
    // Nothing refers to the failed QP any more.
    let waiting = slot.take().map(|q| q.waiting).unwrap_or_default();
    if waiting.is_empty() {
        return Ok(None);
    }
    match FlushQueue::new(port, config) {
        Ok(mut queue) => {
            queue.waiting = waiting;
            Ok(Some(slot.insert(queue)))
        }
        Err(e) => {
            for (ticket, ..) in waiting {
                ticket.finish(Some(format!("rebuilding the flush QP: {e}")));
            }
            Err(e)
        }
    }
}

impl FlushQueue {
    fn new(port: &PortContext, config: &Config) -> Result<Self> {
        let cq = CompletionQueue::new(&port.device, READS_IN_FLIGHT)?;
        let qp = QueuePair::new(&port.pd, &cq, FLUSH_QP_CAPS)?;
        qp.to_init(
            port.port_num(),
            port.pkey_index,
            Access::LOCAL_WRITE.with(Access::REMOTE_READ),
        )?;
        let gid = port.current_gid(config);
        let own = port.endpoint(&gid, 0);
        let path = path_params(port, &gid, config, &own, Traffic::default());
        qp.to_rtr(
            &RemoteEndpoint {
                qpn: qp.qpn(),
                gid: own.gid,
            },
            &path,
        )?;
        qp.to_rts(&path)?;
        let scratch = HostRegion::new(std::slice::from_ref(&port.pd), 64, Access::LOCAL_WRITE)?;
        Ok(Self {
            qp,
            cq,
            scratch,
            in_flight: vec![None; READS_IN_FLIGHT as usize],
            free: (0..u64::from(READS_IN_FLIGHT)).rev().collect(),
            waiting: VecDeque::new(),
            broken: false,
        })
    }

    /// Post a read for `ticket` in a free slot (the caller made sure there is one).
    fn post(&mut self, ticket: Arc<FlushTicket>, addr: u64, rkey: u32) -> Result<()> {
        let Some(wr_id) = self.free.pop() else {
            return Err(Error::misuse("flush read posted with no slot free"));
        };
        let wr = WorkRequest {
            wr_id,
            op: Op::Read,
            local: Sge {
                addr: self.scratch.addr(0),
                len: 1,
                lkey: self.scratch.mr(0).lkey(),
            },
            tail: Sge::default(),
            remote_addr: addr,
            rkey,
            signaled: true,
            cpu_readable: true,
        };
        // SAFETY: the scratch region lives as long as the QP; the read source is a registered
        // receive buffer NCCL keeps alive until the flush request completes.
        match unsafe { self.qp.post_one(&wr) } {
            Ok(()) => {
                self.in_flight[wr_id as usize] = Some(ticket);
                Ok(())
            }
            Err(refused) => {
                self.free.push(wr_id);
                Err(match refused {
                    PostRefused::Full => Error::new(
                        Kind::System,
                        format!(
                            "flush QP of {} refused a read with a slot free",
                            self.qp.label()
                        ),
                    ),
                    PostRefused::Failed(e) => e,
                })
            }
        }
    }

    /// Post what waits, as far as there are free slots; a read that cannot be posted fails its
    /// ticket.
    fn post_waiting(&mut self) {
        while !self.broken && !self.free.is_empty() {
            let Some((ticket, addr, rkey)) = self.waiting.pop_front() else {
                return;
            };
            if let Err(e) = self.post(Arc::clone(&ticket), addr, rkey) {
                ticket.finish(Some(e.to_string()));
            }
        }
    }

    /// One batch of completions; how many there were.
    fn poll(&mut self, port: &PortContext) -> Result<usize> {
        let (in_flight, free, broken) = (&mut self.in_flight, &mut self.free, &mut self.broken);
        self.cq.poll_each(|c| {
            let Some(ticket) = in_flight.get_mut(c.wr_id as usize).and_then(Option::take) else {
                return Ok(());
            };
            free.push(c.wr_id);
            let failure = (!c.is_ok()).then(|| {
                *broken = true;
                format!(
                    "flush read through {} failed: {} (vendor error {:#x})",
                    port.label(),
                    c.status_name(),
                    c.vendor_err
                )
            });
            ticket.finish(failure);
            Ok(())
        })
    }
}
