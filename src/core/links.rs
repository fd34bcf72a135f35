//! Byte formats of the shared out-of-band links: one TCP connection between two processes that
//! carries the liveness and failover messages of every comm between them (see
//! `transport::peer_link`), instead of one connection per comm.
//!
//! - A **link** is dialed to the listener's door like a comm's handshake, and opens with a
//!   [`LinkHello`] (the dialer's process, the link's number, the nonce of a handle it holds);
//!   the door answers one [`LINK_ACK`] byte once the link is registered, and the dialer lets no
//!   comm join it before that byte arrived, so a comm never names a link the listener does not
//!   know yet.
//! - A **comm** still shakes hands on a connection of its own. When the listen handle announces
//!   the listener's process (`ListenHandle::process`), the connector sets
//!   `Hello::shares_links` and sends a [`Proposal`] after its hello: join this link. A listener
//!   that shares links answers with the flag set and an [`Answer`] after its hello; either way
//!   both sides know from the two hellos whether these bytes come. A comm that joined closes
//!   its handshake connection after the ready byte; one that did not (an older peer, a link
//!   the listener does not have) keeps it, as every comm did before.
//! - On a link, every message is a [`LinkMessage`]: which comm (its channel, the connect nonce
//!   of its handshake) and what: a failover frame, the comm's goodbye, or that the comm is gone
//!   without one.

use super::error::{Error, Kind, Result};
use super::repair::{Frame, MAX_FRAME_LEN};
use super::wire::{u32_at, u64_at};

const LINK_MAGIC: u32 = 0x5253_494c; // "RSIL"
const PROPOSAL_MAGIC: u32 = 0x5253_4950; // "RSIP"
const ANSWER_MAGIC: u32 = 0x5253_4941; // "RSIA"

/// The byte the door answers a link's hello with once the link is registered.
pub const LINK_ACK: u8 = 0x4c;

fn remote(what: String) -> Error {
    Error::new(Kind::Remote, what)
}

/// The first bytes on a link's connection.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LinkHello {
    /// The nonce of a listen handle of the door's (proof that the dialer holds one).
    pub listen_nonce: u64,
    /// The dialer's process.
    pub process: u64,
    /// The link's number, chosen by the dialer; comms that join it name it.
    pub link: u64,
}

impl LinkHello {
    /// Encoded size.
    pub const LEN: usize = 32;

    /// Whether `first` (at least 4 bytes) begins a link's hello rather than a comm's.
    pub fn begins(first: &[u8]) -> bool {
        first.len() >= 4 && u32_at(first, 0) == LINK_MAGIC
    }

    /// Encode.
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&LINK_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.listen_nonce.to_le_bytes());
        out[16..24].copy_from_slice(&self.process.to_le_bytes());
        out[24..32].copy_from_slice(&self.link.to_le_bytes());
        out
    }

    /// Decode.
    ///
    /// # Errors
    /// `Remote` for anything but a link's hello from a process and with a link number.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::LEN || !Self::begins(b) || b[4..8] != [0; 4] {
            return Err(remote("sent an unknown link hello".into()));
        }
        let hello = Self {
            listen_nonce: u64_at(b, 8),
            process: u64_at(b, 16),
            link: u64_at(b, 24),
        };
        if hello.process == 0 || hello.link == 0 {
            return Err(remote("sent a link hello without process or link".into()));
        }
        Ok(hello)
    }
}

/// What a connector sends after its hello when it offers to share: the link it asks its comm
/// to join.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Proposal {
    /// The connector's process.
    pub process: u64,
    /// The link (its [`LinkHello::link`]).
    pub link: u64,
}

impl Proposal {
    /// Encoded size.
    pub const LEN: usize = 24;

    /// Encode.
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&PROPOSAL_MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.process.to_le_bytes());
        out[16..24].copy_from_slice(&self.link.to_le_bytes());
        out
    }

    /// Decode.
    ///
    /// # Errors
    /// `Remote` when the bytes are no proposal.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::LEN || u32_at(b, 0) != PROPOSAL_MAGIC || b[4..8] != [0; 4] {
            return Err(remote(
                "offered to share a link but sent no proposal".into(),
            ));
        }
        Ok(Self {
            process: u64_at(b, 8),
            link: u64_at(b, 16),
        })
    }
}

/// What a listener that shares links sends after its hello: whether the comm joined the
/// proposed link (else it keeps its handshake connection).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The comm is on the proposed link.
    pub joined: bool,
}

impl Answer {
    /// Encoded size.
    pub const LEN: usize = 8;

    /// Encode.
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&ANSWER_MAGIC.to_le_bytes());
        out[4] = u8::from(self.joined);
        out
    }

    /// Decode.
    ///
    /// # Errors
    /// `Remote` when the bytes are no answer.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::LEN || u32_at(b, 0) != ANSWER_MAGIC || b[4] > 1 || b[5..8] != [0; 3] {
            return Err(remote("shares links but sent no answer".into()));
        }
        Ok(Self { joined: b[4] == 1 })
    }
}

/// One message on a link, for the comm on `channel`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LinkMessage {
    /// The comm it is for: the connect nonce of its handshake.
    pub channel: u64,
    /// What it says.
    pub body: Body,
}

/// What a [`LinkMessage`] says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A failover frame.
    Frame(Frame),
    /// The comm closed in order (`closeSend`/`closeRecv`).
    Goodbye,
    /// The comm is gone without a goodbye: its handshake failed after both sides agreed on
    /// its channel.
    Gone,
}

const FRAME: u8 = 1;
const GOODBYE: u8 = 2;
const GONE: u8 = 3;

/// Longest message on a link.
pub const MAX_LINK_MESSAGE: usize = 9 + MAX_FRAME_LEN;

impl LinkMessage {
    /// Encode into `out`, returning the bytes written.
    pub fn emit(&self, out: &mut [u8; MAX_LINK_MESSAGE]) -> usize {
        out[1..9].copy_from_slice(&self.channel.to_le_bytes());
        match self.body {
            Body::Frame(frame) => {
                out[0] = FRAME;
                let mut f = [0u8; MAX_FRAME_LEN];
                let n = frame.emit(&mut f);
                out[9..9 + n].copy_from_slice(&f[..n]);
                9 + n
            }
            Body::Goodbye => {
                out[0] = GOODBYE;
                9
            }
            Body::Gone => {
                out[0] = GONE;
                9
            }
        }
    }

    /// Decode the first message of `bytes`: `Ok(None)` until it has fully arrived, else the
    /// message and the bytes it took.
    ///
    /// # Errors
    /// `Remote` for an unknown kind or a malformed frame (the link is useless after it).
    pub fn parse(bytes: &[u8]) -> Result<Option<(Self, usize)>> {
        if bytes.len() < 9 {
            return Ok(None);
        }
        let channel = u64_at(bytes, 1);
        let (body, used) = match bytes[0] {
            FRAME => match Frame::parse(&bytes[9..])? {
                Some((frame, n)) => (Body::Frame(frame), 9 + n),
                None => return Ok(None),
            },
            GOODBYE => (Body::Goodbye, 9),
            GONE => (Body::Gone, 9),
            other => {
                return Err(remote(format!(
                    "sent a link message of unknown kind {other:#x}"
                )));
            }
        };
        Ok(Some((Self { channel, body }, used)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_hellos_proposals_and_answers_round_trip_and_refuse_foreign_bytes() {
        let hello = LinkHello {
            listen_nonce: 7,
            process: 0x1234_5678_9abc,
            link: 42,
        };
        let b = hello.emit();
        assert!(LinkHello::begins(&b));
        assert_eq!(LinkHello::parse(&b).unwrap(), hello);
        for zero in [16, 24] {
            let mut b = b;
            b[zero..zero + 8].fill(0);
            assert!(LinkHello::parse(&b).is_err(), "a zero at {zero}");
        }
        let proposal = Proposal {
            process: 9,
            link: 42,
        };
        assert_eq!(Proposal::parse(&proposal.emit()).unwrap(), proposal);
        for joined in [false, true] {
            let answer = Answer { joined };
            assert_eq!(Answer::parse(&answer.emit()).unwrap(), answer);
        }
        let mut two = Answer { joined: true }.emit();
        two[4] = 2;
        assert!(Answer::parse(&two).is_err());
        // Each kind's bytes are no other kind.
        assert!(Proposal::parse(&Answer { joined: true }.emit()).is_err());
        assert!(!LinkHello::begins(&proposal.emit()));
        assert!(Answer::parse(&proposal.emit()).is_err());
    }

    #[test]
    fn link_messages_arrive_whole_in_any_split() {
        let messages = [
            LinkMessage {
                channel: 1,
                body: Body::Frame(Frame::Health { down: 2 }),
            },
            LinkMessage {
                channel: u64::MAX,
                body: Body::Goodbye,
            },
            LinkMessage {
                channel: 5,
                body: Body::Frame(Frame::Broken {
                    lanes: 1 << 100,
                    down: 1,
                }),
            },
            LinkMessage {
                channel: 6,
                body: Body::Gone,
            },
        ];
        let mut stream = Vec::new();
        for m in &messages {
            let mut out = [0u8; MAX_LINK_MESSAGE];
            let n = m.emit(&mut out);
            for short in 0..n {
                assert_eq!(LinkMessage::parse(&out[..short]).unwrap(), None);
            }
            stream.extend_from_slice(&out[..n]);
        }
        let mut got = Vec::new();
        let mut at = 0;
        while let Some((m, used)) = LinkMessage::parse(&stream[at..]).unwrap() {
            got.push(m);
            at += used;
        }
        assert_eq!(got, messages);
        assert_eq!(at, stream.len());
        assert!(LinkMessage::parse(&[9; 12]).is_err(), "an unknown kind");
    }
}
