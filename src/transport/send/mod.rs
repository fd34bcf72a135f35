//! The sending end: the send comm (its connect state machine is in `connect`).
#![allow(unsafe_code)] // posts NCCL buffers to the NIC (see the transport module doc)

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::DeviceContext;
use super::conn::{
    CREDIT_OFFSET, Failure, Nonces, SEND_QP_CAPS, SEND_RINGS_BYTES, SEND_STAGING_AT,
    SIZES_RING_BYTES, SIZES_SLOT_BYTES, WR_DATA, WR_INDEX_MASK, WR_SEND_DONE, agreed_eager_bytes,
    bounce_slots, check_alive, check_peer, completion_error, connection_qps, describe_eager,
    describe_local, describe_remote, failover_agreed, local_hello, quiet_receives, random_u64,
};
use super::failover::{Failover, Repairing, log_failover};
use super::health::DeviceHealth;
use super::held::Builder;
use super::mr::MrHandle;
use super::peer_link::Watched;
use super::profile::{Events, Parent, QpEvent};
use super::qp_set::QpSet;
use super::watch::{ClientProgress, Tend, Tended, Tick, busy_tick};
use super::wire_io::{HandshakeStream, socket_error};
use crate::core::config::MAX_FUSED_MEMBERS;
use crate::core::config::Traffic;
use crate::core::eager;
use crate::core::error::{Error, Kind, Result};
use crate::core::group::Group;
use crate::core::proto::{
    CtsLayout, Layout, Post, RdmaWrite, SendBuf, SendSide, SingleSend, Staging, check_message_size,
};
use crate::core::repair::FollowRepair;
use crate::core::wire::{Cts, Hello, ListenHandle, MAX_RECVS, Role};
use crate::topology::LinkLayer;
use crate::verbs::{Access, Completion, HostRegion, Op, Sge, WorkRequest};

pub use crate::core::proto::SEND_REQUESTS;
pub use connect::Connecting;

mod connect;

/// How long a closed send comm keeps delivering messages NCCL already saw done (see
/// [`SendComm::close`]).
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub(super) struct SendState {
    pub(super) proto: SendSide,
    pub(super) failed: Failure,
    completed_any: bool,
    /// The client's own progress, which the watcher need not repeat.
    client: ClientProgress,
    /// The profiler's QP events, when one is installed.
    events: Option<Events>,
    /// Port failover, when both sides agreed on it.
    pub(super) failover: Option<Box<Failover<FollowRepair>>>,
}

/// A connected send comm. `isend`/`test` come from NCCL's progress thread; the lock only guards
/// against `regMr` on the service thread racing it.
#[derive(Debug)]
pub struct SendComm {
    pub(super) ctx: Arc<DeviceContext>,
    /// Its lanes' QPs and posts: a send goes at once, messages released together as one chain.
    pub(super) qps: QpSet,
    /// What its QPs use (a lane's new QP too).
    pub(super) traffic: Traffic,
    /// The CTS ring the receiver writes, its credit word, and from `SEND_STAGING_AT` the
    /// staging: sizes of grouped messages, then eager headers, as they are written to the
    /// receiver.
    rings: HostRegion,
    /// Where the receiver writes its entries in the CTS ring.
    cts_layout: CtsLayout,
    /// With quiet receives, each eager message (header and payload) as it goes, kept until the
    /// receiver has it (`core::proto::Staging`).
    eager_staging: Option<HostRegion>,
    /// The receiver's sizes ring; its eager bounce ring follows it.
    remote_sizes_addr: u64,
    remote_sizes_rkeys: Vec<u32>,
    layout: Layout,
    /// With adaptive routing, a data write-with-immediate above this many bytes goes as a plain
    /// write and a zero-byte write-with-immediate ([`Config::adaptive_routing_split`]); without,
    /// `u64::MAX` (one comparison on every send either way).
    split_above: u64,
    local: String,
    pub(super) remote: String,
    /// The out-of-band connection, watched for the receiver's end; set when the handshake ends.
    pub(super) link: Option<Watched>,
    pub(super) state: Mutex<SendState>,
}

impl SendComm {
    /// The device context the comm lives on.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// Start sending `size` bytes at `addr`; `Ok(None)` until the receiver posted a buffer with
    /// this tag in the message at the head of the CTS ring. Returns the request index. The
    /// profiler's events of its writes go under `parent` (NCCL's `phandle`).
    ///
    /// # Safety
    /// `addr..addr + size` must stay valid and unchanged until `test` reports the request done
    /// (NCCL's contract for isend).
    ///
    /// # Errors
    /// A failed comm's error; `Misuse` for a buffer outside `mr`.
    pub unsafe fn isend(
        &self,
        addr: u64,
        size: u64,
        tag: i32,
        mr: &MrHandle,
        parent: Option<Parent>,
    ) -> Result<Option<usize>> {
        check_message_size(size, "a send")?;
        mr.check(addr, size)?;
        let buf = SendBuf {
            addr,
            size,
            lkeys: mr.lkeys(),
            tag,
            host: mr.is_host(),
        };
        let mut st = self.state.lock();
        st.failed.check_posting()?;
        // A send that adaptive routing may split goes the general way, which splits; NCCL's
        // usual send keeps its one post (a split check there cost every `isend` ~30
        // instructions of register spills).
        if size <= self.split_above
            && let Some(single) = self.isend_single(&mut st, buf)?
        {
            if let Some(truncated) = single.truncated {
                self.trace_truncated(truncated);
            }
            // SAFETY: the payload is NCCL's, unchanged until test() reports done (this
            // function's contract).
            let posted = unsafe { self.post_one(&single.post, st.failover.as_deref()) };
            if st.events.is_some() {
                self.report_posts(
                    &mut st,
                    Some((single.req, parent)),
                    std::slice::from_ref(&single.post),
                );
            }
            return posted
                .map(|()| Some(single.req))
                .map_err(|e| st.failed.record(e));
        }
        self.read_answers(&mut st)?;
        let Some(accepted) = st.proto.isend(buf)? else {
            // NCCL calls again until it gets a request: that loop must end when the receiver
            // is gone. (A send that starts learns of it in `test`.)
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
        if let Some(truncated) = accepted.truncated {
            self.trace_truncated(truncated);
        }
        // SAFETY: as above.
        let posted = unsafe { self.post(&accepted.posts, false, st.failover.as_deref()) };
        if st.events.is_some() {
            self.report_posts(&mut st, Some((accepted.req, parent)), &accepted.posts);
        }
        st.proto.recycle(accepted.posts);
        if let Err(e) = posted {
            return Err(st.failed.record(e));
        }
        Ok(Some(accepted.req))
    }

    /// NCCL's usual send, without the general way's bookkeeping: the next message's CTS is in
    /// the ring, for a single receive with `buf`'s tag, and nothing else waits on the ring
    /// (see [`SendSide::isend_single`]). `Ok(None)`, with nothing taken, otherwise.
    #[inline(always)]
    fn isend_single(&self, st: &mut SendState, buf: SendBuf) -> Result<Option<SingleSend>> {
        let Some((seq, slot)) = st.proto.single_cts() else {
            return Ok(None);
        };
        if self.entry_seq(slot, 0) != seq + 1 {
            return Ok(None);
        }
        st.proto.isend_single(&self.entry(slot, 0), buf)
    }

    /// The sequence number (plus one) that entry `i` of ring slot `slot` carries: read
    /// (acquire) before the entry it guards. Inlined: `isend` reads one per call.
    #[inline(always)]
    fn entry_seq(&self, slot: usize, i: usize) -> u64 {
        self.rings
            .read_u64_acquire(self.cts_layout.offset(slot, i) + Cts::SEQ_OFFSET)
    }

    /// Entry `i` of ring slot `slot`, once [`Self::entry_seq`] showed it written.
    #[inline(always)]
    fn entry(&self, slot: usize, i: usize) -> Cts {
        Cts::parse(&self.rings.read(self.cts_layout.offset(slot, i)))
    }

    /// Log a truncated send at TRACE: out of line, as truncation is rare.
    #[cold]
    fn trace_truncated(&self, (asked, sent): (u64, u64)) {
        tracing::trace!(
            "isend of {asked} bytes truncated to the posted receive size {sent} ({})",
            self.remote
        );
    }

    /// Take what the receiver wrote into the CTS ring, in order: answers to eager messages,
    /// then the next message's CTS; post what they release (a refused eager message again, or
    /// held sends that complete a message).
    ///
    /// Messages released together (held sends that each CTS completes) go as one chain per QP,
    /// posted when the ring has nothing more.
    fn read_answers(&self, st: &mut SendState) -> Result<()> {
        if st.proto.wants_credit() {
            let credit = self.rings.read_u64_acquire(CREDIT_OFFSET);
            if let Err(e) = st.proto.handle_credit(credit) {
                return Err(st.failed.record(e));
            }
        }
        let mut released = false;
        let read = loop {
            let Some((seq, slot)) = st.proto.wants_cts() else {
                break Ok(());
            };
            let posts = match self.read_cts(seq, slot, |entries| st.proto.handle_cts(entries)) {
                Ok(Some(posts)) => posts,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            if !posts.is_empty() {
                released = true;
                // SAFETY: the posts carry sends NCCL keeps unchanged until test() reports them
                // done (isend's contract).
                let held = unsafe { self.post(&posts, true, st.failover.as_deref()) };
                if st.events.is_some() {
                    self.report_posts(st, None, &posts);
                }
                st.proto.recycle(posts);
                if let Err(e) = held {
                    break Err(e);
                }
            }
        };
        let posted = if released {
            self.qps.flush_queues()
        } else {
            Ok(())
        };
        read.and(posted).map_err(|e| st.failed.record(e))
    }

    /// Poll request `index`: `Some(bytes sent)` when done (and then forgotten).
    ///
    /// # Errors
    /// The comm's failure (error completion), or `Misuse` for an index that is not in flight.
    pub fn test(&self, index: usize) -> Result<Option<u64>> {
        let mut st = self.state.lock();
        st.failed.check()?;
        let done = match st.proto.poll_done(index) {
            Some(sent) => Some(sent),
            None => {
                self.progress(&mut st)?;
                if st.proto.waits_on_ring() {
                    // An eager message completes with its answer in the CTS ring.
                    st.client.made();
                    self.read_answers(&mut st)?;
                }
                st.proto.poll_done(index)
            }
        };
        if done.is_some() {
            st.proto.release(index);
            if let Some(events) = &mut st.events {
                events.finish(index);
            }
            return Ok(done);
        }
        if let Err(e) = self.check_alive() {
            return Err(st.failed.record(e));
        }
        Ok(None)
    }

    /// `Err` once the device failed or the receiver is gone (closed its comm, or its process).
    #[inline(always)]
    fn check_alive(&self) -> Result<()> {
        check_alive(&self.ctx, self.link.as_ref(), "receive comm")
    }

    /// Close: at once, unless messages whose requests NCCL saw done still need this comm (an
    /// eager message the receiver may refuse is written again from the kept copy): then a
    /// thread keeps it going until they are delivered, the receiver closes or fails, or
    /// `SETTLE_LIMIT` (60 s) passes, so that closing never waits on the peer.
    pub fn close(self) {
        let owed = {
            let st = self.state.lock();
            st.proto.undelivered() && st.failed.check().is_ok()
        };
        if !owed || self.check_alive().is_err() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("nccl-net-rs close".into())
            .spawn(move || self.settle());
        if let Err(e) = spawned {
            tracing::warn!("closing a send comm: no thread to deliver its last messages: {e}");
        }
    }

    fn settle(self) {
        let deadline = Instant::now() + SETTLE_LIMIT;
        loop {
            {
                let mut st = self.state.lock();
                if self.deliver(&mut st).is_err()
                    || !st.proto.undelivered()
                    || self.check_alive().is_err()
                {
                    return;
                }
            }
            if Instant::now() > deadline {
                tracing::warn!(
                    "closed send comm to {}: messages still undelivered after {SETTLE_LIMIT:?}, \
                     dropped",
                    self.remote
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Hand the ring slot's entries to `take` once all of them carry `seq + 1` (the count may
    /// carry the refusal flag); one entry with count 0 is the acknowledgement of an eager
    /// message, and a first entry of a later message is handed alone (it stands for an eager
    /// message's answer, see [`SendSide::handle_cts`]). `Ok(None)` while they have not all
    /// arrived.
    fn read_cts<R>(
        &self,
        seq: u64,
        slot: usize,
        take: impl FnOnce(&[Cts]) -> Result<R>,
    ) -> Result<Option<R>> {
        let want = seq + 1;
        let first_seq = self.entry_seq(slot, 0);
        if first_seq < want {
            return Ok(None);
        }
        let first = self.entry(slot, 0);
        if first_seq > want {
            return take(&[first]).map(Some);
        }
        let n = (first.nreqs & !eager::REFUSED) as usize;
        if n > MAX_RECVS {
            return Err(Error::new(
                Kind::Remote,
                format!("peer posted a CTS with {n} buffers ({})", self.remote),
            ));
        }
        if n <= 1 {
            // A single receive, NCCL's usual case, builds no group of eight.
            return take(&[first]).map(Some);
        }
        let mut entries = Group::one(first);
        for i in 1..n {
            if self.entry_seq(slot, i) != want {
                return Ok(None);
            }
            entries.push(self.entry(slot, i));
        }
        take(&entries).map(Some)
    }

    /// Post `posts` (grouped by QP, in order): each QP's run goes through its queue, in one
    /// `ibv_post_send` with what the queue holds unless it fills the chain; with `hold`, kept
    /// in the queues for a later post (only queues that hold, see `held`). A single post not
    /// held, and not split by adaptive routing, goes through [`Self::post_one`].
    ///
    /// # Safety
    /// The payloads `posts` read stay unchanged until their completions (isend's contract).
    pub(super) unsafe fn post(
        &self,
        posts: &[Post],
        hold: bool,
        failover: Option<&Failover<FollowRepair>>,
    ) -> Result<()> {
        if let [p] = posts
            && !hold
            && !self.splits(p)
        {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.post_one(p, failover) };
        }
        for run in posts.chunk_by(|a, b| a.qp() == b.qp()) {
            let lane = run[0].qp();
            if failover.is_some_and(|f| !f.is_up(lane)) {
                // Written when the lane is repaired (the protocol keeps what each lane owes).
                continue;
            }
            // SAFETY: forwarded from this function's contract; the sizes and header staging
            // slots are rewritten only after this slot's completion.
            unsafe {
                self.qps.lanes[lane]
                    .read()
                    .queue
                    .submit(hold, |b| run.iter().try_for_each(|p| self.push(b, p)))
            }?;
        }
        Ok(())
    }

    /// Post `p` alone and at once: NCCL's usual message, its data write built here; any other
    /// post through [`Self::work_request`].
    ///
    /// # Safety
    /// As [`Self::post`].
    #[inline(always)]
    unsafe fn post_one(&self, p: &Post, failover: Option<&Failover<FollowRepair>>) -> Result<()> {
        let lane = p.qp();
        if failover.is_some_and(|f| !f.is_up(lane)) {
            return Ok(());
        }
        let wr = match *p {
            Post::WriteImm { write, imm, slot } => data_write(&write, imm, slot)?,
            _ => self.work_request(p)?,
        };
        // SAFETY: forwarded from this function's contract.
        unsafe { self.qps.lanes[lane].read().queue.post_one(&wr) }
    }

    /// Whether `p` is a data write that adaptive routing splits into two requests.
    fn splits(&self, p: &Post) -> bool {
        matches!(p, Post::WriteImm { write, .. } if write.len > self.split_above)
    }

    /// Add `p` to a chain: its work request, or, for a data write adaptive routing splits, the
    /// data as a plain write and then a zero-byte write-with-immediate that carries the same
    /// immediate and completion (the receiver sees one completion, after the data, by RC order).
    fn push(&self, b: &mut Builder<'_>, p: &Post) -> Result<()> {
        match *p {
            Post::WriteImm { write, imm, slot } if self.splits(p) => {
                b.push(&write_request(&write, WR_DATA, Op::Write, false)?)?;
                b.push(&data_write(&RdmaWrite { len: 0, ..write }, imm, slot)?)
            }
            _ => b.push(&self.work_request(p)?),
        }
    }

    /// The work request of `p` (an eager message's header staged for it).
    fn work_request(&self, p: &Post) -> Result<WorkRequest> {
        let wr = match *p {
            Post::Write(w) => write_request(&w, WR_DATA, Op::Write, false)?,
            Post::WriteImm { write, imm, slot } => data_write(&write, imm, slot)?,
            Post::Eager {
                qp,
                slot,
                bounce,
                seq,
                tag,
                local_addr,
                lkey,
                len,
                imm,
            } => {
                // Header and payload in one write into the bounce slot.
                let (local, remote) = (self.layout.local_member(qp), self.layout.remote_member(qp));
                let header = eager::header(seq, tag);
                let len = u32::try_from(len).unwrap_or(0);
                // The slot's place in the bounce ring, and in the staging ring that mirrors it.
                let offset = eager::slot_offset(bounce, self.layout.eager_bytes);
                let (head, tail) = match &self.eager_staging {
                    // Quiet receives: both copied into the slot's staging and written from
                    // there; the send is done once written, the copy stays for a refusal.
                    Some(ring) => {
                        let at = offset as usize;
                        ring.write(at, &header);
                        // SAFETY: isend's contract: a host-memory send buffer of `len` bytes,
                        // readable until the send is done; this staging slot is written again
                        // only once the receiver read the message it held (credit or answer)
                        // and its own write completed.
                        unsafe {
                            ring.copy_from(
                                at + eager::HEADER_BYTES,
                                local_addr as *const u8,
                                len as usize,
                            );
                        }
                        let whole = Sge {
                            addr: ring.addr(at),
                            len: eager::HEADER_BYTES as u32 + len,
                            lkey: ring.mr(local).lkey(),
                        };
                        (whole, Sge::default())
                    }
                    // The header from staging, the payload gathered behind it from NCCL's
                    // buffer.
                    None => {
                        let staged =
                            SEND_STAGING_AT + SIZES_RING_BYTES + slot * eager::HEADER_BYTES;
                        self.rings.write(staged, &header);
                        let head = Sge {
                            addr: self.rings.addr(staged),
                            len: eager::HEADER_BYTES as u32,
                            lkey: self.rings.mr(local).lkey(),
                        };
                        let payload = Sge {
                            addr: local_addr,
                            len,
                            lkey,
                        };
                        (head, payload)
                    }
                };
                WorkRequest {
                    wr_id: WR_SEND_DONE | slot as u64,
                    op: Op::WriteImm(imm),
                    local: head,
                    tail,
                    remote_addr: self.remote_sizes_addr + SIZES_RING_BYTES as u64 + offset,
                    rkey: self.remote_sizes_rkeys[remote],
                    signaled: true,
                    // Eager messages are host memory only (the staging ring, or NCCL's buffer).
                    cpu_readable: true,
                }
            }
            Post::Sizes {
                qp,
                members: (local, remote),
                slot,
                sizes,
            } => {
                let mut bytes = [0u8; SIZES_SLOT_BYTES];
                for (chunk, size) in bytes.chunks_exact_mut(8).zip(sizes) {
                    chunk.copy_from_slice(&size.to_le_bytes());
                }
                let offset = slot * SIZES_SLOT_BYTES;
                let staged = SEND_STAGING_AT + offset;
                self.rings.write(staged, &bytes);
                let write = RdmaWrite {
                    qp,
                    local_addr: self.rings.addr(staged),
                    lkey: self.rings.mr(local).lkey(),
                    len: SIZES_SLOT_BYTES as u64,
                    remote_addr: self.remote_sizes_addr + offset as u64,
                    rkey: self.remote_sizes_rkeys[remote],
                    host: true,
                };
                write_request(&write, WR_DATA, Op::Write, false)?
            }
        };
        Ok(wr)
    }

    fn progress(&self, st: &mut SendState) -> Result<()> {
        self.progress_at(st, None)
    }

    /// [`Self::progress`]; at the watcher's `tick` the failover takes its time, not only at
    /// every 32nd call (ticks come rarely).
    fn progress_at(&self, st: &mut SendState, tick: Option<Instant>) -> Result<()> {
        self.qps.drain(|member, c| self.handle(st, member, c))?;
        // After the completions: a drain that ends on its grace must not leave one unpolled.
        if st.failover.is_some() {
            self.tend_failover(st, tick)?;
        }
        Ok(())
    }

    /// For the profiler, when one is installed: the send `begun` (its request and NCCL's
    /// parent handle), then the sends whose writes `posts` hand out.
    #[cold]
    #[inline(never)]
    fn report_posts(
        &self,
        st: &mut SendState,
        begun: Option<(usize, Option<Parent>)>,
        posts: &[Post],
    ) {
        if let SendState {
            proto,
            events: Some(events),
            ..
        } = st
        {
            if let Some((req, parent)) = begun {
                events.begin(req, [parent]);
            }
            self.start_events(proto, events, posts);
        }
    }

    /// Start the profiler's events of the sends whose writes `posts` hand out, once per send:
    /// one per QP carrying its bytes, as NCCL's transport reports each send's work request.
    #[cold]
    fn start_events(&self, proto: &SendSide, events: &mut Events, posts: &[Post]) {
        let mut slots = posts
            .iter()
            .filter_map(Post::message_slot)
            .collect::<Vec<_>>();
        slots.dedup();
        for slot in slots {
            let mut shares = proto.qp_shares(slot);
            // A send whose events started with an earlier post (written again) has none new.
            shares.retain(|share| !events.started(share.req));
            for share in shares {
                let event = QpEvent {
                    member: self.layout.local_member(share.qp),
                    wr_id: if share.with_imm {
                        WR_SEND_DONE | slot as u64
                    } else {
                        WR_DATA
                    },
                    with_imm: share.with_imm,
                    qp_num: self.qps.qpn(share.qp),
                    length: share.len,
                };
                events.start(share.req, 0, &event);
            }
        }
    }

    /// Progress without a request to poll: completions, then the answers and credit, which
    /// write refused eager messages again from their kept copies.
    fn deliver(&self, st: &mut SendState) -> Result<()> {
        self.progress(st)?;
        self.read_answers(st)
    }

    fn handle(&self, st: &mut SendState, member: usize, c: &Completion) -> Result<()> {
        if !c.is_ok()
            && let Some(f) = st.failover.as_deref_mut()
        {
            let lane = self.qps.index_of(member, c.qp_num).unwrap_or(usize::MAX);
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
        if c.wr_id & !WR_INDEX_MASK == WR_SEND_DONE {
            let qp = self.qps.index_of(member, c.qp_num).unwrap_or(usize::MAX);
            if st.failover.as_deref().is_some_and(|f| !f.is_up(qp)) {
                // The receiver's word on what arrived settles it (`Frame::Resume`).
                return Ok(());
            }
            st.completed_any = true;
            if let Err(e) = st.proto.handle_completion(qp) {
                return Err(st.failed.record(e));
            }
        }
        Ok(())
    }
}

/// With quiet receives, an eager send is done before the receiver took it: when it refuses it
/// (a smaller or grouped receive, another tag), the comm must write it again even if NCCL makes
/// no further call on it. A repair must not wait for NCCL's next call either: the receiver
/// leads it and waits for this side's answers.
impl Tend for SendComm {
    fn devices(&self) -> Vec<Arc<DeviceHealth>> {
        self.ctx.healths()
    }

    fn link_key(&self) -> Option<&AtomicU64> {
        self.link.as_ref().map(|w| w.link().tended_as())
    }

    fn wants_tending(&self) -> bool {
        self.layout.quiet || self.state.lock().failover.is_some()
    }

    fn tend(&self, now: Instant) -> Tick {
        let Some(mut st) = self.state.try_lock() else {
            return busy_tick(self.layout.quiet, self.link.as_ref());
        };
        let polled = st.client.since_last_tick();
        let idle = if self.layout.quiet {
            Tick::Idle
        } else {
            Tick::Quiet
        };
        if st.failed.check().is_err() {
            return idle;
        }
        // A failure is recorded in the comm and reported at its next call.
        if st.proto.undelivered() {
            let _ = self.deliver(&mut st);
        } else if self.failover_due(&mut st) {
            let _ = self.progress_at(&mut st, Some(now));
        } else {
            return idle;
        }
        Tick::owed(polled)
    }
}

/// The work request of RDMA write `w`.
///
/// # Errors
/// `Misuse` for a write of 4 GiB or more (one request moves less).
fn write_request(w: &RdmaWrite, wr_id: u64, op: Op, signaled: bool) -> Result<WorkRequest> {
    let len = u32::try_from(w.len).map_err(|_| Error::misuse("message larger than 4 GiB"))?;
    Ok(WorkRequest {
        wr_id,
        op,
        local: Sge {
            addr: w.local_addr,
            len,
            lkey: w.lkey,
        },
        tail: Sge::default(),
        remote_addr: w.remote_addr,
        rkey: w.rkey,
        signaled,
        cpu_readable: w.host,
    })
}

/// The write-with-immediate of a message's data into its receive (`slot`'s message).
///
/// # Errors
/// As [`write_request`].
fn data_write(write: &RdmaWrite, imm: u32, slot: usize) -> Result<WorkRequest> {
    write_request(write, WR_SEND_DONE | slot as u64, Op::WriteImm(imm), true)
}
