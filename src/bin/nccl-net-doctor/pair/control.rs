//! The control channel between the two doctors: one JSON message per line.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use nccl_net::driver::Handle;
use serde::{Deserialize, Serialize};

use super::traffic::MemberTraffic;
use crate::card::NodeCard;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Msg {
    Card {
        card: Box<NodeCard>,
    },
    Handle {
        handle: String,
    },
    Connected {
        error: Option<String>,
    },
    Verified {
        ok: bool,
        detail: String,
    },
    Gpu {
        usable: Option<String>,
    },
    Stream {
        count: usize,
    },
    StreamDone {
        error: Option<String>,
    },
    Bandwidth {
        gbps: f64,
        seconds: f64,
        bytes: u64,
    },
    Counters {
        deltas: Vec<(String, u64)>,
        read: usize,
        /// Per member of a fused device; empty for one port.
        members: Vec<MemberTraffic>,
    },
    Abort {
        why: String,
    },
}

/// The control channel: one JSON message per line.
pub(super) struct Control {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Control {
    pub(super) fn new(stream: TcpStream, timeout: Duration) -> Result<Self, String> {
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| e.to_string())?;
        let writer = stream.try_clone().map_err(|e| e.to_string())?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
        })
    }

    pub(super) fn send(&mut self, msg: &Msg) -> Result<(), String> {
        let mut line = serde_json::to_string(msg).map_err(|e| e.to_string())?;
        line.push('\n');
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| format!("control channel: {e}"))
    }

    pub(super) fn recv(&mut self) -> Result<Msg, String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) => Err("the peer closed the control channel".to_owned()),
            Ok(_) => match serde_json::from_str(&line) {
                Ok(Msg::Abort { why }) => Err(format!("the peer stopped: {why}")),
                Ok(msg) => Ok(msg),
                Err(e) => Err(format!("unreadable control message ({e}): {}", line.trim())),
            },
            Err(e) => Err(format!(
                "control channel: {e} (the peer did not answer in time)"
            )),
        }
    }
}

/// Expect a message of one kind; `pick` returns `None` for any other.
pub(super) fn expect<T>(
    ctl: &mut Control,
    what: &str,
    pick: impl FnOnce(Msg) -> Option<T>,
) -> Result<T, String> {
    let msg = ctl.recv()?;
    let text = format!("{msg:?}");
    pick(msg).ok_or_else(|| format!("expected {what} from the peer, got {text}"))
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(super) fn unhex(text: &str) -> Option<Handle> {
    let mut h = [0u8; 128];
    if text.len() != 256 {
        return None;
    }
    for (i, byte) in h.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(h)
}
