//! The resumable connect state machine of a send comm: dial the listener, send the hello,
//! take the reply, bring the QPs up and build the comm.

use super::*;
use crate::core::links::{Answer, Proposal};
use crate::transport::peer_link::{Claim, LinkTo, LinkWait, link_to, process_id};

/// How long one attempt to open the TCP connection may block an NCCL call.
const DIAL_ATTEMPT: Duration = Duration::from_millis(100);

/// Resources built once the TCP connection is up, before the peer answered.
#[derive(Debug)]
struct Pending {
    qps: QpSet,
    rings: HostRegion,
    /// What this side sent; the reply must answer it.
    hello: Hello,
    /// The peer's reply, once it arrived, while its link answer is still on its way.
    reply: Option<Box<Hello>>,
}

/// Where the comm's out-of-band messages will go.
#[derive(Debug)]
enum LinkPlan {
    /// Not decided yet: the first dial decides.
    Undecided,
    /// Waiting for the link to the listener's process to open.
    Waiting(LinkWait),
    /// Proposed (or to be proposed) on this channel of a link.
    Proposed(Claim),
    /// Its handshake connection, kept as its own.
    Own,
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
    /// This connect's nonce: the reply must echo it, and it names the comm's channel on a link.
    connect_nonce: u64,
    link: LinkPlan,
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
            connect_nonce: random_u64(),
            link: LinkPlan::Undecided,
        }
    }

    /// True when NCCL stopped calling this connect: its deadline passed a minute before `now`.
    pub fn abandoned(&self, now: Instant) -> bool {
        now > self.deadline + Duration::from_secs(60)
    }

    /// Advance without blocking (beyond one short dial attempt); `Ok(Some)` when connected.
    ///
    /// # Errors
    /// `Remote` when the peer refuses, closes, or misses the deadline; `Config` when the peer's
    /// setup is incompatible; `System` for verbs failures.
    pub fn progress(&mut self) -> Result<Option<Tended<SendComm>>> {
        let peer = self.handle.addr;
        loop {
            let stage = self
                .stage
                .take()
                .ok_or_else(|| Error::misuse("connect resumed after it failed"))?;
            let next = match stage {
                Stage::Dial if !self.plan_link() => {
                    if Instant::now() > self.deadline {
                        return Err(Error::new(
                            Kind::Remote,
                            format!(
                                "cannot connect to peer {peer}: it did not acknowledge the out-of-band link before the deadline (NCCL_NET_RS_CONNECT_TIMEOUT; is the peer process alive and accepting?)"
                            ),
                        ));
                    }
                    self.stage = Some(Stage::Dial);
                    return Ok(None);
                }
                Stage::Dial => match TcpStream::connect_timeout(&peer, DIAL_ATTEMPT) {
                    Ok(tcp) => {
                        let mut stream = HandshakeStream::new(tcp, peer, self.deadline)?;
                        let mut pending = self.build()?;
                        if let LinkPlan::Proposed(claim) = &self.link {
                            pending.hello.shares_links = true;
                            stream.queue(&pending.hello.emit());
                            let proposal = Proposal {
                                process: process_id(),
                                link: claim.link_number(),
                            };
                            stream.queue(&proposal.emit());
                        } else {
                            stream.queue(&pending.hello.emit());
                        }
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
                    Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                        return Err(socket_error(format!("cannot connect to peer {peer}"), e));
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
                    mut pending,
                } => {
                    if stream.expired() {
                        return Err(stream.late("answer with its QP numbers"));
                    }
                    stream.flush()?;
                    let remote = match pending.reply.take() {
                        Some(remote) => remote,
                        None => {
                            let Some(bytes) = stream.receive(Hello::LEN)? else {
                                self.stage = Some(Stage::Exchange { stream, pending });
                                return Ok(None);
                            };
                            let remote = Hello::parse(&bytes)
                                .and_then(|h| h.check_reply(&pending.hello).map(|()| h))
                                .map_err(|e| Error::new(e.kind(), format!("peer {peer} {e}")))?;
                            Box::new(remote)
                        }
                    };
                    if remote.shares_links {
                        let Some(bytes) = stream.receive(Answer::LEN)? else {
                            pending.reply = Some(remote);
                            self.stage = Some(Stage::Exchange { stream, pending });
                            return Ok(None);
                        };
                        self.take_answer(&bytes)
                            .map_err(|e| Error::new(e.kind(), format!("peer {peer} {e}")))?;
                    } else {
                        // A peer that does not share links (or not with us): its own connection.
                        self.link = LinkPlan::Own;
                    }
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
                        let framed = comm.state.get_mut().failover.is_some();
                        comm.link = Some(match std::mem::replace(&mut self.link, LinkPlan::Own) {
                            // The handshake connection closes here: the comm is on the link.
                            LinkPlan::Proposed(claim) => Watched::joined(claim),
                            _ => Watched::own(stream.into_stream(), peer, framed)?,
                        });
                        return Tended::new(*comm).map(Some);
                    }
                    self.stage = Some(Stage::Ready { stream, comm });
                    return Ok(None);
                }
            };
            self.stage = Some(next);
        }
    }

    /// Decide where the comm's out-of-band messages go, before its first dial: its channel on
    /// the link to the listener's process when both sides share links. `false` while that
    /// link is still being opened (the call returns and the next one asks again).
    fn plan_link(&mut self) -> bool {
        let wait = match std::mem::replace(&mut self.link, LinkPlan::Own) {
            LinkPlan::Undecided if self.ctx.config.share_links && self.handle.process != 0 => None,
            LinkPlan::Undecided => return true,
            LinkPlan::Waiting(wait) => Some(wait),
            decided => {
                self.link = decided;
                return true;
            }
        };
        self.link = match link_to(&self.handle, self.connect_nonce, wait) {
            LinkTo::Waiting(wait) => {
                self.link = LinkPlan::Waiting(wait);
                return false;
            }
            LinkTo::Claimed(claim) => LinkPlan::Proposed(claim),
            LinkTo::Alone => LinkPlan::Own,
        };
        true
    }

    /// The listener's answer to our proposal: the comm joins the link, or keeps its own
    /// connection.
    fn take_answer(&mut self, bytes: &[u8]) -> Result<()> {
        let answer = Answer::parse(bytes)?;
        match std::mem::replace(&mut self.link, LinkPlan::Own) {
            LinkPlan::Proposed(mut claim) if answer.joined => {
                claim.agree();
                self.link = LinkPlan::Proposed(claim);
                Ok(())
            }
            LinkPlan::Proposed(_) => Ok(()),
            _ => Err(Error::new(
                Kind::Remote,
                "answered a link proposal this side never made",
            )),
        }
    }

    fn build(&self) -> Result<Pending> {
        let nqps = connection_qps(&self.ctx, usize::from(self.handle.members));
        let config = &self.ctx.config;
        let qps = QpSet::new(
            &self.ctx,
            self.ctx.current_gids(),
            (nqps, usize::from(self.handle.members)),
            (SEND_QP_CAPS, Access::REMOTE_WRITE),
            (config.batch, config.port_failover),
        )?;
        let rings = self.ctx.rings.carve(
            SEND_RINGS_BYTES,
            Access::LOCAL_WRITE.with(Access::REMOTE_WRITE),
        )?;
        let nonces = Nonces {
            listen: self.handle.nonce,
            connect: self.connect_nonce,
        };
        let mut hello = local_hello(
            &self.ctx,
            &qps,
            Role::Connect,
            nonces,
            &rings,
            self.ctx.config.split_data_on_qps,
            self.traffic,
        );
        let offer = agreed_eager_bytes(&self.ctx.config, nqps, u64::MAX);
        hello.eager_bytes = u32::try_from(offer).unwrap_or(0);
        Ok(Pending {
            qps,
            rings,
            hello,
            reply: None,
        })
    }

    fn finish(&self, pending: Pending, remote: &Hello, peer: SocketAddr) -> Result<SendComm> {
        check_peer(&self.ctx, &pending.qps.gids, remote, peer)?;
        let config = &self.ctx.config;
        pending.qps.connect(&self.ctx, remote, self.traffic)?;
        let nqps = pending.qps.len();
        let eager_bytes = agreed_eager_bytes(config, nqps, u64::from(remote.eager_bytes));
        let quiet = quiet_receives(config, eager_bytes, remote);
        let layout = Layout {
            nqps,
            split: config.split_data_on_qps,
            local_members: self.ctx.ports.len(),
            remote_members: remote.members.len(),
            eager_bytes,
            quiet,
            bounce_slots: bounce_slots(
                pending.hello.bounce_slots,
                remote.bounce_slots,
                eager_bytes,
                quiet,
            ),
        };
        // With quiet receives, eager payloads are copied here before they go (see
        // `core::proto`).
        let eager_staging = if layout.quiet {
            let ring = eager::ring_bytes(eager_bytes, layout.bounce_slots) as usize;
            Some(self.ctx.rings.carve(ring, Access::LOCAL_WRITE)?)
        } else {
            None
        };
        let proto = match &eager_staging {
            Some(region) => {
                let mut lkeys = [0; MAX_FUSED_MEMBERS];
                for (member, lkey) in lkeys.iter_mut().enumerate().take(self.ctx.ports.len()) {
                    *lkey = region.mr(member).lkey();
                }
                let staging = Staging {
                    addr: region.addr(0),
                    lkeys,
                };
                SendSide::with_staging(layout, staging)
            }
            None => SendSide::new(layout),
        };
        let local = describe_local(&self.ctx, &pending.qps.gids);
        let remote_desc = describe_remote(remote, peer);
        let all_infiniband = self
            .ctx
            .ports
            .iter()
            .all(|p| p.net.link_layer == LinkLayer::InfiniBand);
        let split_above = config.adaptive_routing_split(all_infiniband);
        tracing::debug!(
            "send comm connected: {local} -> {remote_desc}, {} QPs, {}, {}, {}",
            layout.nqps,
            pending.qps.describe_qos(self.traffic),
            describe_eager(&layout),
            split_above.map_or("no adaptive-routing split".to_owned(), |t| format!(
                "adaptive routing: data writes over {t} bytes split"
            ))
        );
        let failover = failover_agreed(&pending.hello, remote, layout.quiet)
            .then(|| Box::new(Failover::follow(&self.ctx, layout, remote.members.clone())));
        log_failover(&self.ctx, failover.is_some(), &remote_desc);
        Ok(SendComm {
            ctx: Arc::clone(&self.ctx),
            qps: pending.qps,
            traffic: self.traffic,
            rings: pending.rings,
            cts_layout: CtsLayout::with_peer(remote.revision),
            eager_staging,
            remote_sizes_addr: remote.ring_addr,
            remote_sizes_rkeys: remote.members.iter().map(|m| m.ring_rkey).collect(),
            layout,
            split_above: split_above.unwrap_or(u64::MAX),
            local,
            remote: remote_desc,
            link: None,
            state: Mutex::new(SendState {
                proto,
                failed: Failure::default(),
                completed_any: false,
                client: ClientProgress::default(),
                events: Events::new(SEND_REQUESTS),
                failover,
            }),
        })
    }
}
