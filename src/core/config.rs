//! Every environment variable the plugin reads, declared once and parsed once.
//!
//! `plugin::init` hands the process environment to [`Config::from_vars`]; the result is passed
//! down immutable. Nothing else reads the environment, so tests build a `Config` from a list of
//! pairs instead of mutating the process environment. NCCL copies `/etc/nccl.conf` entries into
//! the environment before it calls `init`, so those are seen too.

/// One knob: its name, its default, and what it means, as the README documents it.
#[derive(Debug)]
pub struct Knob {
    /// Environment variable name.
    pub name: &'static str,
    /// Value used when the variable is unset.
    pub default: &'static str,
    /// One-line meaning.
    pub meaning: &'static str,
}

/// Every variable the plugin honours. `tests/readme.rs` checks that the README lists each one.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: "NCCL_IB_HCA",
        default: "(unset: every active port)",
        meaning: "device filter with NCCL's syntax: `[^][=]name[:port],...`",
    },
    Knob {
        name: "NCCL_DEBUG",
        default: "(unset: warnings only)",
        meaning: "NCCL's log level; also sets how much the plugin formats (WARN, INFO, TRACE)",
    },
    Knob {
        name: "NCCL_NET_RS_LOG",
        default: "(unset: derived from NCCL_DEBUG)",
        meaning: "plugin log filter in tracing's syntax, e.g. `nccl_net=debug`",
    },
];

/// The parsed configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Config {
    /// Raw `NCCL_IB_HCA`, parsed by `topology::HcaFilter`; `None` when unset or empty.
    pub ib_hca: Option<String>,
    /// `tracing` filter directive for the plugin's own log events.
    pub log_directive: String,
}

impl Config {
    /// Build the configuration from `(name, value)` pairs (the caller passes the process environment).
    pub fn from_vars<I, K, V>(vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut ib_hca = None;
        let mut nccl_debug = None;
        let mut own_filter = None;
        for (name, value) in vars {
            let value = value.as_ref().trim();
            match name.as_ref() {
                "NCCL_IB_HCA" if !value.is_empty() => ib_hca = Some(value.to_owned()),
                "NCCL_DEBUG" => nccl_debug = Some(value.to_ascii_uppercase()),
                "NCCL_NET_RS_LOG" if !value.is_empty() => own_filter = Some(value.to_owned()),
                _ => {}
            }
        }
        let log_directive = own_filter.unwrap_or_else(|| {
            // NCCL filters by level after we format; matching its level avoids formatting lines
            // it would drop.
            let level = match nccl_debug.as_deref() {
                Some("TRACE") => "trace",
                Some("INFO") => "info",
                _ => "warn",
            };
            format!("nccl_net={level}")
        });
        Self {
            ib_hca,
            log_directive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_log_warnings_only() {
        let c = Config::from_vars(Vec::<(String, String)>::new());
        assert_eq!(
            c,
            Config {
                ib_hca: None,
                log_directive: "nccl_net=warn".into()
            }
        );
    }

    #[test]
    fn nccl_debug_sets_the_level_case_insensitively() {
        let c = Config::from_vars([("NCCL_DEBUG", "info")]);
        assert_eq!(c.log_directive, "nccl_net=info");
        let c = Config::from_vars([("NCCL_DEBUG", "TRACE")]);
        assert_eq!(c.log_directive, "nccl_net=trace");
    }

    #[test]
    fn own_filter_wins_over_nccl_debug() {
        let c = Config::from_vars([
            ("NCCL_DEBUG", "INFO"),
            ("NCCL_NET_RS_LOG", "nccl_net=debug"),
        ]);
        assert_eq!(c.log_directive, "nccl_net=debug");
    }

    #[test]
    fn empty_hca_is_unset() {
        assert_eq!(Config::from_vars([("NCCL_IB_HCA", "  ")]).ib_hca, None);
        assert_eq!(
            Config::from_vars([("NCCL_IB_HCA", "^rxe0")])
                .ib_hca
                .as_deref(),
            Some("^rxe0")
        );
    }
}
