//! Posts held back for a batch. Each QP a comm posts on has a [`PostQueue`]: the comm builds
//! its work requests in the queue's chain and either posts them at once or holds them, so
//! that what several calls produce goes in one `ibv_post_send`, and adjacent writes (a run of
//! answers in the CTS ring) as one write. A single request on a queue that never holds (every
//! queue unless the comm batches) skips the chain: [`PostQueue::post_one`] posts it at once,
//! built on the stack, NCCL's usual message costing no chain, lock or loop.
//!
//! With `NCCL_NET_RS_BATCH=1` (off by default: on rxe it measures even with writing each answer
//! at once, and a held answer may wait a watcher tick; docs/design.md), two things are held. A receive comm's answers, across consecutive `irecv`s
//! on that comm: what NCCL's proxy does when it posts a step's receives before it tests any.
//! And a send comm's messages that one reading of the CTS ring releases together, until the
//! reading ends. Holding must never leave a peer waiting for something this side will not
//! post, nor stall a pipeline behind unrelated work, so what a queue holds is posted:
//! - at the start of every other call into the plugin, on any comm ([`flush_all`], from the
//!   C entry points): a `test`, an `isend`, an `irecv` on another comm, a close;
//! - when the chain is full;
//! - at the watcher thread's next tick (which calls [`flush_all`]; 10 to 80 ms apart, see
//!   `watch`): a client that posts receives and then waits outside the plugin (a barrier,
//!   another library) still makes progress.
//!
//! [`flush_all`] visits only the queues that started holding since its last visit (each is
//! listed once, when it starts holding), never every queue of the process. It only ever *tries*
//! a chain's lock: a chain that is busy belongs to a comm in the middle of a call, which posts
//! it itself or leaves it to the next visit.
#![allow(unsafe_code)] // posts work requests whose memory the comms vouch for

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, const_mutex};

use super::conn::Failure;
use super::qp_set::QpSet;
use crate::core::error::Result;
use crate::plugin::PLUGIN_NAME;
use crate::verbs::{PostRefused, QueuePair, SendChain, WorkRequest};

#[derive(Debug)]
struct Chain {
    chain: SendChain,
    /// Requests behind the chain's that wait for room in the send queue, in order (the chain
    /// keeps the first ones a full queue refused). Queues are sized for the usual load, not
    /// for every message posting its most (see `conn::SEND_QP_CAPS`); what does not fit goes
    /// when completions make room: at the comm's next progress, or the next post.
    waiting: VecDeque<WorkRequest>,
    /// A post made for this queue outside its comm's calls (by [`flush_all`]) failed; the comm
    /// reports it at its next post.
    failed: Failure,
}

#[derive(Debug)]
struct Queue {
    qp: Arc<QueuePair>,
    chain: Mutex<Chain>,
    /// The chain holds requests (read without its lock by [`flush_all`]).
    holding: AtomicBool,
    /// Requests wait for room in the send queue (read without the chain's lock by posts).
    backlog: AtomicBool,
    /// In [`LISTED`].
    listed: AtomicBool,
}

/// The queues that started holding since [`flush_all`]'s last visit, each once.
static LISTED: Mutex<Vec<Weak<Queue>>> = const_mutex(Vec::new());
/// Queues whose chain holds requests right now.
static HOLDING: AtomicUsize = AtomicUsize::new(0);
/// Queues that may hold (batching comms'): the watcher ticks while there are any.
static REGISTERED: AtomicUsize = AtomicUsize::new(0);

impl Queue {
    fn set_holding(&self, holding: bool) {
        // Every post clears the flag: a plain load first spares it the atomic swap when it
        // was already clear (always, unless the comm batches).
        if self.holding.load(Ordering::Acquire) != holding
            && self.holding.swap(holding, Ordering::SeqCst) != holding
        {
            if holding {
                HOLDING.fetch_add(1, Ordering::AcqRel);
            } else {
                HOLDING.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// The send queue refused a post for want of room: later posts wait behind it.
    fn note_full(&self) {
        if !self.backlog.swap(true, Ordering::AcqRel) {
            tracing::trace!(
                "NET/{PLUGIN_NAME}: {}: send queue full; work requests wait for completions to \
                 make room",
                self.qp.label()
            );
        }
    }

    /// Post what `c` holds, and what waits behind it, as far as the send queue has room.
    fn post(&self, c: &mut Chain) -> Result<()> {
        self.set_holding(false);
        loop {
            // SAFETY: every request in the chain was added through `PostQueue::submit` or
            // `post_one`, whose callers vouched for its memory until its completion; the chain
            // is this QP's.
            match unsafe { self.qp.post(&mut c.chain) } {
                Ok(()) => {}
                Err(PostRefused::Full) => {
                    self.note_full();
                    return Ok(());
                }
                Err(PostRefused::Failed(e)) => return Err(e),
            }
            if c.waiting.is_empty() {
                self.backlog.store(false, Ordering::Release);
                return Ok(());
            }
            while !c.chain.is_full()
                && let Some(w) = c.waiting.pop_front()
            {
                c.chain.push(&w);
            }
        }
    }
}

/// The work requests one QP of a comm posts, possibly held back (see the module doc).
#[derive(Debug)]
pub(super) struct PostQueue {
    queue: Arc<Queue>,
    /// Registered for [`flush_all`]: only a queue that may hold.
    registered: bool,
}

/// What [`PostQueue::submit`] hands its closure: the queue's chain, posted whenever it fills.
#[derive(Debug)]
pub(super) struct Builder<'a> {
    queue: &'a Queue,
    chain: &'a mut Chain,
}

impl Builder<'_> {
    /// Add `w`, posting the chain first when it is full.
    ///
    /// # Errors
    /// `System` when that post fails.
    pub(super) fn push(&mut self, w: &WorkRequest) -> Result<()> {
        if !self.chain.waiting.is_empty() {
            self.chain.waiting.push_back(*w);
            return Ok(());
        }
        if !self.chain.chain.push(w) {
            self.queue.post(self.chain)?;
            if !self.chain.waiting.is_empty() || !self.chain.chain.push(w) {
                self.chain.waiting.push_back(*w);
            }
        }
        Ok(())
    }

    /// Add `w`, as part of the last request when it continues it (see [`SendChain::merge`]).
    ///
    /// # Errors
    /// As [`Self::push`].
    pub(super) fn push_merged(&mut self, w: &WorkRequest) -> Result<()> {
        if self.chain.waiting.is_empty() && self.chain.chain.merge(w) {
            return Ok(());
        }
        self.push(w)
    }
}

impl PostQueue {
    /// The queue of `qp`; `holds`: it may hold posts (registered for [`flush_all`]).
    pub(super) fn new(qp: Arc<QueuePair>, holds: bool) -> Self {
        let chain = qp.chain();
        let queue = Arc::new(Queue {
            qp,
            chain: Mutex::new(Chain {
                chain,
                waiting: VecDeque::new(),
                failed: Failure::default(),
            }),
            holding: AtomicBool::new(false),
            backlog: AtomicBool::new(false),
            listed: AtomicBool::new(false),
        });
        if holds && REGISTERED.fetch_add(1, Ordering::AcqRel) == 0 {
            super::watch::wake();
        }
        Self {
            queue,
            registered: holds,
        }
    }

    /// Add requests through `add`, then post everything the queue holds, or, with `hold`, keep
    /// it for later (only a queue made to hold does).
    ///
    /// # Safety
    /// Every request `add` adds must keep its local ranges registered and unchanged (writes) or
    /// writable (reads), and its remote ranges valid for the peer, until its completion is
    /// polled or the QP is destroyed.
    ///
    /// # Errors
    /// A failure of an earlier post made for this queue by [`flush_all`], what `add` returns,
    /// or `System` when a post fails.
    pub(super) unsafe fn submit(
        &self,
        hold: bool,
        add: impl FnOnce(&mut Builder<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut chain = self.queue.chain.lock();
        chain.failed.check()?;
        add(&mut Builder {
            queue: &self.queue,
            chain: &mut chain,
        })?;
        if hold && self.registered {
            let holding = !chain.chain.is_empty();
            self.queue.set_holding(holding);
            if holding {
                list(&self.queue);
            }
            return Ok(());
        }
        self.queue.post(&mut chain)
    }

    /// Post `w` now, after what the queue holds: `submit(false, |b| b.push(w))`, without the
    /// chain for a queue that never holds and has nothing waiting (its chain is empty between
    /// calls, and nothing was posted for it outside its comm's calls that could have failed).
    ///
    /// # Safety
    /// As [`Self::submit`], for `w`.
    ///
    /// # Errors
    /// As [`Self::submit`].
    #[inline]
    pub(super) unsafe fn post_one(&self, w: &WorkRequest) -> Result<()> {
        if self.registered || self.queue.backlog.load(Ordering::Acquire) {
            // SAFETY: forwarded from this function's contract.
            return unsafe { self.submit(false, |b| b.push(w)) };
        }
        // SAFETY: forwarded from this function's contract; the QP is this queue's.
        match unsafe { self.queue.qp.post_one(w) } {
            Ok(()) => Ok(()),
            Err(PostRefused::Full) => {
                self.wait_for_room(w);
                Ok(())
            }
            Err(PostRefused::Failed(e)) => Err(e),
        }
    }

    /// Keep `w`, which a full send queue refused, for a later post. Out of line: the queue is
    /// full only under a load it was not sized for.
    #[cold]
    #[inline(never)]
    fn wait_for_room(&self, w: &WorkRequest) {
        let mut chain = self.queue.chain.lock();
        // Nothing waits (`backlog` is clear), so the chain is empty and takes it.
        if !chain.chain.push(w) {
            chain.waiting.push_back(*w);
        }
        self.queue.note_full();
    }

    /// Post what the queue holds, and what waits for room in the send queue as far as there
    /// is room now.
    ///
    /// # Errors
    /// As [`Self::submit`].
    pub(super) fn flush(&self) -> Result<()> {
        if !self.queue.holding.load(Ordering::Acquire)
            && !self.queue.backlog.load(Ordering::Acquire)
        {
            return self.queue.chain.lock().failed.check();
        }
        self.post_chain()
    }

    /// Post what waits for room in the send queue, as far as there is room now (requests
    /// held for a batch behind them go too).
    ///
    /// # Errors
    /// As [`Self::submit`].
    #[inline]
    pub(super) fn post_waiting(&self) -> Result<()> {
        if !self.queue.backlog.load(Ordering::Acquire) {
            return Ok(());
        }
        self.post_chain()
    }

    /// Post the chain and what waits behind it, unless an earlier post for it failed.
    #[cold]
    #[inline(never)]
    fn post_chain(&self) -> Result<()> {
        let mut chain = self.queue.chain.lock();
        chain.failed.check()?;
        self.queue.post(&mut chain)
    }
}

impl Drop for PostQueue {
    fn drop(&mut self) {
        if self.registered {
            // Its entry in LISTED, if any, no longer upgrades.
            REGISTERED.fetch_sub(1, Ordering::AcqRel);
        }
        // What is still held goes now (the comm waits for it before destroying the QP).
        if let Err(e) = self.flush() {
            tracing::debug!("posting held work requests at close: {e}");
        }
        self.queue.set_holding(false);
    }
}

/// Post what every queue of the process holds (a call other than an `irecv` begins). Costs
/// one atomic load when nothing is held.
pub fn flush_all() {
    flush_held(None);
}

/// As [`flush_all`], but leave what the lanes of `keep` hold (an `irecv` on the comm that owns
/// them).
pub(super) fn flush_all_but(keep: &QpSet) {
    flush_held(Some(keep));
}

#[inline]
fn flush_held(keep: Option<&QpSet>) {
    if HOLDING.load(Ordering::Acquire) == 0 {
        return;
    }
    flush_registered(keep);
}

/// Put `queue` on [`LISTED`] unless it is there (it started holding).
fn list(queue: &Arc<Queue>) {
    // SeqCst here and in the visit: each side's write must be seen by the other's later read.
    if !queue.listed.swap(true, Ordering::SeqCst) {
        LISTED.lock().push(Arc::downgrade(queue));
    }
}

#[cold]
fn flush_registered(keep: Option<&QpSet>) {
    // A lane being replaced (its lock taken) belongs to the calling comm's own call, which is
    // not this one: counted as kept, it is posted by the next visit.
    let kept = |q: &Arc<Queue>| {
        keep.is_some_and(|set| {
            set.lanes
                .iter()
                .any(|l| l.try_read().is_none_or(|l| Arc::ptr_eq(&l.queue.queue, q)))
        })
    };
    let listed = std::mem::take(&mut *LISTED.lock());
    for q in listed.iter().filter_map(Weak::upgrade) {
        // Cleared before `holding` is read: a queue that starts holding after the read lists
        // itself again.
        q.listed.store(false, Ordering::SeqCst);
        if !q.holding.load(Ordering::SeqCst) {
            continue;
        }
        match q.chain.try_lock() {
            Some(mut chain) if !kept(&q) => {
                if let Err(e) = q.post(&mut chain) {
                    chain.failed.record(e);
                }
            }
            _ => list(&q),
        }
    }
}

/// Whether any queue may hold posts: the watcher then ticks.
pub(super) fn any_registered() -> bool {
    REGISTERED.load(Ordering::Acquire) > 0
}
