//! One error type for the whole plugin, classified by [`Kind`].
//!
//! The C boundary (`abi::to_nccl`) is the only place a `Kind` becomes an `ncclResult_t`, and the
//! only place an error is logged: inner layers add context and return.

use std::fmt;
use std::io;

/// What kind of failure happened; decides the `ncclResult_t` NCCL sees.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A call into the kernel or a system library failed (verbs errno, socket, sysfs read).
    System,
    /// The peer or the network failed (reset, error completion, handshake timeout).
    Remote,
    /// NCCL called us in a way the ABI does not allow (NULL, bad index, stale handle), or a panic.
    Misuse,
    /// The user's configuration cannot work (unparsable knob, nothing matches a filter).
    Config,
    /// A CUDA driver call failed.
    Cuda,
}

/// An error with its kind, a message saying what failed, and the OS error behind it if any.
/// Boxed: a `Result<()>` is then one word, returned in a register, on every data-path call that
/// succeeds (an unboxed error made every `Result` a 40-byte value written through memory).
#[derive(Debug)]
pub struct Error(Box<Inner>);

#[derive(Debug)]
struct Inner {
    kind: Kind,
    what: String,
    source: Option<io::Error>,
}

impl Error {
    /// An error of `kind` described by `what` (lowercase, no trailing period).
    #[cold]
    pub fn new(kind: Kind, what: impl Into<String>) -> Self {
        Self(Box::new(Inner {
            kind,
            what: what.into(),
            source: None,
        }))
    }

    /// A failed system call; keeps the errno.
    #[cold]
    pub fn system(what: impl Into<String>, source: io::Error) -> Self {
        Self(Box::new(Inner {
            kind: Kind::System,
            what: what.into(),
            source: Some(source),
        }))
    }

    /// NCCL broke the calling contract.
    pub fn misuse(what: impl Into<String>) -> Self {
        Self::new(Kind::Misuse, what)
    }

    /// The configuration cannot work.
    pub fn config(what: impl Into<String>) -> Self {
        Self::new(Kind::Config, what)
    }

    /// The classification used to pick the `ncclResult_t`.
    pub fn kind(&self) -> Kind {
        self.0.kind
    }

    /// The OS error behind this error, if there is one.
    pub fn os_error(&self) -> Option<&io::Error> {
        self.0.source.as_ref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.source {
            Some(source) => write!(f, "{}: {source}", self.0.what),
            None => f.write_str(&self.0.what),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source.as_ref().map(|e| e as _)
    }
}

/// Result with the plugin's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_appends_the_os_error() {
        let e = Error::system(
            "ibv_get_device_list failed",
            io::Error::from_raw_os_error(38),
        );
        assert_eq!(e.kind(), Kind::System);
        assert!(
            e.to_string().starts_with("ibv_get_device_list failed: "),
            "{e}"
        );
        assert_eq!(e.os_error().and_then(io::Error::raw_os_error), Some(38));
    }

    #[test]
    fn display_without_source_is_the_message() {
        assert_eq!(Error::misuse("NULL ndev").to_string(), "NULL ndev");
    }
}
