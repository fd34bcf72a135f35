//! Byte formats that cross a process boundary: the listen handle, the handshake message and the
//! clear-to-send (CTS) entry. Each has a fixed `LEN`, an `emit` into a byte array and a `parse`
//! that checks length, magic and version before reading a field. Little-endian throughout; no
//! `#[repr(C)]` struct is ever transmuted onto or off the wire.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use super::config::{MAX_FUSED_MEMBERS, MAX_QPS_PER_CONNECTION};
use super::error::{Error, Result};
use super::proto::SLOTS;

const HANDLE_MAGIC: u32 = 0x5253_4942; // "RSIB"
const HELLO_MAGIC: u32 = 0x5253_4948; // "RSIH"
/// Version of the handshake; both sides must agree.
pub const PROTOCOL_VERSION: u8 = 3;

/// Revision of the data path's wire rules, sent in every hello (byte 27). Revision 1 (no
/// revision byte: zero) copied truncated eager messages; revision 2 copies only whole ones and
/// counts an answer the receiver overwrote as a copy; revision 3 writes an eager message as one
/// write (header and payload adjacent in its bounce slot, `core::eager`) and lays the CTS ring
/// out so that answers to consecutive single receives are adjacent
/// ([`super::proto::CtsLayout`]). Eager messages are only exchanged under the same revision; a
/// peer without them (revision 0, or an offer of zero bytes) gets the layout it knows.
pub const DATA_PATH_REVISION: u8 = 3;

/// Largest number of buffers one grouped receive may carry (and CTS entries per slot).
pub const MAX_RECVS: usize = 8;
/// Longest device name carried in the handshake (truncated beyond).
const NAME_LEN: usize = 32;

fn bad(what: &str) -> Error {
    Error::misuse(format!("malformed {what}"))
}

pub(super) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
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
    /// Ports of the listening (fused) device: the connecting side creates QPs for the larger
    /// of its own and this count.
    pub members: u8,
    /// The listener's process, announced when it shares out-of-band links (0: it does not,
    /// or it predates them; see `super::links`).
    pub process: u64,
}

/// Ties a handle's process to its nonce, so that a damaged or forged process field is refused
/// rather than read as another process.
fn process_check(process: u64, nonce: u64) -> u32 {
    let x = (process ^ nonce).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 32) as u32 ^ x as u32
}

impl ListenHandle {
    /// Encoded size; well under `NCCL_NET_HANDLE_MAXSIZE` (128). Builds before 0.3.13 wrote
    /// 36 bytes and zeroed the rest of NCCL's buffer: they read as announcing no process, and
    /// they read ours as before (they never look past byte 36).
    pub const LEN: usize = 48;

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
        out[32] = self.members;
        out[33..36].fill(0);
        if self.process == 0 {
            out[36..48].fill(0);
        } else {
            out[36..44].copy_from_slice(&self.process.to_le_bytes());
            out[44..48].copy_from_slice(&process_check(self.process, self.nonce).to_le_bytes());
        }
    }

    /// Decode; checks every field (magic, version, family, address, port, member count,
    /// reserved bytes): a handle crosses processes and hosts, so nothing in it is trusted.
    ///
    /// # Errors
    /// `Misuse` when the bytes are not a handle written by this plugin's `listen`; `Config` when
    /// it was written by another version.
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
        let members = b[32];
        if members == 0 || usize::from(members) > MAX_FUSED_MEMBERS {
            return Err(bad("listen handle member count"));
        }
        if b[33..36] != [0; 3] {
            return Err(bad("listen handle (reserved bytes set)"));
        }
        let port = u16_at(b, 6);
        if port == 0 || ip.is_unspecified() || ip.is_multicast() {
            return Err(bad("listen handle address"));
        }
        let nonce = u64_at(b, 24);
        let process = u64_at(b, 36);
        let announced = process != 0 && u32_at(b, 44) == process_check(process, nonce);
        if !announced && b[36..48] != [0; 12] {
            return Err(bad("listen handle (process field)"));
        }
        Ok(Self {
            addr: SocketAddr::new(ip, port),
            nonce,
            members,
            process,
        })
    }
}

/// Most QPs one connection may have: one set per member of the larger side.
pub const MAX_CONNECTION_QPS: usize = MAX_FUSED_MEMBERS * MAX_QPS_PER_CONNECTION as usize;

/// One member port of a side's device, as the peer needs it to connect QPs to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Local ID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port number.
    pub port: u8,
    /// Active MTU as an `ibv_mtu` code.
    pub mtu: u8,
    /// Link layer code (`IBV_LINK_LAYER_*`).
    pub link_layer: u8,
    /// Its RoCE version (0 on InfiniBand).
    pub roce_version: u8,
    /// The GID this port uses.
    pub gid: [u8; 16],
    /// Its index in the port's GID table.
    pub gid_index: u32,
    /// Remote key of this side's control ring on this member.
    pub ring_rkey: u32,
    /// Device name, for error messages on the other side.
    pub device: String,
}

impl Endpoint {
    const LEN: usize = 32 + NAME_LEN;

    fn emit(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.lid.to_le_bytes());
        out[2] = self.port;
        out[3] = self.mtu;
        out[4] = self.link_layer;
        out[5] = self.roce_version;
        out[8..24].copy_from_slice(&self.gid);
        out[24..28].copy_from_slice(&self.gid_index.to_le_bytes());
        out[28..32].copy_from_slice(&self.ring_rkey.to_le_bytes());
        let name = self.device.as_bytes();
        let n = name.len().min(NAME_LEN);
        out[32..32 + n].copy_from_slice(&name[..n]);
    }

    fn parse(b: &[u8]) -> Self {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        let name = &b[32..32 + NAME_LEN];
        let name_len = name.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
        Self {
            lid: u16_at(b, 0),
            port: b[2],
            mtu: b[3],
            link_layer: b[4],
            roce_version: b[5],
            gid,
            gid_index: u32_at(b, 24),
            ring_rkey: u32_at(b, 28),
            device: String::from_utf8_lossy(&name[..name_len]).into_owned(),
        }
    }
}

/// Which end of the handshake wrote a [`Hello`]: the connector's hello and the acceptor's reply
/// differ, so a peer that echoes the connector's bytes back is recognised.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Written by `connect`.
    Connect,
    /// Written by `accept`, in answer to a connector's hello.
    Accept,
}

impl Role {
    fn code(self) -> u8 {
        match self {
            Self::Connect => 1,
            Self::Accept => 2,
        }
    }
}

/// One side's description of its end of a connection, exchanged over TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    /// Which side wrote it.
    pub role: Role,
    /// Echo of the listen handle's nonce: proof that the connector holds the handle.
    pub listen_nonce: u64,
    /// Chosen by the connector for this connect and echoed by the acceptor, so a reply recorded
    /// from another connect (a replay) is refused.
    pub connect_nonce: u64,
    /// QP numbers, one per QP of the connection, in QP index order (QP `i` lives on member
    /// `i % members.len()`).
    pub qpns: Vec<u32>,
    /// The member ports of this side's device.
    pub members: Vec<Endpoint>,
    /// Address of this side's control ring (sender: CTS ring; receiver: sizes ring).
    pub ring_addr: u64,
    /// Traffic class chosen by the sender (the receiver echoes it).
    pub traffic_class: u8,
    /// Service level chosen by the sender (the receiver echoes it).
    pub service_level: u8,
    /// Split-data mode chosen by the sender.
    pub split_data: bool,
    /// The eager capability: the largest eager message this side takes part in (the sender's
    /// offer; the receiver's answer is the agreed size). 0 = none; a peer that predates the
    /// eager path leaves these bytes zero and ignores ours. An offer under another revision
    /// than ours is refused.
    pub eager_bytes: u32,
    /// The writer's [`DATA_PATH_REVISION`] (0 from builds before the eager path).
    pub revision: u8,
    /// Capability: this side takes part in quiet receives (`super::proto::Layout::quiet`).
    /// Carried in `QUIET_AT`, a byte older builds leave zero and ignore, so they connect with
    /// the rules they know.
    pub quiet: bool,
    /// Capability: this side moves lanes off a failed member port and back
    /// (`NCCL_IB_RESILIENCY_PORT_FAILOVER`, see `super::repair`): after the handshake its
    /// out-of-band connection carries failover frames. Carried in `FAILOVER_AT`, a byte older
    /// builds leave zero and ignore.
    pub failover: bool,
    /// Capability, with `failover`: this side repairs connections with quiet receives too
    /// (0.3.6 on; bit 1 of `FAILOVER_AT`). 0.3.2 to 0.3.4 leave it zero (and ignore ours): they
    /// give quiet connections no failover, so both sides decide from it alike. 0.3.5 leaves it
    /// zero too but ran failover on them: with quiet receives it disagrees with every other
    /// version (see the CHANGELOG).
    pub failover_quiet: bool,
    /// Capability: the slots of the eager bounce ring this side offers (0.3.10 on; a power of
    /// two of at most `SLOTS`, see `super::eager::agreed_bounce_slots`). Carried in
    /// `BOUNCE_SLOTS_AT`, a byte older builds leave zero (their ring has a slot per message
    /// slot) and ignore.
    pub bounce_slots: u8,
    /// Capability: this side shares out-of-band links (0.3.13 on; bit 1 of `QUIET_AT`, which
    /// older builds leave zero and ignore). From a connector, a [`super::links::Proposal`]
    /// follows its hello; from an acceptor (only in answer to a connector that set it), a
    /// [`super::links::Answer`] follows.
    pub shares_links: bool,
}

/// Where the quiet-receives capability lies: byte 6 of the first member record (unused there).
const QUIET_AT: usize = HELLO_MEMBERS_AT + 6;
/// Where the failover capability lies: byte 7 of the first member record (unused there).
const FAILOVER_AT: usize = HELLO_MEMBERS_AT + 7;
/// Where the bounce ring's slots lie: byte 6 of the second member record (unused there, and
/// present in every hello: unused member records are zero).
const BOUNCE_SLOTS_AT: usize = HELLO_MEMBERS_AT + Endpoint::LEN + 6;

const HELLO_QPNS_AT: usize = 40;
const HELLO_MEMBERS_AT: usize = HELLO_QPNS_AT + 4 * MAX_CONNECTION_QPS;

fn remote(what: String) -> Error {
    Error::new(super::error::Kind::Remote, what)
}

impl Hello {
    /// Encoded size (fixed: unused QP and member slots are zero).
    pub const LEN: usize = HELLO_MEMBERS_AT + MAX_FUSED_MEMBERS * Endpoint::LEN;

    /// Encode.
    pub fn emit(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[0..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        out[4] = PROTOCOL_VERSION;
        out[5] = u8::try_from(self.qpns.len()).unwrap_or(0);
        out[6] = u8::try_from(self.members.len()).unwrap_or(0);
        out[7] = u8::from(self.split_data);
        out[8..16].copy_from_slice(&self.listen_nonce.to_le_bytes());
        out[16..24].copy_from_slice(&self.ring_addr.to_le_bytes());
        out[24] = self.traffic_class;
        out[25] = self.service_level;
        out[26] = self.role.code();
        out[27] = self.revision;
        out[28..32].copy_from_slice(&self.eager_bytes.to_le_bytes());
        out[32..40].copy_from_slice(&self.connect_nonce.to_le_bytes());
        for (i, q) in self.qpns.iter().take(MAX_CONNECTION_QPS).enumerate() {
            let at = HELLO_QPNS_AT + 4 * i;
            out[at..at + 4].copy_from_slice(&q.to_le_bytes());
        }
        for (i, m) in self.members.iter().take(MAX_FUSED_MEMBERS).enumerate() {
            let at = HELLO_MEMBERS_AT + i * Endpoint::LEN;
            m.emit(&mut out[at..at + Endpoint::LEN]);
        }
        out[QUIET_AT] = u8::from(self.quiet) | u8::from(self.shares_links) << 1;
        out[FAILOVER_AT] = u8::from(self.failover) | u8::from(self.failover_quiet) << 1;
        out[BOUNCE_SLOTS_AT] = self.bounce_slots;
        out
    }

    /// Decode.
    ///
    /// # Errors
    /// `Remote` when the peer sent something else (wrong magic, role, QP or member count);
    /// `Config` on a version mismatch (different plugin versions on the two nodes).
    pub fn parse(b: &[u8]) -> Result<Self> {
        if b.len() < Self::LEN || u32_at(b, 0) != HELLO_MAGIC {
            return Err(remote("sent an unknown handshake message".into()));
        }
        if b[4] != PROTOCOL_VERSION {
            return Err(Error::config(format!(
                "speaks protocol version {} but this plugin speaks {PROTOCOL_VERSION}: run the \
                 same plugin version on every node",
                b[4]
            )));
        }
        let role = match b[26] {
            1 => Role::Connect,
            2 => Role::Accept,
            other => {
                return Err(remote(format!(
                    "sent a handshake with unknown role {other}"
                )));
            }
        };
        let (eager_bytes, revision) = (u32_at(b, 28), b[27]);
        if eager_bytes != 0 && revision != DATA_PATH_REVISION {
            return Err(Error::config(format!(
                "offers eager messages under revision {} of the data path's rules but this \
                 plugin follows revision {DATA_PATH_REVISION}: run the same plugin version on \
                 every node (or set NCCL_NET_RS_EAGER_BYTES=0 on every node)",
                revision.max(1)
            )));
        }
        let bounce_slots = b[BOUNCE_SLOTS_AT];
        if usize::from(bounce_slots) > SLOTS || bounce_slots.count_ones() > 1 {
            return Err(remote(format!(
                "announced an eager bounce ring of {bounce_slots} slots (a power of two up to \
                 {SLOTS} expected)"
            )));
        }
        let (nqps, nmembers) = (usize::from(b[5]), usize::from(b[6]));
        if nqps == 0
            || nqps > MAX_CONNECTION_QPS
            || nmembers == 0
            || nmembers > MAX_FUSED_MEMBERS
            || !nqps.is_multiple_of(nmembers)
        {
            return Err(remote(format!(
                "announced {nqps} QPs over {nmembers} ports"
            )));
        }
        Ok(Self {
            role,
            listen_nonce: u64_at(b, 8),
            connect_nonce: u64_at(b, 32),
            qpns: (0..nqps)
                .map(|i| u32_at(b, HELLO_QPNS_AT + 4 * i))
                .collect(),
            members: (0..nmembers)
                .map(|i| Endpoint::parse(&b[HELLO_MEMBERS_AT + i * Endpoint::LEN..]))
                .collect(),
            ring_addr: u64_at(b, 16),
            traffic_class: b[24],
            service_level: b[25],
            split_data: b[7] != 0,
            eager_bytes,
            revision,
            quiet: b[QUIET_AT] & 1 != 0,
            shares_links: b[QUIET_AT] & 2 != 0,
            failover: b[FAILOVER_AT] & 1 != 0,
            failover_quiet: b[FAILOVER_AT] & 2 != 0,
            bounce_slots,
        })
    }

    /// Check that this is a connector's hello (the listener routes it by its `listen_nonce`).
    ///
    /// # Errors
    /// `Remote` when it is an acceptor's reply instead.
    pub fn check_connector(&self) -> Result<()> {
        if self.role != Role::Connect {
            return Err(remote(
                "sent an acceptor's reply where a hello belongs".into(),
            ));
        }
        Ok(())
    }

    /// Check that this is the acceptor's answer to `ours`: written by an acceptor, for the
    /// listener and the connect `ours` names, carrying the acceptor's own QPs (an echo of our
    /// own hello, or a reply recorded from another connect, fails here).
    ///
    /// # Errors
    /// `Remote` naming what is wrong.
    pub fn check_reply(&self, ours: &Self) -> Result<()> {
        if self.role != Role::Accept {
            return Err(remote(
                "answered with a connector's hello instead of a reply (an echo of our own \
                 handshake?)"
                    .into(),
            ));
        }
        if self.listen_nonce != ours.listen_nonce || self.connect_nonce != ours.connect_nonce {
            return Err(remote(
                "answered with a reply to another connect (a replayed or misdirected handshake)"
                    .into(),
            ));
        }
        let own_qp = |m: &Endpoint, q: &u32| {
            ours.members
                .iter()
                .cycle()
                .zip(&ours.qpns)
                .any(|(o, oq)| o.gid == m.gid && oq == q)
        };
        let echoed = self
            .members
            .iter()
            .cycle()
            .zip(&self.qpns)
            .any(|(m, q)| own_qp(m, q));
        if echoed {
            return Err(remote(
                "answered with our own QP numbers (an echo of our handshake)".into(),
            ));
        }
        Ok(())
    }
}

/// One clear-to-send entry: a posted receive buffer, written by the receiver into the sender's
/// CTS ring with an RDMA write. `seq` is written last in memory order and tells the sender that
/// the entry is for the message it expects.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Cts {
    /// Address of the receive buffer.
    pub addr: u64,
    /// Its capacity in bytes.
    pub size: u64,
    /// Remote keys of its registration, one per member of the receiver's device.
    pub rkeys: [u32; MAX_FUSED_MEMBERS],
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
        out[16..20].copy_from_slice(&self.rkeys[0].to_le_bytes());
        out[20..24].copy_from_slice(&self.tag.to_le_bytes());
        out[24..28].copy_from_slice(&self.nreqs.to_le_bytes());
        for (i, rkey) in self.rkeys.iter().enumerate().skip(1) {
            let at = 28 + 4 * (i - 1);
            out[at..at + 4].copy_from_slice(&rkey.to_le_bytes());
        }
        out[56..64].copy_from_slice(&self.seq_plus_one.to_le_bytes());
        out
    }

    /// Decode (any 64 bytes decode; the sender validates `seq_plus_one` and `nreqs`).
    pub fn parse(b: &[u8; Self::LEN]) -> Self {
        Self {
            addr: u64_at(b, 0),
            size: u64_at(b, 8),
            rkeys: std::array::from_fn(|i| {
                if i == 0 {
                    u32_at(b, 16)
                } else {
                    u32_at(b, 28 + 4 * (i - 1))
                }
            }),
            tag: i32::from_le_bytes([b[20], b[21], b[22], b[23]]),
            nreqs: u32_at(b, 24),
            seq_plus_one: u64_at(b, 56),
        }
    }
}

const _: () = assert!(ListenHandle::LEN <= 128);
const _: () = assert!(Cts::LEN.is_multiple_of(32));
const _: () = assert!(28 + 4 * (MAX_FUSED_MEMBERS - 1) <= Cts::SEQ_OFFSET);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_handle_round_trips_v4_and_v6() {
        for addr in ["127.0.1.1:4242", "[fe80::1]:7", "[::1]:65535"] {
            let h = ListenHandle {
                addr: addr.parse().unwrap(),
                nonce: 0xdead_beef_0bad_cafe,
                members: 2,
                process: 0x0123_4567_89ab_cdef,
            };
            let mut b = [0u8; ListenHandle::LEN];
            h.emit(&mut b);
            assert_eq!(ListenHandle::parse(&b).unwrap(), h);
        }
    }

    /// A handle of a build before shared links (36 bytes, NCCL's buffer zeroed past them)
    /// announces no process; a damaged process field is refused, never read as another
    /// process.
    #[test]
    fn the_process_field_is_absent_from_old_handles_and_checked_in_new_ones() {
        let h = ListenHandle {
            addr: "10.0.0.1:5000".parse().unwrap(),
            nonce: 77,
            members: 1,
            process: 0x5151,
        };
        let mut b = [0u8; ListenHandle::LEN];
        h.emit(&mut b);
        let mut old = [0u8; 128];
        old[..36].copy_from_slice(&b[..36]);
        assert_eq!(ListenHandle::parse(&old).unwrap().process, 0);
        for byte in 36..ListenHandle::LEN {
            for bit in 0..8 {
                let mut flipped = b;
                flipped[byte] ^= 1 << bit;
                assert!(
                    ListenHandle::parse(&flipped).is_err(),
                    "byte {byte} bit {bit}"
                );
            }
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
            members: 1,
            process: 0,
        }
        .emit(&mut b);
        b[4] = 99;
        let e = ListenHandle::parse(&b).unwrap_err();
        assert!(e.to_string().contains("protocol version 99"), "{e}");
    }

    fn member(name: &str, gid: u8) -> Endpoint {
        Endpoint {
            lid: 3,
            port: 1,
            mtu: 5,
            link_layer: 2,
            roce_version: 2,
            gid: [gid; 16],
            gid_index: 1,
            ring_rkey: 0x1234,
            device: name.into(),
        }
    }

    fn hello(role: Role, qpn_base: u32) -> Hello {
        Hello {
            role,
            listen_nonce: 7,
            connect_nonce: 99,
            qpns: (0..8).map(|q| qpn_base + q).collect(),
            members: vec![member("mlx5_0", 0xfe), member("mlx5_1", 0xfd)],
            ring_addr: 0x7fff_0000_1000,
            traffic_class: 106,
            service_level: 3,
            split_data: true,
            eager_bytes: 4096,
            revision: DATA_PATH_REVISION,
            quiet: true,
            failover: true,
            failover_quiet: true,
            bounce_slots: 8,
            shares_links: true,
        }
    }

    #[test]
    fn hello_round_trips() {
        let mut h = hello(Role::Accept, 0x00ff_0000);
        h.qpns = (0..64).map(|q| 0x00ff_0000 + q).collect();
        h.members = vec![
            member("mlx5_0", 0xfe),
            member("mlx5_1", 0xfd),
            member("mlx5_2", 1),
            member("mlx5_3", 2),
        ];
        assert_eq!(Hello::parse(&h.emit()).unwrap(), h);
        let bounce = BOUNCE_SLOTS_AT;
        for (at, value) in [
            (5, 0),
            (5, 65),
            (6, 0),
            (6, 5),
            (5, 3),
            (26, 0),
            (26, 3),
            (bounce, 3),
            (bounce, 64),
        ] {
            let mut b = h.emit();
            b[at] = value;
            assert!(Hello::parse(&b).is_err(), "byte {at} = {value}");
        }
    }

    /// A build before quiet receives leaves the capability's byte zero (and ignores ours): its
    /// hello parses as one without them, everything else the same.
    #[test]
    fn a_hello_without_the_quiet_capability_is_an_older_peer_with_eager_messages_only() {
        let mut h = hello(Role::Connect, 0x100);
        h.shares_links = false;
        let mut b = h.emit();
        assert_eq!(b[QUIET_AT], 1);
        b[QUIET_AT] = 0;
        h.quiet = false;
        assert_eq!(Hello::parse(&b).unwrap(), h);
    }

    /// A build before shared links leaves bit 1 of the quiet byte zero (and ignores ours): its
    /// hello parses as one that sends no proposal or answer, everything else the same.
    #[test]
    fn a_hello_without_the_link_capability_is_an_older_peer() {
        let mut h = hello(Role::Connect, 0x100);
        let mut b = h.emit();
        assert_eq!(b[QUIET_AT], 3);
        b[QUIET_AT] = 1;
        h.shares_links = false;
        assert_eq!(Hello::parse(&b).unwrap(), h);
    }

    /// A build before port failover leaves the capability's byte zero (and ignores ours): its
    /// hello parses as one without failover, everything else the same.
    #[test]
    fn a_hello_without_the_failover_capability_is_an_older_peer() {
        let mut h = hello(Role::Accept, 0x100);
        let mut b = h.emit();
        assert_eq!(b[FAILOVER_AT], 3);
        b[FAILOVER_AT] = 0;
        h.failover = false;
        h.failover_quiet = false;
        assert_eq!(Hello::parse(&b).unwrap(), h);
    }

    /// A build before 0.3.10 leaves the bounce ring's byte zero (and ignores ours): its ring has
    /// a slot per message slot, and its hello parses as one that offers no count.
    #[test]
    fn a_hello_without_the_bounce_slots_is_an_older_peer() {
        let mut h = hello(Role::Connect, 0x100);
        h.members.truncate(1);
        let mut b = h.emit();
        assert_eq!(
            b[BOUNCE_SLOTS_AT], 8,
            "in the second member record, even with one member"
        );
        b[BOUNCE_SLOTS_AT] = 0;
        h.bounce_slots = 0;
        assert_eq!(Hello::parse(&b).unwrap(), h);
    }

    /// 0.3.2 to 0.3.4 offer failover without the quiet bit (and read only bit 0 of ours): their
    /// hello parses as one that gives quiet connections no failover.
    #[test]
    fn a_hello_with_failover_but_not_for_quiet_receives_is_a_0_3_4_peer() {
        let mut h = hello(Role::Connect, 0x100);
        let mut b = h.emit();
        b[FAILOVER_AT] = 1;
        h.failover_quiet = false;
        assert_eq!(Hello::parse(&b).unwrap(), h);
    }

    #[test]
    fn a_hello_without_the_eager_bytes_is_an_older_peer_without_eager_messages() {
        let mut h = hello(Role::Connect, 0x100);
        let mut b = h.emit();
        assert_eq!(u32_at(&b, 28), 4096);
        b[27..32].fill(0);
        h.eager_bytes = 0;
        h.revision = 0;
        assert_eq!(Hello::parse(&b).unwrap(), h);
    }

    /// Builds of another revision write eager messages elsewhere in the bounce slot (2) or copy
    /// truncated ones (1, no revision byte): mixing them with this one could lose a message,
    /// so the handshake stops with the reason.
    #[test]
    fn a_hello_offering_eager_messages_under_another_revision_is_refused_naming_it() {
        for (byte, named) in [(0, "revision 1"), (2, "revision 2")] {
            let mut b = hello(Role::Connect, 0x100).emit();
            b[27] = byte;
            let e = Hello::parse(&b).unwrap_err();
            assert_eq!(e.kind(), crate::core::error::Kind::Config);
            assert!(e.to_string().contains(named), "{e}");
            assert!(e.to_string().contains("NCCL_NET_RS_EAGER_BYTES=0"), "{e}");
        }
    }

    /// A peer of revision 2 with its eager path off shares the rendezvous protocol: its hello
    /// parses, with its revision, which picks the CTS layout it knows.
    #[test]
    fn a_hello_of_revision_2_without_eager_messages_is_accepted() {
        let mut h = hello(Role::Connect, 0x100);
        h.eager_bytes = 0;
        h.revision = 2;
        assert_eq!(Hello::parse(&h.emit()).unwrap(), h);
    }

    #[test]
    fn the_listener_takes_only_a_connectors_hello() {
        hello(Role::Connect, 0x100).check_connector().unwrap();
        let reply = hello(Role::Accept, 0x200);
        assert!(
            reply
                .check_connector()
                .unwrap_err()
                .to_string()
                .contains("reply")
        );
    }

    #[test]
    fn a_reply_must_answer_this_connect_with_the_peers_own_qps() {
        let ours = hello(Role::Connect, 0x100);
        hello(Role::Accept, 0x200).check_reply(&ours).unwrap();
        let echo = ours.clone();
        assert!(
            echo.check_reply(&ours)
                .unwrap_err()
                .to_string()
                .contains("echo")
        );
        let mut replayed = hello(Role::Accept, 0x200);
        replayed.connect_nonce = 98;
        assert!(
            replayed
                .check_reply(&ours)
                .unwrap_err()
                .to_string()
                .contains("another connect")
        );
        let mut other_listener = hello(Role::Accept, 0x200);
        other_listener.listen_nonce = 8;
        assert!(other_listener.check_reply(&ours).is_err());
        let mut mirrored = ours.clone();
        mirrored.role = Role::Accept;
        assert!(
            mirrored
                .check_reply(&ours)
                .unwrap_err()
                .to_string()
                .contains("own QP numbers")
        );
    }

    #[test]
    fn cts_round_trips_and_seq_is_last() {
        let c = Cts {
            addr: 0x1000,
            size: 4096,
            rkeys: [9, 10, 11, 12, 13, 14, 15, 0xffff_ffff],
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
