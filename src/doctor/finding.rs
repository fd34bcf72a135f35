//! One finding: a severity, a stable check id, what it is about, what was seen, what to do, and
//! the raw evidence behind it.

use std::fmt;

/// How bad a finding is. Ordered best to worst for sorting; [`Severity::rank`] gives the
/// report order (worst first).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Severity {
    /// Checked and fine.
    Pass,
    /// Worth knowing, nothing to fix.
    Info,
    /// Works, but slower or more fragile than it should be.
    Warn,
    /// NCCL will fail, fall back to sockets, or run far below line rate.
    Fail,
    /// Not applicable here (no GPU, a software device, a check that depends on a failed one).
    Skip,
    /// Could not be measured (needs root, a file is missing); never counted as a pass.
    Unknown,
}

impl Severity {
    /// Every severity, worst first: the report order.
    pub const WORST_FIRST: [Self; 6] = [
        Self::Fail,
        Self::Warn,
        Self::Unknown,
        Self::Skip,
        Self::Info,
        Self::Pass,
    ];

    /// Position in [`Self::WORST_FIRST`].
    pub fn rank(self) -> usize {
        Self::WORST_FIRST
            .iter()
            .position(|&s| s == self)
            .unwrap_or(0)
    }

    /// The upper-case name printed and written to JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Info => "INFO",
            Self::Warn => "WARN",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
            Self::Unknown => "UNKNOWN",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A raw value and where it was read: a path under the root, or a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// `/sys/class/infiniband/rxe0/ports/1/state`, `ibv_query_port(rxe0, 1)`, `NCCL_IB_HCA`.
    pub source: String,
    /// What it said, unparsed.
    pub value: String,
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// Stable check id (`port.state`).
    pub check: &'static str,
    /// What it is about: `rxe0:1`, `process`, `node`, `rxe1 <-> rxe2`.
    pub entity: String,
    /// What was seen.
    pub what: String,
    /// What to do; `None` when nothing needs doing.
    pub fix: Option<String>,
    /// The raw values behind it.
    pub evidence: Vec<Evidence>,
    /// The check whose failure made this one impossible, for a SKIP.
    pub depends_on: Option<&'static str>,
}

impl Finding {
    /// A finding without fix or evidence yet.
    pub fn new(
        severity: Severity,
        check: &'static str,
        entity: impl Into<String>,
        what: impl Into<String>,
    ) -> Self {
        Self {
            severity,
            check,
            entity: entity.into(),
            what: what.into(),
            fix: None,
            evidence: Vec::new(),
            depends_on: None,
        }
    }

    /// With what to do.
    #[must_use]
    pub fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }

    /// With one more piece of evidence.
    #[must_use]
    pub fn evidence(mut self, source: impl Into<String>, value: impl Into<String>) -> Self {
        self.evidence.push(Evidence {
            source: source.into(),
            value: value.into(),
        });
        self
    }

    /// A SKIP because `check` failed.
    #[must_use]
    pub fn depends_on(mut self, check: &'static str) -> Self {
        self.depends_on = Some(check);
        self
    }

    /// `SEVERITY check-id entity: what; fix: ...`: the report line.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{:<7} {:<18} {}: {}",
            self.severity.name(),
            self.check,
            self.entity,
            self.what
        );
        if let Some(fix) = &self.fix {
            line.push_str("; fix: ");
            line.push_str(fix);
        }
        line
    }
}

/// Sort worst first, keeping the check order within one severity.
pub fn worst_first(findings: &mut [Finding]) {
    findings.sort_by_key(|f| f.severity.rank());
}
