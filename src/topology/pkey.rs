//! Partition keys. NCCL's transport puts every QP on the P_Key at index `NCCL_IB_PKEY` (default
//! 0) of its port's table and checks nothing; where partitions are enforced, a QP at an empty
//! or missing entry is in no partition, and one in another partition than the peer's has every
//! packet dropped. Here the index is checked against the port's table when the variable is
//! set, and the key is named.

use std::fmt;

use super::SysfsRoot;

/// One P_Key: the partition (low 15 bits) and the membership bit.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PKey(pub u16);

impl PKey {
    /// The partition: the key without its membership bit.
    pub fn partition(self) -> u16 {
        self.0 & 0x7fff
    }

    /// An entry that names a partition (0x0000 and 0x8000 mark empty ones).
    pub fn is_valid(self) -> bool {
        self.partition() != 0
    }

    /// Full members talk to every member of the partition; limited members only to full ones.
    pub fn is_full_member(self) -> bool {
        self.0 & 0x8000 != 0
    }
}

impl fmt::Display for PKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let membership = if self.is_full_member() {
            "full"
        } else {
            "limited"
        };
        write!(f, "{:#06x} ({membership} member)", self.0)
    }
}

/// Parse a `pkeys/<i>` line: `0xffff`.
pub fn parse_pkey(text: &str) -> Option<PKey> {
    let hex = text.trim().strip_prefix("0x")?;
    u16::from_str_radix(hex, 16).ok().map(PKey)
}

/// The valid key at `index` of a port's P_Key table (`(index, key)` pairs), or why there is
/// none, naming the partitions the port has.
///
/// # Errors
/// A message when `index` is past the table or its entry is empty.
pub fn pkey_at(table: &[(u32, PKey)], index: u16) -> Result<PKey, String> {
    match table.iter().find(|(i, _)| *i == u32::from(index)) {
        Some((_, key)) if key.is_valid() => Ok(*key),
        found => {
            let valid: Vec<String> = table
                .iter()
                .filter(|(_, key)| key.is_valid())
                .map(|(i, key)| format!("index {i} = {key}"))
                .collect();
            let what = if found.is_some() {
                "is an empty entry"
            } else {
                "is past the end"
            };
            Err(format!(
                "P_Key index {index} {what} of the port's table of {} (its partitions: {})",
                table.len(),
                if valid.is_empty() {
                    "none".to_owned()
                } else {
                    valid.join(", ")
                }
            ))
        }
    }
}

/// The key at `NCCL_IB_PKEY`'s `index` on `device:port`, or why it cannot be used, naming the
/// variable and the port (what `init` and a port's opening refuse).
///
/// # Errors
/// As [`pkey_at`], on the port's table under `sysfs`.
pub fn configured_pkey(
    sysfs: &SysfsRoot,
    device: &str,
    port: u32,
    index: u16,
) -> Result<PKey, String> {
    pkey_at(&sysfs.port_pkeys(device, port), index)
        .map_err(|why| format!("NCCL_IB_PKEY={index} on {device}:{port}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(keys: &[u16]) -> Vec<(u32, PKey)> {
        (0..).zip(keys.iter().map(|k| PKey(*k))).collect()
    }

    #[test]
    fn parses_sysfs_text_and_membership() {
        assert_eq!(parse_pkey("0xffff\n"), Some(PKey(0xffff)));
        assert_eq!(parse_pkey("0x0000"), Some(PKey(0)));
        assert_eq!(parse_pkey("ffff"), None);
        assert_eq!(parse_pkey("0xfffff"), None);
        assert!(PKey(0xffff).is_full_member() && !PKey(0x7fff).is_full_member());
        assert!(!PKey(0x8000).is_valid() && !PKey(0).is_valid() && PKey(0x0001).is_valid());
        assert_eq!(PKey(0x8001).to_string(), "0x8001 (full member)");
        assert_eq!(PKey(0x7fff).to_string(), "0x7fff (limited member)");
    }

    #[test]
    fn an_index_must_name_a_partition_of_the_port() {
        // A ConnectX port in two partitions: the default and 0x8001, then empty entries.
        let cx = table(&[0xffff, 0x8001, 0x0000, 0x8000]);
        assert_eq!(pkey_at(&cx, 0), Ok(PKey(0xffff)));
        assert_eq!(pkey_at(&cx, 1), Ok(PKey(0x8001)));
        assert_eq!(
            pkey_at(&cx, 2).unwrap_err(),
            "P_Key index 2 is an empty entry of the port's table of 4 (its partitions: \
             index 0 = 0xffff (full member), index 1 = 0x8001 (full member))"
        );
        assert!(pkey_at(&cx, 3).unwrap_err().contains("empty entry"));
        // Soft-RoCE: one entry.
        let rxe = table(&[0xffff]);
        assert!(
            pkey_at(&rxe, 1)
                .unwrap_err()
                .starts_with("P_Key index 1 is past the end of the port's table of 1")
        );
        assert!(
            pkey_at(&[], 0)
                .unwrap_err()
                .ends_with("(its partitions: none)")
        );
    }
}
