//! A receive comm's writes into the sender's ring: its answers (CTS entries, from the staging
//! ring in the sender's ring's layout), its credits, and the fences that tell it when a staged
//! answer was read (`core::proto::answers`).
#![allow(unsafe_code)] // posts work requests that read the comm's registered staging

use super::conn::{CREDIT_OFFSET, CREDIT_STAGING, WR_CTS, WR_RECV};
use super::held::PostQueue;
use super::recv::{RecvComm, RecvState};
use crate::core::error::Result;
use crate::core::proto::{CtsLayout, CtsPost, RecvBuf, Restage};
use crate::core::wire::Cts;
use crate::verbs::{Op, Sge, WorkRequest};

impl RecvComm {
    /// Whether the next receive's slot may be staged: the answer staged there a ring ago was
    /// read by the NIC. Only a connection that copies eager messages asks (elsewhere a receive
    /// completes after the sender read its answer), and almost always the slot is free at once;
    /// else the completions are polled and, when no signaled write follows that answer (quiet
    /// receives post few), a signaled empty write is posted, whose completion frees the slot
    /// for NCCL's next call.
    #[inline(always)]
    pub(super) fn staging_free(&self, st: &mut RecvState) -> Result<bool> {
        if st.proto.layout().eager_bytes == 0 {
            return Ok(true);
        }
        let slot = st.proto.next_slot();
        if st.answers.restage(slot) == Restage::Free {
            return Ok(true);
        }
        self.await_staging(st, slot)
    }

    /// [`Self::staging_free`] once the slot's answer is not known read (out of line).
    #[cold]
    #[inline(never)]
    fn await_staging(&self, st: &mut RecvState, slot: usize) -> Result<bool> {
        // The write that frees it may wait in the lane's queue.
        self.qps.lanes[0].read().queue.flush()?;
        let progressed = self.progress(st);
        st.failed.after_posting_progress(progressed)?;
        match st.answers.restage(slot) {
            Restage::Free => Ok(true),
            Restage::Reading => Ok(false),
            Restage::Unfenced => {
                self.write_fence(st)?;
                Ok(false)
            }
        }
    }

    /// A signaled RDMA write of no bytes into the sender's ring: its completion says that every
    /// write before it on the QP was read. A lane that is down writes again what it owes when
    /// repaired, which numbers its writes anew.
    fn write_fence(&self, st: &mut RecvState) -> Result<()> {
        if st.failover.as_deref().is_some_and(|f| !f.is_up(0)) {
            return Ok(());
        }
        let write = st.answers.post_signaled();
        let lane = self.qps.lanes[0].read();
        let wr = empty_write(
            WR_CTS | write.index,
            self.remote_ring_addr,
            self.remote_ring_rkeys[lane.remote],
        );
        // SAFETY: a zero-length write reads no local memory.
        unsafe { lane.queue.post_one(&wr) }
    }

    /// RDMA-write `credit` into the sender's credit word; while the lane is down, its repair
    /// writes the latest credit (`RecvSide::credited`) instead.
    pub(super) fn write_credit(&self, st: &mut RecvState, credit: u64) -> Result<()> {
        // A connection with quiet receives has one QP.
        if st.failover.as_deref().is_some_and(|f| !f.is_up(0)) {
            return Ok(());
        }
        let staged = self.staging_at + CREDIT_STAGING;
        self.rings.write(staged, &credit.to_le_bytes());
        let write = st.answers.post();
        let lane = self.qps.lanes[0].read();
        let wr = WorkRequest {
            wr_id: WR_CTS | write.index,
            op: Op::Write,
            local: Sge {
                addr: self.rings.addr(staged),
                len: 8,
                lkey: self.rings.mr(lane.member).lkey(),
            },
            tail: Sge::default(),
            remote_addr: self.remote_ring_addr + CREDIT_OFFSET as u64,
            rkey: self.remote_ring_rkeys[lane.remote],
            signaled: write.signaled,
            cpu_readable: true,
        };
        // SAFETY: the staged word may be rewritten before the NIC reads it, with a larger
        // credit, which is as true (see `CREDIT_STAGING`).
        unsafe { lane.queue.post_one(&wr) }
    }

    /// Post the receives of `cts`, copy its eager message, and write its entries (for the
    /// receive of `bufs`) into the sender's ring: held for a batch when the comm batches, and
    /// merged with the answer before when they are adjacent in the ring.
    ///
    /// # Safety
    /// The copy's destination must be a posted receive buffer (`irecv`'s contract).
    #[inline(always)]
    pub(super) unsafe fn answer(
        &self,
        st: &mut RecvState,
        cts: &CtsPost,
        bufs: &[RecvBuf],
    ) -> Result<()> {
        let layout = st.proto.layout();
        let failover = st.failover.as_deref();
        for q in cts.recvs.clone() {
            if failover.is_some_and(|f| !f.is_up(q)) {
                // Posted when the lane is repaired, with every receive it still owes.
                continue;
            }
            self.qps.lanes[q].read().qp.post_recv(WR_RECV)?;
        }
        if let Some(events) = &mut st.events {
            // The request's slot and QPs by value: a reference would keep `cts` in memory.
            self.start_events(events, layout, cts.slot, cts.recvs.clone(), bufs);
        }
        if let Some(copy) = cts.copy {
            // SAFETY: forwarded from this function's contract.
            unsafe { self.copy_eager(layout, copy) };
        }
        let Some(answer) = cts.answer else {
            return Ok(());
        };
        // The slot's staged answer before this one was read (`staging_free`).
        let n = answer.entries(bufs.len());
        for i in 0..n {
            let at = self.cts_layout.offset(cts.slot, i);
            self.rings
                .write(self.staging_at + at, &answer.entry(bufs, i).emit());
        }
        if st.failover.as_deref().is_some_and(|f| !f.is_up(cts.qp)) {
            // Written again when the lane is repaired (`RecvSide::answers_on`).
            return Ok(());
        }
        let write = st.answers.post_answer(cts.slot);
        let signaled = write.signaled;
        let lane = self.qps.lanes[cts.qp].read();
        let answers = AnswerWrites {
            slot: cts.slot,
            write: write.index,
            lkey: self.rings.mr(lane.member).lkey(),
            rkey: self.remote_ring_rkeys[lane.remote],
        };
        let hold = self.ctx.config.batch;
        // A grouped receive's first entry and the rest lie apart in the dense layout.
        let apart = self.answers_apart(n);
        if !hold && !apart {
            // NCCL's usual answer, one write: posted at once.
            // SAFETY: as in `submit_answer`.
            return unsafe { lane.queue.post_one(&answers.write(self, 0, n, signaled)) };
        }
        // SAFETY: as in `submit_answer`.
        unsafe { self.submit_answer(&lane.queue, &answers, n, signaled, hold, apart) }
    }

    /// Whether an answer of `n` entries is written in two parts: a grouped receive's first
    /// entry and the rest lie apart in the dense layout.
    pub(super) fn answers_apart(&self, n: usize) -> bool {
        self.cts_layout == CtsLayout::Dense && n > 1
    }

    /// Submit the answer's writes to a queue that holds them for a batch (`hold`), or that
    /// writes a grouped receive's first entry apart from the rest (`apart`). Out of line: NCCL's
    /// usual answer is one write posted at once.
    ///
    /// # Safety
    /// These staging bytes are rewritten only for message seq + SLOTS, posted after message seq
    /// completed: after the sender read this answer, or, where a copy completed it (on the one
    /// QP of a connection that copies eager messages), once a signaled write posted with or
    /// after it completed (`staging_free`).
    #[inline(never)]
    pub(super) unsafe fn submit_answer(
        &self,
        queue: &PostQueue,
        answers: &AnswerWrites,
        n: usize,
        signaled: bool,
        hold: bool,
        apart: bool,
    ) -> Result<()> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            queue.submit(hold, |b| {
                if apart {
                    b.push_merged(&answers.write(self, 0, 1, false))?;
                    b.push_merged(&answers.write(self, 1, n - 1, signaled))
                } else {
                    b.push_merged(&answers.write(self, 0, n, signaled))
                }
            })
        }
    }
}

/// A signaled RDMA write of no bytes into the sender's ring at `remote_addr`: its completion
/// comes after every write posted before it on the QP.
pub(super) fn empty_write(wr_id: u64, remote_addr: u64, rkey: u32) -> WorkRequest {
    WorkRequest {
        wr_id,
        op: Op::Write,
        local: Sge::default(),
        tail: Sge::default(),
        remote_addr,
        rkey,
        signaled: true,
        cpu_readable: true,
    }
}

/// The RDMA writes of one answer's entries from the staging ring into the sender's ring.
pub(super) struct AnswerWrites {
    /// The message slot answered.
    pub(super) slot: usize,
    /// The number of the write (`AnswerReads`), which its completion reports.
    pub(super) write: u64,
    pub(super) lkey: u32,
    pub(super) rkey: u32,
}

impl AnswerWrites {
    /// The write of entries `from..from + count`, adjacent in the ring from `from` on.
    #[inline(always)]
    fn write(&self, comm: &RecvComm, from: usize, count: usize, signaled: bool) -> WorkRequest {
        let at = comm.cts_layout.offset(self.slot, from);
        WorkRequest {
            wr_id: WR_CTS | self.write,
            op: Op::Write,
            local: Sge {
                addr: comm.rings.addr(comm.staging_at + at),
                len: (count * Cts::LEN) as u32,
                lkey: self.lkey,
            },
            tail: Sge::default(),
            remote_addr: comm.remote_ring_addr + at as u64,
            rkey: self.rkey,
            signaled,
            cpu_readable: true,
        }
    }
}
