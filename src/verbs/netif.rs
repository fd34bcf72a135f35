//! IP addresses of network interfaces (`getifaddrs`), for the out-of-band TCP exchange, and the
//! one socket call the standard library does not offer (a listen backlog of our choosing).

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;

use crate::core::error::{Error, Result};

/// One address of one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// Interface name (`eth0`, `lo`).
    pub name: String,
    /// Its address.
    pub addr: IpAddr,
    /// Leading bits of its netmask.
    pub prefix_len: u8,
    /// `IFF_RUNNING`: up and with a carrier (NCCL considers only these).
    pub running: bool,
}

/// Every IPv4 and IPv6 address of every interface that is up, in `getifaddrs` order.
///
/// # Errors
/// `System` when `getifaddrs` fails.
pub fn interface_addrs() -> Result<Vec<InterfaceAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::system(
            "getifaddrs failed",
            io::Error::last_os_error(),
        ));
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        if !up || ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: non-NULL sockaddr owned by the list.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: the family says this is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says this is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: non-NULL NUL-terminated name owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: a netmask, when present, is a sockaddr of the address's family.
        let prefix_len = unsafe { netmask_bits(ifa.ifa_netmask, family) };
        let running = ifa.ifa_flags & libc::IFF_RUNNING as u32 != 0;
        out.push(InterfaceAddr {
            name,
            addr,
            prefix_len,
            running,
        });
    }
    // SAFETY: the list returned by getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The leading one bits of `mask` (NULL: a host route, every bit).
///
/// # Safety
/// `mask` is NULL or points at a sockaddr of `family` (`sockaddr_in` or `sockaddr_in6`).
unsafe fn netmask_bits(mask: *const libc::sockaddr, family: i32) -> u8 {
    if mask.is_null() {
        return if family == libc::AF_INET { 32 } else { 128 };
    }
    let ones = if family == libc::AF_INET {
        // SAFETY: this function's contract.
        let sin = unsafe { &*mask.cast::<libc::sockaddr_in>() };
        u32::from_be(sin.sin_addr.s_addr).leading_ones()
    } else {
        // SAFETY: this function's contract.
        let sin6 = unsafe { &*mask.cast::<libc::sockaddr_in6>() };
        u128::from_be_bytes(sin6.sin6_addr.s6_addr).leading_ones()
    };
    u8::try_from(ones).unwrap_or(128)
}

/// Ask for a backlog of `backlog` connections on `listener` (the kernel caps it at
/// `net.core.somaxconn`; the standard library asks for 128). Calling `listen` again on a
/// listening socket only changes its backlog.
///
/// # Errors
/// What `listen(2)` says.
pub fn set_listen_backlog(listener: &TcpListener, backlog: i32) -> io::Result<()> {
    // SAFETY: `listen` on a socket `listener` owns and keeps open; no pointers.
    if unsafe { libc::listen(listener.as_raw_fd(), backlog) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the peer of `stream` has closed its end (its FIN arrived, or the connection
/// failed), asked without reading or waiting: data still unread does not hide it.
pub fn peer_hung_up(stream: &TcpStream) -> bool {
    let mut fd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one pollfd on our stack for a socket `stream` keeps open; no wait.
    let n = unsafe { libc::poll(&raw mut fd, 1, 0) };
    n > 0 && fd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    use super::peer_hung_up;

    #[test]
    fn a_closed_peer_is_seen_without_reading_even_behind_unread_data() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (ours, _) = listener.accept().unwrap();
        assert!(!peer_hung_up(&ours), "open, nothing sent");
        peer.write_all(b"goodbye").unwrap();
        assert!(!peer_hung_up(&ours), "open, data waiting");
        drop(peer);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !peer_hung_up(&ours) {
            assert!(std::time::Instant::now() < deadline, "the FIN never showed");
            std::thread::yield_now();
        }
    }
}
