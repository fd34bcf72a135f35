//! The listen comm and its resumable accept.
//!
//! A listen comm serves any number of accepts, one after another, for as long as it is open:
//! NCCL's own transport frees its accept state when an accept completes (`ncclIbAcceptImpl`,
//! net_ib/connect.cc), and clients keep one listen comm per device and connect to its handle
//! again for every new pair of comms.
//!
//! Every TCP connection that reaches the listener is an *incoming* connection with its own
//! deadline. It becomes the peer of an accept only once it presented a hello carrying this
//! listener's nonce (proof that it holds the handle); anything else (a port scanner, a health
//! check, noise, a handshake for another listener, silence) is dropped with one INFO line and the
//! accept goes on waiting. A proven peer that then fails (incompatible setup, vanished before the
//! ready byte) fails that accept only; the next accept serves the next peer.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::DeviceContext;
use super::conn::random_u64;
use super::recv::RecvComm;
use super::watch::Tended;
use super::watch::Watched;
use super::wire_io::{HandshakeStream, socket_error};
use crate::core::error::{Error, Kind, Result};
use crate::core::wire::{Hello, ListenHandle};

/// How long a new TCP connection may take to present its hello before it is dropped. A real peer
/// sends it right after connecting.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Unproven connections kept at once; beyond that the oldest is dropped, so a flood of half-open
/// intruders cannot lock the real peer out.
const MAX_INCOMING: usize = 64;

/// One TCP connection the listener accepted.
#[derive(Debug)]
enum Incoming {
    /// Waiting for the connector's hello (unproven).
    Hello(HandshakeStream),
    /// Proven: the receive comm is built and the reply queued; waiting for the ready byte.
    Ready {
        stream: HandshakeStream,
        comm: Box<RecvComm>,
    },
}

/// What one incoming connection did on this call.
enum Step {
    Waiting(Incoming),
    Dropped(String),
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
    listener: TcpListener,
    handle: ListenHandle,
    acceptor: Mutex<Acceptor>,
}

impl ListenComm {
    /// Listen on the device's out-of-band address.
    ///
    /// # Errors
    /// `System` when the socket cannot be bound.
    pub fn new(ctx: Arc<DeviceContext>) -> Result<Self> {
        let bind = SocketAddr::new(ctx.oob_ip(), 0);
        let listener = TcpListener::bind(bind)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| socket_error(format!("cannot listen on {bind}"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::system("getsockname on the listener", e))?;
        let handle = ListenHandle {
            addr,
            nonce: random_u64(),
            members: u8::try_from(ctx.ports.len()).unwrap_or(1),
        };
        Ok(Self {
            ctx,
            listener,
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
        self.take_new_connections(acceptor, now)?;
        let mut entries = std::mem::take(&mut acceptor.incoming).into_iter();
        for entry in entries.by_ref() {
            match self.step(entry, deadline) {
                Step::Waiting(entry) => acceptor.incoming.push(entry),
                Step::Dropped(why) => tracing::info!(
                    "NET/{}: listener {} dropped a connection: {why}",
                    crate::plugin::PLUGIN_NAME,
                    self.handle.addr
                ),
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

    /// Move every connection waiting in the kernel's backlog into `incoming`.
    fn take_new_connections(&self, acceptor: &mut Acceptor, now: Instant) -> Result<()> {
        loop {
            match self.listener.accept() {
                Ok((tcp, peer)) => {
                    let stream = match HandshakeStream::new(tcp, peer, now + HELLO_TIMEOUT) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::info!("NET/{}: {e}", crate::plugin::PLUGIN_NAME);
                            continue;
                        }
                    };
                    if acceptor.incoming.len() >= MAX_INCOMING {
                        evict_oldest_unproven(acceptor, self.handle.addr);
                    }
                    acceptor.incoming.push(Incoming::Hello(stream));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The connection died in the backlog (reset before we took it): not our problem.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
                Err(e) => {
                    return Err(socket_error(format!("accept on {}", self.handle.addr), e));
                }
            }
        }
    }

    fn step(&self, entry: Incoming, deadline: Instant) -> Step {
        match entry {
            Incoming::Hello(mut stream) => {
                if stream.expired() {
                    return Step::Dropped(format!(
                        "peer {} sent no hello within {} s",
                        stream.peer,
                        HELLO_TIMEOUT.as_secs()
                    ));
                }
                let bytes = match stream.receive(Hello::LEN) {
                    Ok(Some(bytes)) => bytes,
                    Ok(None) => return Step::Waiting(Incoming::Hello(stream)),
                    Err(e) => return Step::Dropped(e.to_string()),
                };
                let remote = match Hello::parse(&bytes)
                    .and_then(|h| h.check_hello(self.handle.nonce).map(|()| h))
                {
                    Ok(remote) => remote,
                    Err(e) => return Step::Dropped(format!("peer {} {e}", stream.peer)),
                };
                // Proven: from here on a failure is this accept's error.
                match RecvComm::build(&self.ctx, &remote, stream.peer) {
                    Ok((comm, hello)) => {
                        stream.queue(&hello.emit());
                        stream.deadline = deadline;
                        Step::Waiting(Incoming::Ready {
                            stream,
                            comm: Box::new(comm),
                        })
                    }
                    Err(e) => Step::Failed(e),
                }
            }
            Incoming::Ready { mut stream, comm } => {
                if stream.expired() {
                    return Step::Failed(stream.late("send its ready byte"));
                }
                let ready = stream.flush().and_then(|_| stream.receive(1));
                match ready {
                    Ok(Some(_)) => {
                        let mut comm = comm;
                        let peer = stream.peer;
                        let framed = comm.state.get_mut().failover.is_some();
                        match Watched::new(stream.into_stream(), peer, framed) {
                            Ok(link) => {
                                comm.link = Some(link);
                                Step::Accepted(comm)
                            }
                            Err(e) => Step::Failed(e),
                        }
                    }
                    Ok(None) => Step::Waiting(Incoming::Ready { stream, comm }),
                    Err(e) => Step::Failed(e),
                }
            }
        }
    }
}

fn evict_oldest_unproven(acceptor: &mut Acceptor, addr: SocketAddr) {
    let oldest = acceptor
        .incoming
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Incoming::Hello(s) => Some((i, s.deadline)),
            Incoming::Ready { .. } => None,
        })
        .min_by_key(|&(_, d)| d);
    if let Some((i, _)) = oldest {
        let Incoming::Hello(s) = acceptor.incoming.remove(i) else {
            return;
        };
        tracing::info!(
            "NET/{}: listener {addr} dropped a connection: peer {} had not sent its hello \
             while {MAX_INCOMING} connections were pending",
            crate::plugin::PLUGIN_NAME,
            s.peer
        );
    }
}
