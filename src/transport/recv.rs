//! The receiving end of a connection: the receive comm (built by `listen::ListenComm::accept`).
#![allow(unsafe_code)] // posts NCCL buffers to the NIC (see the transport module doc)

use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::DeviceContext;
use super::conn::{
    CTS_SIGNAL_EVERY, Failure, Nonces, SIZES_RING_BYTES, SIZES_SLOT_BYTES, WR_CTS, WR_DRAIN,
    WR_INDEX_MASK, WR_RECV, agreed_eager_bytes, bounce_slots, check_alive, check_peer,
    completion_error, describe_eager, describe_local, describe_remote, eager_receive_pool,
    failover_agreed, local_hello, quiet_receives, recv_qp_caps, recv_rings_bytes, recv_staging_at,
};
use super::failover::{Failover, Repairing, log_failover};
use super::flush::FlushTicket;
use super::health::DeviceHealth;
use super::held;
use super::mr::MrHandle;
use super::peer_link::{PeerState, Watched};
use super::profile::{Events, Parent, QpEvent};
use super::qp_set::QpSet;
use super::quiet_wait::QuietWait;
use super::recv_writes::empty_write;
use super::watch::{ClientProgress, Tend, Tick, busy_tick};
use crate::core::config::Traffic;
use crate::core::eager::{self, Announced};
use crate::core::error::{Error, Kind, Result};
use crate::core::group::Group;
use crate::core::proto::{
    AnswerReads, Arrived, CtsLayout, EagerCopy, EagerHeader, Layout, RecvBuf, RecvDone, RecvSide,
    SLOTS,
};
use crate::core::repair::LeadRepair;
use crate::core::wire::{Hello, Role};
use crate::verbs::{Access, Completion, HostRegion, OPCODE_RECV_RDMA_WITH_IMM};

/// How long closing a receive comm waits for the answers it wrote to reach the sender (an
/// acknowledgement may be the only thing the sender's last request waits for).
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// Requests a receive comm can have in flight: one per slot, plus as many flushes.
pub const RECV_REQUESTS: usize = 2 * SLOTS;

/// A request `test` found complete.
#[derive(Clone, Debug)]
enum Finished {
    Recv(RecvDone),
    /// A flush, and why one of its reads failed.
    Flush(std::result::Result<(), String>),
}

/// A flush slot: free, or the reads of a flush in flight.
#[derive(Clone, Debug)]
enum FlushSlot {
    Free,
    Pending(Arc<FlushTicket>),
}

#[derive(Debug)]
pub(super) struct RecvState {
    pub(super) proto: RecvSide,
    pub(super) failed: Failure,
    completed_any: bool,
    /// The writes into the sender's ring, and which the NIC read (see `core::proto::answers`).
    pub(super) answers: AnswerReads,
    flushes: Vec<FlushSlot>,
    /// How long quiet receives have waited without an eager arrival; `None` while none waits.
    quiet_wait: Option<QuietWait>,
    /// The client's own progress, which the watcher need not repeat.
    client: ClientProgress,
    /// The profiler's QP events, when one is installed.
    pub(super) events: Option<Events>,
    /// Port failover, when both sides agreed on it.
    pub(super) failover: Option<Box<Failover<LeadRepair>>>,
}

/// A connected receive comm.
#[derive(Debug)]
pub struct RecvComm {
    pub(super) ctx: Arc<DeviceContext>,
    /// Its lanes' QPs, and the answers written on each: held for a batch with
    /// `NCCL_NET_RS_BATCH` (see `held`).
    pub(super) qps: QpSet,
    /// What its QPs use (a lane's new QP too).
    pub(super) traffic: Traffic,
    /// Where the sender reads the entries (the ring's layout).
    pub(super) cts_layout: CtsLayout,
    /// One registration: the sizes ring, the eager bounce ring when the connection uses one,
    /// and from `staging_at` the answers as they go out, in the sender's ring's layout (see
    /// [`CTS_STAGING_BYTES`](super::conn::CTS_STAGING_BYTES)), and the credit word.
    pub(super) rings: HostRegion,
    pub(super) staging_at: usize,
    pub(super) remote_ring_addr: u64,
    pub(super) remote_ring_rkeys: Vec<u32>,
    local: String,
    pub(super) remote: String,
    /// The out-of-band connection, watched for the sender's end; set when the handshake ends.
    pub(super) link: Option<Watched>,
    /// It uses quiet receives (as its layout says; here for the watcher, which does not wait
    /// for the state's lock).
    quiet: bool,
    pub(super) state: Mutex<RecvState>,
}

impl RecvComm {
    /// Build the receive comm for a peer that proved it holds the listen handle: QPs connected
    /// to the peer's, rings registered, and the hello to send back.
    ///
    /// # Errors
    /// `Config` for an incompatible peer, `System` for verbs failures.
    pub(super) fn build(
        ctx: &Arc<DeviceContext>,
        remote: &Hello,
        peer: SocketAddr,
    ) -> Result<(Self, Hello)> {
        let gids = ctx.current_gids();
        check_peer(ctx, &gids, remote, peer)?;
        // The eager path and its bounce ring, from both hellos: they size the QPs' receive
        // queues. A connection has as many QPs as the sender offered.
        let eager_bytes = agreed_eager_bytes(
            &ctx.config,
            remote.qpns.len(),
            u64::from(remote.eager_bytes),
        );
        let quiet = quiet_receives(&ctx.config, eager_bytes, remote);
        // The reply offers this side's `eager_slots` (`local_hello`).
        let bounce_slots = bounce_slots(
            remote.bounce_slots,
            ctx.config.eager_slots,
            eager_bytes,
            quiet,
        );
        let eager_pool = eager_receive_pool(eager_bytes, bounce_slots);
        let qps = QpSet::new(
            ctx,
            gids,
            (remote.qpns.len(), remote.members.len()),
            (
                recv_qp_caps(eager_pool),
                Access::REMOTE_WRITE.with(Access::REMOTE_READ),
            ),
            (ctx.config.batch, ctx.config.port_failover),
        )?;
        // The sender chose traffic class and service level; the CTS direction uses the same,
        // unless NCCL_IB_FIFO_TC gives it a RoCE class of its own (`check_peer` made the
        // link layers of both sides and of every member equal).
        let chosen = Traffic {
            class: remote.traffic_class,
            level: remote.service_level,
        };
        let traffic = ctx.config.receiver_traffic(chosen, ctx.ports[0].is_roce());
        qps.connect(ctx, remote, traffic)?;
        // Eager messages arrive unannounced: keep a receive posted for each bounce slot.
        for _ in 0..eager_pool {
            qps.qp(0).post_recv(WR_RECV)?;
        }
        let bounce_bytes = eager::ring_bytes(eager_bytes, bounce_slots) as usize;
        let rings = ctx.rings.carve(
            recv_rings_bytes(bounce_bytes),
            Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
        )?;
        let nonces = Nonces {
            listen: remote.listen_nonce,
            connect: remote.connect_nonce,
        };
        let mut hello = local_hello(
            ctx,
            &qps,
            Role::Accept,
            nonces,
            &rings,
            remote.split_data,
            traffic,
        );
        hello.eager_bytes = u32::try_from(eager_bytes).unwrap_or(0);
        let layout = Layout {
            nqps: qps.len(),
            split: remote.split_data,
            local_members: ctx.ports.len(),
            remote_members: remote.members.len(),
            eager_bytes,
            quiet,
            bounce_slots,
        };
        let local = describe_local(ctx, &qps.gids);
        let remote_desc = describe_remote(remote, peer);
        let mut qos = qps.describe_qos(traffic);
        if traffic != chosen {
            qos += &format!(" (NCCL_IB_FIFO_TC; the sender's is {})", chosen.class);
        }
        tracing::debug!(
            "recv comm accepted: {remote_desc} -> {local}, {} QPs, {qos}, {}",
            layout.nqps,
            describe_eager(&layout)
        );
        let failover = failover_agreed(&hello, remote, layout.quiet)
            .then(|| Box::new(Failover::lead(ctx, layout, remote.members.clone())));
        log_failover(ctx, failover.is_some(), &remote_desc);
        let comm = Self {
            ctx: Arc::clone(ctx),
            qps,
            traffic,
            cts_layout: CtsLayout::with_peer(remote.revision),
            rings,
            staging_at: recv_staging_at(bounce_bytes),
            remote_ring_addr: remote.ring_addr,
            remote_ring_rkeys: remote.members.iter().map(|m| m.ring_rkey).collect(),
            local,
            remote: remote_desc,
            link: None,
            quiet: layout.quiet,
            state: Mutex::new(RecvState {
                proto: RecvSide::new(layout),
                failed: Failure::default(),
                completed_any: false,
                answers: AnswerReads::new(CTS_SIGNAL_EVERY),
                flushes: vec![FlushSlot::Free; SLOTS],
                quiet_wait: None,
                client: ClientProgress::default(),
                events: Events::new(SLOTS),
                failover,
            }),
        };
        Ok((comm, hello))
    }

    /// The device context the comm lives on.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// Before the QPs go: post what the answer queues hold, then a zero-length signaled write
    /// behind it on every QP, and wait (at most [`DRAIN_LIMIT`]) for those completions: the
    /// sender's last request may wait for an acknowledgement still queued here. Skipped when
    /// nothing was answered, the comm failed, or the sender is gone; ends early when the sender
    /// closes meanwhile (a write to its closed QP would wait out the limit unanswered).
    fn drain_answers(&mut self) {
        let st = self.state.get_mut();
        let sender_alive = || {
            self.link.as_ref().is_some_and(|l| {
                let link = l.link();
                link.state() == PeerState::Alive && !link.hung_up()
            })
        };
        if st.answers.none_posted() || st.failed.check().is_err() || !sender_alive() {
            return;
        }
        let mut waiting = 0;
        for (q, lane) in self.qps.lanes.iter().enumerate() {
            if st.failover.as_deref().is_some_and(|f| !f.is_up(q)) {
                continue;
            }
            let lane = lane.read();
            let wr = empty_write(
                WR_DRAIN,
                self.remote_ring_addr,
                self.remote_ring_rkeys[lane.remote],
            );
            // SAFETY: a zero-length write reads no local memory.
            if unsafe { lane.queue.post_one(&wr) }.is_ok() {
                waiting += 1;
            }
        }
        let deadline = Instant::now() + DRAIN_LIMIT;
        while waiting > 0 && Instant::now() < deadline && sender_alive() {
            let polled = self.qps.drain(|_, c| {
                if !c.is_ok() {
                    waiting = 0;
                } else if c.wr_id == WR_DRAIN {
                    waiting -= 1;
                }
                Ok(())
            });
            if polled.is_err() {
                break;
            }
            std::thread::yield_now();
        }
        if waiting > 0 {
            tracing::debug!(
                "closing the recv comm from {}: the last answers were not confirmed within {:?}",
                self.remote,
                DRAIN_LIMIT
            );
        }
    }

    /// Post a (grouped) receive of buffers checked by [`MrHandle::recv_buf`]; `Ok(None)` when
    /// every slot is busy. Returns the request index. The profiler's events of buffer `i` go
    /// under `parents[i]` (NCCL's `phandles`).
    ///
    /// # Safety
    /// Each buffer must stay valid and writable until `test` reports the request done.
    ///
    /// # Errors
    /// A failed comm's error; `Misuse` for a bad group.
    #[inline(always)]
    pub unsafe fn irecv(
        &self,
        bufs: &[RecvBuf],
        parents: &[Option<Parent>],
    ) -> Result<Option<usize>> {
        // Answers held on other comms go now; this comm's may join this one's in one write.
        held::flush_all_but(&self.qps);
        let mut st = self.state.lock();
        st.failed.check_posting()?;
        if let Some((seq, bounce)) = st.proto.next_eager() {
            // An eager message that already arrived is delivered now, without a CTS. Its
            // completion comes after its header, so without the header there is nothing to poll
            // for (one that lands later is answered by this CTS, as if it landed after a poll).
            let at = self.bounce_slot_at(st.proto.layout(), bounce);
            if self.rings.peek_u64(at) == seq {
                let progressed = self.progress(&mut st);
                st.failed.after_posting_progress(progressed)?;
            }
        }
        let posted = if self.staging_free(&mut st)? {
            st.proto.irecv(bufs)?
        } else {
            None
        };
        let Some((_, cts)) = posted else {
            // NCCL calls again until it gets a request: that loop must end when the sender is
            // gone. (A receive that was posted learns of it in `test`.)
            if let Err(e) = self.check_alive() {
                return Err(st.failed.record(e));
            }
            if self.failover_due(&mut st) {
                // What it waits for may come only once a lane is repaired. (A healthy comm
                // skips this: NCCL tests its requests, which progress it.)
                let progressed = self.progress(&mut st);
                st.failed.after_posting_progress(progressed)?;
            }
            return Ok(None);
        };
        if let Some(events) = &mut st.events {
            events.begin(cts.slot, parents.iter().copied());
        }
        // SAFETY: forwarded from this function's contract (the copy's destination is one of
        // `bufs`).
        let written = unsafe { self.answer(&mut st, &cts, bufs) }
            .and_then(|()| self.owed_writes(&mut st, cts.answer.is_some()));
        match written {
            Ok(()) => Ok(Some(cts.slot)),
            Err(e) => Err(st.failed.record(e)),
        }
    }

    /// With quiet receives, write what the receiver owes the sender after handling something
    /// (`answered`: a CTS just went out): the CTS of receives that stopped being quiet, and the
    /// credit when one is due.
    #[inline]
    fn owed_writes(&self, st: &mut RecvState, answered: bool) -> Result<()> {
        if !st.proto.layout().quiet {
            return Ok(());
        }
        self.quiet_writes(st, answered)
    }

    /// [`Self::owed_writes`] on a connection with quiet receives; out of line, so that every
    /// other connection's `irecv` and `test` carry only the check.
    #[inline(never)]
    fn quiet_writes(&self, st: &mut RecvState, answered: bool) -> Result<()> {
        let mut answering = answered;
        while let Some((cts, buf)) = st.proto.late_answer() {
            // SAFETY: a late answer copies nothing and posts no receive.
            unsafe { self.answer(st, &cts, std::slice::from_ref(&buf)) }?;
            answering = true;
        }
        match st.proto.credit_due(answering) {
            Some(credit) => self.write_credit(st, credit),
            None => Ok(()),
        }
    }

    /// Start the profiler's events of the receives `cts` posted: one per QP for each buffer of
    /// the receive, as NCCL's transport reports them (an eager message copied at once took no
    /// receive of its own, and reports none).
    #[cold]
    pub(super) fn start_events(
        &self,
        events: &mut Events,
        layout: Layout,
        slot: usize,
        recvs: Range<usize>,
        bufs: &[RecvBuf],
    ) {
        for q in recvs {
            for (i, buf) in bufs.iter().enumerate() {
                let event = QpEvent {
                    member: layout.local_member(q),
                    wr_id: WR_RECV,
                    with_imm: true,
                    qp_num: self.qps.qpn(q),
                    length: buf.size,
                };
                events.start(slot, i, &event);
            }
        }
    }

    /// Where bounce slot `slot` (its header, then its payload) lies in the sizes ring's region.
    fn bounce_slot_at(&self, layout: Layout, slot: usize) -> usize {
        SIZES_RING_BYTES + eager::slot_offset(slot, layout.eager_bytes) as usize
    }

    /// Copy an eager message out of its bounce slot into the receive buffer.
    ///
    /// # Safety
    /// `copy.addr` must be the buffer of a receive in flight, at least `copy.len` long.
    pub(super) unsafe fn copy_eager(&self, layout: Layout, copy: EagerCopy) {
        let at = self.bounce_slot_at(layout, copy.bounce_slot) + eager::HEADER_BYTES;
        let len = usize::try_from(copy.len).unwrap_or(0);
        // SAFETY: the payload's write-with-immediate completed and the sender writes this bounce
        // slot again only after this message was answered; the destination is the caller's.
        unsafe {
            self.rings.copy_to(at, copy.addr as *mut u8, len);
        }
    }

    /// Make received data visible: one RDMA read of the last non-empty buffer through every
    /// member's flush QP (the data may have arrived through any of them; the QP is the port's,
    /// shared by its receive comms, see `flush`). `Ok(None)` when there is nothing to flush
    /// (NCCL treats that as done).
    ///
    /// # Errors
    /// A failed comm's error; `Misuse` when more flushes are in flight than slots.
    pub fn iflush(&self, targets: &[(u64, u64, &MrHandle)]) -> Result<Option<usize>> {
        if !self.ctx.config.flush_enabled {
            return Ok(None);
        }
        let Some(&(addr, _, mr)) = targets.iter().rev().find(|(_, size, _)| *size > 0) else {
            return Ok(None);
        };
        let mut st = self.state.lock();
        st.failed.check_posting()?;
        let Some(k) = st.flushes.iter().position(|f| matches!(f, FlushSlot::Free)) else {
            return Err(Error::misuse(format!(
                "more than {SLOTS} flushes in flight"
            )));
        };
        let rkeys = mr.rkeys();
        let ticket = FlushTicket::new();
        let mut posted = 0;
        for (member, port) in self.ctx.ports.iter().enumerate() {
            if st.failover.is_some() && port.is_down() {
                // Its lanes moved to the members left, whose reads flush what they carried.
                continue;
            }
            let read = port
                .flush
                .read(port, &self.ctx.config, &ticket, (addr, rkeys[member]));
            if let Err(e) = read {
                return Err(st.failed.record(e));
            }
            posted += 1;
        }
        if posted == 0 {
            return Ok(None);
        }
        st.flushes[k] = FlushSlot::Pending(ticket);
        Ok(Some(SLOTS + k))
    }

    /// Count down the flushes of every member's flush QP (this comm's and others').
    fn progress_flushes(&self) -> Result<()> {
        self.ctx
            .ports
            .iter()
            .try_for_each(|port| port.flush.progress(port, &self.ctx.config))
    }

    /// Poll request `index`: `Some(sizes)` (one per buffer; empty for a flush) when done.
    ///
    /// # Errors
    /// The comm's failure, or `Misuse` for an index that is not in flight.
    pub fn test(&self, index: usize) -> Result<Option<Sizes>> {
        let mut st = self.state.lock();
        st.failed.check()?;
        let finished = match self.finished(&st, index)? {
            Some(f) => f,
            None => {
                self.progress(&mut st)?;
                if index >= SLOTS
                    && let Err(e) = self.progress_flushes()
                {
                    return Err(st.failed.record(e));
                }
                let Some(f) = self.finished(&st, index)? else {
                    if let Err(e) = self.check_alive() {
                        return Err(st.failed.record(e));
                    }
                    return Ok(None);
                };
                f
            }
        };
        if let Finished::Flush(Err(why)) = &finished
            && !(st.failover.is_some() && self.ctx.ports.iter().any(|p| p.is_down()))
        {
            // (With failover, a read through a member that went down flushed nothing the
            // members left did not carry.)
            st.flushes[index - SLOTS] = FlushSlot::Free;
            let e = Error::new(Kind::System, why.clone());
            return Err(st.failed.record(e));
        }
        Ok(Some(self.take(&mut st, index, finished)))
    }

    /// `Err` once the device failed or the sender is gone (closed its comm, or its process).
    #[inline(always)]
    fn check_alive(&self) -> Result<()> {
        check_alive(&self.ctx, self.link.as_ref(), "send comm")
    }

    /// Whether request `index` (a receive, or from [`SLOTS`] on a flush) completed. Small on
    /// purpose: `test` asks on every poll, the sizes are gathered once, by [`Self::take`].
    fn finished(&self, st: &RecvState, index: usize) -> Result<Option<Finished>> {
        let Some(k) = index.checked_sub(SLOTS) else {
            return Ok(st.proto.poll_done(index).map(Finished::Recv));
        };
        match st.flushes.get(k) {
            Some(FlushSlot::Pending(ticket)) => Ok(ticket.done().map(Finished::Flush)),
            _ => Err(Error::misuse(format!(
                "test on flush request {k} that is not in flight"
            ))),
        }
    }

    /// The sizes of finished request `index`, which is then free again.
    fn take(&self, st: &mut RecvState, index: usize, finished: Finished) -> Sizes {
        let done = match finished {
            Finished::Flush(_) => {
                st.flushes[index - SLOTS] = FlushSlot::Free;
                return Sizes::Group(Group::default());
            }
            Finished::Recv(done) => done,
        };
        if let Some(events) = &mut st.events {
            events.finish(index);
        }
        let sizes = if done.ringed {
            let raw: [u8; SIZES_SLOT_BYTES] = self.rings.read(index * SIZES_SLOT_BYTES);
            Sizes::Group(
                raw.chunks_exact(8)
                    .take(done.n)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                    .collect(),
            )
        } else {
            Sizes::One(done.imm_sum)
        };
        st.proto.release(index);
        sizes
    }

    /// The progress of a client's call.
    pub(super) fn progress(&self, st: &mut RecvState) -> Result<()> {
        st.client.made();
        self.progress_at(st, None)
    }

    /// [`Self::progress`]; at the watcher's `tick` (10 to 80 ms apart) the quiet wait reads
    /// the clock on this poll and the failover takes the tick's time.
    fn progress_at(&self, st: &mut RecvState, tick: Option<Instant>) -> Result<()> {
        self.qps.drain(|member, c| self.handle(st, member, c))?;
        // After the completions: a drain that ends on its grace must not leave one unpolled
        // (the receives a lane took decide what the sender writes again).
        if st.failover.is_some() {
            self.tend_failover(st, tick)?;
        }
        if !st.proto.layout().quiet {
            return Ok(());
        }
        self.announce_overdue(st, tick.is_some());
        self.owed_writes(st, false).map_err(|e| st.failed.record(e))
    }

    /// When no eager message arrived for `NCCL_NET_RS_QUIET_WAIT_US` while quiet receives
    /// wait, they write their CTS: the sender may hold a message that cannot go eagerly.
    /// (Receives posted ahead of eager messages that keep coming stay quiet.) The default, 200
    /// us, is several round trips of a slow device, so that a ping-pong of small messages stays
    /// quiet, and short next to what a message that cannot go eagerly then waits. The wait
    /// runs from the first clock read after the latest arrival (see [`QuietWait`]).
    fn announce_overdue(&self, st: &mut RecvState, clock_due: bool) {
        if !st.proto.has_quiet() {
            st.quiet_wait = None;
            return;
        }
        let seen = st.proto.last_eager();
        let wait = match &mut st.quiet_wait {
            Some(w) if w.seen == seen => w,
            other => other.insert(QuietWait::new(seen)),
        };
        if wait.overdue(clock_due, self.ctx.config.quiet_wait, Instant::now) {
            st.proto.announce_all();
            st.quiet_wait = None;
        }
    }

    /// An eager message landed in its bounce slot: read its header, hand it to the protocol,
    /// and copy it when its receive was posted first, else post the receive its
    /// write-with-immediate used again.
    fn eager_arrived(&self, st: &mut RecvState, qp: usize, a: Announced) -> Result<()> {
        let layout = st.proto.layout();
        let at = self.bounce_slot_at(layout, a.slot(layout.bounce_slots));
        // The write-with-immediate completed, so the header is in place; the sender writes this
        // slot again only after the message was answered.
        let seq = u64::from_le_bytes(self.rings.read(at));
        let tag = i32::from_le_bytes(self.rings.read(at + 8));
        match st.proto.eager_arrived(a, EagerHeader { seq, tag })? {
            // SAFETY: the copy goes into a receive still in flight, whose buffer NCCL keeps
            // valid until `test` reports it done (`irecv`'s contract).
            Arrived::Copied(copy) => unsafe { self.copy_eager(st.proto.layout(), copy) },
            Arrived::Kept | Arrived::Dropped => self.qps.qp(qp).post_recv(WR_RECV)?,
        }
        Ok(())
    }

    fn handle(&self, st: &mut RecvState, member: usize, c: &Completion) -> Result<()> {
        if !c.is_ok()
            && let Some(f) = st.failover.as_deref_mut()
        {
            // A QP of no lane is an old one replaced after its drain: what it still reports
            // says nothing.
            let Some(lane) = self.qps.index_of(member, c.qp_num) else {
                return Ok(());
            };
            if let Some(actions) = f.failed_completion(&self.ctx, lane, c.wr_id, c.status) {
                return self.run_actions(st, actions);
            }
        }
        if !c.is_ok() {
            let e = completion_error(
                &self.ctx,
                self.link.as_ref(),
                c,
                &self.local,
                &self.remote,
                st.completed_any,
            );
            return Err(st.failed.record_completion(e));
        }
        let handled = match c.wr_id & !WR_INDEX_MASK {
            WR_RECV if c.opcode == OPCODE_RECV_RDMA_WITH_IMM => {
                st.completed_any = true;
                let imm = c.imm.unwrap_or(0);
                let qp = self
                    .qps
                    .index_of(member, c.qp_num)
                    .ok_or_else(|| Error::misuse("completion from an unknown QP"));
                qp.and_then(|q| match st.proto.announced(imm) {
                    Some(a) => self.eager_arrived(st, q, a),
                    None => st.proto.handle_completion(q, imm),
                })
            }
            WR_CTS => {
                st.answers.completed(c.wr_id & WR_INDEX_MASK);
                Ok(())
            }
            _ => Ok(()),
        };
        handled.map_err(|e| st.failed.record(e))
    }
}

impl Drop for RecvComm {
    fn drop(&mut self) {
        let mut st = self.state.lock();
        if st.failed.check().is_ok()
            && let Some(credit) = st.proto.final_credit()
        {
            // The sender's comm may be waiting for it to let go of its kept copies; written
            // before the drain, which confirms it.
            if let Err(e) = self.write_credit(&mut st, credit) {
                tracing::debug!(
                    "closing the recv comm from {}: final credit: {e}",
                    self.remote
                );
            }
        }
        drop(st);
        self.drain_answers();
    }
}

/// The sizes a finished request reports, one per buffer: a single receive's one size (NCCL's
/// usual request, carried without building a group), a grouped receive's, or none (a flush).
#[derive(Debug)]
pub enum Sizes {
    /// A single receive's size.
    One(u64),
    /// A grouped receive's sizes (or a flush's, none).
    Group(Group<u64>),
}

/// A quiet receive writes its CTS only when no eager message comes for a while: the
/// sender may hold a message that cannot go eagerly, and NCCL may make no further call on this
/// comm until it arrives (it waits on another comm, or outside the plugin). A repair must not
/// wait for NCCL's next call either: the sender's lanes wait for it.
impl Tend for RecvComm {
    fn devices(&self) -> Vec<Arc<DeviceHealth>> {
        self.ctx.healths()
    }

    fn link_key(&self) -> Option<&AtomicU64> {
        self.link.as_ref().map(|w| w.link().tended_as())
    }

    fn wants_tending(&self) -> bool {
        let st = self.state.lock();
        st.proto.layout().quiet || st.failover.is_some()
    }

    fn tend(&self, now: Instant) -> Tick {
        let Some(mut st) = self.state.try_lock() else {
            return busy_tick(self.quiet, self.link.as_ref());
        };
        let polled = st.client.since_last_tick();
        // Quiet receives may come due by the clock alone; failover only by an event.
        let idle = if self.quiet { Tick::Idle } else { Tick::Quiet };
        if st.failed.check().is_err() {
            return idle;
        }
        if !st.proto.has_quiet() && !self.failover_due(&mut st) {
            return idle;
        }
        // Even for a client that polls: its polls read the clock only every 32nd time (the
        // quiet wait's and the failover's).
        // A failure is recorded in the comm and reported at its next call.
        let _ = self.progress_at(&mut st, Some(now));
        Tick::owed(polled)
    }
}
