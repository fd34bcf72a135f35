//! The control messages of port failover, as they travel on a comm's out-of-band TCP
//! connection once the handshake is over (only between two sides that both offered failover):
//! a tag byte, a length byte, the payload (little-endian). The goodbye a closing comm writes is
//! the single byte [`GOODBYE`], which is never a frame's tag, so a reader that knows frames and
//! one that waits only for the goodbye both read it.

use crate::core::error::{Error, Kind, Result};

/// The byte a comm writes to its peer when it closes in order.
pub const GOODBYE: u8 = 0x42;

/// A set of lanes (QP indexes of a connection, at most `MAX_CONNECTION_QPS` = 128).
pub type LaneSet = u128;

/// A set of member ports of one side (bit `m`: member `m`), at most `MAX_FUSED_MEMBERS` = 8.
pub type MemberSet = u8;

/// One control message.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// These lanes failed on the writer's side (a completion error, a port event): from the
    /// sender, the receiver repairs them; from the receiver, the sender stops writing on them
    /// and waits for its offers. `down` is the writer's members that are down now.
    Broken {
        /// The lanes that failed.
        lanes: LaneSet,
        /// The sender's members that are down.
        down: MemberSet,
    },
    /// Either side: which of its members are down now (sent when that changes).
    Health {
        /// The members that are down.
        down: MemberSet,
    },
    /// From the receiver: a new QP for `lane`, on its member `recv_member`, to be connected to a
    /// new QP of the sender's on `send_member`.
    Offer {
        /// The lane being repaired.
        lane: u8,
        /// Which repair of that lane this is (stale answers are ignored).
        epoch: u32,
        /// The receiver's member the new QP lives on.
        recv_member: u8,
        /// The sender's member its new QP must live on.
        send_member: u8,
        /// The receiver's new QP number.
        qpn: u32,
        /// Its first packet sequence number.
        psn: u32,
    },
    /// From the sender: its new QP for `lane`, connected to the receiver's offer.
    Accept {
        /// The lane being repaired.
        lane: u8,
        /// The offer's epoch.
        epoch: u32,
        /// The sender's new QP number.
        qpn: u32,
        /// Its first packet sequence number.
        psn: u32,
    },
    /// From the sender: it cannot take the offer (its member is down, or the QP failed).
    Refuse {
        /// The lane being repaired.
        lane: u8,
        /// The offer's epoch.
        epoch: u32,
        /// The sender's members that are down now.
        down: MemberSet,
    },
    /// From the receiver: the new QP is ready and has `consumed` messages of the lane behind it
    /// (every message the lane carried before, counted by its closing write-with-immediate):
    /// the sender writes the rest again on the new QP.
    Resume {
        /// The lane repaired.
        lane: u8,
        /// The offer's epoch.
        epoch: u32,
        /// Messages of the lane the receiver has taken in all.
        consumed: u64,
    },
}

const BROKEN: u8 = 1;
const HEALTH: u8 = 2;
const OFFER: u8 = 3;
const ACCEPT: u8 = 4;
const REFUSE: u8 = 5;
const RESUME: u8 = 6;

/// Longest frame on the wire: tag, length, and the longest payload (`Broken`).
pub const MAX_FRAME_LEN: usize = 2 + 17;

fn malformed(what: String) -> Error {
    Error::new(
        Kind::Remote,
        format!("peer sent a malformed failover message: {what}"),
    )
}

impl Frame {
    /// Encode into `out`, returning the bytes written.
    pub fn emit(&self, out: &mut [u8; MAX_FRAME_LEN]) -> usize {
        let mut w = Writer { out, at: 2 };
        let tag = match *self {
            Self::Broken { lanes, down } => {
                w.put(&lanes.to_le_bytes());
                w.put(&[down]);
                BROKEN
            }
            Self::Health { down } => {
                w.put(&[down]);
                HEALTH
            }
            Self::Offer {
                lane,
                epoch,
                recv_member,
                send_member,
                qpn,
                psn,
            } => {
                w.put(&[lane]);
                w.put(&epoch.to_le_bytes());
                w.put(&[recv_member, send_member]);
                w.put(&qpn.to_le_bytes());
                w.put(&psn.to_le_bytes());
                OFFER
            }
            Self::Accept {
                lane,
                epoch,
                qpn,
                psn,
            } => {
                w.put(&[lane]);
                w.put(&epoch.to_le_bytes());
                w.put(&qpn.to_le_bytes());
                w.put(&psn.to_le_bytes());
                ACCEPT
            }
            Self::Refuse { lane, epoch, down } => {
                w.put(&[lane]);
                w.put(&epoch.to_le_bytes());
                w.put(&[down]);
                REFUSE
            }
            Self::Resume {
                lane,
                epoch,
                consumed,
            } => {
                w.put(&[lane]);
                w.put(&epoch.to_le_bytes());
                w.put(&consumed.to_le_bytes());
                RESUME
            }
        };
        let len = w.at;
        out[0] = tag;
        out[1] = u8::try_from(len - 2).unwrap_or(0);
        len
    }

    /// Decode the first frame of `bytes`: `Ok(None)` until it has fully arrived, else the frame
    /// and the bytes it took.
    ///
    /// # Errors
    /// `Remote` for an unknown tag or a payload of the wrong length.
    pub fn parse(bytes: &[u8]) -> Result<Option<(Self, usize)>> {
        let [tag, len, ..] = *bytes else {
            return Ok(None);
        };
        let len = usize::from(len);
        let Some(p) = bytes.get(2..2 + len) else {
            return Ok(None);
        };
        let want = match tag {
            BROKEN => 17,
            HEALTH => 1,
            OFFER => 15,
            ACCEPT => 13,
            REFUSE => 6,
            RESUME => 13,
            other => return Err(malformed(format!("unknown tag {other:#x}"))),
        };
        if len != want {
            return Err(malformed(format!(
                "tag {tag} with {len} bytes (expected {want})"
            )));
        }
        let u32_at = |at: usize| u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]]);
        let frame = match tag {
            BROKEN => {
                let mut lanes = [0u8; 16];
                lanes.copy_from_slice(&p[..16]);
                Self::Broken {
                    lanes: u128::from_le_bytes(lanes),
                    down: p[16],
                }
            }
            HEALTH => Self::Health { down: p[0] },
            OFFER => Self::Offer {
                lane: p[0],
                epoch: u32_at(1),
                recv_member: p[5],
                send_member: p[6],
                qpn: u32_at(7),
                psn: u32_at(11),
            },
            ACCEPT => Self::Accept {
                lane: p[0],
                epoch: u32_at(1),
                qpn: u32_at(5),
                psn: u32_at(9),
            },
            REFUSE => Self::Refuse {
                lane: p[0],
                epoch: u32_at(1),
                down: p[5],
            },
            _ => {
                let mut consumed = [0u8; 8];
                consumed.copy_from_slice(&p[5..13]);
                Self::Resume {
                    lane: p[0],
                    epoch: u32_at(1),
                    consumed: u64::from_le_bytes(consumed),
                }
            }
        };
        Ok(Some((frame, 2 + len)))
    }
}

struct Writer<'a> {
    out: &'a mut [u8; MAX_FRAME_LEN],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.out[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Frame> {
        vec![
            Frame::Broken {
                lanes: 1 << 127 | 5,
                down: 0b10,
            },
            Frame::Health { down: 0x81 },
            Frame::Offer {
                lane: 127,
                epoch: 7,
                recv_member: 1,
                send_member: 7,
                qpn: 0x00ab_cdef,
                psn: 0x0012_3456,
            },
            Frame::Accept {
                lane: 3,
                epoch: u32::MAX,
                qpn: 17,
                psn: 0,
            },
            Frame::Refuse {
                lane: 0,
                epoch: 1,
                down: 0xff,
            },
            Frame::Resume {
                lane: 9,
                epoch: 2,
                consumed: u64::MAX - 1,
            },
        ]
    }

    #[test]
    fn every_frame_reads_back_as_written_and_never_starts_with_the_goodbye() {
        for frame in all() {
            let mut out = [0u8; MAX_FRAME_LEN];
            let n = frame.emit(&mut out);
            assert_ne!(out[0], GOODBYE);
            assert_eq!(Frame::parse(&out[..n]).unwrap(), Some((frame, n)));
            for short in 0..n {
                assert_eq!(
                    Frame::parse(&out[..short]).unwrap(),
                    None,
                    "{frame:?} cut at {short}"
                );
            }
        }
    }

    #[test]
    fn frames_back_to_back_parse_one_at_a_time() {
        let mut stream = Vec::new();
        for frame in all() {
            let mut out = [0u8; MAX_FRAME_LEN];
            let n = frame.emit(&mut out);
            stream.extend_from_slice(&out[..n]);
        }
        let mut at = 0;
        let mut read = Vec::new();
        while let Some((frame, n)) = Frame::parse(&stream[at..]).unwrap() {
            read.push(frame);
            at += n;
        }
        assert_eq!(read, all());
        assert_eq!(at, stream.len());
    }

    #[test]
    fn unknown_tags_and_wrong_lengths_are_refused() {
        assert!(Frame::parse(&[0x77, 0]).is_err());
        assert!(Frame::parse(&[HEALTH, 2, 0, 0]).is_err());
        assert!(Frame::parse(&[RESUME, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }
}
