//! PCI identity of an RDMA device: its address, its physical function when it is an SR-IOV VF,
//! its NUMA node and its network interfaces, all read from sysfs links and files.

use std::fmt;
use std::str::FromStr;

/// A PCI address `domain:bus:device.function`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number (0..32).
    pub device: u8,
    /// Function number (0..8).
    pub function: u8,
}

impl PciAddress {
    /// `0000:0b:00`: the address without its function. Every function of one PCI device shares
    /// it, which is how the ports of a multi-function NIC (a dual-port ConnectX-7) recognise
    /// each other.
    pub fn slot_name(&self) -> String {
        format!("{:04x}:{:02x}:{:02x}", self.domain, self.bus, self.device)
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:x}", self.slot_name(), self.function)
    }
}

/// Why a string is not a PCI address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadPciAddress(pub String);

impl FromStr for PciAddress {
    type Err = BadPciAddress;

    /// Parse `DDDD:BB:DD.F` (hexadecimal fields, as sysfs names PCI devices).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadPciAddress(s.to_owned());
        let mut colon = s.split(':');
        let (Some(domain), Some(bus), Some(rest), None) =
            (colon.next(), colon.next(), colon.next(), colon.next())
        else {
            return Err(bad());
        };
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let hex = |field: &str, digits: usize| {
            (field.len() == digits && field.chars().all(|c| c.is_ascii_hexdigit()))
                .then(|| u32::from_str_radix(field, 16).ok())
                .flatten()
                .ok_or_else(bad)
        };
        let address = Self {
            domain: hex(domain, 4)?,
            bus: u8::try_from(hex(bus, 2)?).map_err(|_| bad())?,
            device: u8::try_from(hex(device, 2)?).map_err(|_| bad())?,
            function: u8::try_from(hex(function, 1)?).map_err(|_| bad())?,
        };
        if address.device >= 32 || address.function >= 8 {
            return Err(bad());
        }
        Ok(address)
    }
}

/// The PCI function behind one RDMA device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciFunction {
    /// Its address.
    pub address: PciAddress,
    /// The physical function's address when this is an SR-IOV virtual function (`physfn` link).
    pub physfn: Option<PciAddress>,
    /// NUMA node, when the platform reports one.
    pub numa_node: Option<u32>,
    /// Network interfaces of the function (RoCE netdevs, IPoIB), sorted.
    pub netdevs: Vec<String>,
}

impl PciFunction {
    /// True for an SR-IOV virtual function whose PF is visible.
    pub fn is_vf(&self) -> bool {
        self.physfn.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print_in_sysfs_notation() {
        let a: PciAddress = "0000:0b:00.1".parse().unwrap();
        assert_eq!((a.domain, a.bus, a.device, a.function), (0, 0x0b, 0, 1));
        assert_eq!(a.to_string(), "0000:0b:00.1");
        assert_eq!(a.slot_name(), "0000:0b:00");
        let b: PciAddress = "10000:ff:1f.7".parse().unwrap_or(a);
        assert_eq!(b, a, "five-digit domains are not sysfs PCI names");
        for bad in [
            "",
            "0000:0b:00",
            "0000:0b:00.8",
            "0000:0b:20.0",
            "pci0000:00",
            "0000:0g:00.0",
            "0000:0b:00.1:2",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
        let slot = |s: &str| s.parse::<PciAddress>().unwrap().slot_name();
        assert_eq!(slot("0000:0b:00.0"), slot("0000:0b:00.1"));
        assert_ne!(slot("0000:0b:00.0"), slot("0000:0c:00.0"));
    }
}
