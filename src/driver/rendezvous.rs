//! The TCP rendezvous the tools run before they drive a plugin (the benchmark's ranks, the
//! doctor's two ends): one side accepts, the other connects, both with a deadline.
#![forbid(unsafe_code)]

use std::io;
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Accept one connection on `listener` before `deadline`; `give_up` is asked between tries and
/// ends the wait with its reason (a child process that died, for instance).
///
/// # Errors
/// The reason `give_up` gave, `timed out`, or the accept error.
pub fn accept(
    listener: &TcpListener,
    deadline: Instant,
    mut give_up: impl FnMut() -> Option<String>,
) -> Result<TcpStream, String> {
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                return Ok(stream);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Some(why) = give_up() {
                    return Err(why);
                }
                if Instant::now() > deadline {
                    return Err("timed out".to_owned());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Connect to `addr`, retrying until `deadline` (the other side may not listen yet).
///
/// # Errors
/// The last connect error once the deadline passed.
pub fn connect(addr: &str, deadline: Instant) -> Result<TcpStream, io::Error> {
    loop {
        match TcpStream::connect(addr) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}
