//! The one call into NCCL's variadic logger.

use std::ffi::{CString, c_int, c_ulong};

use parking_lot::RwLock;

use super::types::{
    NCCL_INIT, NCCL_LOG_INFO, NCCL_LOG_TRACE, NCCL_LOG_WARN, NCCL_NET, ncclDebugLogger_t,
};

static LOGGER: RwLock<ncclDebugLogger_t> = RwLock::new(None);

/// NCCL's severities that the plugin uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Severity {
    Warn,
    Info,
    Trace,
}

/// One formatted log line.
#[derive(Debug)]
pub(crate) struct Record<'a> {
    pub(crate) level: Severity,
    /// Also tag the line with NCCL's INIT subsystem.
    pub(crate) init: bool,
    pub(crate) file: &'a str,
    pub(crate) line: u32,
    pub(crate) message: &'a str,
}

/// Remember the logger NCCL passed to `init` (NULL keeps logging on stderr).
pub(crate) fn set(logger: ncclDebugLogger_t) {
    *LOGGER.write() = logger;
}

/// Deliver a line to NCCL's logger. `false` when no logger is installed.
pub(crate) fn emit(record: &Record<'_>) -> bool {
    let Some(log) = *LOGGER.read() else {
        return false;
    };
    let level = match record.level {
        Severity::Warn => NCCL_LOG_WARN,
        Severity::Info => NCCL_LOG_INFO,
        Severity::Trace => NCCL_LOG_TRACE,
    };
    let flags: c_ulong = if record.init {
        NCCL_INIT | NCCL_NET
    } else {
        NCCL_NET
    };
    let file = CString::new(record.file).unwrap_or_default();
    let message = CString::new(record.message.replace('\0', "\\0")).unwrap_or_default();
    let line = c_int::try_from(record.line).unwrap_or(0);
    // SAFETY: NCCL's logger is a printf-style function; the format is the literal "%s" and its one
    // argument is a NUL-terminated string that outlives the call, so no user text is ever
    // interpreted as a format.
    unsafe {
        log(
            level,
            flags,
            file.as_ptr(),
            line,
            c"%s".as_ptr(),
            message.as_ptr(),
        )
    };
    true
}
