//! The bandwidth phase: one direction at a time, and what it should reach.

use std::time::Instant;

use nccl_net::doctor::{Finding, Severity};

use super::control::{Control, Msg, expect};
use super::{BW_SIZE, BW_WINDOW, Comms, Rail, with_cause};
use crate::card::CardDevice;

impl Rail<'_> {
    /// About `seconds` of `BW_SIZE` messages one way, `BW_WINDOW` in flight.
    pub(super) fn bandwidth(
        &mut self,
        c: &mut Comms,
        direction: usize,
        l: &CardDevice,
        r: &CardDevice,
    ) -> Result<(), String> {
        let net = self.net;
        let (sptr, rptr) = (c.sbuf.as_mut_ptr(), c.rbuf.as_mut_ptr());
        let name = self.direction_name(direction);
        let measured = if self.sends(direction) {
            let run = |count: usize, ctl: &mut Control| -> Result<f64, String> {
                ctl.send(&Msg::Stream { count })?;
                let start = Instant::now();
                let sent = net
                    .send_stream(
                        c.sc,
                        c.smh,
                        &[sptr],
                        BW_SIZE,
                        count,
                        BW_WINDOW,
                        Instant::now() + self.o.timeout,
                        |_, _| {},
                    )
                    .map_err(with_cause);
                let elapsed = start.elapsed().as_secs_f64();
                let theirs = expect(ctl, "its stream result", |m| match m {
                    Msg::StreamDone { error } => Some(error),
                    _ => None,
                })?;
                sent?;
                theirs.map_or(Ok(elapsed), Err)
            };
            let probe = run(BW_WINDOW, self.ctl)?;
            let count = ((self.o.seconds / probe.max(1e-6)) * BW_WINDOW as f64)
                .clamp(BW_WINDOW as f64, 1e6) as usize;
            let seconds = run(count, self.ctl)?;
            let bytes = (count * BW_SIZE) as u64;
            let gbps = bytes as f64 * 8.0 / seconds / 1e9;
            self.ctl.send(&Msg::Bandwidth {
                gbps,
                seconds,
                bytes,
            })?;
            (gbps, seconds, bytes)
        } else {
            loop {
                match self.ctl.recv()? {
                    Msg::Stream { count } => {
                        let got = net
                            .recv_stream(
                                c.rc,
                                c.rmh,
                                &[rptr],
                                BW_SIZE,
                                count,
                                BW_WINDOW,
                                Instant::now() + self.o.timeout,
                                |i, _, received| {
                                    if received == BW_SIZE {
                                        Ok(())
                                    } else {
                                        Err(format!("message {i}: {received} of {BW_SIZE} bytes"))
                                    }
                                },
                            )
                            .map_err(with_cause);
                        self.ctl.send(&Msg::StreamDone { error: got.err() })?;
                    }
                    Msg::Bandwidth {
                        gbps,
                        seconds,
                        bytes,
                    } => break (gbps, seconds, bytes),
                    other => return Err(format!("expected the bandwidth run, got {other:?}")),
                }
            }
        };
        let (gbps, seconds, bytes) = measured;
        let expected = expected_mbps(l, r);
        let what = format!(
            "{name}: {gbps:.2} Gb/s ({} MiB in {seconds:.2} s)",
            bytes >> 20
        );
        let f = match expected {
            Expected::Software => {
                let mut f = Finding::new(
                    Severity::Info,
                    "pair.bandwidth",
                    self.entity.clone(),
                    format!("{what}; software device: its nominal rate means nothing"),
                );
                f = f.evidence("measured Gb/s", format!("{gbps:.3}"));
                f
            }
            Expected::Rate { mbps, limit } => {
                let pct = gbps * 1000.0 / mbps as f64 * 100.0;
                let text = format!(
                    "{what} = {pct:.0}% of the expected {:.0} Gb/s ({limit})",
                    mbps as f64 / 1000.0
                );
                let severity = match pct {
                    p if p >= 90.0 => Severity::Pass,
                    p if p >= 75.0 => Severity::Warn,
                    _ => Severity::Fail,
                };
                let mut f = Finding::new(severity, "pair.bandwidth", self.entity.clone(), text);
                if severity != Severity::Pass {
                    f = f.fix("compare with ib_write_bw between the same ports; check link.rate, pcie.link, mtu and the error counters on both nodes");
                }
                f.evidence("measured Gb/s", format!("{gbps:.3}"))
                    .evidence("expected Mbps", mbps.to_string())
            }
        };
        self.findings.push(f);
        Ok(())
    }
}

/// What the bandwidth should reach.
enum Expected {
    /// A device without PCI (Soft-RoCE): no meaningful rate.
    Software,
    /// The smaller of both ends' port rates and PCIe links, and which term it was.
    Rate { mbps: u64, limit: String },
}

/// Whether a member of `device` is a software device (rxe, siw: no PCI function).
pub(super) fn is_software(device: &CardDevice) -> bool {
    device.members.iter().any(|m| m.pci.is_none())
}

fn expected_mbps(l: &CardDevice, r: &CardDevice) -> Expected {
    if is_software(l) || is_software(r) {
        return Expected::Software;
    }
    let pcie = |d: &CardDevice| {
        d.members
            .iter()
            .map(|m| m.pcie_mbps.unwrap_or(u64::MAX))
            .fold(0u64, u64::saturating_add)
    };
    let terms = [
        (u64::from(l.speed_mbps), "this node's port rate"),
        (u64::from(r.speed_mbps), "the peer's port rate"),
        (pcie(l), "this node's PCIe link"),
        (pcie(r), "the peer's PCIe link"),
    ];
    let (mbps, limit) = terms
        .iter()
        .min_by_key(|(m, _)| *m)
        .copied()
        .unwrap_or((1, ""));
    Expected::Rate {
        mbps: mbps.max(1),
        limit: limit.to_owned(),
    }
}
