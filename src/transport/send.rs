//! The sending end: the resumable connect state machine and the send comm.
#![allow(unsafe_code)] // posts NCCL buffers to the NIC (see the transport module doc)

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::DeviceContext;
use super::conn::{
    CTS_RING_BYTES, Failure, Nonces, QpSet, SEND_QP_CAPS, SIZES_SLOT_BYTES, WR_DATA, WR_INDEX_MASK,
    WR_SEND_DONE, check_alive, check_peer, completion_error, connection_qps, describe_local,
    describe_remote, local_hello, random_u64,
};
use super::mr::MrHandle;
use super::watch::Watched;
use super::wire_io::HandshakeStream;
use crate::core::config::Traffic;
use crate::core::error::{Error, Kind, Result};
use crate::core::group::Group;
use crate::core::proto::{
    Layout, POSTS_PER_MESSAGE, Post, RdmaWrite, SLOTS, SendBuf, SendSide, check_message_size,
};
use crate::core::wire::{Cts, Hello, ListenHandle, MAX_RECVS, Role};
use crate::verbs::{Access, Completion, HostRegion, Op, WorkRequest};

/// Requests a send comm can have in flight: every entry of every slot.
pub const SEND_REQUESTS: usize = SLOTS * MAX_RECVS;

/// Work requests per posted chain: one message's posts on one QP.
const CHAIN: usize = POSTS_PER_MESSAGE;

/// How long one attempt to open the TCP connection may block an NCCL call.
const DIAL_ATTEMPT: Duration = Duration::from_millis(100);

/// Resources built once the TCP connection is up, before the peer answered.
#[derive(Debug)]
struct Pending {
    qps: QpSet,
    cts_ring: HostRegion,
    /// What this side sent; the reply must answer it.
    hello: Hello,
}

#[derive(Debug)]
enum Stage {
    Dial,
    Exchange {
        stream: HandshakeStream,
        pending: Box<Pending>,
    },
    Ready {
        stream: HandshakeStream,
        comm: Box<SendComm>,
    },
}

/// A connect in progress; NCCL calls `connect` again until it yields a comm.
#[derive(Debug)]
pub struct Connecting {
    ctx: Arc<DeviceContext>,
    handle: ListenHandle,
    /// What the QPs of this connection use (the receiver adopts it from the hello).
    traffic: Traffic,
    deadline: Instant,
    stage: Option<Stage>,
}

impl Connecting {
    /// Start connecting to the listener described by `handle`, for a communicator that asked
    /// for traffic class `comm_class` (see [`crate::core::config::Config::traffic`]).
    pub fn new(ctx: Arc<DeviceContext>, handle: ListenHandle, comm_class: Option<u8>) -> Self {
        let deadline = Instant::now() + ctx.config.connect_timeout;
        let traffic = ctx.config.traffic(comm_class);
        Self {
            ctx,
            handle,
            traffic,
            deadline,
            stage: Some(Stage::Dial),
        }
    }

    /// True when NCCL stopped calling this connect: its deadline passed a minute ago.
    pub fn abandoned(&self) -> bool {
        Instant::now() > self.deadline + Duration::from_secs(60)
    }

    /// Advance without blocking (beyond one short dial attempt); `Ok(Some)` when connected.
    ///
    /// # Errors
    /// `Remote` when the peer refuses, closes, or misses the deadline; `Config` when the peer's
    /// setup is incompatible; `System` for verbs failures.
    pub fn progress(&mut self) -> Result<Option<SendComm>> {
        let peer = self.handle.addr;
        loop {
            let stage = self
                .stage
                .take()
                .ok_or_else(|| Error::misuse("connect resumed after it failed"))?;
            let next = match stage {
                Stage::Dial => match TcpStream::connect_timeout(&peer, DIAL_ATTEMPT) {
                    Ok(tcp) => {
                        let mut stream = HandshakeStream::new(tcp, peer, self.deadline)?;
                        let pending = self.build()?;
                        stream.queue(&pending.hello.emit());
                        Stage::Exchange {
                            stream,
                            pending: Box::new(pending),
                        }
                    }
                    Err(e)
                        if e.kind() == std::io::ErrorKind::TimedOut
                            && Instant::now() < self.deadline =>
                    {
                        self.stage = Some(Stage::Dial);
                        return Ok(None);
                    }
                    Err(e) => {
                        return Err(Error::new(
                            Kind::Remote,
                            format!(
                                "cannot connect to peer {peer}: {e} (is the peer process alive and listening?)"
                            ),
                        ));
                    }
                },
                Stage::Exchange {
                    mut stream,
                    pending,
                } => {
                    if stream.expired() {
                        return Err(stream.late("answer with its QP numbers"));
                    }
                    stream.flush()?;
                    let Some(bytes) = stream.receive(Hello::LEN)? else {
                        self.stage = Some(Stage::Exchange { stream, pending });
                        return Ok(None);
                    };
                    let remote = Hello::parse(&bytes)
                        .and_then(|h| h.check_reply(&pending.hello).map(|()| h))
                        .map_err(|e| Error::new(e.kind(), format!("peer {peer} {e}")))?;
                    let comm = Box::new(self.finish(*pending, &remote, peer)?);
                    stream.queue(&[1]);
                    Stage::Ready { stream, comm }
                }
                Stage::Ready {
                    mut stream,
                    mut comm,
                } => {
                    if stream.expired() {
                        return Err(stream.late("take the ready byte"));
                    }
                    if stream.flush()? {
                        comm.link = Some(Watched::new(stream.into_stream(), peer)?);
                        return Ok(Some(*comm));
                    }
                    self.stage = Some(Stage::Ready { stream, comm });
                    return Ok(None);
                }
            };
            self.stage = Some(next);
        }
    }

    fn build(&self) -> Result<Pending> {
        let nqps = connection_qps(&self.ctx, usize::from(self.handle.members));
        let qps = QpSet::new(&self.ctx, nqps, SEND_QP_CAPS, Access::REMOTE_WRITE, 0)?;
        let cts_ring = HostRegion::new(
            &self.ctx.pds(),
            CTS_RING_BYTES,
            Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
        )?;
        let nonces = Nonces {
            listen: self.handle.nonce,
            connect: random_u64(),
        };
        let hello = local_hello(
            &self.ctx,
            &qps,
            Role::Connect,
            nonces,
            &cts_ring,
            self.ctx.config.split_data_on_qps,
            self.traffic,
        );
        Ok(Pending {
            qps,
            cts_ring,
            hello,
        })
    }

    fn finish(&self, pending: Pending, remote: &Hello, peer: SocketAddr) -> Result<SendComm> {
        check_peer(&self.ctx, remote, peer)?;
        let config = &self.ctx.config;
        pending.qps.connect(&self.ctx, remote, self.traffic)?;
        let sizes_staging = HostRegion::new(
            &self.ctx.pds(),
            SLOTS * SIZES_SLOT_BYTES,
            Access::LOCAL_WRITE,
        )?;
        let layout = Layout {
            nqps: pending.qps.qps.len(),
            split: config.split_data_on_qps,
            local_members: self.ctx.ports.len(),
            remote_members: remote.members.len(),
        };
        let local = describe_local(&self.ctx);
        let remote_desc = describe_remote(remote, peer);
        tracing::debug!(
            "send comm connected: {local} -> {remote_desc}, {} QPs, {}",
            layout.nqps,
            pending.qps.describe_qos(self.traffic)
        );
        Ok(SendComm {
            ctx: Arc::clone(&self.ctx),
            qps: pending.qps,
            cts_ring: pending.cts_ring,
            sizes_staging,
            remote_sizes_addr: remote.ring_addr,
            remote_sizes_rkeys: remote.members.iter().map(|m| m.ring_rkey).collect(),
            layout,
            local,
            remote: remote_desc,
            link: None,
            state: Mutex::new(SendState {
                proto: SendSide::new(layout),
                failed: Failure::default(),
                completed_any: false,
            }),
        })
    }
}

#[derive(Debug)]
struct SendState {
    proto: SendSide,
    failed: Failure,
    completed_any: bool,
}

/// A connected send comm. `isend`/`test` come from NCCL's progress thread; the lock only guards
/// against `regMr` on the service thread racing it.
#[derive(Debug)]
pub struct SendComm {
    ctx: Arc<DeviceContext>,
    qps: QpSet,
    cts_ring: HostRegion,
    sizes_staging: HostRegion,
    remote_sizes_addr: u64,
    remote_sizes_rkeys: Vec<u32>,
    layout: Layout,
    local: String,
    remote: String,
    /// The out-of-band connection, watched for the receiver's end; set when the handshake ends.
    link: Option<Watched>,
    state: Mutex<SendState>,
}

impl SendComm {
    /// The device context the comm lives on.
    pub fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// Start sending `size` bytes at `addr`; `Ok(None)` until the receiver posted a buffer with
    /// this tag in the message at the head of the CTS ring. Returns the request index.
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
    ) -> Result<Option<usize>> {
        check_message_size(size, "a send")?;
        mr.check(addr, size)?;
        let mut st = self.state.lock();
        st.failed.check()?;
        if let Err(e) = self.check_alive() {
            return Err(st.failed.record(e));
        }
        if let Some((seq, slot)) = st.proto.wants_cts() {
            match self.read_cts(seq, slot) {
                Ok(Some(entries)) => st.proto.handle_cts(entries)?,
                Ok(None) => return Ok(None),
                Err(e) => return Err(st.failed.record(e)),
            }
        }
        let Some(accepted) = st.proto.isend(SendBuf {
            addr,
            size,
            lkeys: mr.lkeys(),
            tag,
        })?
        else {
            return Ok(None);
        };
        if let Some((asked, sent)) = accepted.truncated {
            tracing::trace!(
                "isend of {asked} bytes truncated to the posted receive size {sent} ({})",
                self.remote
            );
        }
        let posted = self.post(&accepted.posts);
        st.proto.recycle(accepted.posts);
        if let Err(e) = posted {
            return Err(st.failed.record(e));
        }
        Ok(Some(accepted.slot * MAX_RECVS + accepted.entry))
    }

    /// Poll request `index`: `Some(bytes sent)` when done (and then forgotten).
    ///
    /// # Errors
    /// The comm's failure (error completion), or `Misuse` for an index that is not in flight.
    pub fn test(&self, index: usize) -> Result<Option<u64>> {
        let (slot, entry) = (index / MAX_RECVS, index % MAX_RECVS);
        let mut st = self.state.lock();
        st.failed.check()?;
        if st.proto.poll_done(slot, entry).is_none() {
            self.progress(&mut st)?;
        }
        let done = st.proto.poll_done(slot, entry);
        if done.is_some() {
            st.proto.release(slot, entry);
        } else if let Err(e) = self.check_alive() {
            return Err(st.failed.record(e));
        }
        Ok(done)
    }

    /// `Err` once the device failed or the receiver is gone (closed its comm, or its process).
    fn check_alive(&self) -> Result<()> {
        check_alive(&self.ctx, self.link.as_ref(), "receive comm")
    }

    /// The ring slot's entries once all of them carry `seq + 1`.
    fn read_cts(&self, seq: u64, slot: usize) -> Result<Option<Group<Cts>>> {
        let base = slot * MAX_RECVS * Cts::LEN;
        let want = seq + 1;
        if self.cts_ring.read_u64_acquire(base + Cts::SEQ_OFFSET) != want {
            return Ok(None);
        }
        let entry = |i: usize| Cts::parse(&self.cts_ring.read(base + i * Cts::LEN));
        let first = entry(0);
        let n = first.nreqs as usize;
        if !(1..=MAX_RECVS).contains(&n) {
            return Err(Error::new(
                Kind::Remote,
                format!("peer posted a CTS with {n} buffers ({})", self.remote),
            ));
        }
        let arrived = |i: usize| {
            let at = base + i * Cts::LEN;
            self.cts_ring.read_u64_acquire(at + Cts::SEQ_OFFSET) == want
        };
        if !(1..n).all(arrived) {
            return Ok(None);
        }
        Ok(Some(
            std::iter::once(first).chain((1..n).map(entry)).collect(),
        ))
    }

    /// Post `posts` (grouped by QP, in order) as one chain per QP.
    fn post(&self, posts: &[Post]) -> Result<()> {
        let mut chain = [WorkRequest::EMPTY; CHAIN];
        let (mut len, mut chain_qp) = (0, 0);
        for p in posts {
            let (qp, wr) = self.work_request(p)?;
            if len > 0 && (qp != chain_qp || len == CHAIN) {
                self.post_chain(chain_qp, &chain[..len])?;
                len = 0;
            }
            chain_qp = qp;
            chain[len] = wr;
            len += 1;
        }
        self.post_chain(chain_qp, &chain[..len])
    }

    fn post_chain(&self, qp: usize, wrs: &[WorkRequest]) -> Result<()> {
        // SAFETY: payload memory is NCCL's, valid until test() reports done (isend's contract);
        // the sizes staging slot is rewritten only after this slot's completion.
        unsafe { self.qps.qps[qp].post_send(wrs) }
    }

    fn work_request(&self, p: &Post) -> Result<(usize, WorkRequest)> {
        let request = |w: &RdmaWrite, wr_id: u64, op: Op, signaled: bool| {
            let len =
                u32::try_from(w.len).map_err(|_| Error::misuse("message larger than 4 GiB"))?;
            let wr = WorkRequest {
                wr_id,
                op,
                local_addr: w.local_addr,
                len,
                lkey: w.lkey,
                remote_addr: w.remote_addr,
                rkey: w.rkey,
                signaled,
            };
            Ok((w.qp, wr))
        };
        match *p {
            Post::Write(w) => request(&w, WR_DATA, Op::Write, false),
            Post::WriteImm { write, imm, slot } => {
                request(&write, WR_SEND_DONE | slot as u64, Op::WriteImm(imm), true)
            }
            Post::Sizes { qp, slot, sizes } => {
                let mut bytes = [0u8; SIZES_SLOT_BYTES];
                for (chunk, size) in bytes.chunks_exact_mut(8).zip(sizes) {
                    chunk.copy_from_slice(&size.to_le_bytes());
                }
                let offset = slot * SIZES_SLOT_BYTES;
                self.sizes_staging.write(offset, &bytes);
                let write = RdmaWrite {
                    qp,
                    local_addr: self.sizes_staging.addr(offset),
                    lkey: self.sizes_staging.mr(self.layout.local_member(qp)).lkey(),
                    len: SIZES_SLOT_BYTES as u64,
                    remote_addr: self.remote_sizes_addr + offset as u64,
                    rkey: self.remote_sizes_rkeys[self.layout.remote_member(qp)],
                };
                request(&write, WR_DATA, Op::Write, false)
            }
        }
    }

    fn progress(&self, st: &mut SendState) -> Result<()> {
        self.qps.drain(|_, c| self.handle(st, c))
    }

    fn handle(&self, st: &mut SendState, c: &Completion) -> Result<()> {
        if !c.is_ok() {
            let e = completion_error(
                &self.ctx,
                self.link.as_ref(),
                c,
                &self.local,
                &self.remote,
                st.completed_any,
            );
            return Err(st.failed.record(e));
        }
        if c.wr_id & !WR_INDEX_MASK == WR_SEND_DONE {
            st.completed_any = true;
            let slot = usize::try_from(c.wr_id & WR_INDEX_MASK).unwrap_or(usize::MAX);
            if let Err(e) = st.proto.handle_completion(slot) {
                return Err(st.failed.record(e));
            }
        }
        Ok(())
    }
}
