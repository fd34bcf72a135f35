//! Each member's share of a fused device's packets during a rail's checks: a member that
//! carried (almost) nothing means the device ran on fewer ports than it has.

use std::collections::BTreeMap;

use nccl_net::doctor::Severity;
use serde::{Deserialize, Serialize};

use crate::card::CardDevice;

/// Packet counters, first found first: InfiniBand's port counters, then rxe's.
const SENT_COUNTERS: [&str; 2] = ["port_xmit_packets", "sent_pkts"];
const RECEIVED_COUNTERS: [&str; 2] = ["port_rcv_packets", "rcvd_pkts"];

/// Packets one member sent and received between two counter readings; `None`: no counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct MemberTraffic {
    pub(super) member: String,
    pub(super) sent: Option<u64>,
    pub(super) received: Option<u64>,
}

/// The members of `device` as `(name, RDMA device, port)`.
pub(super) fn members(device: &CardDevice) -> impl Iterator<Item = (&str, &str, u32)> {
    device
        .members
        .iter()
        .map(|m| (m.name.as_str(), m.device.as_str(), m.port))
}

/// Every member's packets, from the readings of [`super::counters::read_counters`].
pub(super) fn member_traffic<'a>(
    members: impl Iterator<Item = (&'a str, &'a str, u32)>,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> Vec<MemberTraffic> {
    members
        .map(|(name, device, port)| {
            let delta = |names: &[&str]| {
                let port_dir = format!("/sys/class/infiniband/{device}/ports/{port}/");
                let device_dir = format!("/sys/class/infiniband/{device}/hw_counters/");
                names.iter().find_map(|name| {
                    after.iter().find_map(|(path, now)| {
                        let ours = (path.starts_with(&port_dir) || path.starts_with(&device_dir))
                            && path.ends_with(&format!("/{name}"));
                        ours.then(|| now.saturating_sub(*before.get(path).unwrap_or(now)))
                    })
                })
            };
            MemberTraffic {
                member: name.to_owned(),
                sent: delta(&SENT_COUNTERS),
                received: delta(&RECEIVED_COUNTERS),
            }
        })
        .collect()
}

/// The verdict on one end's members: every member carried at least a quarter of its even
/// share of the packets each way (PASS), one did not (WARN), or a counter is missing (UNKNOWN).
pub(super) fn judge_traffic(whose: &str, traffic: &[MemberTraffic]) -> (Severity, String) {
    let members = traffic.len() as u64;
    let missing: Vec<&str> = traffic
        .iter()
        .filter(|t| t.sent.is_none() || t.received.is_none())
        .map(|t| t.member.as_str())
        .collect();
    if !missing.is_empty() {
        return (
            Severity::Unknown,
            format!(
                "no packet counter {whose} for {}: each member's share is unknown",
                missing.join(", ")
            ),
        );
    }
    let total = |pick: fn(&MemberTraffic) -> Option<u64>| -> u64 {
        traffic.iter().filter_map(pick).sum::<u64>().max(1)
    };
    let (all_sent, all_received) = (total(|t| t.sent), total(|t| t.received));
    let pct = |n: u64, all: u64| n * 100 / all;
    let shares: Vec<String> = traffic
        .iter()
        .map(|t| {
            let (s, r) = (t.sent.unwrap_or(0), t.received.unwrap_or(0));
            format!(
                "{} sent {s} ({}%), received {r} ({}%)",
                t.member,
                pct(s, all_sent),
                pct(r, all_received)
            )
        })
        .collect();
    // Under a quarter of an even share (4 x n x packets < all) is a member left out, not skew.
    let idle: Vec<&str> = traffic
        .iter()
        .filter(|t| {
            4 * members * t.sent.unwrap_or(0) < all_sent
                || 4 * members * t.received.unwrap_or(0) < all_received
        })
        .map(|t| t.member.as_str())
        .collect();
    if idle.is_empty() {
        (
            Severity::Pass,
            format!("packets per member {whose}: {}", shares.join("; ")),
        )
    } else {
        (
            Severity::Warn,
            format!(
                "{} carried almost no packets {whose}: the device ran on fewer ports than it has ({})",
                idle.join(", "),
                shares.join("; ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traffic(member: &str, sent: Option<u64>, received: Option<u64>) -> MemberTraffic {
        MemberTraffic {
            member: member.to_owned(),
            sent,
            received,
        }
    }

    #[test]
    fn reads_infiniband_then_rxe_counters_per_member() {
        let device = [("mlx5_0", "mlx5_0", 1), ("rxe1", "rxe1", 1)];
        let reading = |ib: u64, rxe: u64| {
            BTreeMap::from([
                (
                    "/sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_packets".to_owned(),
                    ib,
                ),
                (
                    "/sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_packets".to_owned(),
                    2 * ib,
                ),
                (
                    "/sys/class/infiniband/rxe1/ports/1/hw_counters/sent_pkts".to_owned(),
                    rxe,
                ),
                (
                    "/sys/class/infiniband/rxe1/ports/1/hw_counters/rcvd_pkts".to_owned(),
                    rxe + 1,
                ),
            ])
        };
        assert_eq!(
            member_traffic(device.into_iter(), &reading(10, 100), &reading(15, 130)),
            vec![
                traffic("mlx5_0", Some(5), Some(10)),
                traffic("rxe1", Some(30), Some(30)),
            ]
        );
        // A counter that appeared between the readings counts from zero; one absent is None.
        let later = BTreeMap::from([(
            "/sys/class/infiniband/rxe1/ports/1/hw_counters/sent_pkts".to_owned(),
            7,
        )]);
        assert_eq!(
            member_traffic(device.into_iter(), &BTreeMap::new(), &later),
            vec![
                traffic("mlx5_0", None, None),
                traffic("rxe1", Some(0), None)
            ]
        );
    }

    #[test]
    fn an_idle_member_warns_and_an_unknown_one_is_unknown() {
        let even = [
            traffic("rxe1", Some(600), Some(500)),
            traffic("rxe3", Some(400), Some(500)),
        ];
        let (severity, what) = judge_traffic("here", &even);
        assert_eq!(severity, Severity::Pass);
        assert_eq!(
            what,
            "packets per member here: rxe1 sent 600 (60%), received 500 (50%); rxe3 sent 400 (40%), received 500 (50%)"
        );
        // 1 of 9 one way is under a quarter of an even share (1/8): left out.
        let skewed = [
            traffic("rxe1", Some(800), Some(500)),
            traffic("rxe3", Some(100), Some(500)),
        ];
        let (severity, what) = judge_traffic("on the peer", &skewed);
        assert_eq!(severity, Severity::Warn);
        assert!(
            what.starts_with("rxe3 carried almost no packets on the peer: the device ran on fewer ports than it has (rxe1 sent 800 (88%)"),
            "{what}"
        );
        let unknown = [
            traffic("rxe1", Some(1), Some(1)),
            traffic("mlx5_0", None, Some(1)),
        ];
        assert_eq!(
            judge_traffic("here", &unknown),
            (
                Severity::Unknown,
                "no packet counter here for mlx5_0: each member's share is unknown".to_owned()
            )
        );
    }
}
