//! One listening socket per device, shared by all its listen comms.
//!
//! NCCL calls `listen` once per receive connection (and keeps up to 128 connects in a round), so
//! a socket per listen comm is a descriptor per connection being set up. Instead every listen
//! comm of a device hands out the address of the device's one *door* with a nonce of its own,
//! and each connector's hello, which echoes the handle's nonce, is routed to the listen comm
//! that nonce names. The connector's side is unchanged: a peer of any version connects to the
//! handle's address and sends the same hello, so mixed versions work either way.
//!
//! Any accept of any of the device's listen comms moves the door along: it takes what waits in
//! the kernel's backlog and reads hellos only from the connections epoll reports readable, so an
//! accept call costs what arrived, not how many listen comms or connections exist. A connection
//! that presents no hello within [`HELLO_TIMEOUT`], or a hello for no open listen comm of the
//! device, or noise, is dropped with one INFO line. The door closes with the device's last
//! listen comm.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::peer_link::accept_link;
use super::wire_io::{HandshakeStream, socket_error};
use crate::core::error::{Error, Result};
use crate::core::links::LinkHello;
use crate::core::wire::Hello;
use crate::verbs::{Epoll, set_listen_backlog};

/// How long a new TCP connection may take to present its hello before it is dropped. A real peer
/// sends it right after connecting.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections without a hello yet kept at once per device; beyond that the oldest is dropped,
/// so a flood of half-open intruders cannot lock the real peers out. Real peers send their hello
/// at once, so this bounds intruders, not connects in flight (NCCL keeps 128 per round and peer).
const MAX_UNPROVEN: usize = 1024;

/// The backlog asked of `listen(2)` (the kernel caps it at `net.core.somaxconn`, 4096 by
/// default).
const BACKLOG: i32 = 4096;

/// The epoll key of the listening socket; connections get keys from 1 up.
const LISTENER_KEY: u64 = 0;

/// A connector whose hello named one of the door's listen comms.
#[derive(Debug)]
pub(super) struct Proven {
    pub(super) stream: HandshakeStream,
    pub(super) hello: Hello,
}

/// A device's listening socket.
#[derive(Debug)]
pub(super) struct Door {
    listener: TcpListener,
    addr: SocketAddr,
    epoll: Epoll,
    hall: Mutex<Hall>,
}

#[derive(Debug, Default)]
struct Hall {
    next_key: u64,
    /// Connections that have not presented a hello yet, by epoll key.
    unproven: HashMap<u64, HandshakeStream>,
    /// Keys in arrival order, which is deadline order (one timeout for all); keys of
    /// connections that left `unproven` since are skipped when they come up.
    arrivals: VecDeque<u64>,
    /// Per open listen comm (by nonce), the connectors that proved they hold its handle.
    proven: HashMap<u64, VecDeque<Proven>>,
    ready: Vec<u64>,
}

impl Door {
    /// Listen on `ip`, any port.
    ///
    /// # Errors
    /// `System` when the socket cannot be bound or watched.
    pub(super) fn open(ip: IpAddr) -> Result<Self> {
        let bind = SocketAddr::new(ip, 0);
        let listener = TcpListener::bind(bind)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| socket_error(format!("cannot listen on {bind}"), e))?;
        // Every connect of a round, from every peer process, arrives at this one socket.
        if let Err(e) = set_listen_backlog(&listener, BACKLOG) {
            tracing::info!(
                "NET/{}: cannot widen the listen backlog of {bind} to {BACKLOG} ({e}); connects \
                 beyond the default backlog are retried by TCP",
                crate::plugin::PLUGIN_NAME
            );
        }
        let addr = listener
            .local_addr()
            .map_err(|e| Error::system("getsockname on the listener", e))?;
        let epoll = Epoll::new()?;
        epoll.add(listener.as_raw_fd(), LISTENER_KEY)?;
        Ok(Self {
            listener,
            addr,
            epoll,
            hall: Mutex::new(Hall {
                next_key: LISTENER_KEY + 1,
                ..Hall::default()
            }),
        })
    }

    /// The address every handle of this door carries.
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Route hellos naming `nonce` to the listen comm that holds it, from now until
    /// [`Door::forget`].
    pub(super) fn expect(&self, nonce: u64) {
        self.hall.lock().proven.entry(nonce).or_default();
    }

    /// The listen comm holding `nonce` is closed: drop the connectors still waiting for it.
    pub(super) fn forget(&self, nonce: u64) {
        let left = self.hall.lock().proven.remove(&nonce).unwrap_or_default();
        for p in left {
            self.dropped(&format!(
                "peer {} connected to a listen comm that was closed before accepting it",
                p.stream.peer
            ));
        }
    }

    /// Move the door along, then hand over the connectors proven for `nonce` since the last
    /// call.
    ///
    /// # Errors
    /// `System` when the listening socket or its epoll set fails.
    pub(super) fn arrivals_for(&self, nonce: u64, now: Instant) -> Result<VecDeque<Proven>> {
        let mut hall = self.hall.lock();
        self.route(&mut hall, now)?;
        Ok(hall
            .proven
            .get_mut(&nonce)
            .map(std::mem::take)
            .unwrap_or_default())
    }

    fn route(&self, hall: &mut Hall, now: Instant) -> Result<()> {
        let mut ready = std::mem::take(&mut hall.ready);
        loop {
            self.epoll.wait(&mut ready, 0)?;
            for &key in &ready {
                if key == LISTENER_KEY {
                    self.take_backlog(hall, now)?;
                } else {
                    self.read_hello(hall, key);
                }
            }
            // Fewer than a full batch: nothing else is ready.
            if ready.len() < Epoll::BATCH {
                break;
            }
        }
        hall.ready = ready;
        self.expire(hall, now);
        Ok(())
    }

    /// Move every connection waiting in the kernel's backlog into `unproven`, reading the hello
    /// of each at once (a peer sends it right after connecting).
    fn take_backlog(&self, hall: &mut Hall, now: Instant) -> Result<()> {
        loop {
            match self.listener.accept() {
                Ok((tcp, peer)) => {
                    let stream = match HandshakeStream::new(tcp, peer, now + HELLO_TIMEOUT) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::info!("NET/{}: {e}", crate::plugin::PLUGIN_NAME);
                            continue;
                        }
                    };
                    if hall.unproven.len() >= MAX_UNPROVEN {
                        self.evict_oldest(hall);
                    }
                    let key = hall.next_key;
                    hall.next_key += 1;
                    if let Err(e) = self.epoll.add(stream.raw_fd(), key) {
                        self.dropped(&format!("peer {peer}: {e}"));
                        continue;
                    }
                    hall.unproven.insert(key, stream);
                    hall.arrivals.push_back(key);
                    self.read_hello(hall, key);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // The connection died in the backlog (reset before we took it): not our problem.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted => {}
                Err(e) => return Err(socket_error(format!("accept on {}", self.addr), e)),
            }
        }
    }

    /// Read what connection `key` sent; a complete hello goes to its listen comm's queue.
    fn read_hello(&self, hall: &mut Hall, key: u64) {
        let Some(stream) = hall.unproven.get_mut(&key) else {
            return;
        };
        let link = match stream.peek(4) {
            Ok(None) => return,
            Ok(Some(first)) => LinkHello::begins(first),
            Err(e) => {
                let stream = self.leave(hall, key);
                self.dropped(&format!("peer {} {e}", stream.peer));
                return;
            }
        };
        if link {
            self.read_link_hello(hall, key);
            return;
        }
        let Some(stream) = hall.unproven.get_mut(&key) else {
            return;
        };
        let outcome = stream.receive(Hello::LEN).and_then(|bytes| {
            bytes
                .map(|b| Hello::parse(&b).and_then(|h| h.check_connector().map(|()| h)))
                .transpose()
        });
        let hello = match outcome {
            Ok(None) => return,
            Ok(Some(hello)) => hello,
            Err(e) => {
                let stream = self.leave(hall, key);
                self.dropped(&format!("peer {} {e}", stream.peer));
                return;
            }
        };
        let stream = self.leave(hall, key);
        match hall.proven.get_mut(&hello.listen_nonce) {
            Some(queue) => queue.push_back(Proven { stream, hello }),
            None => self.dropped(&format!(
                "peer {} presented a handle for another listener (no open listen comm of this \
                 device holds its nonce)",
                stream.peer
            )),
        }
    }

    /// Read the hello of a link dialed to this door (see `core::links`): one that holds the
    /// handle of an open listen comm of the door's is listed and acknowledged.
    fn read_link_hello(&self, hall: &mut Hall, key: u64) {
        let Some(stream) = hall.unproven.get_mut(&key) else {
            return;
        };
        let hello = match stream.receive(LinkHello::LEN) {
            Ok(None) => return,
            Ok(Some(bytes)) => LinkHello::parse(&bytes),
            Err(e) => Err(e),
        };
        let stream = self.leave(hall, key);
        let peer = stream.peer;
        match hello {
            Ok(hello) if hall.proven.contains_key(&hello.listen_nonce) => {
                if let Err(e) = accept_link(stream, hello) {
                    self.dropped(&format!("peer {peer}'s link: {e}"));
                }
            }
            Ok(_) => self.dropped(&format!(
                "peer {peer} dialed a link with a handle for another listener (no open listen \
                 comm of this device holds its nonce)"
            )),
            Err(e) => self.dropped(&format!("peer {peer} {e}")),
        }
    }

    /// Take connection `key` out of `unproven` and the epoll set.
    fn leave(&self, hall: &mut Hall, key: u64) -> HandshakeStream {
        let stream = hall
            .unproven
            .remove(&key)
            .expect("the caller found the key in unproven");
        self.epoll.remove(stream.raw_fd());
        stream
    }

    /// Drop the connections whose hello deadline passed (the oldest arrivals).
    fn expire(&self, hall: &mut Hall, now: Instant) {
        while let Some(&key) = hall.arrivals.front() {
            match hall.unproven.get(&key) {
                None => {
                    hall.arrivals.pop_front();
                }
                Some(s) if s.deadline < now => {
                    hall.arrivals.pop_front();
                    let stream = self.leave(hall, key);
                    self.dropped(&format!(
                        "peer {} sent no hello within {} s",
                        stream.peer,
                        HELLO_TIMEOUT.as_secs()
                    ));
                }
                Some(_) => return,
            }
        }
    }

    fn evict_oldest(&self, hall: &mut Hall) {
        while let Some(key) = hall.arrivals.pop_front() {
            if hall.unproven.contains_key(&key) {
                let stream = self.leave(hall, key);
                self.dropped(&format!(
                    "peer {} had not sent its hello while {MAX_UNPROVEN} connections were \
                     pending",
                    stream.peer
                ));
                return;
            }
        }
    }

    fn dropped(&self, why: &str) {
        tracing::info!(
            "NET/{}: listener {} dropped a connection: {why}",
            crate::plugin::PLUGIN_NAME,
            self.addr
        );
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::{Ipv4Addr, TcpStream};

    use super::*;
    use crate::core::wire::{DATA_PATH_REVISION, Endpoint, Role};

    fn hello(role: Role, listen_nonce: u64) -> [u8; Hello::LEN] {
        Hello {
            role,
            listen_nonce,
            connect_nonce: listen_nonce + 100,
            qpns: vec![0x11],
            members: vec![Endpoint {
                lid: 0,
                port: 1,
                mtu: 3,
                link_layer: 2,
                roce_version: 2,
                gid: [0; 16],
                gid_index: 1,
                ring_rkey: 1,
                device: "rxe0".into(),
            }],
            ring_addr: 0x1000,
            traffic_class: 0,
            service_level: 0,
            split_data: false,
            eager_bytes: 0,
            revision: DATA_PATH_REVISION,
            quiet: false,
            failover: false,
            failover_quiet: false,
            bounce_slots: 0,
            shares_links: false,
        }
        .emit()
    }

    fn door() -> Door {
        Door::open(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap()
    }

    fn connect(door: &Door, bytes: &[u8]) -> TcpStream {
        let mut s = TcpStream::connect(door.addr()).unwrap();
        s.write_all(bytes).unwrap();
        s
    }

    /// Route until `nonce` has `n` connectors, gathering them.
    fn wait_for(door: &Door, nonce: u64, n: usize) -> Vec<Proven> {
        let until = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < n {
            got.extend(door.arrivals_for(nonce, Instant::now()).unwrap());
            assert!(Instant::now() < until, "{} of {n} for {nonce}", got.len());
        }
        got
    }

    /// True once the door closed `s` (a read sees the end of the stream).
    fn closed_by_the_door(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        matches!(s.read(&mut [0u8; 1]), Ok(0) | Err(_))
    }

    #[test]
    fn each_hello_reaches_the_listen_comm_its_nonce_names() {
        let door = door();
        door.expect(1);
        door.expect(2);
        let a = connect(&door, &hello(Role::Connect, 2));
        let b = connect(&door, &hello(Role::Connect, 1));
        let c = connect(&door, &hello(Role::Connect, 2));
        let for_two = wait_for(&door, 2, 2);
        let for_one = wait_for(&door, 1, 1);
        let peers = |p: &[Proven]| p.iter().map(|p| p.stream.peer).collect::<Vec<_>>();
        let mut two = peers(&for_two);
        two.sort_unstable();
        let mut expected = vec![a.local_addr().unwrap(), c.local_addr().unwrap()];
        expected.sort_unstable();
        assert_eq!(two, expected);
        assert_eq!(peers(&for_one), [b.local_addr().unwrap()]);
        assert!(for_two.iter().all(|p| p.hello.listen_nonce == 2));
        assert!(door.arrivals_for(1, Instant::now()).unwrap().is_empty());
    }

    #[test]
    fn strangers_are_dropped_and_the_real_peer_still_gets_through() {
        let door = door();
        door.expect(7);
        let mut other_listener = connect(&door, &hello(Role::Connect, 8));
        let mut reply = connect(&door, &hello(Role::Accept, 7));
        let mut noise = connect(&door, &[0xa5; 2 * Hello::LEN]);
        let mut silent = connect(&door, &[]);
        let real = connect(&door, &hello(Role::Connect, 7));
        let got = wait_for(&door, 7, 1);
        assert_eq!(got[0].stream.peer, real.local_addr().unwrap());
        for s in [&mut other_listener, &mut reply, &mut noise] {
            assert!(closed_by_the_door(s), "{:?}", s.local_addr());
        }
        // The silent one stays until its hello deadline has passed.
        assert_eq!(door.hall.lock().unproven.len(), 1);
        door.arrivals_for(7, Instant::now() + HELLO_TIMEOUT + Duration::from_secs(1))
            .unwrap();
        assert!(closed_by_the_door(&mut silent));
        assert!(door.hall.lock().unproven.is_empty());
    }

    #[test]
    fn connectors_of_a_closed_listen_comm_are_dropped() {
        let door = door();
        door.expect(3);
        door.expect(4);
        let mut early = connect(&door, &hello(Role::Connect, 3));
        // Routed by the other listen comm's accept, then its own comm closes.
        let until = Instant::now() + Duration::from_secs(10);
        while door.hall.lock().proven[&3].is_empty() {
            assert!(door.arrivals_for(4, Instant::now()).unwrap().is_empty());
            assert!(Instant::now() < until, "the hello for 3 was never routed");
        }
        door.forget(3);
        assert!(closed_by_the_door(&mut early));
        let mut late = connect(&door, &hello(Role::Connect, 3));
        let until = Instant::now() + Duration::from_secs(10);
        while !door.hall.lock().unproven.is_empty() || door.hall.lock().next_key < 3 {
            door.arrivals_for(4, Instant::now()).unwrap();
            assert!(Instant::now() < until);
        }
        assert!(closed_by_the_door(&mut late));
    }
}
