//! Byte formats that cross a process boundary: the listen handle, the handshake message and the
//! clear-to-send (CTS) entry. Each has a fixed `LEN`, an `emit` into a byte array and a `parse`
//! that checks length, magic and version before reading a field. Little-endian throughout; no
//! `#[repr(C)]` struct is ever transmuted onto or off the wire.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::config::MAX_QPS_PER_CONNECTION;
use super::error::{Error, Result};

const HANDLE_MAGIC: u32 = 0x5253_4942; // "RSIB"
const HELLO_MAGIC: u32 = 0x5253_4948; // "RSIH"
/// Version of the handshake; both sides must agree.
pub const PROTOCOL_VERSION: u8 = 1;

/// Largest number of buffers one grouped receive may carry (and CTS entries per slot).
pub const MAX_RECVS: usize = 8;
/// Longest device name carried in the handshake (truncated beyond).
const NAME_LEN: usize = 32;

fn bad(what: &str) -> Error {
    Error::misuse(format!("malformed {what}"))
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// What `listen` writes into NCCL's 128-byte handle: where to connect and a nonce that ties the
/// connection to this listen comm. Position independent: no pointers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ListenHandle {
    /// Address of the listening socket.
    pub addr: SocketAddr,
    /// Random value the connecting side must echo.
    pub nonce: u64,
}

impl ListenHandle {
    /// Encoded size; well under `NCCL_NET_HANDLE_MAXSIZE` (128).
    pub const LEN: usize = 36;

    /// Encode into the first `LEN` bytes of `out`.
    pub fn emit(&self, out: &mut [u8; Self::LEN]) {
        out[0..4].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        out[4] = PROTOCOL_VERSION;
        let (family, ip) = match self.addr.ip() {
            IpAddr::V4(v4) => (4, v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => (6, v6.octets()),
        };
        out[5] = family;
        out[6..8].copy_from_slice(&self.addr.port().to_le_bytes());
        out[8..24].copy_from_slice(&ip);
        out[24..32].copy_from_slice(&self.nonce.to_le_bytes());
        out[32..36].fill(0);
    }

    /// Decode; checks magic, version and family.
    ///
    /// # Errors
    /// `Misuse` when the bytes are not a handle written by this plugin's `listen`.
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::LEN || u32_at(b, 0) != HANDLE_MAGIC {
            return Err(Error::misuse(
                "unknown listen handle (not written by this plugin's listen)",
            ));
        }
        if b[4] != PROTOCOL_VERSION {
            return Err(Error::config(format!(
                "listen handle has protocol version {} but this plugin speaks {PROTOCOL_VERSION}: \
                 run the same plugin version on every node",
                b[4]
            )));
        }
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&b[8..24]);
        let v6 = Ipv6Addr::from(ip);
        let ip = match b[5] {
            4 => IpAddr::V4(
                v6.to_ipv4_mapped()
                    .ok_or_else(|| bad("listen handle address"))?,
            ),
            6 => IpAddr::V6(v6),
            _ => return Err(bad("listen handle family")),
        };
        Ok(Self {
            addr: SocketAddr::new(ip, u16_at(b, 6)),
            nonce: u64_at(b, 24),
        })
    }
}

/// One side's description of its end of a connection, exchanged over TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Echo of the listen handle's nonce.
    pub nonce: u64,
    /// QP numbers, one per QP of the connection, in QP index order.
    pub qpns: Vec<u32>,
    /// Local ID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port number.
    pub port: u8,
    /// Active MTU as an `ibv_mtu` code.
    pub mtu: u8,
    /// Link layer code (`IBV_LINK_LAYER_*`).
    pub link_layer: u8,
    /// The GID this side will use.
    pub gid: [u8; 16],
    /// Its index in the local GID table.
    pub gid_index: u32,
    /// Its RoCE version (0 on InfiniBand).
    pub roce_version: u8,
    /// Address of this side's control ring (sender: CTS ring; receiver: sizes ring).
    pub ring_addr: u64,
    /// Remote key of that ring.
    pub ring_rkey: u32,
    /// Traffic class chosen by the sender (the receiver echoes it).
    pub traffic_class: u8,
    /// Service level chosen by the sender (the receiver echoes it).
    pub service_level: u8,
    /// Split-data mode chosen by the sender.
    pub split_data: bool,
    /// Device name, for error messages on the other side.
    pub device: String,
}

impl Hello {
    /// Encoded size (fixed: unused QP slots are zero).
    pub const LEN: usize = 8 + 8 + 4 * MAX_QPS_PER_CONNECTION as usize + 48 + NAME_LEN;

    /// Encode.
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        out[4] = PROTOCOL_VERSION;
        out[5] = u8::try_from(self.qpns.len()).unwrap_or(0);
        out[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        let mut at = 16;
        for q in self.qpns.iter().take(MAX_QPS_PER_CONNECTION as usize) {
            out[at..at + 4].copy_from_slice(&q.to_le_bytes());
            at += 4;
        }
        let at = 16 + 4 * MAX_QPS_PER_CONNECTION as usize;
        out[at..at + 2].copy_from_slice(&self.lid.to_le_bytes());
        out[at + 2] = self.port;
        out[at + 3] = self.mtu;
        out[at + 4] = self.link_layer;
        out[at + 5] = self.roce_version;
        out[at + 6] = self.traffic_class;
        out[at + 7] = self.service_level;
        out[at + 8..at + 24].copy_from_slice(&self.gid);
        out[at + 24..at + 28].copy_from_slice(&self.gid_index.to_le_bytes());
        out[at + 28..at + 36].copy_from_slice(&self.ring_addr.to_le_bytes());
        out[at + 36..at + 40].copy_from_slice(&self.ring_rkey.to_le_bytes());
        out[at + 40] = u8::from(self.split_data);
        let name = self.device.as_bytes();
        let n = name.len().min(NAME_LEN);
        out[at + 48..at + 48 + n].copy_from_slice(&name[..n]);
        out
    }

    /// Decode.
    ///
    /// # Errors
    /// `Remote` when the peer sent something else (wrong magic, QP count); `Config` on a version
    /// mismatch (different plugin versions on the two nodes).
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::LEN || u32_at(b, 0) != HELLO_MAGIC {
            return Err(Error::new(
                super::error::Kind::Remote,
                "peer sent an unknown handshake message",
            ));
        }
        if b[4] != PROTOCOL_VERSION {
            return Err(Error::config(format!(
                "peer speaks protocol version {} but this plugin speaks {PROTOCOL_VERSION}: run the \
                 same plugin version on every node",
                b[4]
            )));
        }
        let nqps = usize::from(b[5]);
        if nqps == 0 || nqps > MAX_QPS_PER_CONNECTION as usize {
            return Err(Error::new(
                super::error::Kind::Remote,
                format!("peer announced {nqps} QPs"),
            ));
        }
        let qpns = (0..nqps).map(|i| u32_at(b, 16 + 4 * i)).collect();
        let at = 16 + 4 * MAX_QPS_PER_CONNECTION as usize;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[at + 8..at + 24]);
        let name = &b[at + 48..at + 48 + NAME_LEN];
        let name_len = name.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
        Ok(Self {
            nonce: u64_at(b, 8),
            qpns,
            lid: u16_at(b, at),
            port: b[at + 2],
            mtu: b[at + 3],
            link_layer: b[at + 4],
            roce_version: b[at + 5],
            traffic_class: b[at + 6],
            service_level: b[at + 7],
            gid,
            gid_index: u32_at(b, at + 24),
            ring_addr: u64_at(b, at + 28),
            ring_rkey: u32_at(b, at + 36),
            split_data: b[at + 40] != 0,
            device: String::from_utf8_lossy(&name[..name_len]).into_owned(),
        })
    }
}

/// One clear-to-send entry: a posted receive buffer, written by the receiver into the sender's
/// CTS ring with an RDMA write. `seq` is written last in memory order and tells the sender that
/// the entry is for the message it expects.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Cts {
    /// Address of the receive buffer.
    pub addr: u64,
    /// Its capacity in bytes.
    pub size: u64,
    /// Remote key of its registration.
    pub rkey: u32,
    /// Tag of the expected send.
    pub tag: i32,
    /// Number of buffers in this grouped receive (all entries of the slot carry the same).
    pub nreqs: u32,
    /// Message sequence number + 1 (0 never appears in a valid entry).
    pub seq_plus_one: u64,
}

impl Cts {
    /// Encoded size; a 32-byte multiple so an entry never straddles a cache line pair.
    pub const LEN: usize = 64;
    /// Offset of `seq_plus_one`, which the sender polls.
    pub const SEQ_OFFSET: usize = 56;

    /// Encode.
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..8].copy_from_slice(&self.addr.to_le_bytes());
        out[8..16].copy_from_slice(&self.size.to_le_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        out[20..24].copy_from_slice(&self.tag.to_le_bytes());
        out[24..28].copy_from_slice(&self.nreqs.to_le_bytes());
        out[56..64].copy_from_slice(&self.seq_plus_one.to_le_bytes());
        out
    }

    /// Decode (any 64 bytes decode; the sender validates `seq_plus_one` and `nreqs`).
    pub fn parse(b: &[u8; Self::LEN]) -> Self {
        Self {
            addr: u64_at(b, 0),
            size: u64_at(b, 8),
            rkey: u32_at(b, 16),
            tag: i32::from_le_bytes([b[20], b[21], b[22], b[23]]),
            nreqs: u32_at(b, 24),
            seq_plus_one: u64_at(b, 56),
        }
    }
}

const _: () = assert!(ListenHandle::LEN <= 128);
const _: () = assert!(Cts::LEN.is_multiple_of(32));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_handle_round_trips_v4_and_v6() {
        for addr in ["127.0.1.1:4242", "[fe80::1]:7", "[::1]:65535"] {
            let h = ListenHandle {
                addr: addr.parse().unwrap(),
                nonce: 0xdead_beef_0bad_cafe,
            };
            let mut b = [0u8; ListenHandle::LEN];
            h.emit(&mut b);
            assert_eq!(ListenHandle::parse(&b).unwrap(), h);
        }
    }

    #[test]
    fn foreign_bytes_are_not_a_handle() {
        assert!(ListenHandle::parse(&[0u8; 128]).is_err());
        assert!(ListenHandle::parse(&[1u8; 3]).is_err());
        let mut b = [0u8; ListenHandle::LEN];
        ListenHandle {
            addr: "127.0.0.1:1".parse().unwrap(),
            nonce: 1,
        }
        .emit(&mut b);
        b[4] = 99;
        let e = ListenHandle::parse(&b).unwrap_err();
        assert!(e.to_string().contains("protocol version 99"), "{e}");
    }

    #[test]
    fn hello_round_trips() {
        let h = Hello {
            nonce: 7,
            qpns: vec![17, 18, 0x00ff_ffff],
            lid: 3,
            port: 1,
            mtu: 5,
            link_layer: 2,
            gid: [0xfe; 16],
            gid_index: 1,
            roce_version: 2,
            ring_addr: 0x7fff_0000_1000,
            ring_rkey: 0x1234,
            traffic_class: 106,
            service_level: 3,
            split_data: true,
            device: "mlx5_0".into(),
        };
        assert_eq!(Hello::parse(&h.emit()).unwrap(), h);
        let mut b = h.emit();
        b[5] = 0;
        assert!(Hello::parse(&b).is_err());
    }

    #[test]
    fn cts_round_trips_and_seq_is_last() {
        let c = Cts {
            addr: 0x1000,
            size: 4096,
            rkey: 9,
            tag: -3,
            nreqs: 8,
            seq_plus_one: 42,
        };
        let b = c.emit();
        assert_eq!(Cts::parse(&b), c);
        assert_eq!(u64_at(&b, Cts::SEQ_OFFSET), 42);
    }

    #[test]
    fn parse_never_panics_on_arbitrary_bytes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        for len in 0..200 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed & 0xff) as u8
                })
                .collect();
            let _ = ListenHandle::parse(&bytes);
            let _ = Hello::parse(&bytes);
        }
    }
}
