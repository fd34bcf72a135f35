//! Per-communicator contexts (ncclNet v11+): what `init` was told for one communicator, and the
//! traffic hints `setNetAttr` gives it. NCCL's own transport ignores the hints; this plugin
//! validates and records them (and logs them at TRACE), and uses none of them yet.

use std::fmt;

use parking_lot::Mutex;

use crate::core::error::{Error, Result};

/// NCCL's "undefined" for the signed hint fields and the traffic class.
const UNDEF: i32 = -1;

/// Function, algorithm and protocol kinds NCCL 2.30 knows (`ncclNumFuncs`,
/// `NCCL_NUM_ALGORITHMS`, `NCCL_NUM_PROTOCOLS`): bits beyond them are refused.
const OP_KINDS: u32 = 15;
const ALGO_KINDS: u32 = 7;
const PROTO_KINDS: u32 = 3;

/// One communicator's context, created by `init` and released by `finalize`.
#[derive(Debug)]
pub struct CommContext {
    /// The communicator's hash (`commId`).
    pub comm_id: u64,
    /// Its traffic class (`config->trafficClass`), when it set one.
    pub traffic_class: Option<u8>,
    hints: Mutex<Option<NetHints>>,
}

impl CommContext {
    /// A context for communicator `comm_id` whose config asked for `traffic_class` (-1: none).
    ///
    /// # Errors
    /// `Config` for a traffic class outside -1..=255.
    pub fn new(comm_id: u64, traffic_class: i32) -> Result<Self> {
        Ok(Self {
            comm_id,
            traffic_class: traffic_class_of(traffic_class)?,
            hints: Mutex::new(None),
        })
    }

    /// Record `hints` (any thread, any time) and log them at TRACE.
    pub fn set_hints(&self, hints: NetHints) {
        tracing::trace!("setNetAttr for comm {:#x}: {hints}", self.comm_id);
        *self.hints.lock() = Some(hints);
    }

    /// The hints last recorded.
    pub fn hints(&self) -> Option<NetHints> {
        *self.hints.lock()
    }
}

/// The traffic class a communicator's config carries: `NCCL_NET_TRAFFIC_CLASS_UNDEF` (-1) means
/// none.
///
/// # Errors
/// `Config` for a value outside -1..=255.
pub fn traffic_class_of(value: i32) -> Result<Option<u8>> {
    if value == UNDEF {
        return Ok(None);
    }
    u8::try_from(value).map(Some).map_err(|_| {
        Error::config(format!(
            "communicator traffic class {value} is not valid: expected -1 (unset) or 0..=255"
        ))
    })
}

/// Concurrent peers and flows per peer for one direction, each a range; `None` is undefined.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Flows {
    /// Concurrent peers, (min, max).
    pub peers: (Option<u32>, Option<u32>),
    /// Flows (channels) per peer, (min, max).
    pub flows_per_peer: (Option<u32>, Option<u32>),
}

/// What `setNetAttr` says about the traffic to come.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct NetHints {
    /// Sending side.
    pub send: Flows,
    /// Receiving side.
    pub recv: Flows,
    /// Collective functions (bit per `ncclFunc_t`), `None` when undefined.
    pub op: Option<u32>,
    /// Algorithms (bit per algorithm).
    pub algo: Option<u32>,
    /// Protocols (bit per protocol).
    pub proto: Option<u32>,
}

/// The fields of `ncclNetAttr_v11_t`/`_v12_t` as NCCL passes them: per side `[maxConcurrentPeers,
/// minConcurrentPeers, maxFlowsPerPeer, minFlowsPerPeer]`, then op, algo and proto masks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RawNetAttr {
    /// Sending side.
    pub send: [i32; 4],
    /// Receiving side.
    pub recv: [i32; 4],
    /// Function mask, or `u32::MAX` (undefined).
    pub op: u32,
    /// Algorithm mask, or `u32::MAX`.
    pub algo: u32,
    /// Protocol mask, or `u32::MAX`.
    pub proto: u32,
}

fn count(value: i32, side: &str, field: &str) -> Result<Option<u32>> {
    if value == UNDEF {
        return Ok(None);
    }
    u32::try_from(value)
        .map(Some)
        .map_err(|_| Error::misuse(format!("setNetAttr: {side} {field} is {value}")))
}

fn range(min: i32, max: i32, side: &str, field: &str) -> Result<(Option<u32>, Option<u32>)> {
    let (lo, hi) = (
        count(min, side, &format!("min{field}"))?,
        count(max, side, &format!("max{field}"))?,
    );
    if let (Some(lo), Some(hi)) = (lo, hi)
        && lo > hi
    {
        return Err(Error::misuse(format!(
            "setNetAttr: {side} min{field} {lo} is above max{field} {hi}"
        )));
    }
    Ok((lo, hi))
}

fn flows(raw: [i32; 4], side: &str) -> Result<Flows> {
    Ok(Flows {
        peers: range(raw[1], raw[0], side, "ConcurrentPeers")?,
        flows_per_peer: range(raw[3], raw[2], side, "FlowsPerPeer")?,
    })
}

fn mask(value: u32, kinds: u32, field: &str) -> Result<Option<u32>> {
    if value == u32::MAX {
        return Ok(None);
    }
    if value >> kinds != 0 {
        return Err(Error::misuse(format!(
            "setNetAttr: {field} mask {value:#x} has bits beyond the {kinds} kinds NCCL 2.30 knows"
        )));
    }
    Ok(Some(value))
}

impl NetHints {
    /// Validate what NCCL passed.
    ///
    /// # Errors
    /// `Misuse` naming the field: a negative count other than -1, a minimum above its maximum,
    /// or a mask with unknown bits.
    pub fn parse(raw: &RawNetAttr) -> Result<Self> {
        Ok(Self {
            send: flows(raw.send, "sendCommAttr")?,
            recv: flows(raw.recv, "recvCommAttr")?,
            op: mask(raw.op, OP_KINDS, "op")?,
            algo: mask(raw.algo, ALGO_KINDS, "algo")?,
            proto: mask(raw.proto, PROTO_KINDS, "proto")?,
        })
    }
}

impl fmt::Display for NetHints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = |(lo, hi): (Option<u32>, Option<u32>)| {
            let n = |v: Option<u32>| v.map_or("*".to_owned(), |v| v.to_string());
            format!("{}-{}", n(lo), n(hi))
        };
        let m = |v: Option<u32>| v.map_or("*".to_owned(), |v| format!("{v:#x}"));
        write!(
            f,
            "send peers {} flows {}, recv peers {} flows {}, op {} algo {} proto {}",
            r(self.send.peers),
            r(self.send.flows_per_peer),
            r(self.recv.peers),
            r(self.recv.flows_per_peer),
            m(self.op),
            m(self.algo),
            m(self.proto)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNSET: RawNetAttr = RawNetAttr {
        send: [-1; 4],
        recv: [-1; 4],
        op: u32::MAX,
        algo: u32::MAX,
        proto: u32::MAX,
    };

    #[test]
    fn nccls_initial_attributes_are_all_undefined() {
        assert_eq!(NetHints::parse(&UNSET).unwrap(), NetHints::default());
    }

    #[test]
    fn a_transfer_hint_is_recorded_as_given() {
        let raw = RawNetAttr {
            send: [2, 2, 4, 4],
            op: 1 << 6,
            algo: 1 << 1,
            proto: 1 << 2,
            ..UNSET
        };
        let hints = NetHints::parse(&raw).unwrap();
        assert_eq!(hints.send.peers, (Some(2), Some(2)));
        assert_eq!(hints.send.flows_per_peer, (Some(4), Some(4)));
        assert_eq!(
            (hints.op, hints.algo, hints.proto),
            (Some(64), Some(2), Some(4))
        );
        let ctx = CommContext::new(7, -1).unwrap();
        ctx.set_hints(hints);
        assert_eq!(ctx.hints(), Some(hints));
    }

    #[test]
    fn invalid_fields_are_named() {
        for (raw, field) in [
            (
                RawNetAttr {
                    send: [-5, -1, -1, -1],
                    ..UNSET
                },
                "maxConcurrentPeers",
            ),
            (
                RawNetAttr {
                    recv: [1, 3, -1, -1],
                    ..UNSET
                },
                "minConcurrentPeers 3 is above",
            ),
            (
                RawNetAttr {
                    op: 1 << 20,
                    ..UNSET
                },
                "op mask",
            ),
            (RawNetAttr { proto: 8, ..UNSET }, "proto mask"),
        ] {
            let e = NetHints::parse(&raw).unwrap_err();
            assert!(e.to_string().contains(field), "{e}");
        }
    }

    #[test]
    fn traffic_class_is_undefined_or_a_byte() {
        assert_eq!(traffic_class_of(-1).unwrap(), None);
        assert_eq!(traffic_class_of(106).unwrap(), Some(106));
        assert!(traffic_class_of(256).is_err() && traffic_class_of(-2).is_err());
    }
}
