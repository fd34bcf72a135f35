//! The out-of-band connections comms keep after their handshake, which tell them when their
//! peer is gone and carry their failover frames: one TCP connection shared by every comm
//! between two processes (a *link*, see `core::links`), or, with a peer that predates links or
//! with `NCCL_NET_RS_SHARE_LINKS=0`, one of its own per comm.
//!
//! - **Liveness.** On an orderly `closeSend`/`closeRecv` the closing comm writes its goodbye
//!   (on a link, a message naming its channel; on its own connection, one byte) before it lets
//!   go; a peer process that exits or is killed closes its connections without one (the
//!   kernel closes its sockets), and every comm on them reads as gone. The watcher thread sees
//!   either within milliseconds and records it in the comm's [`PeerLink`], which
//!   `isend`/`irecv`/`test` read with one atomic load.
//! - **Descriptors.** A process dials one link per peer process and listener address (its
//!   comms to that device of that process join it), and accepts the links the peers dial to
//!   it: descriptors grow with peer processes, not with comms (NCCL's transport keeps one
//!   socket per comm: at 16,384 comms, the 64k limit of many containers). A link closes with
//!   the last comm on it at either end; the other end then sees it close with no comm left
//!   that it could concern.
//! - **Work.** Reading a link takes what arrived and hands each message to its comm through a
//!   map: a wake-up costs what arrived, never a walk of the comms on the link. Only its end
//!   (the peer process gone) touches every comm on it, once. What the watcher sends while it
//!   tends the comms due ([`corked`]) goes out in one write per connection, not one per
//!   message: a repair storm sends a few messages per comm, and on loopback every write also
//!   costs the peer's kernel and watcher a wake-up.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::conn::random_u64;
use super::door::HELLO_TIMEOUT;
use super::watch::{NOT_TENDED, Target, WATCHER, Watcher};
use super::wire_io::HandshakeStream;
use crate::core::error::{Error, Kind, Result};
use crate::core::links::{Body, LINK_ACK, LinkHello, LinkMessage, MAX_LINK_MESSAGE, Proposal};
use crate::core::repair::{Frame, GOODBYE, MAX_FRAME_LEN};
use crate::core::wire::ListenHandle;
use crate::plugin::PLUGIN_NAME;
use crate::verbs::peer_hung_up;

/// How long after a peer's orderly close its pending requests still may complete.
const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// How long one attempt to open a link may block an NCCL call.
const DIAL_ATTEMPT: Duration = Duration::from_millis(100);

/// How many bytes of messages a corked connection holds before it writes them out anyway: a
/// dozen messages, so the first of a long pass waits for a few comms' progress, not for all.
const CORK_BYTES: usize = 256;

/// The channel of the one comm on a connection of its own.
const OWN_CHANNEL: u64 = 0;

const ALIVE: u8 = 0;
const CLOSED: u8 = 1;
const DIED: u8 = 2;

/// This process, as links and handles name it (random, never 0).
pub(super) fn process_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        loop {
            let id = random_u64();
            if id != 0 {
                break id;
            }
        }
    })
}

/// What became of the peer at the other end of a comm.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum PeerState {
    /// Still there.
    Alive,
    /// Closed its comm in order (`closeSend`/`closeRecv`).
    Closed,
    /// Its process exited or was killed (the connection closed without a goodbye).
    Died,
}

/// Where a link is listed, for the comms that may join it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
enum Listing {
    /// Dialed by this process to a listener of `process` at `ip` (whichever of its doors:
    /// a door closes with its device's last listen comm, and NCCL closes those after each
    /// round of connects, so the next round's handles carry another port).
    Dialed { process: u64, ip: IpAddr },
    /// Accepted from `process`, which numbered it `link`.
    Accepted { process: u64, link: u64 },
}

/// A link's identity.
#[derive(Copy, Clone, Debug)]
struct Shared {
    link: u64,
    listing: Listing,
}

/// One TCP connection: a link, or a comm's own.
#[derive(Debug)]
pub(super) struct Connection {
    /// Taken (closed) under the lock when the last comm lets go, so the socket is closed when
    /// that `closeSend`/`closeRecv` returns even while the watcher still holds this, and the
    /// watcher never reads a closed fd.
    stream: Mutex<Option<TcpStream>>,
    fd: RawFd,
    peer: SocketAddr,
    /// `None` for a comm's own connection (the wire of builds before links).
    shared: Option<Shared>,
    /// A comm's own connection carries failover frames (both sides agreed on failover).
    framed: bool,
    /// The bytes of a message not complete yet.
    partial: Mutex<Vec<u8>>,
    /// Messages held back by [`corked`], written ahead of anything later (lock order: `stream`
    /// before this).
    held: Mutex<Vec<u8>>,
    /// The comms on it, by channel.
    channels: Mutex<HashMap<u64, Weak<PeerLink>>>,
    /// Still listed for new comms to join (cleared under the table's lock).
    listed: AtomicBool,
    watch_key: AtomicU64,
}

impl Connection {
    /// Watch `stream`, with `first` on it already (a comm's own connection): registered after
    /// the channel, so nothing that arrives finds it missing.
    fn open(
        stream: TcpStream,
        peer: SocketAddr,
        shared: Option<Shared>,
        framed: bool,
    ) -> Result<(Arc<Self>, Option<Arc<PeerLink>>)> {
        stream
            .set_nonblocking(true)
            .map_err(|e| Error::system(format!("watching the connection to {peer}"), e))?;
        let conn = Arc::new(Self {
            fd: stream.as_raw_fd(),
            stream: Mutex::new(Some(stream)),
            peer,
            shared,
            framed,
            partial: Mutex::new(Vec::new()),
            held: Mutex::new(Vec::new()),
            channels: Mutex::new(HashMap::new()),
            listed: AtomicBool::new(shared.is_some()),
            watch_key: AtomicU64::new(0),
        });
        let own = shared.is_none().then(|| conn.add_channel(OWN_CHANNEL));
        let key = Watcher::get()?.register(conn.fd, Target::Link(Arc::clone(&conn)))?;
        conn.watch_key.store(key, Ordering::Release);
        Ok((conn, own))
    }

    pub(super) fn fd(&self) -> RawFd {
        self.fd
    }

    fn add_channel(self: &Arc<Self>, channel: u64) -> Arc<PeerLink> {
        let link = Arc::new(PeerLink {
            conn: Arc::clone(self),
            channel,
            state: AtomicU8::new(ALIVE),
            closed_at: OnceLock::new(),
            frames: Mutex::new(Vec::new()),
            has_frames: AtomicBool::new(false),
            repairing: AtomicBool::new(false),
            tended_as: AtomicU64::new(NOT_TENDED),
        });
        self.channels.lock().insert(channel, Arc::downgrade(&link));
        link
    }

    /// Read what arrived (the watcher, when epoll says so); `false` once the connection is
    /// over (nothing more to watch).
    pub(super) fn on_readable(self: &Arc<Self>) -> bool {
        let open = self.read_from(&self.stream.lock());
        if !open {
            self.end();
        }
        open
    }

    /// Read what arrived without waiting for the watcher thread, which may not get a CPU for a
    /// while from clients that poll. Nothing when the watcher is reading it at the moment.
    fn pull(self: &Arc<Self>) {
        let open = match self.stream.try_lock() {
            Some(stream) => self.read_from(&stream),
            None => return,
        };
        if !open {
            self.end();
        }
    }

    fn read_from(&self, stream: &Option<TcpStream>) -> bool {
        let Some(mut stream) = stream.as_ref() else {
            // Closed by its last comm: nothing more to watch.
            return false;
        };
        let mut buf = [0u8; 4096];
        let mut due = Vec::new();
        let open = loop {
            match stream.read(&mut buf) {
                // The end of the stream: comms that had their goodbye closed in order, the others'
                // process is gone; a reset or other error is the same.
                Ok(0) => break false,
                Ok(n) => {
                    if !self.take(&buf[..n], &mut due) {
                        break false;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        make_due(&due);
        open
    }

    /// Hand what `bytes` complete to their comms, noting in `due` the tended ones; `false` when
    /// the peer sent something that is not a message (the connection is useless).
    fn take(&self, bytes: &[u8], due: &mut Vec<u64>) -> bool {
        let mut partial = self.partial.lock();
        partial.extend_from_slice(bytes);
        let channels = self.channels.lock();
        let comm = |channel| channels.get(&channel).and_then(Weak::upgrade);
        let mut at = 0;
        let ok = loop {
            let rest = &partial[at..];
            if rest.is_empty() {
                break true;
            }
            let (body, channel, used) = if self.shared.is_some() {
                match LinkMessage::parse(rest) {
                    Ok(Some((m, used))) => (m.body, m.channel, used),
                    Ok(None) => break true,
                    Err(e) => {
                        tracing::warn!("NET/{PLUGIN_NAME}: peer {}: {e}", self.peer);
                        break false;
                    }
                }
            } else if !self.framed || rest[0] == GOODBYE {
                // A comm's own connection carries its goodbye byte and, when framed, frames.
                let goodbye = if self.framed {
                    rest[0] == GOODBYE
                } else {
                    rest.contains(&GOODBYE)
                };
                at = partial.len();
                if let Some(link) = comm(OWN_CHANNEL) {
                    due.push(link.tended_as.load(Ordering::Acquire));
                    if goodbye {
                        link.said_goodbye();
                    }
                }
                break true;
            } else {
                match Frame::parse(rest) {
                    Ok(Some((frame, used))) => (Body::Frame(frame), OWN_CHANNEL, used),
                    Ok(None) => break true,
                    Err(e) => {
                        tracing::warn!("NET/{PLUGIN_NAME}: peer {}: {e}", self.peer);
                        break false;
                    }
                }
            };
            at += used;
            // A message for a comm closed here meanwhile concerns nobody.
            if let Some(link) = comm(channel) {
                link.take(body);
                due.push(link.tended_as.load(Ordering::Acquire));
            }
        };
        partial.drain(..at);
        ok
    }

    /// The connection is over: every comm on it that had no goodbye reads as gone, it is no
    /// longer listed, and it closes once no comm holds it.
    fn end(self: &Arc<Self>) {
        let comms: Vec<Arc<PeerLink>> = self
            .channels
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let due: Vec<u64> = comms
            .iter()
            .map(|link| {
                link.ended();
                link.tended_as.load(Ordering::Acquire)
            })
            .collect();
        make_due(&due);
        if self.shared.is_some() {
            TABLE.lock().forget(self);
        }
        if self.channels.lock().is_empty() {
            self.close();
        }
    }

    /// Write `bytes` after what is held back, or, inside [`corked`], hold them back too.
    fn write(self: &Arc<Self>, bytes: &[u8]) -> Result<()> {
        let full = CORKED.with(|corked| {
            let mut corked = corked.borrow_mut();
            let listed = corked.as_mut()?;
            if !listed.iter().any(|c| Arc::ptr_eq(c, self)) {
                listed.push(Arc::clone(self));
            }
            let mut held = self.held.lock();
            held.extend_from_slice(bytes);
            Some(held.len() >= CORK_BYTES)
        });
        match full {
            Some(false) => Ok(()),
            Some(true) => self.write_held(&[]),
            None => self.write_held(bytes),
        }
    }

    /// Write what is held back, then `bytes`.
    fn write_held(&self, bytes: &[u8]) -> Result<()> {
        let stream = self.stream.lock();
        let stream = stream.as_ref().ok_or_else(|| {
            Error::new(Kind::Remote, format!("connection to {} closed", self.peer))
        })?;
        let mut out = std::mem::take(&mut *self.held.lock());
        if out.is_empty() {
            return self.write_whole(stream, bytes);
        }
        out.extend_from_slice(bytes);
        self.write_whole(stream, &out)
    }

    /// Write `bytes` whole: a partial message would garble every later one on a link, so a
    /// write that fails shuts the connection down, and every comm on it reads as gone.
    fn write_whole(&self, mut stream: &TcpStream, bytes: &[u8]) -> Result<()> {
        let mut sent = 0;
        let deadline = Instant::now() + Duration::from_secs(1);
        while sent < bytes.len() {
            match stream.write(&bytes[sent..]) {
                Ok(n) => sent += n,
                // A few bytes into a socket whose buffer is full: the peer reads it within a
                // moment unless it is stuck, which the deadline reports.
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::yield_now();
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = stream.shutdown(Shutdown::Both);
                    return Err(Error::new(
                        Kind::Remote,
                        format!("sending a failover message to {}: {e}", self.peer),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Write `body` for the comm on `channel`.
    fn send(self: &Arc<Self>, channel: u64, body: Body) -> Result<()> {
        match (self.shared, body) {
            (Some(_), body) => {
                let mut out = [0u8; MAX_LINK_MESSAGE];
                let n = LinkMessage { channel, body }.emit(&mut out);
                self.write(&out[..n])
            }
            (None, Body::Frame(frame)) => {
                let mut out = [0u8; MAX_FRAME_LEN];
                let n = frame.emit(&mut out);
                self.write(&out[..n])
            }
            (None, Body::Goodbye) => self.write(&[GOODBYE]),
            // A comm's own connection says it by closing.
            (None, Body::Gone) => Ok(()),
        }
    }

    /// The comm on `channel` let go: the connection closes with its last comm (a link is
    /// unlisted first, under the table's lock, so no comm joins it meanwhile).
    fn release(self: &Arc<Self>, channel: u64) {
        let empty = {
            let mut channels = self.channels.lock();
            channels.remove(&channel);
            channels.is_empty()
        };
        if !empty {
            return;
        }
        if self.shared.is_some() {
            let mut table = TABLE.lock();
            if !self.channels.lock().is_empty() {
                return;
            }
            table.forget(self);
        }
        self.close();
    }

    /// Stop watching and close the socket (idempotent).
    fn close(&self) {
        if let Some(w) = WATCHER.get() {
            w.unregister(self.watch_key.load(Ordering::Acquire));
        }
        drop(self.stream.lock().take());
    }
}

thread_local! {
    /// The connections [`corked`] holds messages for on this thread, while it runs.
    static CORKED: RefCell<Option<Vec<Arc<Connection>>>> = const { RefCell::new(None) };
}

/// Run `tend`, holding back the messages it sends on each connection and writing them at the
/// end (or every [`CORK_BYTES`]) in one write: the watcher's pass over the comms due. A message
/// sent meanwhile from another thread writes what is held before it, so each comm's messages
/// keep their order.
pub(super) fn corked<T>(tend: impl FnOnce() -> T) -> T {
    struct Cork;
    impl Drop for Cork {
        fn drop(&mut self) {
            let listed = CORKED.with(|corked| corked.borrow_mut().take());
            for conn in listed.into_iter().flatten() {
                if let Err(e) = conn.write_held(&[]) {
                    tracing::debug!("NET/{PLUGIN_NAME}: {e}");
                }
            }
        }
    }
    CORKED.with(|corked| *corked.borrow_mut() = Some(Vec::new()));
    let _cork = Cork;
    tend()
}

/// Let the watcher tend the comms `keys` name (what arrived for them may need their progress).
fn make_due(keys: &[u64]) {
    if let Some(w) = WATCHER.get() {
        w.make_due(keys);
    }
}

/// One comm's end of its out-of-band connection, as the comm and the watcher see it.
#[derive(Debug)]
pub(super) struct PeerLink {
    conn: Arc<Connection>,
    channel: u64,
    state: AtomicU8,
    /// When the goodbye arrived.
    closed_at: OnceLock<Instant>,
    /// Frames that arrived, for the comm's next progress.
    frames: Mutex<Vec<Frame>>,
    /// Frames are waiting (read without their lock on every progress).
    has_frames: AtomicBool,
    /// The comm has a repair under way: the watcher keeps ticking it even while its client is
    /// in a call (a healthy comm busy in one needs no tick: that call makes its progress).
    repairing: AtomicBool,
    /// The tended comm this is for ([`NOT_TENDED`] when none): what arrives for it makes that
    /// comm due.
    tended_as: AtomicU64,
}

impl PeerLink {
    /// What the watcher last saw of the peer.
    pub(super) fn state(&self) -> PeerState {
        match self.state.load(Ordering::Acquire) {
            ALIVE => PeerState::Alive,
            CLOSED => PeerState::Closed,
            _ => PeerState::Died,
        }
    }

    /// Whether the peer has closed its end, seen now rather than from the watcher (which may
    /// be thousands of closes behind when a whole job tears down at once): on a link, what
    /// arrived is read first.
    pub(super) fn hung_up(&self) -> bool {
        if self.conn.shared.is_some() {
            self.conn.pull();
            if self.state() != PeerState::Alive {
                return true;
            }
        }
        self.conn.stream.lock().as_ref().is_none_or(peer_hung_up)
    }

    /// `Err` once the peer is gone: `what` names what the peer closed (its send or receive comm)
    /// for an orderly close. An orderly close fails pending requests only [`CLOSE_GRACE`] after
    /// the goodbye: completions the peer's last transfers owe us (an acknowledgement on the
    /// wire) may still be on their way.
    #[inline]
    pub(super) fn check(&self, what: &str) -> Result<()> {
        if self.state() == PeerState::Alive {
            return Ok(());
        }
        self.check_gone(what)
    }

    /// [`Self::check`] once the peer is no longer alive: out of line, as every poll that finds
    /// nothing asks.
    #[cold]
    fn check_gone(&self, what: &str) -> Result<()> {
        let peer = self.conn.peer;
        match self.state() {
            PeerState::Alive => Ok(()),
            PeerState::Closed
                if self
                    .closed_at
                    .get()
                    .is_none_or(|at| at.elapsed() < CLOSE_GRACE) =>
            {
                Ok(())
            }
            PeerState::Closed => Err(Error::new(
                Kind::Remote,
                format!("peer {peer} closed its {what} while this request was pending"),
            )),
            PeerState::Died => Err(Error::new(
                Kind::Remote,
                format!("peer {peer} closed its connection (process exited or was killed)"),
            )),
        }
    }

    /// Whether the comm said it has a repair under way ([`Self::set_repairing`]).
    pub(super) fn repairing(&self) -> bool {
        self.repairing.load(Ordering::Acquire)
    }

    /// The comm has a repair under way (`true`) or is healthy again. When one starts, the
    /// watcher is woken to tick the comm: a client that stops calling right after must not
    /// leave the repair waiting for the watcher's idle timeout.
    pub(super) fn set_repairing(&self, on: bool) {
        if self.repairing.swap(on, Ordering::AcqRel) != on && on {
            make_due(&[self.tended_as.load(Ordering::Acquire)]);
        }
    }

    /// Read what arrived without waiting for the watcher (a comm in the middle of a repair
    /// calls this now and then).
    pub(super) fn pull(&self) {
        self.conn.pull();
    }

    /// Where the tended comm this is for keeps its key (see `Tend::link_key`).
    pub(super) fn tended_as(&self) -> &AtomicU64 {
        &self.tended_as
    }

    /// Whether frames arrived that [`Self::frames`] has not taken yet.
    pub(super) fn has_frames(&self) -> bool {
        self.has_frames.load(Ordering::Acquire)
    }

    /// The frames that arrived since the last call (a comm that agreed on failover).
    pub(super) fn frames(&self) -> Vec<Frame> {
        if !self.has_frames.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut frames = self.frames.lock();
        self.has_frames.store(false, Ordering::Release);
        std::mem::take(&mut frames)
    }

    /// Send `frame` to the peer.
    ///
    /// # Errors
    /// `Remote` when the connection is gone.
    pub(super) fn send(&self, frame: &Frame) -> Result<()> {
        self.conn.send(self.channel, Body::Frame(*frame))
    }

    fn take(&self, body: Body) {
        match body {
            Body::Frame(frame) => {
                self.frames.lock().push(frame);
                self.has_frames.store(true, Ordering::Release);
            }
            Body::Goodbye => self.said_goodbye(),
            Body::Gone => self.ended(),
        }
    }

    fn said_goodbye(&self) {
        let _ = self.closed_at.set(Instant::now());
        let _ = self
            .state
            .compare_exchange(ALIVE, CLOSED, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The peer is gone without a goodbye: it died (unless it said goodbye first).
    fn ended(&self) {
        let _ = self
            .state
            .compare_exchange(ALIVE, DIED, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// A comm's hold on its out-of-band connection: watched while it exists; dropping it (closing
/// the comm) says goodbye to the peer and lets go.
#[derive(Debug)]
pub(super) struct Watched {
    link: Arc<PeerLink>,
}

impl Watched {
    /// Keep `stream`, the comm's handshake connection to `peer`, as its own (a peer without
    /// links, or one of the two sides with `NCCL_NET_RS_SHARE_LINKS=0`). With `framed`, it
    /// carries failover frames too.
    ///
    /// # Errors
    /// `System` when the watcher cannot be started or the socket not registered.
    pub(super) fn own(stream: TcpStream, peer: SocketAddr, framed: bool) -> Result<Self> {
        let (_, own) = Connection::open(stream, peer, None, framed)?;
        Ok(Self {
            link: own.expect("a connection of its own has its comm's channel"),
        })
    }

    /// The comm is on the link its handshake claimed.
    pub(super) fn joined(mut claim: Claim) -> Self {
        Self {
            link: claim
                .link
                .take()
                .expect("a claim holds its channel until joined"),
        }
    }

    /// The link.
    pub(super) fn link(&self) -> &PeerLink {
        &self.link
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.link.state() == PeerState::Alive {
            // Best effort: a full socket buffer or a dead peer just means no goodbye.
            let _ = self.link.conn.send(self.link.channel, Body::Goodbye);
        }
        self.link.conn.release(self.link.channel);
    }
}

/// A comm's channel on a link, held while its handshake runs: messages for it are kept from
/// the moment it exists, and the link cannot close under it.
#[derive(Debug)]
pub(super) struct Claim {
    link: Option<Arc<PeerLink>>,
    /// Both sides know the channel: a claim dropped without a comm tells the peer.
    agreed: bool,
}

impl Claim {
    /// The link's number, for the proposal.
    pub(super) fn link_number(&self) -> u64 {
        self.link
            .as_ref()
            .and_then(|l| l.conn.shared)
            .map_or(0, |s| s.link)
    }

    /// The peer agreed to put the comm on this link.
    pub(super) fn agree(&mut self) {
        self.agreed = true;
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            if self.agreed {
                let _ = link.conn.send(link.channel, Body::Gone);
            }
            link.conn.release(link.channel);
        }
    }
}

/// Claim `channel` on `conn`, a listed link (the caller holds the table's lock).
fn claim_on(conn: &Arc<Connection>, channel: u64) -> Option<Claim> {
    if !conn.listed.load(Ordering::Acquire) || conn.channels.lock().contains_key(&channel) {
        return None;
    }
    Some(Claim {
        link: Some(conn.add_channel(channel)),
        agreed: false,
    })
}

/// The links of this process.
#[derive(Debug, Default)]
struct Table {
    /// Dialed, by peer process and listener address; one being opened waits for the door's
    /// acknowledgement.
    dialed: HashMap<(u64, IpAddr), Dialed>,
    /// Accepted, by peer process and the link number it chose.
    accepted: HashMap<(u64, u64), Arc<Connection>>,
}

#[derive(Debug)]
enum Dialed {
    Opening(Opening),
    Open(Arc<Connection>),
}

/// A link dialed whose door has not acknowledged it yet.
#[derive(Debug)]
struct Opening {
    stream: TcpStream,
    link: u64,
    deadline: Instant,
    /// Connects waiting for it ([`LinkWait`]): it is dropped when the last one gives up.
    waiters: usize,
}

/// A connect's wait for a link being opened; dropping it (the connect failed or was
/// abandoned) drops the link when no other connect waits for it, so a door that never
/// answers leaves nothing behind.
#[derive(Debug)]
pub(super) struct LinkWait {
    key: (u64, IpAddr),
    link: u64,
}

impl Drop for LinkWait {
    fn drop(&mut self) {
        let mut table = TABLE.lock();
        if let Some(Dialed::Opening(opening)) = table.dialed.get_mut(&self.key)
            && opening.link == self.link
        {
            opening.waiters -= 1;
            if opening.waiters == 0 {
                table.dialed.remove(&self.key);
            }
        }
    }
}

impl Table {
    /// Unlist `conn` (if it is still the one listed under its key).
    fn forget(&mut self, conn: &Arc<Connection>) {
        conn.listed.store(false, Ordering::Release);
        let Some(shared) = conn.shared else {
            return;
        };
        match shared.listing {
            Listing::Dialed { process, ip } => {
                if matches!(self.dialed.get(&(process, ip)), Some(Dialed::Open(c)) if Arc::ptr_eq(c, conn))
                {
                    self.dialed.remove(&(process, ip));
                }
            }
            Listing::Accepted { process, link } => {
                if self
                    .accepted
                    .get(&(process, link))
                    .is_some_and(|c| Arc::ptr_eq(c, conn))
                {
                    self.accepted.remove(&(process, link));
                }
            }
        }
    }
}

static TABLE: Lazy<Mutex<Table>> = Lazy::new(Mutex::default);

/// What a connector's comm does about a link.
#[derive(Debug)]
pub(super) enum LinkTo {
    /// The link is being opened: call again (holding the wait).
    Waiting(LinkWait),
    /// Its channel on the link (propose it).
    Claimed(Claim),
    /// No link: the comm keeps its handshake connection.
    Alone,
}

/// The link to the listener of `handle` for the comm whose handshake has connect nonce
/// `channel`: claimed on the open link, or the link dialed (one short dial attempt), or
/// a wait while the door has not acknowledged it yet. `wait` is the connect's wait from its
/// previous call, if it waited.
pub(super) fn link_to(handle: &ListenHandle, channel: u64, wait: Option<LinkWait>) -> LinkTo {
    let key = (handle.process, handle.addr.ip());
    let mut table = TABLE.lock();
    let outcome = link_to_in(&mut table, handle, key, channel, wait);
    drop(table);
    match outcome {
        Ok(to) => to,
        Err(why) => alone(handle, &why),
    }
}

fn link_to_in(
    table: &mut Table,
    handle: &ListenHandle,
    key: (u64, IpAddr),
    channel: u64,
    mut wait: Option<LinkWait>,
) -> std::result::Result<LinkTo, String> {
    // A connect that stops waiting: whatever it waited for is settled now.
    let settled = |wait: Option<LinkWait>| std::mem::forget(wait);
    let mut opening = match table.dialed.remove(&key) {
        Some(Dialed::Open(conn)) => {
            settled(wait);
            let claim = claim_on(&conn, channel);
            table.dialed.insert(key, Dialed::Open(conn));
            return Ok(claim.map_or(LinkTo::Alone, LinkTo::Claimed));
        }
        Some(Dialed::Opening(opening)) => opening,
        None => {
            settled(wait.take());
            match dial(handle)? {
                Some(opening) => opening,
                None => return Ok(LinkTo::Alone),
            }
        }
    };
    match acknowledged(&opening) {
        Ok(false) if Instant::now() < opening.deadline => {
            let wait = match wait {
                Some(wait) if wait.link == opening.link => wait,
                other => {
                    settled(other);
                    opening.waiters += 1;
                    LinkWait {
                        key,
                        link: opening.link,
                    }
                }
            };
            table.dialed.insert(key, Dialed::Opening(opening));
            Ok(LinkTo::Waiting(wait))
        }
        outcome => {
            // The link is settled for every connect that waited: the others find it open or
            // gone at their next call.
            settled(wait);
            match outcome {
                Ok(true) => {}
                Ok(false) => return Err("the listener did not acknowledge it in time".into()),
                Err(why) => return Err(why),
            }
            let shared = Shared {
                link: opening.link,
                listing: Listing::Dialed {
                    process: handle.process,
                    ip: handle.addr.ip(),
                },
            };
            let (conn, _) = Connection::open(opening.stream, handle.addr, Some(shared), false)
                .map_err(|e| e.to_string())?;
            let claim = claim_on(&conn, channel);
            table.dialed.insert(key, Dialed::Open(conn));
            Ok(claim.map_or(LinkTo::Alone, LinkTo::Claimed))
        }
    }
}

fn alone(handle: &ListenHandle, why: &str) -> LinkTo {
    tracing::info!(
        "NET/{PLUGIN_NAME}: no shared link to {}: {why}; this comm keeps a connection of its own",
        handle.addr
    );
    LinkTo::Alone
}

/// Dial a link to the listener of `handle` and send its hello; `Ok(None)` when the dial
/// attempt timed out (the comm dials on its own, and retries as before links).
fn dial(handle: &ListenHandle) -> std::result::Result<Option<Opening>, String> {
    let tcp = match TcpStream::connect_timeout(&handle.addr, DIAL_ATTEMPT) {
        Ok(tcp) => tcp,
        Err(e) if e.kind() == ErrorKind::TimedOut => return Ok(None),
        Err(e) => return Err(format!("cannot connect: {e}")),
    };
    let link = loop {
        let link = random_u64();
        if link != 0 {
            break link;
        }
    };
    let hello = LinkHello {
        listen_nonce: handle.nonce,
        process: process_id(),
        link,
    };
    // A few bytes on a fresh connection: the socket buffer takes them at once.
    (&tcp)
        .write_all(&hello.emit())
        .and_then(|()| tcp.set_nonblocking(true))
        .and_then(|()| tcp.set_nodelay(true))
        .map_err(|e| format!("sending the link's hello: {e}"))?;
    Ok(Some(Opening {
        stream: tcp,
        link,
        deadline: Instant::now() + HELLO_TIMEOUT,
        waiters: 0,
    }))
}

/// Whether the door's acknowledgement arrived.
fn acknowledged(opening: &Opening) -> std::result::Result<bool, String> {
    let mut byte = [0u8; 1];
    match (&opening.stream).read(&mut byte) {
        Ok(1) if byte[0] == LINK_ACK => Ok(true),
        Ok(0) => Err("the listener closed it (its listen comm is gone?)".into()),
        Ok(_) => Err("the listener answered something else".into()),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

/// A link dialed to this process's door (its hello read by the door): list it, then
/// acknowledge it, so the dialer's comms name it only once it is listed here.
///
/// # Errors
/// A line for the door's log when it cannot be watched or acknowledged.
pub(super) fn accept_link(mut stream: HandshakeStream, hello: LinkHello) -> Result<()> {
    let peer = stream.peer;
    let shared = Shared {
        link: hello.link,
        listing: Listing::Accepted {
            process: hello.process,
            link: hello.link,
        },
    };
    stream.queue(&[LINK_ACK]);
    let mut table = TABLE.lock();
    if table.accepted.contains_key(&(hello.process, hello.link)) {
        return Err(Error::new(
            Kind::Remote,
            format!("peer {peer} dialed a link it already has"),
        ));
    }
    if !stream.flush()? {
        return Err(Error::new(
            Kind::Remote,
            format!("peer {peer}: cannot acknowledge its link"),
        ));
    }
    let (conn, _) = Connection::open(stream.into_stream(), peer, Some(shared), false)?;
    table.accepted.insert((hello.process, hello.link), conn);
    Ok(())
}

/// The channel for the comm whose connector proposed `proposal` from `peer` with connect nonce
/// `channel`, when this process has that link from that process and host.
pub(super) fn claim_accepted(proposal: &Proposal, peer: IpAddr, channel: u64) -> Option<Claim> {
    let table = TABLE.lock();
    let conn = table.accepted.get(&(proposal.process, proposal.link))?;
    if conn.peer.ip() != peer {
        return None;
    }
    let mut claim = claim_on(conn, channel)?;
    claim.agree();
    Some(claim)
}

#[cfg(test)]
mod tests;
