//! The listen comm and its resumable accept.
//!
//! A listen comm serves any number of accepts, one after another, for as long as it is open:
//! NCCL's own transport frees its accept state when an accept completes (`ncclIbAcceptImpl`,
//! net_ib/connect.cc), and clients keep one listen comm per device and connect to its handle
//! again for every new pair of comms.
//!
//! The listen comms of a device share its one listening socket (see [`super::door`]), which
//! hands each its connectors: only those that presented a hello carrying this listen comm's nonce
//! (proof that they hold the handle). A proven peer that then fails (incompatible setup, vanished
//! before the ready byte) fails that accept only; the next accept serves the next peer.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::DeviceContext;
use super::conn::random_u64;
use super::door::{Door, Proven};
use super::peer_link::{Claim, Watched, claim_accepted, process_id};
use super::recv::RecvComm;
use super::watch::Tended;
use super::wire_io::HandshakeStream;
use crate::core::error::{Error, Kind, Result};
use crate::core::links::{Answer, Proposal};
use crate::core::wire::ListenHandle;

/// One connector the door handed to this listen comm.
#[derive(Debug)]
enum Incoming {
    /// Its hello named this listen comm; nothing built yet.
    Proven(Proven),
    /// Proven: the receive comm is built and the reply queued; waiting for the ready byte.
    Ready {
        stream: HandshakeStream,
        comm: Box<RecvComm>,
        /// Its channel on the link the connector proposed, when it joined.
        claim: Option<Claim>,
    },
}

/// What one incoming connection did on this call.
enum Step {
    Waiting(Incoming),
    Accepted(Box<RecvComm>),
    Failed(Error),
}

#[derive(Debug, Default)]
struct Acceptor {
    /// Deadline of the accept in progress; `None` when none is (the next call starts one).
    deadline: Option<Instant>,
    incoming: Vec<Incoming>,
}

/// A listening endpoint. `closeListen` may come without any accept (NCCL does that with shared
/// connections).
#[derive(Debug)]
pub struct ListenComm {
    ctx: Arc<DeviceContext>,
    door: Arc<Door>,
    handle: ListenHandle,
    acceptor: Mutex<Acceptor>,
}

impl ListenComm {
    /// Listen at the device's door (opened with its first listen comm).
    ///
    /// # Errors
    /// `System` when the device's listening socket cannot be bound.
    pub fn new(ctx: Arc<DeviceContext>) -> Result<Self> {
        let door = ctx.door()?;
        let handle = ListenHandle {
            addr: door.addr(),
            nonce: random_u64(),
            members: u8::try_from(ctx.ports.len()).unwrap_or(1),
            process: if ctx.config.share_links {
                process_id()
            } else {
                0
            },
        };
        door.expect(handle.nonce);
        Ok(Self {
            ctx,
            door,
            handle,
            acceptor: Mutex::new(Acceptor::default()),
        })
    }

    /// What `listen` returns to NCCL for the peer.
    pub fn handle(&self) -> ListenHandle {
        self.handle
    }

    /// Advance the accept in progress, or start one; `Ok(Some)` when a peer is connected.
    ///
    /// # Errors
    /// For this accept only (the listen comm stays usable): `Remote` when no peer proved itself
    /// before `NCCL_NET_RS_CONNECT_TIMEOUT` or a proven peer vanished; `Config` for an
    /// incompatible peer; `System` for verbs or socket failures.
    pub fn accept(&self) -> Result<Option<Tended<RecvComm>>> {
        let mut acceptor = self.acceptor.lock();
        let now = Instant::now();
        let deadline = *acceptor
            .deadline
            .get_or_insert(now + self.ctx.config.connect_timeout);
        let outcome = self.advance(&mut acceptor, now, deadline);
        if !matches!(outcome, Ok(None)) {
            acceptor.deadline = None;
        }
        outcome
    }

    fn advance(
        &self,
        acceptor: &mut Acceptor,
        now: Instant,
        deadline: Instant,
    ) -> Result<Option<Tended<RecvComm>>> {
        let arrived = self.door.arrivals_for(self.handle.nonce, now)?;
        acceptor
            .incoming
            .extend(arrived.into_iter().map(Incoming::Proven));
        let mut entries = std::mem::take(&mut acceptor.incoming).into_iter();
        for entry in entries.by_ref() {
            match self.step(entry, deadline) {
                Step::Waiting(entry) => acceptor.incoming.push(entry),
                Step::Accepted(comm) => {
                    acceptor.incoming.extend(entries);
                    return Tended::new(*comm).map(Some);
                }
                Step::Failed(e) => {
                    acceptor.incoming.extend(entries);
                    return Err(e);
                }
            }
        }
        if now > deadline {
            return Err(Error::new(
                Kind::Remote,
                format!(
                    "no peer connected to {} before the deadline (NCCL_NET_RS_CONNECT_TIMEOUT)",
                    self.handle.addr
                ),
            ));
        }
        Ok(None)
    }

    fn step(&self, entry: Incoming, deadline: Instant) -> Step {
        match entry {
            Incoming::Proven(Proven {
                mut stream,
                hello: remote,
            }) => {
                // A connector that shares links sent its proposal right behind its hello.
                let proposal = if remote.shares_links {
                    match stream.receive(Proposal::LEN) {
                        Ok(Some(bytes)) => match Proposal::parse(&bytes) {
                            Ok(p) => Some(p),
                            Err(e) => {
                                return Step::Failed(Error::new(
                                    e.kind(),
                                    format!("peer {} {e}", stream.peer),
                                ));
                            }
                        },
                        Ok(None) => {
                            return Step::Waiting(Incoming::Proven(Proven {
                                stream,
                                hello: remote,
                            }));
                        }
                        Err(e) => return Step::Failed(e),
                    }
                } else {
                    None
                };
                let sharing = proposal.filter(|_| self.ctx.config.share_links);
                // From here on a failure is this accept's error.
                match RecvComm::build(&self.ctx, &remote, stream.peer) {
                    Ok((comm, mut hello)) => {
                        let claim = sharing.and_then(|p| {
                            claim_accepted(&p, stream.peer.ip(), remote.connect_nonce)
                        });
                        hello.shares_links = sharing.is_some();
                        stream.queue(&hello.emit());
                        if hello.shares_links {
                            stream.queue(
                                &Answer {
                                    joined: claim.is_some(),
                                }
                                .emit(),
                            );
                        }
                        stream.deadline = deadline;
                        Step::Waiting(Incoming::Ready {
                            stream,
                            comm: Box::new(comm),
                            claim,
                        })
                    }
                    Err(e) => Step::Failed(e),
                }
            }
            Incoming::Ready {
                mut stream,
                comm,
                claim,
            } => {
                if stream.expired() {
                    return Step::Failed(stream.late("send its ready byte"));
                }
                let ready = stream.flush().and_then(|_| stream.receive(1));
                match ready {
                    Ok(Some(_)) => {
                        let mut comm = comm;
                        let peer = stream.peer;
                        let framed = comm.state.get_mut().failover.is_some();
                        let link = match claim {
                            // The handshake connection closes here: the comm is on the link.
                            Some(claim) => Ok(Watched::joined(claim)),
                            None => Watched::own(stream.into_stream(), peer, framed),
                        };
                        match link {
                            Ok(link) => {
                                comm.link = Some(link);
                                Step::Accepted(comm)
                            }
                            Err(e) => Step::Failed(e),
                        }
                    }
                    Ok(None) => Step::Waiting(Incoming::Ready {
                        stream,
                        comm,
                        claim,
                    }),
                    Err(e) => Step::Failed(e),
                }
            }
        }
    }
}

impl Drop for ListenComm {
    fn drop(&mut self) {
        self.door.forget(self.handle.nonce);
    }
}
