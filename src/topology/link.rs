//! Link layer and speed decoding from `ibv_port_attr` codes (nccl-net-abi.md §3.1).

use std::fmt;

/// The port's link layer as verbs reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// Native InfiniBand.
    InfiniBand,
    /// RoCE (verbs over Ethernet), including Soft-RoCE.
    Ethernet,
    /// Anything else (unspecified or a future value); such ports are not used.
    Other(u8),
}

impl LinkLayer {
    /// Decode `ibv_port_attr.link_layer` (`IBV_LINK_LAYER_*`). Older drivers report 0
    /// (unspecified) for InfiniBand ports, as the verbs documentation allows.
    pub fn from_code(code: u8) -> Self {
        match code {
            0 | 1 => Self::InfiniBand,
            2 => Self::Ethernet,
            other => Self::Other(other),
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InfiniBand => f.write_str("IB"),
            Self::Ethernet => f.write_str("RoCE"),
            Self::Other(code) => write!(f, "link layer {code}"),
        }
    }
}

/// Port speed in Mbps from `active_speed` (per-lane rate code) and `active_width` (lane code).
///
/// Speed codes are bit flags: 1 SDR 2.5G, 2 DDR 5G, 4 QDR 10G, 8 FDR10 10G, 16 FDR 14G, 32 EDR 25G,
/// 64 HDR 50G, 128 NDR 100G, 256 XDR 200G. Width codes: 1 → 1x, 2 → 4x, 4 → 8x, 8 → 12x, 16 → 2x.
/// The lowest set bit decides; an unknown code maps to the last table entry, as NCCL does.
pub fn link_speed_mbps(active_speed: u32, active_width: u8) -> u32 {
    const LANE_MBPS: [u32; 9] = [
        2_500, 5_000, 10_000, 10_000, 14_000, 25_000, 50_000, 100_000, 200_000,
    ];
    const LANES: [u32; 5] = [1, 4, 8, 12, 2];
    fn pick(code: u32, table: &[u32]) -> u32 {
        let index = (code.trailing_zeros() as usize).min(table.len() - 1);
        table[index]
    }
    pick(active_speed, &LANE_MBPS) * pick(u32::from(active_width), &LANES)
}

/// Bytes of an `ibv_mtu` code (1 = 256 .. 5 = 4096); 0 for an unknown code.
pub fn mtu_bytes(code: u8) -> u32 {
    match code {
        1..=5 => 128 << code,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_of_common_links() {
        assert_eq!(link_speed_mbps(1, 1), 2_500); // Soft-RoCE on lo: 1X SDR
        assert_eq!(link_speed_mbps(128, 2), 400_000); // NDR 4x
        assert_eq!(link_speed_mbps(64, 2), 200_000); // HDR 4x
        assert_eq!(link_speed_mbps(32, 2), 100_000); // EDR 4x
        assert_eq!(link_speed_mbps(256, 16), 400_000); // XDR 2x
    }

    #[test]
    fn unknown_codes_take_the_last_entry() {
        assert_eq!(link_speed_mbps(1 << 12, 1), 200_000);
        assert_eq!(link_speed_mbps(1, 1 << 6), 2 * 2_500);
    }

    #[test]
    fn mtu_codes() {
        assert_eq!([1, 3, 5, 0, 6].map(mtu_bytes), [256, 1024, 4096, 0, 0]);
    }

    #[test]
    fn link_layer_codes() {
        assert_eq!(LinkLayer::from_code(2), LinkLayer::Ethernet);
        assert_eq!(LinkLayer::from_code(1), LinkLayer::InfiniBand);
        assert_eq!(LinkLayer::from_code(0), LinkLayer::InfiniBand);
        assert_eq!(LinkLayer::from_code(9).to_string(), "link layer 9");
    }
}
