//! The ports' counters before and after a rail's checks, on both ends.

use std::collections::BTreeMap;

use nccl_net::doctor::{Roots, Severity};

use super::Rail;
use super::bandwidth::is_software;
use super::control::{Msg, expect};
use super::traffic::{MemberTraffic, judge_traffic, member_traffic, members};
use crate::card::CardDevice;

/// Counters whose rise means lost packets, retries or a flapping link.
const ERROR_COUNTERS: &[&str] = &[
    "symbol_error",
    "link_downed",
    "link_error_recovery",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_xmit_discards",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "out_of_sequence",
    "packet_seq_err",
    "local_ack_timeout_err",
    "roce_adp_retrans",
    "rnr_nak_retry_err",
    "req_cqe_error",
    "resp_cqe_error",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_seq_err",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
];

/// One end's counter report: whose, the rises, how many counters were read, each member's
/// packets (fused devices), its device.
type End<'a> = (
    &'a str,
    Vec<(String, u64)>,
    usize,
    Vec<MemberTraffic>,
    &'a CardDevice,
);

impl Rail<'_> {
    /// Error counters before and after, on both ends (`l` here, `r` the peer's).
    pub(super) fn counters(
        &mut self,
        roots: &Roots,
        l: &CardDevice,
        r: &CardDevice,
        before: &BTreeMap<String, u64>,
    ) -> Result<(), String> {
        let after = read_counters(roots, l);
        let deltas: Vec<(String, u64)> = after
            .iter()
            .filter(|(k, _)| ERROR_COUNTERS.iter().any(|e| k.ends_with(&format!("/{e}"))))
            .filter_map(|(k, v)| Some((k.clone(), v.checked_sub(*before.get(k)?)?)))
            .filter(|(_, d)| *d > 0)
            .collect();
        let traffic = if l.members.len() > 1 {
            member_traffic(members(l), before, &after)
        } else {
            Vec::new()
        };
        self.ctl.send(&Msg::Counters {
            deltas: deltas.clone(),
            read: after.len(),
            members: traffic.clone(),
        })?;
        let (theirs, their_read, their_traffic) = expect(self.ctl, "its counters", |m| match m {
            Msg::Counters {
                deltas,
                read,
                members,
            } => Some((deltas, read, members)),
            _ => None,
        })?;
        let ends: Vec<End<'_>> = if self.loopback {
            vec![("here", deltas, after.len(), traffic, l)]
        } else {
            vec![
                ("here", deltas, after.len(), traffic, l),
                ("on the peer", theirs, their_read, their_traffic, r),
            ]
        };
        for (whose, deltas, read, traffic, device) in ends {
            if !traffic.is_empty() {
                let (severity, what) = judge_traffic(whose, &traffic);
                let f = self.finding(severity, "pair.member_traffic", what);
                if severity == Severity::Warn {
                    f.fix = Some(
                        "see port.state and plugin.devices on that node: a member down or left out of the fusion carries nothing".to_owned(),
                    );
                }
            }
            if read == 0 {
                self.finding(
                    Severity::Unknown,
                    "pair.counters",
                    format!("no port counters readable {whose}"),
                );
            } else if deltas.is_empty() {
                self.finding(
                    Severity::Pass,
                    "pair.counters",
                    format!("no error counter rose {whose} ({read} counters read)"),
                );
            } else {
                let list: Vec<String> = deltas.iter().map(|(k, d)| format!("{k} +{d}")).collect();
                let f = self.finding(
                    Severity::Warn,
                    "pair.counters",
                    format!(
                        "error counters rose {whose} during the check: {}",
                        list.join(", ")
                    ),
                );
                f.fix = Some(if is_software(device) {
                    "software device: packets lost in the host's network stack (CPU load, netdev backlog) and retried; nothing to fix on the wire".to_owned()
                } else {
                    "packet loss or retries: check cables/transceivers, PFC/ECN on RoCE, and the switch port counters".to_owned()
                });
            }
        }
        Ok(())
    }
}

/// Every numeric file under the members' `counters/` and `hw_counters/`, keyed by path.
pub(super) fn read_counters(roots: &Roots, device: &CardDevice) -> BTreeMap<String, u64> {
    let mut all = BTreeMap::new();
    for m in &device.members {
        for dir in [
            format!(
                "/sys/class/infiniband/{}/ports/{}/counters",
                m.device, m.port
            ),
            format!(
                "/sys/class/infiniband/{}/ports/{}/hw_counters",
                m.device, m.port
            ),
            format!("/sys/class/infiniband/{}/hw_counters", m.device),
        ] {
            let Ok(listing) = std::fs::read_dir(roots.at(&dir)) else {
                continue;
            };
            for entry in listing.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(v) = std::fs::read_to_string(entry.path())
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                {
                    all.insert(format!("{dir}/{name}"), v);
                }
            }
        }
    }
    all
}
