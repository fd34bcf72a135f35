//! Which ports become one fused NCCL device, and why. The ports of one NIC (the functions of one
//! PCI device, or several ports of one function) fuse by default; an SR-IOV VF never fuses with
//! its own PF; the VFs of one PF fuse only with `NCCL_IB_MERGE_VFS=1`; anything else (separate
//! NICs, Soft-RoCE devices without a PCI parent) fuses only when listed in `NCCL_NET_RS_FUSE`.
//! Every resulting device comes with one line saying why it is fused or alone.

use std::path::Path;

use super::{NetDevice, PciAddress};

/// The knobs that steer fusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FusionPolicy {
    /// `NCCL_IB_MERGE_NICS`: fusion allowed at all.
    pub merge_nics: bool,
    /// `NCCL_IB_MERGE_VFS`: VFs of one PF fuse.
    pub merge_vfs: bool,
    /// `NCCL_NET_RS_FUSE`: explicit groups of device names.
    pub explicit: Vec<Vec<String>>,
    /// Most members of one fused device.
    pub max_members: usize,
    /// What sets that limit (`"this plugin"`, or the ncclNet tables whose devices list fewer
    /// ports), for the line that refuses a larger group.
    pub limit_holder: &'static str,
}

/// One NCCL device: a single port, or several fused ports that carry its traffic together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VirtualDevice {
    /// The member ports, in the order their QPs are striped; at least one.
    pub members: Vec<NetDevice>,
}

impl VirtualDevice {
    /// The name NCCL sees: the members' names joined by `+`.
    pub fn name(&self) -> String {
        let names: Vec<&str> = self.members.iter().map(|m| m.name.as_str()).collect();
        names.join("+")
    }

    /// The first member, whose PCI path, GUID and port NCCL sees.
    pub fn first(&self) -> &NetDevice {
        &self.members[0]
    }

    /// Sum of the members' link speeds.
    pub fn speed_mbps(&self) -> u32 {
        self.members
            .iter()
            .fold(0u32, |sum, m| sum.saturating_add(m.speed_mbps))
    }

    /// Connections the device can hold: the smallest member's limit.
    pub fn max_comms(&self) -> u32 {
        self.members.iter().map(|m| m.max_comms).min().unwrap_or(0)
    }

    /// The PCI path NCCL places the device by: the first member's.
    pub fn pci_path(&self) -> Option<&Path> {
        self.first().pci_path.as_deref()
    }
}

/// The devices NCCL will see, in index order, with one decision line per device and one per
/// refused explicit fusion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fusion {
    /// The devices; index = NCCL device number.
    pub devices: Vec<VirtualDevice>,
    /// `"fused a+b: <reason>"`, `"a not fused: <reason>"`, `"fusion a+b refused: <reason>"`.
    pub decisions: Vec<String>,
    /// `NCCL_NET_RS_FUSE` groups with more ports than one device may have: what the operator
    /// asked for and does not get, one WARN line each; their ports stay separate devices.
    pub warnings: Vec<String>,
}

/// How the automatic policy sees a port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Family {
    /// No PCI parent: only explicit fusion.
    Virtual,
    /// A PF (or a VF whose PF is not visible): fuses with the other functions of its slot
    /// (the address with function 0).
    Slot(PciAddress),
    /// A VF: fuses with its sibling VFs when asked.
    VfsOf(PciAddress),
}

fn family(d: &NetDevice) -> Family {
    match &d.pci {
        None => Family::Virtual,
        Some(f) => match f.physfn {
            Some(pf) => Family::VfsOf(pf),
            None => Family::Slot(PciAddress {
                function: 0,
                ..f.address
            }),
        },
    }
}

/// A reason the members may not be fused, if any.
fn refusal(members: &[&NetDevice], policy: &FusionPolicy) -> Option<String> {
    if !policy.merge_nics {
        return Some("NCCL_IB_MERGE_NICS=0 turns fusion off".to_owned());
    }
    if members.len() > policy.max_members {
        return Some(too_many(members.len(), policy));
    }
    let first = members[0];
    if let Some(other) = members.iter().find(|m| m.link_layer != first.link_layer) {
        return Some(format!(
            "{} is {} but {} is {}; fused ports must share a link layer",
            first.name, first.link_layer, other.name, other.link_layer
        ));
    }
    for vf in members {
        let Some(pf) = vf.pci.as_ref().and_then(|f| f.physfn) else {
            continue;
        };
        if let Some(own) = members
            .iter()
            .find(|m| m.pci.as_ref().is_some_and(|f| f.address == pf))
        {
            return Some(format!(
                "{} is a VF of {pf}, which is {}; a VF never fuses with its own PF (they share \
                 one port)",
                vf.name, own.name
            ));
        }
    }
    None
}

/// Why `n` ports are more than one device may fuse.
fn too_many(n: usize, policy: &FusionPolicy) -> String {
    format!(
        "{n} ports, more than the {} one device of {} may have",
        policy.max_members, policy.limit_holder
    )
}

/// The WARN line of an `NCCL_NET_RS_FUSE` group larger than one device may be, if `wanted` is
/// one.
fn oversized_group(wanted: &[String], policy: &FusionPolicy) -> Option<String> {
    (wanted.len() > policy.max_members).then(|| {
        format!(
            "NCCL_NET_RS_FUSE group {} refused: {}; its ports stay separate devices (split it \
             into groups of at most {})",
            wanted.join("+"),
            too_many(wanted.len(), policy),
            policy.max_members
        )
    })
}

/// Why a port with no partner stays alone.
fn alone_reason(d: &NetDevice, all: &[NetDevice], policy: &FusionPolicy) -> String {
    match family(d) {
        Family::Virtual => "no PCI parent (Soft-RoCE or a virtual device); fuse it by \
                                 listing it in NCCL_NET_RS_FUSE"
            .to_owned(),
        Family::VfsOf(pf) => {
            if let Some(own) = all
                .iter()
                .find(|m| m.pci.as_ref().is_some_and(|f| f.address == pf))
            {
                format!(
                    "VF of {pf}, which is {}; a VF never fuses with its own PF (they share one port)",
                    own.name
                )
            } else if !policy.merge_vfs
                && all
                    .iter()
                    .any(|m| m.name != d.name && family(m) == Family::VfsOf(pf))
            {
                format!("VFs of {pf} fuse only with NCCL_IB_MERGE_VFS=1")
            } else {
                format!("the only visible VF of {pf}")
            }
        }
        Family::Slot(slot) => format!(
            "the only port of PCI device {} (separate NICs fuse only when listed in NCCL_NET_RS_FUSE)",
            slot.slot_name()
        ),
    }
}

/// `", NUMA node 1, netdevs ens1f0np0 ens1f1np1"`: where the fused ports sit, as far as sysfs
/// says (operators match these against the GPU's NUMA node and their RoCE interfaces).
fn placement(members: &[&NetDevice]) -> String {
    let functions: Vec<_> = members.iter().filter_map(|m| m.pci.as_ref()).collect();
    let mut nodes: Vec<u32> = functions.iter().filter_map(|f| f.numa_node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let netdevs: Vec<&str> = functions
        .iter()
        .flat_map(|f| f.netdevs.iter().map(String::as_str))
        .collect();
    let mut out = String::new();
    match nodes.as_slice() {
        [] => {}
        [node] => out.push_str(&format!(", NUMA node {node}")),
        several => out.push_str(&format!(", NUMA nodes {several:?}")),
    }
    if !netdevs.is_empty() {
        out.push_str(&format!(", netdevs {}", netdevs.join(" ")));
    }
    out
}

/// The positions of the ports an explicit group names.
fn find_named(wanted: &[String], devices: &[NetDevice]) -> Result<Vec<usize>, String> {
    wanted
        .iter()
        .map(|name| {
            devices
                .iter()
                .position(|d| &d.name == name)
                .ok_or_else(|| format!("{name} is not an active port selected by NCCL_IB_HCA"))
        })
        .collect()
}

/// `"fused a+b (N Mbps): <reason>"`.
fn fused_line(device: &VirtualDevice, reason: &str) -> String {
    format!(
        "fused {} ({} Mbps): {reason}",
        device.name(),
        device.speed_mbps()
    )
}

/// Fuse exactly `members` (NCCL's `makeVDevice`, ncclNet v9+): the same rules as automatic and
/// explicit fusion; `Err` carries the reason they refuse.
pub fn fuse_listed(members: &[&NetDevice], policy: &FusionPolicy) -> Result<VirtualDevice, String> {
    if let Some(why) = refusal(members, policy) {
        return Err(why);
    }
    Ok(VirtualDevice {
        members: members.iter().map(|&m| m.clone()).collect(),
    })
}

/// The devices of ncclNet v9 and later, where NCCL fuses ports itself through `makeVDevice`:
/// every port alone, in index order, then one device per `NCCL_NET_RS_FUSE` group.
pub fn physical_then_explicit(devices: Vec<NetDevice>, policy: &FusionPolicy) -> Fusion {
    let mut decisions = Vec::new();
    let mut warnings = Vec::new();
    let mut fused = Vec::new();
    for wanted in &policy.explicit {
        if let Some(warning) = oversized_group(wanted, policy) {
            warnings.push(warning);
            continue;
        }
        let label = wanted.join("+");
        let made = find_named(wanted, &devices).and_then(|found| {
            let refs: Vec<&NetDevice> = found.iter().map(|&i| &devices[i]).collect();
            fuse_listed(&refs, policy)
        });
        match made {
            Ok(device) => {
                decisions.push(fused_line(&device, "listed in NCCL_NET_RS_FUSE"));
                fused.push(device);
            }
            Err(why) => decisions.push(format!("fusion {label} refused: {why}")),
        }
    }
    let mut all: Vec<VirtualDevice> = devices
        .into_iter()
        .map(|d| VirtualDevice { members: vec![d] })
        .collect();
    all.extend(fused);
    Fusion {
        devices: all,
        decisions,
        warnings,
    }
}

/// Group `devices` (already in NCCL index order) into virtual devices.
pub fn fuse(devices: Vec<NetDevice>, policy: &FusionPolicy) -> Fusion {
    let mut decisions = Vec::new();
    let mut warnings = Vec::new();
    // Group ids per device; a group is placed where its first member was.
    let mut group_of: Vec<Option<usize>> = vec![None; devices.len()];
    let mut groups: Vec<(Vec<usize>, String)> = Vec::new();

    for wanted in &policy.explicit {
        if let Some(warning) = oversized_group(wanted, policy) {
            warnings.push(warning);
            continue;
        }
        let label = wanted.join("+");
        let found = find_named(wanted, &devices).and_then(|found| {
            match found.iter().find(|&&i| group_of[i].is_some()) {
                Some(&i) => Err(format!("{} is already fused", devices[i].name)),
                None => Ok(found),
            }
        });
        let members = match found {
            Ok(m) => m,
            Err(why) => {
                decisions.push(format!("fusion {label} refused: {why}"));
                continue;
            }
        };
        let refs: Vec<&NetDevice> = members.iter().map(|&i| &devices[i]).collect();
        if let Some(why) = refusal(&refs, policy) {
            decisions.push(format!("fusion {label} refused: {why}"));
            continue;
        }
        for &i in &members {
            group_of[i] = Some(groups.len());
        }
        groups.push((members, "listed in NCCL_NET_RS_FUSE".to_owned()));
    }

    for i in 0..devices.len() {
        if group_of[i].is_some() {
            continue;
        }
        let fam = family(&devices[i]);
        let auto = match &fam {
            Family::Virtual => false,
            Family::Slot(..) => true,
            Family::VfsOf(_) => policy.merge_vfs,
        };
        let mut members = vec![i];
        if auto {
            members.extend(
                (i + 1..devices.len())
                    .filter(|&j| group_of[j].is_none() && family(&devices[j]) == fam),
            );
        }
        if members.len() == 1 {
            group_of[i] = Some(groups.len());
            groups.push((
                members,
                format!("not fused: {}", alone_reason(&devices[i], &devices, policy)),
            ));
            continue;
        }
        let refs: Vec<&NetDevice> = members.iter().map(|&j| &devices[j]).collect();
        if let Some(why) = refusal(&refs, policy) {
            let names: Vec<&str> = refs.iter().map(|d| d.name.as_str()).collect();
            let reason = format!("not fused with {}: {why}", names.join("+"));
            for j in members {
                group_of[j] = Some(groups.len());
                groups.push((vec![j], reason.clone()));
            }
            continue;
        }
        let reason = match &fam {
            Family::VfsOf(pf) => format!("VFs of {pf}, NCCL_IB_MERGE_VFS=1"),
            Family::Slot(slot) => format!(
                "ports of one NIC (PCI device {}{})",
                slot.slot_name(),
                placement(&members.iter().map(|&j| &devices[j]).collect::<Vec<_>>())
            ),
            // Never grouped automatically (see `auto` above).
            Family::Virtual => "devices without a PCI parent".to_owned(),
        };
        for &j in &members {
            group_of[j] = Some(groups.len());
        }
        groups.push((members, reason));
    }

    // Order groups by their first member's position.
    groups.sort_by_key(|(members, _)| members.iter().copied().min());
    let mut slots: Vec<Option<NetDevice>> = devices.into_iter().map(Some).collect();
    let mut fusion = Fusion {
        devices: Vec::new(),
        decisions,
        warnings,
    };
    for (members, reason) in groups {
        let members: Vec<NetDevice> = members.iter().filter_map(|&i| slots[i].take()).collect();
        let device = VirtualDevice { members };
        fusion.decisions.push(if device.members.len() > 1 {
            fused_line(&device, &reason)
        } else {
            format!("{} {reason}", device.name())
        });
        fusion.devices.push(device);
    }
    fusion
}
