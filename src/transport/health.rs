//! A device's health as its asynchronous events tell it: the watcher thread (`watch`) reads
//! each opened device's async-event fd; a fatal device event is recorded here, which every comm
//! on the device reads at each call; port and GID changes and failed QPs are counted, for the
//! comms with failover to look again, and logged once per event.

use std::collections::HashSet;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use super::watch::{Target, WATCHER, Watcher};
use crate::core::error::{Error, Kind, Result};
use crate::plugin::PLUGIN_NAME;
use crate::verbs::{AsyncEvent, Device};

/// A device's health as its asynchronous events tell it.
#[derive(Debug)]
pub struct DeviceHealth {
    device: Arc<Device>,
    pub(super) fd: RawFd,
    fail_on_fatal: bool,
    fatal: AtomicBool,
    key: AtomicU64,
    /// How many times the device reported a change in a GID table.
    gid_changes: AtomicU64,
    /// Ports whose latest event was `IBV_EVENT_PORT_ERR` (bit = port number).
    ports_down: AtomicU64,
    /// How many port events the device reported: a comm that saw another count looks again.
    port_events: AtomicU64,
    /// QPs the device reported failed (`IBV_EVENT_QP_FATAL` and the like).
    failed_qps: Mutex<FailedQps>,
    /// How many QPs it reported failed: a comm that saw another count looks at the list.
    qp_failures: AtomicU64,
    /// The watcher's keys of the tended comms with lanes on this device: the ones its events
    /// make due, found without a walk of every comm.
    tended: Mutex<HashSet<u64>>,
}

/// The numbers of the latest QPs a device reported failed, [`FAILED_QPS`] at most, and how
/// many it reported in all.
#[derive(Debug, Default)]
struct FailedQps {
    latest: std::collections::VecDeque<u32>,
    count: u64,
}

impl FailedQps {
    fn record(&mut self, qpn: u32) {
        if self.latest.len() == FAILED_QPS {
            self.latest.pop_front();
        }
        self.latest.push_back(qpn);
        self.count += 1;
    }

    /// Those reported after the first `seen` (the latest [`FAILED_QPS`] at most), and the
    /// count to remember.
    fn since(&self, seen: u64) -> (Vec<u32>, u64) {
        let new = usize::try_from(self.count.saturating_sub(seen)).unwrap_or(usize::MAX);
        let skip = self.latest.len().saturating_sub(new);
        (self.latest.iter().skip(skip).copied().collect(), self.count)
    }
}

/// How many failed QP numbers a device keeps: more than the comms could miss between two polls.
const FAILED_QPS: usize = 64;

impl DeviceHealth {
    /// Watch `device`'s asynchronous events. With `fail_on_fatal` (`NCCL_IB_RETURN_ASYNC_EVENTS`)
    /// a fatal device event fails every comm on it; without, it is only logged.
    ///
    /// # Errors
    /// `System` when the watcher cannot be started or the event fd not registered.
    pub fn watch(device: Arc<Device>, fail_on_fatal: bool) -> Result<Arc<Self>> {
        let fd = device.async_event_fd()?;
        let health = Arc::new(Self {
            device,
            fd,
            fail_on_fatal,
            fatal: AtomicBool::new(false),
            key: AtomicU64::new(0),
            gid_changes: AtomicU64::new(0),
            ports_down: AtomicU64::new(0),
            port_events: AtomicU64::new(0),
            failed_qps: Mutex::default(),
            qp_failures: AtomicU64::new(0),
            tended: Mutex::default(),
        });
        let key = Watcher::get()?.register(fd, Target::Device(Arc::clone(&health)))?;
        health.key.store(key, Ordering::Release);
        Ok(health)
    }

    /// How many GID-table changes the device has reported (`IBV_EVENT_GID_CHANGE`): a port
    /// whose count moved chooses its GID again for its next connection.
    pub fn gid_changes(&self) -> u64 {
        self.gid_changes.load(Ordering::Acquire)
    }

    /// How many port events (down or active) the device has reported.
    #[inline]
    pub fn port_events(&self) -> u64 {
        self.port_events.load(Ordering::Acquire)
    }

    /// Whether `port`'s latest event said it went down.
    pub fn port_down(&self, port: u8) -> bool {
        self.ports_down.load(Ordering::Acquire) & port_bit(u32::from(port)) != 0
    }

    /// How many QPs the device reported failed so far.
    #[inline]
    pub fn qp_failures(&self) -> u64 {
        self.qp_failures.load(Ordering::Acquire)
    }

    /// The QPs reported failed after the first `seen` (the latest 64 at most), and
    /// the count to remember.
    pub fn failed_qps_since(&self, seen: u64) -> (Vec<u32>, u64) {
        self.failed_qps.lock().since(seen)
    }

    fn qp_failed(&self, qpn: u32) {
        let mut list = self.failed_qps.lock();
        list.record(qpn);
        self.qp_failures.store(list.count, Ordering::Release);
        HEALTH_CHANGES.fetch_add(1, Ordering::AcqRel);
    }

    fn port_event(&self, port: u32, down: bool) {
        if down {
            self.ports_down.fetch_or(port_bit(port), Ordering::AcqRel);
        } else {
            self.ports_down.fetch_and(!port_bit(port), Ordering::AcqRel);
        }
        self.port_events.fetch_add(1, Ordering::AcqRel);
        HEALTH_CHANGES.fetch_add(1, Ordering::AcqRel);
    }

    /// `Err` once the device reported a fatal error.
    ///
    /// # Errors
    /// `System`, naming the device.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if !self.fatal.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(self.fatal_error())
    }

    #[cold]
    fn fatal_error(&self) -> Error {
        Error::new(
            Kind::System,
            format!(
                "device {} reported a fatal error (IBV_EVENT_DEVICE_FATAL): the NIC or its driver \
                 failed and nothing on it works until it is reset; check dmesg on this node",
                self.device.name()
            ),
        )
    }

    /// Index tended comm `key` as one with lanes on this device.
    pub(super) fn track(&self, key: u64) {
        self.tended.lock().insert(key);
    }

    /// Take tended comm `key` off the index (it closed).
    pub(super) fn untrack(&self, key: u64) {
        self.tended.lock().remove(&key);
    }

    /// The tended comms with lanes on this device.
    pub(super) fn tracked(&self) -> Vec<u64> {
        self.tended.lock().iter().copied().collect()
    }

    /// Stop watching (the device is being closed).
    pub fn unwatch(&self) {
        if let Some(w) = WATCHER.get() {
            w.unregister(self.key.load(Ordering::Acquire));
        }
    }

    /// Handle the events that arrived; whether any concerns the comms on the device (all but
    /// the ones only logged).
    pub(super) fn on_readable(&self) -> bool {
        let name = self.device.name();
        let mut concerns_comms = false;
        while let Some(event) = self.device.next_async_event() {
            concerns_comms |= !matches!(event, AsyncEvent::Other(_) | AsyncEvent::GidChange(_));
            match event {
                AsyncEvent::DeviceFatal => {
                    if self.fail_on_fatal {
                        self.fatal.store(true, Ordering::Release);
                    }
                    tracing::error!(
                        "NET/{PLUGIN_NAME}: {name}: fatal device error (IBV_EVENT_DEVICE_FATAL){}",
                        if self.fail_on_fatal {
                            ": every comm on it fails from its next call"
                        } else {
                            " (NCCL_IB_RETURN_ASYNC_EVENTS=0: comms go on until they fail)"
                        }
                    );
                }
                AsyncEvent::PortDown(port) => {
                    self.port_event(port, true);
                    tracing::warn!(
                        "NET/{PLUGIN_NAME}: {name}:{port} went down (IBV_EVENT_PORT_ERR): link, \
                         cable or switch"
                    );
                }
                AsyncEvent::PortUp(port) => {
                    self.port_event(port, false);
                    tracing::info!("NET/{PLUGIN_NAME}: {name}:{port} is active again");
                }
                AsyncEvent::GidChange(port) => {
                    self.gid_changes.fetch_add(1, Ordering::AcqRel);
                    tracing::info!(
                        "NET/{PLUGIN_NAME}: {name}:{port}: GID table changed (an address was added \
                         or removed): the next connection chooses its GID again; connections made \
                         before keep theirs"
                    );
                }
                AsyncEvent::QpFatal(what, qpn) => {
                    self.qp_failed(qpn);
                    tracing::warn!(
                        "NET/{PLUGIN_NAME}: {name}: {what} on QP {qpn}: a comm with port failover \
                         moves the lane to another QP, any other reports it at its next call"
                    );
                }
                AsyncEvent::CqFatal(what) => tracing::warn!(
                    "NET/{PLUGIN_NAME}: {name}: {what}: the affected comm reports it at its next call"
                ),
                AsyncEvent::Other(what) => tracing::debug!("NET/{PLUGIN_NAME}: {name}: {what}"),
            }
        }
        concerns_comms
    }
}

/// How many port events and failed QPs every device of the process reported, counted after the
/// device's own record of each: a comm with failover reads this one word per progress rather
/// than its members' counters (on a fused device that was most of what failover cost a healthy
/// `test`), and looks at its members only when it moved.
static HEALTH_CHANGES: AtomicU64 = AtomicU64::new(0);

/// See [`HEALTH_CHANGES`].
#[inline]
pub(super) fn health_changes() -> u64 {
    HEALTH_CHANGES.load(Ordering::Acquire)
}

fn port_bit(port: u32) -> u64 {
    1u64.checked_shl(port).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comm_sees_each_failed_qp_once_and_only_the_latest_when_far_behind() {
        let mut failed = FailedQps::default();
        let (none, seen) = failed.since(0);
        assert!(none.is_empty());
        failed.record(7);
        failed.record(9);
        let (new, seen) = failed.since(seen);
        assert_eq!((new, seen), (vec![7, 9], 2));
        assert!(failed.since(seen).0.is_empty(), "nothing new");
        failed.record(11);
        assert_eq!(failed.since(seen), (vec![11], 3));
        for qpn in 100..200 {
            failed.record(qpn);
        }
        let (new, seen) = failed.since(3);
        assert_eq!(
            new,
            (136..200).collect::<Vec<u32>>(),
            "the latest {FAILED_QPS}"
        );
        assert_eq!(seen, 103);
    }
}
