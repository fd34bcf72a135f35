//! Non-blocking byte exchange over the out-of-band TCP stream, with a deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use crate::core::error::{Error, Kind, Result};

/// One handshake stream: bytes waiting to go out, bytes received so far.
#[derive(Debug)]
pub(super) struct HandshakeStream {
    stream: TcpStream,
    pub(super) peer: SocketAddr,
    inbox: Vec<u8>,
    outbox: Vec<u8>,
    pub(super) deadline: Instant,
}

fn remote(what: String) -> Error {
    Error::new(Kind::Remote, what)
}

/// `System` error for socket call `what` that failed with `e`. When `e` is the process's
/// open-file limit (EMFILE) or the system's (ENFILE), the message names the limit, what holds
/// descriptors, and how to raise it: a process keeps one TCP connection per peer process (or per
/// comm, with a peer that does not share links), a connection per connect or accept in
/// progress, and a device with listen comms open one listening socket.
pub(super) fn socket_error(what: impl Into<String>, e: std::io::Error) -> Error {
    let what = what.into();
    match e.raw_os_error() {
        Some(libc::EMFILE) => {
            // Not from /proc/self/limits: opening it needs the descriptor there is none of.
            let limit = crate::driver::process::open_file_limit().map_or_else(
                |e| format!("unknown: {e}"),
                |(soft, hard)| format!("soft {}, hard {}", limit_text(soft), limit_text(hard)),
            );
            Error::system(
                format!(
                    "{what}: the process reached its open-file limit (RLIMIT_NOFILE {limit}): \
                     a process keeps one TCP connection per peer process (per comm where a peer \
                     does not share links, NCCL_NET_RS_SHARE_LINKS), one per connect or accept \
                     in progress, and a device with listen comms open one listening socket; \
                     NCCL raises the soft limit to the hard \
                     one when it starts, so raise the hard limit where the job starts (ulimit \
                     -Hn, systemd LimitNOFILE=, docker --ulimit nofile=N:N)"
                ),
                e,
            )
        }
        Some(libc::ENFILE) => Error::system(
            format!(
                "{what}: the system's open-file table is full (fs.file-max, \
                 /proc/sys/fs/file-nr): raise fs.file-max with sysctl"
            ),
            e,
        ),
        _ => Error::system(what, e),
    }
}

fn limit_text(limit: u64) -> String {
    if limit == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        limit.to_string()
    }
}

impl HandshakeStream {
    pub(super) fn new(stream: TcpStream, peer: SocketAddr, deadline: Instant) -> Result<Self> {
        stream
            .set_nonblocking(true)
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| Error::system(format!("configuring the handshake socket to {peer}"), e))?;
        Ok(Self {
            stream,
            peer,
            inbox: Vec::new(),
            outbox: Vec::new(),
            deadline,
        })
    }

    /// Queue bytes to send.
    pub(super) fn queue(&mut self, bytes: &[u8]) {
        self.outbox.extend_from_slice(bytes);
    }

    /// The TCP connection, for the comm to keep once the handshake is over.
    pub(super) fn into_stream(self) -> TcpStream {
        self.stream
    }

    /// The socket's descriptor, for an epoll set.
    pub(super) fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.stream)
    }

    /// True once the deadline passed.
    pub(super) fn expired(&self) -> bool {
        Instant::now() > self.deadline
    }

    /// The error of a peer that did not `step` before the deadline.
    pub(super) fn late(&self, step: &str) -> Error {
        remote(format!(
            "peer {} did not {step} before the deadline (NCCL_NET_RS_CONNECT_TIMEOUT): is the \
             peer process alive?",
            self.peer
        ))
    }

    /// A socket error in plain words: a reset or broken pipe is the peer going away.
    fn io_failure(&self, doing: &str, e: &std::io::Error) -> Error {
        match e.kind() {
            ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::ConnectionAborted => {
                remote(format!(
                    "peer {} closed the connection during the handshake ({e})",
                    self.peer
                ))
            }
            _ => remote(format!("{doing} peer {} failed: {e}", self.peer)),
        }
    }

    /// Send what is queued; `true` when nothing is left.
    pub(super) fn flush(&mut self) -> Result<bool> {
        while !self.outbox.is_empty() {
            match self.stream.write(&self.outbox) {
                Ok(0) => {
                    return Err(remote(format!(
                        "peer {} closed the connection during the handshake",
                        self.peer
                    )));
                }
                Ok(n) => {
                    self.outbox.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_failure("sending the handshake to", &e)),
            }
        }
        Ok(true)
    }

    /// Exactly `len` bytes once they have all arrived; `None` until then.
    pub(super) fn receive(&mut self, len: usize) -> Result<Option<Vec<u8>>> {
        if !self.fill(len)? {
            return Ok(None);
        }
        Ok(Some(self.inbox.drain(..len).collect()))
    }

    /// The first `len` bytes that arrived, left for [`Self::receive`]; `Ok(None)` until they
    /// are all there.
    ///
    /// # Errors
    /// As [`Self::receive`].
    pub(super) fn peek(&mut self, len: usize) -> Result<Option<&[u8]>> {
        Ok(self.fill(len)?.then(|| &self.inbox[..len]))
    }

    /// Read until `len` bytes are buffered: whether they are.
    fn fill(&mut self, len: usize) -> Result<bool> {
        let mut buf = [0u8; 512];
        while self.inbox.len() < len {
            let want = (len - self.inbox.len()).min(buf.len());
            match self.stream.read(&mut buf[..want]) {
                Ok(0) => {
                    return Err(remote(format!(
                        "peer {} closed the connection during the handshake",
                        self.peer
                    )));
                }
                Ok(n) => self.inbox.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_failure("receiving the handshake from", &e)),
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_is_named_with_both_values_and_how_to_raise_it() {
        let (soft, hard) = crate::driver::process::open_file_limit().unwrap();
        let e = socket_error(
            "accept on 10.0.0.1:5000",
            std::io::Error::from_raw_os_error(libc::EMFILE),
        );
        let text = e.to_string();
        for needle in [
            "accept on 10.0.0.1:5000",
            &format!(
                "RLIMIT_NOFILE soft {}, hard {}",
                limit_text(soft),
                limit_text(hard)
            ),
            "ulimit -Hn",
            "LimitNOFILE",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        let other = socket_error("bind", std::io::Error::from_raw_os_error(libc::EADDRINUSE));
        assert!(!other.to_string().contains("RLIMIT"), "{other}");
    }
}
