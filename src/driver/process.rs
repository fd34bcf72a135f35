//! What a program driving a plugin reads and sets of its own process, as NCCL's does: the
//! open-file limit NCCL raises at start, and the CPU time spent (the benchmark's and the VM
//! tests' idle and call costs).
#![allow(unsafe_code)] // getrlimit, setrlimit and getrusage on local structs

/// Raise the open-file soft limit to the hard one, as NCCL does when it starts
/// (`ncclOsSetFilesLimit`): a plugin keeps descriptors per comm, and a large job opens
/// thousands of comms.
///
/// # Errors
/// The OS error of `getrlimit` or `setrlimit`; the limit is then as it was.
pub fn raise_open_file_limit() -> std::io::Result<()> {
    let (_, hard) = open_file_limit()?;
    let limit = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: a valid pointer to a local rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The open-file limit, soft and hard (`RLIM_INFINITY` for none). Needs no descriptor, so it
/// can say what the limit is when the process has reached it.
///
/// # Errors
/// The OS error of `getrlimit`.
pub fn open_file_limit() -> std::io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer to a local rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((limit.rlim_cur, limit.rlim_max))
}

/// CPU seconds (user + system) this process has used, all its threads.
pub fn cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: a valid out-pointer; RUSAGE_SELF always succeeds.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) };
    // SAFETY: zero-initialised plain C data, filled by getrusage.
    let ru = unsafe { ru.assume_init() };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}
