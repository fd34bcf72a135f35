//! InfiniBand addressing, as NCCL's IB transport decides it (`src/transport/net_ib/connect.cc`:
//! `ncclIbGetGidIndex`, `ncclIbRtrQp`): which GID an InfiniBand port offers its peers, and how a
//! QP reaches the peer: by LID alone inside one subnet, with a global route header when the
//! subnets differ (through an IB router: the destination LID is then the peer's FLID) or when
//! the port requires one (a virtual HCA, such as an SR-IOV function in a VM, is reached by GID).

use super::gid::GidEntry;

/// The GID an InfiniBand port offers: entry `routable_index` (`NCCL_IB_ROUTABLE_FLID_GID_INDEX`,
/// 1 by default) when it carries a routable FLID, else entry 0 (the port GID). A port without
/// either offers the zero GID, as builds before this choice did.
pub fn select_ib_gid(entries: &[GidEntry], routable_index: u32) -> GidEntry {
    let at = |index| entries.iter().find(|e| e.index == index);
    let chosen = at(routable_index)
        .filter(|e| flid(&e.gid) != 0)
        .or_else(|| at(0));
    GidEntry {
        index: chosen.map_or(0, |e| e.index),
        gid: chosen.map_or([0; 16], |e| e.gid),
        // "IB/RoCE v1" in sysfs: no RoCE version on an InfiniBand port.
        roce_version: None,
        netdev: None,
    }
}

/// The FLID a GID carries: bytes 4 and 5 of its subnet prefix (0: none).
fn flid(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[4], gid[5]])
}

/// The local part of a GID's subnet prefix (its low 16 bits), which NCCL compares.
fn local_subnet(gid: &[u8; 16]) -> u16 {
    u16::from_be_bytes([gid[6], gid[7]])
}

/// How an InfiniBand QP addresses its peer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct IbRoute {
    /// Send a global route header (with the peer's GID).
    pub global: bool,
    /// Destination LID: the peer's, or its FLID across subnets.
    pub dlid: u16,
    /// Why the route is global, for the log (`None`: LID alone).
    pub why: Option<&'static str>,
}

/// The route from a port with GID `local` (requiring a GRH when `grh_required`, the port's
/// `IBV_QPF_GRH_REQUIRED`) to a peer with GID `remote` and LID `remote_lid`. A peer that sent the
/// zero GID (a build before GIDs were exchanged on InfiniBand) is taken to share the subnet.
pub fn ib_route(
    local: &[u8; 16],
    remote: &[u8; 16],
    remote_lid: u16,
    grh_required: bool,
) -> IbRoute {
    let same_subnet = *remote == [0; 16] || local_subnet(local) == local_subnet(remote);
    if !same_subnet {
        // NCCL falls back to the LID (with a warning) when the peer has no FLID.
        let dlid = match flid(remote) {
            0 => remote_lid,
            f => f,
        };
        return IbRoute {
            global: true,
            dlid,
            why: Some("the subnets differ"),
        };
    }
    IbRoute {
        global: grh_required,
        dlid: remote_lid,
        why: grh_required.then_some("the port requires a GRH"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::parse_gid;

    fn entry(index: u32, gid: &str) -> GidEntry {
        GidEntry {
            index,
            gid: parse_gid(gid).unwrap(),
            roce_version: Some(1),
            netdev: None,
        }
    }

    const PORT_GID: &str = "fe80:0000:0000:0000:0e42:a103:00aa:0001";
    const FLID_GID: &str = "fec0:0000:0012:0001:0e42:a103:00aa:0001";

    #[test]
    fn an_ib_port_offers_its_routable_gid_when_it_has_a_flid_else_the_port_gid() {
        let table = [entry(0, PORT_GID), entry(1, FLID_GID)];
        assert_eq!(select_ib_gid(&table, 1).index, 1);
        assert_eq!(select_ib_gid(&table, 1).roce_version, None);
        // Index 1 without a FLID (bytes 4-5 zero), or an index that is not there: the port GID.
        let table = [entry(0, PORT_GID), entry(1, PORT_GID)];
        assert_eq!(select_ib_gid(&table, 1).index, 0);
        assert_eq!(select_ib_gid(&[entry(0, PORT_GID)], 5).gid, table[0].gid);
        assert_eq!(select_ib_gid(&[], 1).gid, [0; 16]);
    }

    /// NCCL's `ncclIbRtrQp` on InfiniBand: LID alone within a subnet; a GRH across subnets (to
    /// the peer's FLID, or its LID when it has none) or when the port requires one.
    #[test]
    fn a_grh_goes_across_subnets_and_where_the_port_requires_one() {
        let local = parse_gid(PORT_GID).unwrap();
        let same = parse_gid("fe80:0000:0000:0000:0e42:a103:00bb:0002").unwrap();
        assert_eq!(
            ib_route(&local, &same, 7, false),
            IbRoute {
                global: false,
                dlid: 7,
                why: None
            }
        );
        let required = ib_route(&local, &same, 7, true);
        assert!(required.global && required.dlid == 7 && required.why.is_some());
        let routed = parse_gid(FLID_GID).unwrap();
        let across = ib_route(&local, &routed, 7, false);
        assert!(across.global);
        assert_eq!(across.dlid, 0x0012, "the peer's FLID");
        let mut no_flid = routed;
        no_flid[4..6].fill(0);
        assert_eq!(ib_route(&local, &no_flid, 7, false).dlid, 7);
        // A peer that sent no GID shares the subnet: LID alone, as between older builds.
        assert!(!ib_route(&local, &[0; 16], 7, false).global);
    }
}
