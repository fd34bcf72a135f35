//! PCIe facts of a NIC function: the trained link against its maximum, the Enable Relaxed
//! Ordering bit of its Device Control register, and the ACS controls of the switch ports above it.

use std::path::Path;

/// A PCIe link as sysfs reports it (`current_link_speed` "16.0 GT/s PCIe", `..._width` "16").
#[derive(Clone, Debug, PartialEq)]
pub struct PcieLink {
    /// Transfer rate per lane in GT/s.
    pub gts: f64,
    /// Lanes.
    pub width: u32,
}

impl PcieLink {
    /// Read `<function>/{prefix}_link_speed` and `..._width` (`prefix` = `current` or `max`).
    pub fn read(function: &Path, prefix: &str) -> Option<Self> {
        let read = |name: &str| std::fs::read_to_string(function.join(name)).ok();
        let speed = read(&format!("{prefix}_link_speed"))?;
        let width = read(&format!("{prefix}_link_width"))?;
        Self::parse(&speed, &width)
    }

    /// Parse the two sysfs values; `None` for "Unknown" or an untrained (x0) link.
    pub fn parse(speed: &str, width: &str) -> Option<Self> {
        let gts: f64 = speed.split_whitespace().next()?.parse().ok()?;
        let width: u32 = width.trim().parse().ok()?;
        (gts > 0.0 && width > 0).then_some(Self { gts, width })
    }

    /// Usable bandwidth in Mbps after line encoding: 8b/10b up to 5 GT/s (Gen1/2), 128b/130b
    /// from 8 GT/s (Gen3 to 5), 242/256 for the FLIT mode of 64 GT/s (Gen6).
    pub fn mbps(&self) -> u64 {
        let encoding = if self.gts <= 5.0 {
            0.8
        } else if self.gts < 64.0 {
            128.0 / 130.0
        } else {
            242.0 / 256.0
        };
        (self.gts * 1000.0 * encoding * f64::from(self.width)) as u64
    }

    /// `Gen4 x16 (16 GT/s)`.
    pub fn describe(&self) -> String {
        let generation = match self.gts {
            g if g <= 2.5 => "Gen1",
            g if g <= 5.0 => "Gen2",
            g if g <= 8.0 => "Gen3",
            g if g <= 16.0 => "Gen4",
            g if g <= 32.0 => "Gen5",
            _ => "Gen6",
        };
        format!("{generation} x{} ({} GT/s)", self.width, self.gts)
    }
}

/// The Enable Relaxed Ordering bit (bit 4) of the PCI Express capability's Device Control
/// register, from a function's configuration space (the `config` file). `Err` says why it could
/// not be read: without root, sysfs returns only the first 64 bytes, before any capability.
pub fn relaxed_ordering_enabled(config: &[u8]) -> Result<bool, String> {
    const STATUS: usize = 0x06;
    const CAP_LIST: u16 = 1 << 4;
    const CAP_POINTER: usize = 0x34;
    const PCI_EXPRESS: u8 = 0x10;
    const DEVICE_CONTROL: usize = 8;
    if config.len() <= 64 {
        return Err(format!(
            "only {} bytes of configuration space readable (needs root)",
            config.len()
        ));
    }
    let status = u16::from_le_bytes([config[STATUS], config[STATUS + 1]]);
    if status & CAP_LIST == 0 {
        return Err("no capability list".to_owned());
    }
    let mut at = usize::from(config[CAP_POINTER] & 0xfc);
    // A list longer than 48 entries is a loop in a corrupt configuration space.
    for _ in 0..48 {
        if at < 64 || at + DEVICE_CONTROL + 2 > config.len() {
            break;
        }
        if config[at] == PCI_EXPRESS {
            let control =
                u16::from_le_bytes([config[at + DEVICE_CONTROL], config[at + DEVICE_CONTROL + 1]]);
            return Ok(control & (1 << 4) != 0);
        }
        at = usize::from(config[at + 1] & 0xfc);
    }
    Err("no PCI Express capability".to_owned())
}

/// The ACS Control bits that send peer-to-peer traffic up to the root complex instead of
/// across the switch: P2P Request Redirect, P2P Completion Redirect, Upstream Forwarding.
const ACS_REDIRECTS: [(u16, &str); 3] = [
    (1 << 2, "RequestRedirect"),
    (1 << 3, "CompletionRedirect"),
    (1 << 4, "UpstreamForwarding"),
];

/// The Control register of a port's Access Control Services extended capability (ID 0x000d),
/// from its configuration space; `Ok(None)` when it has none. Extended capabilities start at
/// 0x100, so a user other than root (64 bytes) or a conventional-PCI view (256) cannot tell.
pub(super) fn acs_control(config: &[u8]) -> Result<Option<u16>, String> {
    const EXTENDED: usize = 0x100;
    const ACS: u32 = 0x000d;
    const CONTROL: usize = 6;
    if config.len() <= EXTENDED {
        return Err(format!(
            "only {} bytes of configuration space readable (needs root)",
            config.len()
        ));
    }
    let mut at = EXTENDED;
    // Each extended capability takes at least 4 bytes of the 4 KiB: more is a loop.
    for _ in 0..1024 {
        let Some(header) = config.get(at..at + 4) else {
            break;
        };
        let header = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        if header == 0 || header == u32::MAX {
            break;
        }
        if header & 0xffff == ACS {
            return config
                .get(at + CONTROL..at + CONTROL + 2)
                .map(|c| Some(u16::from_le_bytes([c[0], c[1]])))
                .ok_or_else(|| "ACS capability cut short".to_owned());
        }
        at = usize::try_from((header >> 20) & 0xffc).unwrap_or(0);
        if at < EXTENDED {
            break;
        }
    }
    Ok(None)
}

/// The names of the redirecting bits set in an ACS Control value.
pub(super) fn acs_redirects(control: u16) -> Vec<&'static str> {
    ACS_REDIRECTS
        .iter()
        .filter(|(bit, _)| control & bit != 0)
        .map(|(_, name)| *name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_bandwidth_by_generation() {
        let gen4 = PcieLink::parse("16.0 GT/s PCIe\n", "16\n").unwrap();
        assert_eq!(gen4.mbps(), 252_061);
        assert_eq!(gen4.describe(), "Gen4 x16 (16 GT/s)");
        let gen3x8 = PcieLink::parse("8.0 GT/s PCIe", "8").unwrap();
        assert_eq!(gen3x8.mbps(), 63_015);
        assert_eq!(PcieLink::parse("2.5 GT/s", "1").unwrap().mbps(), 2_000);
        assert_eq!(PcieLink::parse("Unknown", "16"), None);
        assert_eq!(PcieLink::parse("16.0 GT/s", "0"), None);
    }

    fn config_with_devctl(control: u16) -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0x06] = 0x10; // capability list present
        c[0x34] = 0x40;
        c[0x40] = 0x01; // power management first
        c[0x41] = 0x60;
        c[0x60] = 0x10; // PCI Express
        c[0x68..0x6a].copy_from_slice(&control.to_le_bytes());
        c
    }

    /// 4 KiB of configuration space with an AER capability at 0x100 and, after it, ACS at
    /// 0x140 (capability register at 0x144, `control` at 0x146).
    fn config_with_acs(control: u16) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        c[0x100..0x104].copy_from_slice(&(0x0001_u32 | (1 << 16) | (0x140 << 20)).to_le_bytes());
        c[0x140..0x144].copy_from_slice(&(0x000d_u32 | (1 << 16)).to_le_bytes());
        c[0x144..0x146].copy_from_slice(&0x005f_u16.to_le_bytes());
        c[0x146..0x148].copy_from_slice(&control.to_le_bytes());
        c
    }

    #[test]
    fn acs_control_is_found_among_the_extended_capabilities() {
        let on = config_with_acs(0x001d);
        assert_eq!(acs_control(&on), Ok(Some(0x001d)));
        assert_eq!(
            acs_redirects(0x001d),
            [
                "RequestRedirect",
                "CompletionRedirect",
                "UpstreamForwarding"
            ]
        );
        assert_eq!(acs_redirects(0x0001), Vec::<&str>::new());
        let mut none = vec![0u8; 4096];
        none[0x100..0x104].copy_from_slice(&0x0001_0001_u32.to_le_bytes());
        assert_eq!(acs_control(&none), Ok(None));
        assert!(acs_control(&[0; 64]).unwrap_err().contains("needs root"));
        assert!(acs_control(&[0; 256]).unwrap_err().contains("256 bytes"));
        let mut looped = vec![0u8; 4096];
        looped[0x100..0x104].copy_from_slice(&(0x0001_u32 | (0x100 << 20)).to_le_bytes());
        assert_eq!(acs_control(&looped), Ok(None));
    }

    #[test]
    fn device_control_relaxed_ordering_bit() {
        assert_eq!(
            relaxed_ordering_enabled(&config_with_devctl(0x2930)),
            Ok(true)
        );
        assert_eq!(
            relaxed_ordering_enabled(&config_with_devctl(0x2920)),
            Ok(false)
        );
        assert!(
            relaxed_ordering_enabled(&[0; 64])
                .unwrap_err()
                .contains("needs root")
        );
        let mut looped = config_with_devctl(0);
        looped[0x40] = 0x05;
        looped[0x41] = 0x40;
        assert_eq!(
            relaxed_ordering_enabled(&looped),
            Err("no PCI Express capability".to_owned())
        );
    }
}
