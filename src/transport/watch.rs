//! The watcher: one thread per process that learns, without the data path paying for it, when a
//! comm's peer is gone and when a device reports an asynchronous event.
//!
//! - **Peers.** After the handshake each comm keeps an out-of-band TCP connection (a link
//!   shared with the other comms between the same two processes, or one of its own; see
//!   `peer_link`): the watcher reads what arrives on it (goodbyes, failover frames, its end)
//!   and hands it to the comm it concerns.
//! - **Devices.** Each opened device's async-event fd is watched (`health`).
//!
//! - **Held posts.** While any comm may hold posts for a batch (`NCCL_NET_RS_BATCH=1`), it
//!   ticks and posts what is still held (see `held`), so a held post waits at most one tick.
//!   A post found held is no sign that its client is away (a streaming client holds answers
//!   between its calls), and a client that left holds nothing new, so held posts do not
//!   shorten the ticks.
//! - **Tended comms.** A comm whose progress may not wait for its client's next call (quiet
//!   receives, see `core::proto`: a receive that writes its CTS only when no eager message
//!   comes, a sender that writes a refused eager message again from its kept copy) is tended:
//!   while any exists, the thread wakes and lets each make the progress that is due
//!   ([`Tend::tend`]), so a client that posts and then waits elsewhere (a barrier, another
//!   library, another comm) never leaves its peer waiting for good.
//!
//! The ticks come every [`AWAY_TICK`] while a tended comm owed something and its client made no
//! progress since the previous tick ([`ClientProgress`]); otherwise they stretch to
//! [`CLIENT_TICK_LIMIT`]: each wake-up takes a CPU from a client that polls (on the emulated
//! two-core test bed, 10-ms ticks cost quiet receives 3-11% of their latency and message rate,
//! and batching most of what it was measured to cost).
//!
//! The thread is started by the first registration and blocks in `epoll_wait` when idle. With
//! `-z nodelete` the library is never unmapped under it.

use std::collections::{HashMap, HashSet};
use std::ops::Deref;
use std::os::fd::RawFd;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use super::health::DeviceHealth;
use super::held;
use super::peer_link::{Connection, Watched, corked};
use crate::core::error::{Error, Result};
use crate::plugin::PLUGIN_NAME;
use crate::verbs::{Epoll, EventFd};

/// `PeerLink::tended_as` of a comm the watcher does not tend (keys start at 1).
pub(super) const NOT_TENDED: u64 = 0;

/// A comm that may owe its peer progress while its client makes no call.
pub trait Tend: Send + Sync + 'static {
    /// Whether the comm may ever need tending (decided at connect).
    fn wants_tending(&self) -> bool;
    /// The devices of its lanes (its members): their port events and failed QPs make it due.
    fn devices(&self) -> Vec<Arc<DeviceHealth>>;
    /// Where its out-of-band link keeps the comm's key ([`super::peer_link::PeerLink::tended_as`]): what arrives
    /// on the link (frames, the end) makes the comm due.
    fn link_key(&self) -> Option<&AtomicU64>;
    /// Make the progress that is due; called by the watcher thread at every tick, `now` read
    /// once for every comm it tends (a clock read may be a system call, or in a VM a trip to
    /// an emulated timer). Must not block: a comm busy in its client's call is left to that
    /// call.
    fn tend(&self, now: Instant) -> Tick;
}

/// A tended comm at a tick (ordered by how soon it wants the next).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tick {
    /// It owes nothing and will owe nothing before an event the watcher wakes for (a port
    /// event, a frame from the peer): no tick is needed for it.
    Quiet,
    /// It owed nothing, or its client made its progress since the previous tick
    /// ([`ClientProgress`]) or is in a call now.
    Idle,
    /// It owed its peer progress and its client made none since the previous tick: the
    /// watcher made it, and ticks again soon.
    ClientAway,
}

impl Tick {
    /// A comm that owed its peer progress, which the tick made: whether its client is away,
    /// i.e. made no progress since the previous tick (`client_progressed`).
    pub(crate) fn owed(client_progressed: bool) -> Self {
        if client_progressed {
            Self::Idle
        } else {
            Self::ClientAway
        }
    }
}

/// The tick a tended comm asks for when its client is in a call (the comm's lock is taken): a
/// comm with `quiet` receives or a repair under way ticks on; any other is healthy, and the
/// call makes its progress.
pub(super) fn busy_tick(quiet: bool, link: Option<&Watched>) -> Tick {
    if quiet || link.is_some_and(|l| l.link().repairing()) {
        Tick::Idle
    } else {
        Tick::Quiet
    }
}

/// The tick while a tended comm's client is away. (A 1 ms tick measurably slowed both
/// benchmark processes on the emulated two-core test bed.)
const AWAY_TICK: Duration = Duration::from_millis(10);

/// The longest tick, while no tended comm's client is away: the longest a peer waits for a comm
/// whose client stops calling, and a held post for its writing.
const CLIENT_TICK_LIMIT: Duration = Duration::from_millis(80);

/// The next tick after one of `tick`: [`AWAY_TICK`] when a tended comm's client is `away`, else
/// twice as long, up to [`CLIENT_TICK_LIMIT`].
fn next_tick(tick: Duration, away: bool) -> Duration {
    if away {
        AWAY_TICK
    } else {
        (tick * 2).min(CLIENT_TICK_LIMIT)
    }
}

/// Counts the calls in which a tended comm's client made the progress that [`Tend::tend`]
/// would make; kept under the comm's lock.
#[derive(Debug, Default)]
pub(crate) struct ClientProgress {
    made: u64,
    seen: u64,
}

impl ClientProgress {
    /// The client's call made the comm's progress.
    #[inline]
    pub(crate) fn made(&mut self) {
        self.made = self.made.wrapping_add(1);
    }

    /// At a tick: whether the client made it since the previous tick.
    pub(crate) fn since_last_tick(&mut self) -> bool {
        let made = self.made != self.seen;
        self.seen = self.made;
        made
    }
}

/// A comm the watcher tends while it exists (when it wants tending): what NCCL holds.
#[derive(Debug)]
pub struct Tended<C: Tend> {
    comm: Arc<C>,
    tending: Option<Tending>,
}

/// A comm's place in the watcher's registry and in its devices' indexes; dropping it takes the
/// comm off both.
#[derive(Debug)]
struct Tending {
    key: u64,
    devices: Vec<Arc<DeviceHealth>>,
}

impl Drop for Tending {
    fn drop(&mut self) {
        for d in &self.devices {
            d.untrack(self.key);
        }
        if let Some(w) = WATCHER.get() {
            let mut registry = w.tended.lock();
            registry.comms.remove(&self.key);
            registry.ticking.remove(&self.key);
        }
    }
}

impl<C: Tend> Tended<C> {
    /// Hand `comm` to the watcher when it wants tending.
    ///
    /// # Errors
    /// `System` when the watcher cannot be started.
    pub(super) fn new(comm: C) -> Result<Self> {
        let comm = Arc::new(comm);
        let tending = if comm.wants_tending() {
            let watcher = Watcher::get()?;
            let key = watcher.next_key.fetch_add(1, Ordering::Relaxed);
            let weak: Weak<C> = Arc::downgrade(&comm);
            watcher.tended.lock().comms.insert(key, weak);
            let devices = comm.devices();
            for d in &devices {
                d.track(key);
            }
            if let Some(slot) = comm.link_key() {
                slot.store(key, Ordering::Release);
            }
            // Its first tick comes now, not at the next timeout.
            watcher.make_due(&[key]);
            Some(Tending { key, devices })
        } else {
            None
        };
        Ok(Self { comm, tending })
    }

    /// The comm, off the tending list, once the watcher let go of it (a tick holds one comm at
    /// a time, for the moment its tend takes): closing it then frees its resources in the
    /// closing call.
    pub fn into_inner(self) -> C {
        let Self { mut comm, tending } = self;
        drop(tending);
        loop {
            match Arc::try_unwrap(comm) {
                Ok(inner) => return inner,
                Err(shared) => {
                    comm = shared;
                    std::thread::yield_now();
                }
            }
        }
    }
}

impl<C: Tend> Deref for Tended<C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.comm
    }
}

#[derive(Clone, Debug)]
pub(super) enum Target {
    Link(Arc<Connection>),
    Device(Arc<DeviceHealth>),
}

impl Target {
    fn fd(&self) -> RawFd {
        match self {
            Self::Link(l) => l.fd(),
            Self::Device(d) => d.fd,
        }
    }
}

#[derive(Debug)]
pub(super) struct Watcher {
    epoll: Epoll,
    targets: Mutex<HashMap<u64, Target>>,
    next_key: AtomicU64,
    /// The comms that want tending, and which of them the next wake-up tends.
    tended: Mutex<Registry>,
    /// Wakes the thread to recompute its timeout (watched under [`WAKE_KEY`]).
    wake: EventFd,
}

/// The tended comms. A wake-up tends those due and those ticking, never all: its work grows
/// with what is due, not with how many comms exist.
#[derive(Debug, Default)]
struct Registry {
    comms: HashMap<u64, Weak<dyn Tend>>,
    /// Comms whose last tend asked for ticks (a quiet receive, a repair under way), tended at
    /// every tick until one says [`Tick::Quiet`].
    ticking: HashSet<u64>,
    /// Comms an event concerns (new, a frame or the end of its link, a port event or a failed
    /// QP on one of its devices, a repair started by its client), tended at the next wake-up.
    due: Vec<u64>,
}

/// The epoll key of [`Watcher::wake`] (targets' keys start at 1).
const WAKE_KEY: u64 = 0;

/// Wake the watcher thread, if it runs: the first queue that may hold posts appeared, so it
/// must tick from now on.
pub(super) fn wake() {
    if let Some(w) = WATCHER.get() {
        w.wake.notify();
    }
}

pub(super) static WATCHER: OnceCell<Watcher> = OnceCell::new();

impl Watcher {
    pub(super) fn get() -> Result<&'static Self> {
        WATCHER.get_or_try_init(|| {
            let watcher = Self {
                epoll: Epoll::new()?,
                targets: Mutex::default(),
                next_key: AtomicU64::new(WAKE_KEY + 1),
                tended: Mutex::default(),
                wake: EventFd::new()?,
            };
            watcher.epoll.add(watcher.wake.raw(), WAKE_KEY)?;
            std::thread::Builder::new()
                .name("rsib-watch".into())
                .spawn(|| {
                    // The static is set right after this closure returns; wait for it.
                    let watcher = loop {
                        match WATCHER.get() {
                            Some(w) => break w,
                            None => std::thread::yield_now(),
                        }
                    };
                    // A bug in a handler must not end the watching for good.
                    let run = || std::panic::catch_unwind(AssertUnwindSafe(|| watcher.run()));
                    while run().is_err() {
                        tracing::error!(
                            "NET/{PLUGIN_NAME}: watcher thread panicked; restarting it"
                        );
                    }
                })
                .map_err(|e| Error::system("starting the watcher thread", e))?;
            Ok(watcher)
        })
    }

    pub(super) fn register(&self, fd: RawFd, target: Target) -> Result<u64> {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.targets.lock().insert(key, target);
        if let Err(e) = self.epoll.add(fd, key) {
            self.targets.lock().remove(&key);
            return Err(e);
        }
        Ok(key)
    }

    /// Idempotent; the fd is still open (its owner is still alive) when this runs.
    pub(super) fn unregister(&self, key: u64) {
        if let Some(target) = self.targets.lock().remove(&key) {
            self.epoll.remove(target.fd());
        }
    }

    /// Tend `keys` at the next wake-up (which this brings on when any is a tended comm's).
    pub(super) fn make_due(&self, keys: &[u64]) {
        let mut keys = keys.iter().filter(|&&k| k != NOT_TENDED).peekable();
        if keys.peek().is_none() {
            // A link or device no tended comm uses: nothing to wake for.
            return;
        }
        self.tended.lock().due.extend(keys);
        self.wake.notify();
    }

    /// Let the comms due and ticking make their progress, one at a time and outside the
    /// registry's lock (a comm that closes meanwhile waits only for its own tend); the most
    /// any asked for: no tick ([`Tick::Quiet`]), ticks, or soon ([`Tick::ClientAway`]).
    fn tend_due(&self) -> Tick {
        let mut keys = {
            let mut registry = self.tended.lock();
            let mut keys = std::mem::take(&mut registry.due);
            keys.extend(registry.ticking.iter().copied());
            keys
        };
        keys.sort_unstable();
        keys.dedup();
        let now = Instant::now();
        let mut most = Tick::Quiet;
        for key in keys {
            let Some(comm) = self.tended.lock().comms.get(&key).and_then(Weak::upgrade) else {
                continue;
            };
            let tick = comm.tend(now);
            drop(comm);
            let mut registry = self.tended.lock();
            if tick == Tick::Quiet {
                registry.ticking.remove(&key);
            } else if registry.comms.contains_key(&key) {
                registry.ticking.insert(key);
            }
            most = most.max(tick);
        }
        most
    }

    fn run(&self) {
        let mut keys = Vec::new();
        let mut tick = AWAY_TICK;
        // What the tended comms asked for at the last tick (a comm that becomes due wakes the
        // thread, see `make_due`).
        let mut wanted = Tick::Quiet;
        loop {
            let timeout = if held::any_registered() || wanted != Tick::Quiet {
                tick
            } else {
                Duration::from_secs(1)
            };
            let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(1000);
            let waited = self.epoll.wait(&mut keys, timeout_ms);
            held::flush_all();
            // Port events and frames are handled first: the comms they concern owe progress.
            if waited.is_ok() {
                self.handle(&keys);
            }
            // One write per link for what the comms due send (a repair storm: a few frames
            // per comm).
            wanted = corked(|| self.tend_due());
            tick = next_tick(tick, wanted == Tick::ClientAway);
            if let Err(e) = waited {
                tracing::warn!("NET/{PLUGIN_NAME}: watcher: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Handle what woke the thread: port events, bytes from peers.
    fn handle(&self, keys: &[u64]) {
        for &key in keys {
            if key == WAKE_KEY {
                self.wake.drain();
                continue;
            }
            // Clone out of the lock: the handler may take time, and unregister must not wait.
            let Some(target) = self.targets.lock().get(&key).cloned() else {
                continue;
            };
            match &target {
                // It makes the comms due that what arrived concerns.
                Target::Link(conn) => {
                    if !conn.on_readable() {
                        self.unregister(key);
                    }
                }
                Target::Device(health) => {
                    if health.on_readable() {
                        self.make_due(&health.tracked());
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A comm that counts its tends and always asks for `tick`.
    struct Counted {
        tends: Arc<AtomicU64>,
        tick: Tick,
    }

    impl Tend for Counted {
        fn wants_tending(&self) -> bool {
            true
        }
        fn devices(&self) -> Vec<Arc<DeviceHealth>> {
            Vec::new()
        }
        fn link_key(&self) -> Option<&AtomicU64> {
            None
        }
        fn tend(&self, _now: Instant) -> Tick {
            self.tends.fetch_add(1, Ordering::AcqRel);
            self.tick
        }
    }

    fn eventually(what: &str, cond: impl Fn() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < until, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The watcher's work per wake-up follows what is due: a new comm is tended once, an event
    /// tends the comm it concerns, a comm that asks for ticks gets them, and no wake-up (the
    /// idle timeout's, another comm's ticks) walks the others.
    #[test]
    fn a_wake_up_tends_what_is_due_never_every_comm() {
        let quiet = Arc::new(AtomicU64::new(0));
        let comms: Vec<Tended<Counted>> = (0..200)
            .map(|_| {
                let tends = Arc::clone(&quiet);
                Tended::new(Counted {
                    tends,
                    tick: Tick::Quiet,
                })
                .unwrap()
            })
            .collect();
        let count = || quiet.load(Ordering::Acquire);
        eventually("each new comm is tended once", || count() == 200);
        // Past the idle timeout's wake-up (1 s).
        std::thread::sleep(Duration::from_millis(1200));
        assert_eq!(count(), 200, "an idle wake-up tends nobody");
        let key = comms[7].tending.as_ref().unwrap().key;
        Watcher::get().unwrap().make_due(&[key]);
        eventually("the comm made due is tended", || count() == 201);
        let ticks = Arc::new(AtomicU64::new(0));
        let ticking = Tended::new(Counted {
            tends: Arc::clone(&ticks),
            tick: Tick::Idle,
        })
        .unwrap();
        eventually("a comm that asks for ticks gets them", || {
            ticks.load(Ordering::Acquire) >= 4
        });
        assert_eq!(count(), 201, "the ticks of one comm tend no other");
        drop(ticking.into_inner());
        let after = ticks.load(Ordering::Acquire);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            ticks.load(Ordering::Acquire) <= after + 1,
            "a closed comm is off the ticks"
        );
        for c in comms {
            drop(c.into_inner());
        }
        assert!(Watcher::get().unwrap().tended.lock().comms.is_empty());
    }

    #[test]
    fn ticks_stretch_while_clients_poll_and_shrink_when_one_is_away() {
        let mut tick = AWAY_TICK;
        let stretched: Vec<u128> = (0..5)
            .map(|_| {
                tick = next_tick(tick, false);
                tick.as_millis()
            })
            .collect();
        assert_eq!(stretched, [20, 40, 80, 80, 80]);
        assert_eq!(next_tick(tick, true), AWAY_TICK);
    }

    #[test]
    fn client_progress_is_seen_once_per_tick() {
        let mut client = ClientProgress::default();
        assert!(!client.since_last_tick(), "no call yet");
        client.made();
        client.made();
        assert!(client.since_last_tick());
        assert!(!client.since_last_tick(), "nothing since the previous tick");
    }
}
