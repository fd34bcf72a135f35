//! Links over loopback TCP, both ends in this process (the table keeps dialed and accepted
//! links apart), with the real door and watcher thread.

use std::net::{Ipv4Addr, Shutdown};

use super::*;
use crate::transport::door::Door;

fn eventually(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A door on loopback address 127.0.0.`host` (each test its own: links are listed by peer
/// process and host, and the tests run at once in one process) with one open listen comm, and
/// that listen comm's handle.
fn door(host: u8) -> (Door, ListenHandle) {
    let door = Door::open(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))).unwrap();
    let nonce = random_u64();
    door.expect(nonce);
    let handle = ListenHandle {
        addr: door.addr(),
        nonce,
        members: 1,
        process: process_id(),
    };
    (door, handle)
}

/// The dialer's claim of `channel` on the link to `handle`'s listener, moving the door along
/// while the link waits for its acknowledgement.
fn dialed_claim(door: &Door, handle: &ListenHandle, channel: u64) -> LinkTo {
    let until = Instant::now() + Duration::from_secs(10);
    let mut wait = None;
    loop {
        match link_to(handle, channel, wait.take()) {
            LinkTo::Waiting(w) => {
                wait = Some(w);
                door.arrivals_for(handle.nonce, Instant::now()).unwrap();
            }
            done => return done,
        }
        assert!(Instant::now() < until, "the link was never acknowledged");
    }
}

/// Both ends of comm `channel`, joined to the link between the dialer and the door.
fn joined(door: &Door, handle: &ListenHandle, channel: u64) -> (Watched, Watched) {
    let LinkTo::Claimed(mut dialer) = dialed_claim(door, handle, channel) else {
        panic!("no link for channel {channel}");
    };
    let proposal = Proposal {
        process: process_id(),
        link: dialer.link_number(),
    };
    let acceptor = claim_accepted(
        &proposal,
        dialer_ip(&dialer.link.as_ref().unwrap().conn),
        channel,
    )
    .expect("the door listed the link before acknowledging it");
    dialer.agree();
    (Watched::joined(dialer), Watched::joined(acceptor))
}

/// The address the dialer's end of `conn` comes from (what the acceptor checks).
fn dialer_ip(conn: &Connection) -> IpAddr {
    conn.stream
        .lock()
        .as_ref()
        .unwrap()
        .local_addr()
        .unwrap()
        .ip()
}

fn frame(down: u8) -> Frame {
    Frame::Health { down }
}

/// Fifty comms between two processes ride one connection at each end; a frame reaches only the
/// comm it names, either way; a goodbye closes only its comm; the link closes with its last
/// comm at both ends and is no longer listed.
#[test]
fn comms_between_two_processes_share_one_link_and_each_hears_only_its_own() {
    let (door, handle) = door(11);
    let pairs: Vec<(Watched, Watched)> = (1..=50).map(|c| joined(&door, &handle, c)).collect();
    let (dialed, accepted) = (&pairs[0].0.link.conn, &pairs[0].1.link.conn);
    assert!(!Arc::ptr_eq(dialed, accepted), "two ends, two sockets");
    for (d, a) in &pairs {
        assert!(Arc::ptr_eq(&d.link.conn, dialed) && Arc::ptr_eq(&a.link.conn, accepted));
    }
    pairs[6].0.link().send(&frame(7)).unwrap();
    pairs[8].1.link().send(&frame(9)).unwrap();
    eventually("the acceptor's comm 7 has its frame", || {
        pairs[6].1.link().has_frames()
    });
    eventually("the dialer's comm 9 has its frame", || {
        pairs[8].0.link().has_frames()
    });
    assert_eq!(pairs[6].1.link().frames(), [frame(7)]);
    assert_eq!(pairs[8].0.link().frames(), [frame(9)]);
    for (i, (d, a)) in pairs.iter().enumerate() {
        assert!(!d.link().has_frames() && !a.link().has_frames(), "comm {i}");
    }
    let (dialed, accepted) = (Arc::clone(dialed), Arc::clone(accepted));
    let mut pairs = pairs;
    let (gone, stays) = pairs.remove(2);
    drop(gone);
    eventually("the comm whose peer closed sees its goodbye", || {
        stays.link().state() == PeerState::Closed
    });
    assert!(stays.link().check("send comm").is_ok(), "within the grace");
    assert!(
        pairs
            .iter()
            .all(|(d, a)| d.link().state() == PeerState::Alive
                && a.link().state() == PeerState::Alive),
        "one goodbye closes one comm"
    );
    drop(stays);
    drop(pairs);
    for conn in [&dialed, &accepted] {
        assert!(conn.stream.lock().is_none(), "closed with its last comm");
        assert!(!conn.listed.load(Ordering::Acquire));
    }
    let table = TABLE.lock();
    assert!(
        !table
            .dialed
            .contains_key(&(handle.process, handle.addr.ip()))
    );
}

/// A peer process gone (its end closed without goodbyes): every comm on the link reads as
/// died, but the one whose peer had said goodbye; the link is no longer offered to new comms.
#[test]
fn a_link_that_ends_leaves_its_comms_gone_but_those_that_said_goodbye() {
    let (door, handle) = door(12);
    let mut pairs: Vec<(Watched, Watched)> = (1..=3).map(|c| joined(&door, &handle, c)).collect();
    let (closed, survivor) = pairs.remove(0);
    drop(closed);
    eventually("the goodbye arrives", || {
        survivor.link().state() == PeerState::Closed
    });
    let dialed = Arc::clone(&pairs[0].0.link.conn);
    let link = pairs[0].0.link.conn.shared.unwrap().link;
    // What the kernel does to the sockets of a process that dies.
    dialed
        .stream
        .lock()
        .as_ref()
        .unwrap()
        .shutdown(Shutdown::Both)
        .unwrap();
    for (_, a) in &pairs {
        eventually("a comm on the link learns its peer died", || {
            a.link().state() == PeerState::Died
        });
        let e = a.link().check("send comm").unwrap_err();
        assert!(
            e.to_string().contains("process exited or was killed"),
            "{e}"
        );
    }
    assert_eq!(survivor.link().state(), PeerState::Closed);
    let proposal = Proposal {
        process: process_id(),
        link,
    };
    assert!(
        claim_accepted(&proposal, dialer_ip(&dialed), 99).is_none(),
        "an ended link takes no new comm"
    );
    for (d, _) in &pairs {
        assert!(d.link().hung_up());
    }
}

/// A proposal naming a link this process does not have, or one from another host than the
/// link's, is not joined (the comm keeps its own connection); neither is a channel in use.
#[test]
fn only_a_listed_link_of_the_same_process_and_host_is_joined() {
    let (door, handle) = door(13);
    let (d, a) = joined(&door, &handle, 5);
    let link = d.link.conn.shared.unwrap().link;
    let proposal = |process, link| Proposal { process, link };
    let localhost = dialer_ip(&d.link.conn);
    assert!(claim_accepted(&proposal(process_id(), link ^ 1), localhost, 6).is_none());
    assert!(claim_accepted(&proposal(process_id() ^ 1, link), localhost, 6).is_none());
    let elsewhere = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 99));
    assert!(claim_accepted(&proposal(process_id(), link), elsewhere, 6).is_none());
    assert!(
        claim_accepted(&proposal(process_id(), link), localhost, 5).is_none(),
        "channel 5 is taken"
    );
    assert!(claim_accepted(&proposal(process_id(), link), localhost, 6).is_some());
    drop((d, a));
}

/// A link dialed with a handle the door does not know is dropped: the connector's comm keeps a
/// connection of its own.
#[test]
fn a_link_with_a_stranger_handle_is_refused_and_the_comm_goes_alone() {
    let (door, mut handle) = door(14);
    let open_nonce = handle.nonce;
    handle.nonce ^= 1;
    let until = Instant::now() + Duration::from_secs(10);
    let mut wait = None;
    loop {
        match link_to(&handle, 1, wait.take()) {
            LinkTo::Waiting(w) => {
                wait = Some(w);
                door.arrivals_for(open_nonce, Instant::now()).unwrap();
            }
            LinkTo::Alone => break,
            LinkTo::Claimed(_) => panic!("the door listed a link for a stranger"),
        }
        assert!(Instant::now() < until, "never refused");
    }
    assert!(
        !TABLE
            .lock()
            .dialed
            .contains_key(&(handle.process, handle.addr.ip()))
    );
}

/// A link whose door never answers (its process stopped accepting) is dropped when the last
/// connect waiting for it gives up: nothing is left behind.
#[test]
fn a_link_nobody_waits_for_any_more_is_dropped() {
    let (_door, handle) = door(15);
    let key = (handle.process, handle.addr.ip());
    let LinkTo::Waiting(first) = link_to(&handle, 1, None) else {
        panic!("the door answered without being moved along");
    };
    let LinkTo::Waiting(second) = link_to(&handle, 2, None) else {
        panic!("the door answered without being moved along");
    };
    drop(first);
    assert!(
        TABLE.lock().dialed.contains_key(&key),
        "one connect still waits"
    );
    drop(second);
    assert!(!TABLE.lock().dialed.contains_key(&key));
}

/// What the watcher sends while it tends comms waits for the end of its pass (or for
/// `CORK_BYTES`) and then goes in one write; a frame sent meanwhile from another thread goes
/// after what is held, so every comm's frames arrive in the order they were sent.
#[test]
fn frames_sent_while_corked_go_at_the_end_in_their_order() {
    let (door, handle) = door(16);
    let pairs: Vec<(Watched, Watched)> = (1..=3).map(|c| joined(&door, &handle, c)).collect();
    let arrived = |i: usize| pairs[i].1.link().has_frames();
    corked(|| {
        pairs[0].0.link().send(&frame(1)).unwrap();
        pairs[1].0.link().send(&frame(2)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!arrived(0) && !arrived(1), "held while corked");
        // Another thread's frame for comm 1 writes the held ones first.
        std::thread::scope(|s| {
            s.spawn(|| pairs[0].0.link().send(&frame(3)).unwrap());
        });
        eventually("the frames held and the other thread's arrived", || {
            arrived(0) && arrived(1)
        });
        pairs[2].0.link().send(&frame(4)).unwrap();
        pairs[0].0.link().send(&frame(5)).unwrap();
    });
    eventually("the frames held to the end arrived", || {
        arrived(2) && arrived(0)
    });
    assert_eq!(pairs[0].1.link().frames(), [frame(1), frame(3), frame(5)]);
    assert_eq!(pairs[1].1.link().frames(), [frame(2)]);
    assert_eq!(pairs[2].1.link().frames(), [frame(4)]);
    // Enough to fill the cork goes out without waiting for the end.
    let per_frame = {
        let mut out = [0u8; MAX_LINK_MESSAGE];
        LinkMessage {
            channel: 1,
            body: Body::Frame(frame(0)),
        }
        .emit(&mut out)
    };
    corked(|| {
        for _ in 0..CORK_BYTES.div_ceil(per_frame) {
            pairs[1].0.link().send(&frame(6)).unwrap();
        }
        eventually("a full cork is written at once", || arrived(1));
    });
}
