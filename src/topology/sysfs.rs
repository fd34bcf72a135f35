//! The one place that joins sysfs paths. Tests point it at a fixture tree.

use std::path::{Path, PathBuf};

use super::{GidEntry, PKey, PciAddress, PciFunction, parse_gid, parse_pkey, parse_roce_version};

/// Root of a sysfs tree: `/sys` on a real machine, a fixture directory in tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysfsRoot(PathBuf);

impl Default for SysfsRoot {
    fn default() -> Self {
        Self(PathBuf::from("/sys"))
    }
}

impl SysfsRoot {
    /// A tree rooted at `root` (the directory that holds `class/`, `bus/`, `devices/`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self(root.into())
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Whether `rel` (e.g. `module/nvidia_peermem/version`) exists under the root.
    pub fn exists(&self, rel: &str) -> bool {
        self.0.join(rel).exists()
    }

    /// The trimmed text of the file `rel`, `None` when it is missing, unreadable or empty.
    pub fn read_value(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.0.join(rel))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    }

    /// `class/infiniband/<device>`: the RDMA device's own directory.
    fn ib_device_dir(&self, device: &str) -> PathBuf {
        self.0.join("class").join("infiniband").join(device)
    }

    /// Realpath of the RDMA device's parent (PCI) device directory, as NCCL reports `pciPath`.
    /// `None` for devices without a parent, such as Soft-RoCE (`rxe`).
    pub fn ib_device_pci_path(&self, device: &str) -> Option<PathBuf> {
        self.ib_device_dir(device)
            .join("device")
            .canonicalize()
            .ok()
    }

    /// The PCI function behind `device`: the address is the name of the directory its `device`
    /// link resolves to, the PF the name of the directory `physfn` resolves to. `None` without a
    /// PCI parent (Soft-RoCE) or when the parent is not named like a PCI function.
    pub fn pci_function(&self, device: &str) -> Option<PciFunction> {
        let dir = self
            .ib_device_dir(device)
            .join("device")
            .canonicalize()
            .ok()?;
        let address_of =
            |path: &Path| -> Option<PciAddress> { path.file_name()?.to_str()?.parse().ok() };
        let address = address_of(&dir)?;
        let physfn = dir
            .join("physfn")
            .canonicalize()
            .ok()
            .and_then(|pf| address_of(&pf));
        let numa_node = std::fs::read_to_string(dir.join("numa_node"))
            .ok()
            .and_then(|n| n.trim().parse::<u32>().ok());
        let mut netdevs: Vec<String> = std::fs::read_dir(dir.join("net"))
            .map(|listing| {
                listing
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        netdevs.sort();
        Some(PciFunction {
            address,
            physfn,
            numa_node,
            netdevs,
        })
    }
}

impl SysfsRoot {
    /// The populated entries of a port's GID table (zero GIDs are skipped).
    pub fn port_gids(&self, device: &str, port: u32) -> Vec<GidEntry> {
        let port_dir = self
            .ib_device_dir(device)
            .join("ports")
            .join(port.to_string());
        let Ok(listing) = std::fs::read_dir(port_dir.join("gids")) else {
            return Vec::new();
        };
        let mut entries: Vec<GidEntry> = listing
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let index: u32 = name.parse().ok()?;
                let gid =
                    parse_gid(&std::fs::read_to_string(port_dir.join("gids").join(&name)).ok()?)?;
                if gid == [0; 16] {
                    return None;
                }
                let attr = |kind: &str| {
                    std::fs::read_to_string(port_dir.join("gid_attrs").join(kind).join(&name)).ok()
                };
                Some(GidEntry {
                    index,
                    gid,
                    roce_version: attr("types").as_deref().and_then(parse_roce_version),
                    netdev: attr("ndevs")
                        .map(|n| n.trim().to_owned())
                        .filter(|n| !n.is_empty()),
                })
            })
            .collect();
        entries.sort_by_key(|e| e.index);
        entries
    }

    /// A port's P_Key table as `(index, key)` pairs in index order, empty entries included;
    /// empty when the table cannot be read.
    pub fn port_pkeys(&self, device: &str, port: u32) -> Vec<(u32, PKey)> {
        let dir = self
            .ib_device_dir(device)
            .join("ports")
            .join(port.to_string())
            .join("pkeys");
        let Ok(listing) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut table: Vec<(u32, PKey)> = listing
            .filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                let index: u32 = name.parse().ok()?;
                Some((
                    index,
                    parse_pkey(&std::fs::read_to_string(dir.join(&name)).ok()?)?,
                ))
            })
            .collect();
        table.sort_unstable_by_key(|(index, _)| *index);
        table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn pci_path_follows_the_device_link_and_is_none_without_one() {
        let dir = std::env::temp_dir().join(format!("sysfs-root-{}", std::process::id()));
        let pci = dir.join("devices/pci0000:00/0000:00:02.0/0000:0b:00.0");
        fs::create_dir_all(&pci).unwrap();
        fs::create_dir_all(dir.join("class/infiniband/mlx5_0")).unwrap();
        fs::create_dir_all(dir.join("class/infiniband/rxe0")).unwrap();
        std::os::unix::fs::symlink(&pci, dir.join("class/infiniband/mlx5_0/device")).unwrap();

        let root = SysfsRoot::new(&dir);
        assert_eq!(
            root.ib_device_pci_path("mlx5_0"),
            Some(pci.canonicalize().unwrap())
        );
        assert_eq!(root.ib_device_pci_path("rxe0"), None);
        assert_eq!(root.ib_device_pci_path("absent"), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pci_function_reads_address_physfn_numa_and_netdevs() {
        let dir = std::env::temp_dir().join(format!("sysfs-pci-{}", std::process::id()));
        let pf = dir.join("devices/pci0000:00/0000:00:02.0/0000:0b:00.0");
        let vf = dir.join("devices/pci0000:00/0000:00:02.0/0000:0b:00.2");
        for (function, numa, net) in [(&pf, "1\n", "ens1f0"), (&vf, "-1\n", "ens1f0v0")] {
            fs::create_dir_all(function.join("net").join(net)).unwrap();
            fs::write(function.join("numa_node"), numa).unwrap();
        }
        std::os::unix::fs::symlink(&pf, vf.join("physfn")).unwrap();
        for (name, function) in [("mlx5_0", &pf), ("mlx5_2", &vf)] {
            fs::create_dir_all(dir.join("class/infiniband").join(name)).unwrap();
            std::os::unix::fs::symlink(
                function,
                dir.join("class/infiniband").join(name).join("device"),
            )
            .unwrap();
        }
        let root = SysfsRoot::new(&dir);
        let pf_fn = root.pci_function("mlx5_0").unwrap();
        assert_eq!(pf_fn.address.to_string(), "0000:0b:00.0");
        assert_eq!((pf_fn.physfn, pf_fn.numa_node), (None, Some(1)));
        assert_eq!(pf_fn.netdevs, ["ens1f0"]);
        let vf_fn = root.pci_function("mlx5_2").unwrap();
        assert_eq!(vf_fn.physfn, Some(pf_fn.address));
        assert_eq!((vf_fn.numa_node, vf_fn.is_vf()), (None, true));
        assert_eq!(root.pci_function("rxe0"), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
