//! The plugin's log: `tracing` events delivered to the logger NCCL passes to `init`, or to stderr
//! when there is none (tools, tests, a host that passes NULL).
//!
//! Levels map to NCCL's: ERROR and WARN → `NCCL_LOG_WARN`, INFO → `NCCL_LOG_INFO`, DEBUG and TRACE
//! → `NCCL_LOG_TRACE`. Every line carries the NET subsystem bit; lines with target
//! [`INIT_TARGET`] also carry INIT, so `NCCL_DEBUG_SUBSYS=INIT` shows the banner.
//!
//! Inside the cdylib the dispatcher becomes the global default of the plugin's private copy of
//! tracing, which costs nothing per call. When the library is linked into a Rust program that
//! already has a global subscriber, [`scoped`] installs it around each entry point instead.

use std::fmt::Write as _;

use once_cell::sync::OnceCell;
use tracing::field::{Field, Visit};
use tracing::{Dispatch, Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{EnvFilter, Layer, Registry, reload};

use crate::abi::logger;

/// Target for init-time lines (the banner): they carry NCCL's INIT subsystem bit as well as NET.
pub const INIT_TARGET: &str = "nccl_net::init";

/// Filter used until `init` supplies the configured one.
const DEFAULT_DIRECTIVE: &str = "nccl_net=warn";

struct LogState {
    dispatch: Dispatch,
    filter: reload::Handle<EnvFilter, Registry>,
    global: bool,
}

static STATE: OnceCell<LogState> = OnceCell::new();

fn state() -> &'static LogState {
    STATE.get_or_init(|| {
        let (filter, handle) = reload::Layer::new(EnvFilter::new(DEFAULT_DIRECTIVE));
        let dispatch = Dispatch::new(Registry::default().with(filter).with(NcclLayer));
        let global = tracing::dispatcher::set_global_default(dispatch.clone()).is_ok();
        LogState {
            dispatch,
            filter: handle,
            global,
        }
    })
}

/// Apply the configured filter directive (tracing's `EnvFilter` syntax). Idempotent; a directive
/// that does not parse keeps the current filter and says so.
pub fn set_filter(directive: &str) {
    let state = state();
    scoped(|| match EnvFilter::try_new(directive) {
        Ok(filter) => {
            if let Err(e) = state.filter.reload(filter) {
                tracing::warn!("log filter '{directive}' could not be applied: {e}");
            }
        }
        Err(e) => tracing::warn!("NCCL_NET_RS_LOG='{directive}' is not a valid filter: {e}"),
    });
}

/// Run `f` with the plugin's dispatcher current. Free when the global default was accepted.
pub fn scoped<T>(f: impl FnOnce() -> T) -> T {
    scoped_in(state(), f)
}

/// [`scoped`] with `state`'s dispatcher.
#[inline(always)]
fn scoped_in<T>(state: &LogState, f: impl FnOnce() -> T) -> T {
    // `f` is called in one place, so that each entry point's body inlines into it; the guard
    // is dropped by hand, so that the global case calls no drop.
    let scope = (!state.global).then(|| tracing::dispatcher::set_default(&state.dispatch));
    let out = f();
    if let Some(guard) = scope {
        drop(guard);
    }
    out
}

/// Collects an event's message and fields into one line.
struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        } else {
            let _ = write!(self.0, " {}={value}", field.name());
        }
    }
}

struct NcclLayer;

impl<S: Subscriber> Layer<S> for NcclLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut line = Line(String::with_capacity(128));
        event.record(&mut line);
        let record = logger::Record {
            level: match *meta.level() {
                Level::ERROR | Level::WARN => logger::Severity::Warn,
                Level::INFO => logger::Severity::Info,
                _ => logger::Severity::Trace,
            },
            init: meta.target() == INIT_TARGET,
            file: meta.module_path().unwrap_or("nccl_net"),
            line: meta.line().unwrap_or(0),
            message: &line.0,
        };
        if !logger::emit(&record) {
            eprintln!("nccl-net-rsib {} {}", meta.level(), line.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts the events it sees.
    struct Counting(Arc<AtomicUsize>);

    impl<S: Subscriber> Layer<S> for Counting {
        fn on_event(&self, _event: &Event<'_>, _ctx: Context<'_, S>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_state(global: bool) -> (LogState, Arc<AtomicUsize>) {
        let seen = Arc::new(AtomicUsize::new(0));
        let (_, filter) = reload::Layer::new(EnvFilter::new(DEFAULT_DIRECTIVE));
        let dispatch = Dispatch::new(Registry::default().with(Counting(Arc::clone(&seen))));
        let state = LogState {
            dispatch,
            filter,
            global,
        };
        (state, seen)
    }

    #[test]
    fn without_the_global_default_the_dispatcher_is_current_only_inside_each_call() {
        let (state, seen) = counting_state(false);
        scoped_in(&state, || tracing::warn!("inside"));
        tracing::warn!("outside");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert_eq!(scoped_in(&state, || 7), 7, "the call's value comes back");
        // A panic inside (caught at the C boundary) leaves no dispatcher behind.
        let caught = catch_unwind(AssertUnwindSafe(|| scoped_in(&state, || panic!("inside"))));
        assert!(caught.is_err());
        tracing::warn!("outside again");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn with_the_global_default_a_call_installs_nothing() {
        let (state, seen) = counting_state(true);
        scoped_in(&state, || tracing::warn!("inside"));
        assert_eq!(seen.load(Ordering::SeqCst), 0);
    }
}
