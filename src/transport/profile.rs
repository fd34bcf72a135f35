//! NCCL's profiler (ncclNet v10+): the QP events NCCL's own IB transport reports
//! (`src/transport/net_ib/p2p.cc`, built with `NCCL_ENABLE_NET_PROFILING`, NCCL's default),
//! reported here the same way, so that a profiler plugin sees this plugin's work requests as it
//! sees NCCL's: an event starts for each QP that carries a request's bytes (a send's write, a
//! receive's posted receive), under the parent handle NCCL passed with that request, and stops
//! when `test` reports the request done. Nothing is reported without an installed profiler
//! (ncclNet v8 and v9, or a NULL callback) or for a request NCCL passed no parent with.

use std::num::NonZeroUsize;
use std::sync::OnceLock;

/// An opaque handle of NCCL's, passed with a request (`phandle`): the event's parent. Kept as an
/// address (never NULL, so that an `Option<Parent>` is one word on the data path); only the
/// profiler callback reads it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Parent(pub NonZeroUsize);

/// The handle the profiler gave a started event.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EventHandle(pub usize);

/// One work request on a QP, as the profiler is told of it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpEvent {
    /// The member port of the comm's device the QP lives on.
    pub member: usize,
    /// The work request's id.
    pub wr_id: u64,
    /// An RDMA write with immediate (the one that completes a message on its QP, and what a
    /// posted receive takes), rather than a plain RDMA write.
    pub with_imm: bool,
    /// The QP's number.
    pub qp_num: u32,
    /// Bytes of the request it carries (a receive: the buffer's size).
    pub length: u64,
}

/// Where the events go: NCCL's callback (`abi::profiler`), or a test's.
pub trait Sink: Send + Sync {
    /// Start `event` under `parent`; `None` when the profiler keeps no handle for it.
    fn start(&self, parent: Parent, event: &QpEvent) -> Option<EventHandle>;
    /// Stop a started event.
    fn stop(&self, event: EventHandle);
}

static SINK: OnceLock<Box<dyn Sink>> = OnceLock::new();

/// Report QP events to `sink` from now on. The first one stays (NCCL passes the same callback
/// to every `init`); `false` when one was installed already.
pub fn install(sink: Box<dyn Sink>) -> bool {
    SINK.set(sink).is_ok()
}

/// The events of one comm's requests, by request index: present only when a profiler is
/// installed when the comm is built, so that other comms pay one `None` check per request.
pub(super) struct Events {
    sink: &'static dyn Sink,
    requests: Vec<RequestEvents>,
}

/// One request's parents (one per buffer) and the events started under them.
#[derive(Default)]
struct RequestEvents {
    parents: Vec<Option<Parent>>,
    open: Vec<EventHandle>,
    started: bool,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field(
                "open",
                &self.requests.iter().map(|r| r.open.len()).sum::<usize>(),
            )
            .finish_non_exhaustive()
    }
}

impl Events {
    /// Events for a comm of `requests` request indices; `None` without a profiler.
    pub(super) fn new(requests: usize) -> Option<Self> {
        Some(Self::reporting_to(SINK.get()?.as_ref(), requests))
    }

    fn reporting_to(sink: &'static dyn Sink, requests: usize) -> Self {
        Self {
            sink,
            requests: (0..requests).map(|_| RequestEvents::default()).collect(),
        }
    }

    /// Request `req` began, with NCCL's `parents` (one per buffer; a NULL one reports nothing).
    #[cold]
    #[inline(never)]
    pub(super) fn begin(&mut self, req: usize, parents: impl IntoIterator<Item = Option<Parent>>) {
        if let Some(r) = self.requests.get_mut(req) {
            r.parents.clear();
            r.parents.extend(parents);
            r.started = false;
        }
    }

    /// Whether the events of request `req`'s bytes were started already (a message written
    /// again, such as an eager one the receiver refused, reports nothing new).
    pub(super) fn started(&self, req: usize) -> bool {
        self.requests.get(req).is_none_or(|r| r.started)
    }

    /// Start `event` for buffer `buffer` of request `req`.
    #[cold]
    #[inline(never)]
    pub(super) fn start(&mut self, req: usize, buffer: usize, event: &QpEvent) {
        let Some(r) = self.requests.get_mut(req) else {
            return;
        };
        r.started = true;
        if let Some(Some(parent)) = r.parents.get(buffer)
            && let Some(handle) = self.sink.start(*parent, event)
        {
            r.open.push(handle);
        }
    }

    /// Request `req` is done: stop its events.
    #[cold]
    #[inline(never)]
    pub(super) fn finish(&mut self, req: usize) {
        if let Some(r) = self.requests.get_mut(req) {
            for handle in r.open.drain(..) {
                self.sink.stop(handle);
            }
            r.parents.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// What a sink was told: `(parent, event's length, handle)` per start, then the stops.
    #[derive(Default)]
    struct Recorder {
        started: Mutex<Vec<(usize, u64, usize)>>,
        stopped: Mutex<Vec<usize>>,
    }

    impl Sink for Recorder {
        fn start(&self, parent: Parent, event: &QpEvent) -> Option<EventHandle> {
            let mut started = self.started.lock().unwrap();
            let handle = 100 + started.len();
            started.push((parent.0.get(), event.length, handle));
            Some(EventHandle(handle))
        }

        fn stop(&self, event: EventHandle) {
            self.stopped.lock().unwrap().push(event.0);
        }
    }

    fn parent(addr: usize) -> Option<Parent> {
        NonZeroUsize::new(addr).map(Parent)
    }

    fn event(length: u64) -> QpEvent {
        QpEvent {
            member: 0,
            wr_id: 7,
            with_imm: true,
            qp_num: 0x11,
            length,
        }
    }

    #[test]
    fn events_start_under_their_buffers_parent_and_stop_when_the_request_is_done() {
        let sink: &'static Recorder = Box::leak(Box::default());
        let mut events = Events::reporting_to(sink, 4);
        events.begin(2, [parent(0xa0), None, parent(0xc0)]);
        assert!(!events.started(2));
        events.start(2, 0, &event(10));
        events.start(2, 1, &event(20)); // NCCL passed no parent: nothing reported
        events.start(2, 2, &event(30));
        assert!(events.started(2));
        assert!(
            events.started(9),
            "an index beyond the comm's is never started"
        );
        events.finish(2);
        events.finish(2); // a second finish stops nothing again
        assert_eq!(
            *sink.started.lock().unwrap(),
            [(0xa0, 10, 100), (0xc0, 30, 101)]
        );
        assert_eq!(*sink.stopped.lock().unwrap(), [100, 101]);
        // The index is reused by the next request, under its own parent.
        events.begin(2, [parent(0xd0)]);
        assert!(!events.started(2));
    }
}
