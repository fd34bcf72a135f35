//! `NCCL_IB_HCA`, with NCCL's syntax and matching rules (nccl-net-abi.md §3.2).
//!
//! `[^][=]name[:port[:rail[:plane]]],...`: a leading `^` excludes the listed entries, a
//! following `=` asks for exact names (otherwise an entry matches every device whose name starts
//! with it, so `mlx5_1` also matches `mlx5_10`), and an omitted or empty port matches any port.

use std::fmt;

/// A parsed `NCCL_IB_HCA` value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilter {
    source: String,
    exclude: bool,
    exact: bool,
    entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    name: String,
    port: Option<u32>,
}

/// Why an `NCCL_IB_HCA` value could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HcaFilterError {
    source: String,
    reason: String,
}

impl fmt::Display for HcaFilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NCCL_IB_HCA='{}' is not valid: {}",
            self.source, self.reason
        )
    }
}

impl std::error::Error for HcaFilterError {}

impl HcaFilter {
    /// Parse a filter value.
    ///
    /// # Errors
    /// An entry without a name or whose name starts with `^` or `=` (a misplaced prefix), or a
    /// port, rail or plane field that is not a number.
    pub fn parse(value: &str) -> Result<Self, HcaFilterError> {
        let fail = |reason: String| HcaFilterError {
            source: value.to_owned(),
            reason,
        };
        let mut rest = value.trim();
        let exclude = rest.starts_with('^');
        if exclude {
            rest = &rest[1..];
        }
        let exact = rest.starts_with('=');
        if exact {
            rest = &rest[1..];
        }
        let mut entries = Vec::new();
        for item in rest.split(',').map(str::trim) {
            let mut fields = item.split(':');
            let name = fields.next().unwrap_or_default().trim();
            if name.is_empty() {
                return Err(fail(format!("entry '{item}' has no device name")));
            }
            // No device name starts so; such an entry is a misplaced prefix ("^ =mlx5_0"), and
            // written back as a filter it would read as one.
            if name.starts_with(['^', '=']) {
                return Err(fail(format!(
                    "entry '{item}' starts with '{}': '^' and '=' go once, in that order, before                      the first entry and without spaces (e.g. ^=mlx5_0)",
                    &name[..1]
                )));
            }
            let port =
                match fields.next() {
                    None | Some("") => None,
                    Some(p) => Some(p.parse::<u32>().map_err(|_| {
                        fail(format!("port '{p}' of entry '{item}' is not a number"))
                    })?),
                };
            // NCCL 2.30 accepts a rail and a plane after the port; they only label devices (v12
            // railId/planeId) and never change which devices match, so they are checked, not kept.
            for extra in fields.by_ref().take(2) {
                if !extra.is_empty() && extra.parse::<u32>().is_err() {
                    return Err(fail(format!(
                        "field '{extra}' of entry '{item}' is not a number"
                    )));
                }
            }
            if fields.next().is_some() {
                return Err(fail(format!(
                    "entry '{item}' has more than name:port:rail:plane"
                )));
            }
            entries.push(Entry {
                name: name.to_owned(),
                port,
            });
        }
        Ok(Self {
            source: value.to_owned(),
            exclude,
            exact,
            entries,
        })
    }

    /// Whether port `port` of device `device` passes the filter.
    pub fn allows(&self, device: &str, port: u32) -> bool {
        let listed = self.entries.iter().any(|e| {
            let name_matches = if self.exact {
                e.name == device
            } else {
                device.starts_with(e.name.as_str())
            };
            name_matches && e.port.is_none_or(|p| p == port)
        });
        listed != self.exclude
    }

    /// The same filter in canonical form (`^=name:port,...`, no spaces or rail/plane labels):
    /// parsing it again gives a filter that allows exactly the same ports.
    pub fn canonical(&self) -> String {
        let entries: Vec<String> = self
            .entries
            .iter()
            .map(|e| match e.port {
                Some(p) => format!("{}:{p}", e.name),
                None => e.name.clone(),
            })
            .collect();
        format!(
            "{}{}{}",
            if self.exclude { "^" } else { "" },
            if self.exact { "=" } else { "" },
            entries.join(",")
        )
    }

    /// The value as the user wrote it, for log lines.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allows(filter: &str, device: &str, port: u32) -> bool {
        HcaFilter::parse(filter).unwrap().allows(device, port)
    }

    #[test]
    fn include_list_matches_by_prefix() {
        assert!(allows("mlx5_1", "mlx5_1", 1));
        assert!(allows("mlx5_1", "mlx5_10", 1));
        assert!(!allows("mlx5_1", "mlx5_2", 1));
        assert!(allows("rxe", "rxe0", 1));
        assert!(allows("mlx5_0,rxe1", "rxe1", 1));
    }

    #[test]
    fn exact_names_do_not_match_longer_names() {
        assert!(allows("=mlx5_1", "mlx5_1", 1));
        assert!(!allows("=mlx5_1", "mlx5_10", 1));
        assert!(!allows("=rxe", "rxe0", 1));
    }

    #[test]
    fn exclusion_keeps_everything_not_listed() {
        assert!(!allows("^rxe0", "rxe0", 1));
        assert!(allows("^rxe0", "rxe1", 1));
        assert!(!allows("^mlx5_1", "mlx5_10", 1));
        assert!(allows("^=mlx5_1", "mlx5_10", 1));
        assert!(!allows("^=mlx5_3:1", "mlx5_3", 1));
        assert!(allows("^=mlx5_3:1", "mlx5_3", 2));
    }

    #[test]
    fn port_restricts_and_empty_port_means_any() {
        assert!(allows("mlx5_0:1", "mlx5_0", 1));
        assert!(!allows("mlx5_0:1", "mlx5_0", 2));
        assert!(allows("mlx5_0:", "mlx5_0", 2));
        assert!(allows("mlx5_0:1,mlx5_1:1", "mlx5_1", 1));
    }

    #[test]
    fn rail_and_plane_fields_are_accepted() {
        assert!(allows("mlx5_0:1:0:1", "mlx5_0", 1));
        assert!(allows("mlx5_0::3", "mlx5_0", 2));
    }

    #[test]
    fn malformed_values_are_errors_that_quote_the_value() {
        for bad in [
            "",
            ",",
            "^",
            "mlx5_0:x",
            ":1",
            "mlx5_0:1:r",
            "mlx5_0:1:0:1:9",
            "^ =",
            "^ =mlx5_0",
            "=^mlx5_0",
            "mlx5_0,^mlx5_1",
        ] {
            let err = HcaFilter::parse(bad).unwrap_err();
            assert!(
                err.to_string().contains(&format!("NCCL_IB_HCA='{bad}'")),
                "{err}"
            );
        }
    }
}
