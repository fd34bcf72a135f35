//! What the plugin's watcher thread waits on: an epoll set, and each device's asynchronous
//! events (`ibv_get_async_event` on the context's non-blocking async fd).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use rdma_sys as sys;

use super::Device;
use crate::core::error::{Error, Result};

/// An epoll instance; level-triggered, keyed by a `u64` per registered fd.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    /// The most keys one [`Epoll::wait`] returns; a full batch means more may be ready.
    pub const BATCH: usize = 64;

    /// `epoll_create1(EPOLL_CLOEXEC)`.
    ///
    /// # Errors
    /// `System` when the kernel refuses.
    pub fn new() -> Result<Self> {
        // SAFETY: no pointer arguments.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(Error::system("epoll_create1", io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor this object now owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// Watch `fd` for input, hang-up and errors under `key`. The caller keeps `fd` open until
    /// [`Epoll::remove`].
    ///
    /// # Errors
    /// `System` when `epoll_ctl` fails.
    pub fn add(&self, fd: RawFd, key: u64) -> Result<()> {
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32,
            u64: key,
        };
        // SAFETY: a valid epoll fd, an fd the caller keeps open, and a valid event.
        let rc =
            unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if rc != 0 {
            return Err(Error::system("epoll_ctl(ADD)", io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Stop watching `fd` (still open). Removing an fd that is not watched is harmless.
    pub fn remove(&self, fd: RawFd) {
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: a valid epoll fd; a non-NULL event for kernels before 2.6.9.
        unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut event) };
    }

    /// Wait up to `timeout_ms` for ready fds and put their keys (at most [`Epoll::BATCH`]) into
    /// `keys`.
    ///
    /// # Errors
    /// `System` when `epoll_wait` fails (other than being interrupted).
    pub fn wait(&self, keys: &mut Vec<u64>, timeout_ms: i32) -> Result<()> {
        const MAX: usize = Epoll::BATCH;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; MAX];
        // SAFETY: a valid epoll fd and a buffer of MAX events.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                MAX as i32,
                timeout_ms,
            )
        };
        keys.clear();
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(Error::system("epoll_wait", e));
        }
        keys.extend(events[..n as usize].iter().map(|e| e.u64));
        Ok(())
    }
}

/// An eventfd, non-blocking: one thread wakes another out of [`Epoll::wait`].
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// `eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)`.
    ///
    /// # Errors
    /// `System` when the kernel refuses.
    pub fn new() -> Result<Self> {
        // SAFETY: no pointer arguments.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::system("eventfd", io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor this object now owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    /// The descriptor, for [`Epoll::add`].
    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Make the descriptor readable (a full counter already is: nothing is lost).
    pub fn notify(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd this object owns.
        unsafe { libc::write(self.raw(), std::ptr::from_ref(&one).cast(), 8) };
    }

    /// Reset the counter (nothing to read is fine: the descriptor is non-blocking).
    pub fn drain(&self) {
        let mut count = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from an eventfd this object owns.
        unsafe { libc::read(self.raw(), std::ptr::from_mut(&mut count).cast(), 8) };
    }
}

/// One asynchronous event of a device, in the terms the plugin acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`); nothing on it works any more.
    DeviceFatal,
    /// A port left the ACTIVE state (`IBV_EVENT_PORT_ERR`).
    PortDown(u32),
    /// A port became ACTIVE (`IBV_EVENT_PORT_ACTIVE`).
    PortUp(u32),
    /// A port's GID table changed (`IBV_EVENT_GID_CHANGE`): an address moved.
    GidChange(u32),
    /// A QP failed (`IBV_EVENT_QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`): the event's name and
    /// the QP's number.
    QpFatal(String, u32),
    /// A CQ failed (`IBV_EVENT_CQ_ERR`).
    CqFatal(String),
    /// Anything else, by libibverbs' name.
    Other(String),
}

impl Device {
    /// The context's async-event fd, switched to non-blocking so the watcher can drain it.
    ///
    /// # Errors
    /// `System` when `fcntl` fails.
    pub fn async_event_fd(&self) -> Result<RawFd> {
        // SAFETY: the context is open; `async_fd` is a plain int field set by ibv_open_device.
        let fd = unsafe { (*self.raw()).async_fd };
        // SAFETY: fcntl on an fd the context owns; no pointers.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(Error::system(
                format!("making {}'s async event fd non-blocking", self.name()),
                io::Error::last_os_error(),
            ));
        }
        Ok(fd)
    }

    /// The next pending asynchronous event (acknowledged), or `None` when there is none.
    pub fn next_async_event(&self) -> Option<AsyncEvent> {
        let mut raw = std::mem::MaybeUninit::<sys::ibv_async_event>::zeroed();
        // SAFETY: an open context and a writable event; the fd is non-blocking, so this returns
        // -1 (EAGAIN) at once when nothing is pending.
        if unsafe { sys::ibv_get_async_event(self.raw(), raw.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: ibv_get_async_event filled the event.
        let mut event = unsafe { raw.assume_init() };
        let kind = event.event_type;
        // SAFETY: for port events the union holds the port number (verbs.h).
        let port = || u32::try_from(unsafe { event.element.port_num }).unwrap_or(0);
        use sys::ibv_event_type::*;
        let decoded = match kind {
            IBV_EVENT_DEVICE_FATAL => AsyncEvent::DeviceFatal,
            IBV_EVENT_PORT_ERR => AsyncEvent::PortDown(port()),
            IBV_EVENT_PORT_ACTIVE => AsyncEvent::PortUp(port()),
            IBV_EVENT_GID_CHANGE => AsyncEvent::GidChange(port()),
            IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => {
                // SAFETY: for QP events the union holds the QP, alive until the event is
                // acknowledged below.
                let qp = unsafe { event.element.qp };
                let qpn = if qp.is_null() {
                    0
                } else {
                    // SAFETY: as above; checked for NULL.
                    unsafe { (*qp).qp_num }
                };
                AsyncEvent::QpFatal(event_name(kind), qpn)
            }
            IBV_EVENT_CQ_ERR => AsyncEvent::CqFatal(event_name(kind)),
            other => AsyncEvent::Other(event_name(other)),
        };
        // SAFETY: every event from ibv_get_async_event is acknowledged exactly once; destroying
        // the object it names waits for that.
        unsafe { sys::ibv_ack_async_event(&mut event) };
        Some(decoded)
    }
}

fn event_name(kind: sys::ibv_event_type) -> String {
    // SAFETY: returns a static NUL-terminated string for any value.
    let name = unsafe { sys::ibv_event_type_str(kind) };
    if name.is_null() {
        return format!("{kind:?}");
    }
    // SAFETY: non-NULL and static.
    unsafe { std::ffi::CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}
