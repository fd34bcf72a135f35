//! Quiet receives: no clear-to-send while eager messages flow, credits, announcements.

use super::*;

/// A connection with quiet receives after `warm` ping-pong rounds of 8 bytes for tag 3: the
/// receive of round `i` at `dst_of(i)`, its send from `i * 8`.
fn quiet_after(warm: u64) -> Pair {
    let mut p = Pair::eager_with(EAGER, 3, true);
    for i in 0..warm {
        ping(&mut p, i);
    }
    p
}

fn dst_of(i: u64) -> u64 {
    16_384 + (i % SLOTS as u64) * 8192
}

/// One round: the receive posted first (as NCCL's proxy keeps them), then the send; both
/// complete byte-exact.
fn ping(p: &mut Pair, i: u64) -> Accepted {
    let slot = p.irecv(&[rbuf(dst_of(i), 8, 3)]).unwrap();
    let a = p.isend(sbuf(i * 8, 8, 3)).unwrap().unwrap();
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![8]), "round {i}");
    assert_delivered(p, dst_of(i), i * 8, 8);
    assert_eq!(p.sent(a.req), Some(8), "round {i}");
    p.send.release(a.req);
    p.recv.release(slot);
    p.recv_mem[dst_of(i) as usize..dst_of(i) as usize + 8].fill(0xee);
    a
}

/// What quiet receives are for: in a ping-pong of small host-memory messages the receiver writes no
/// CTS at all once the first eager message went through (the second message, sent into the
/// copy its CTS promised), only a credit every `CREDIT_EVERY` messages, and every send goes as
/// one eager write.
#[test]
fn quiet_receives_write_nothing_but_a_credit_every_few_messages() {
    let mut p = quiet_after(2);
    let (cts_before, credits_before) = (p.cts_writes, p.credit_writes);
    let rounds = 10 * SLOTS as u64;
    for i in 2..2 + rounds {
        let a = ping(&mut p, i);
        assert!(is_eager(&a), "round {i}");
    }
    assert_eq!(p.cts_writes, cts_before, "no CTS while receives are quiet");
    let credits = (p.credit_writes - credits_before) as u64;
    assert!(
        (rounds / eager::CREDIT_EVERY - 1..=rounds / eager::CREDIT_EVERY + 1).contains(&credits),
        "{credits} credits for {rounds} messages"
    );
}

/// A send that cannot go eagerly (GPU memory, or over the threshold) into a quiet receive waits
/// for its CTS, as any send: the receive writes it once no eager message took it within a while
/// (the glue's clock; here `time_passes`), and the message goes by rendezvous, byte-exact. The
/// receive after it is announced at once (no eager message before it), and a later small send
/// brings quiet receives back.
#[test]
fn a_send_that_cannot_go_eagerly_waits_until_the_quiet_receive_announces_itself() {
    for (host, size) in [(false, 100), (true, EAGER + 1)] {
        let mut p = quiet_after(4);
        let dst = dst_of(4);
        let cts_before = p.cts_writes;
        let slot = p.irecv(&[rbuf(dst, 2 * EAGER, 3)]).unwrap();
        assert_eq!(cts_before, p.cts_writes, "the receive is quiet");
        let buf = SendBuf {
            host,
            ..sbuf(64, size, 3)
        };
        assert!(p.isend(buf).unwrap().is_none(), "waits for its CTS");
        p.time_passes();
        assert_eq!(p.cts_writes, cts_before + 1, "the receive announced itself");
        let a = p.isend(buf).unwrap().unwrap();
        assert!(!is_eager(&a), "{:?}", a.posts);
        p.deliver_all();
        assert_eq!(p.received(slot), Some(vec![size]));
        assert_delivered(&p, dst, 64, size);
        assert_eq!(p.sent(a.req), Some(size));
        p.send.release(a.req);
        p.recv.release(slot);
        let next = p.irecv(&[rbuf(dst_of(5), 8, 3)]).unwrap();
        assert_eq!(
            p.cts_writes,
            cts_before + 2,
            "announced: the last message was not eager"
        );
        let b = p.isend(sbuf(8, 8, 3)).unwrap().unwrap();
        p.deliver_all();
        assert_eq!(p.received(next), Some(vec![8]));
        assert!(is_eager(&b), "into the promised copy");
        p.send.release(b.req);
        p.recv.release(next);
        let c = ping(&mut p, 6);
        assert!(is_eager(&c));
        assert_eq!(p.cts_writes, cts_before + 2, "quiet again");
    }
}

/// An eager send is done once written (its payload is kept in the staging ring), so NCCL may
/// reuse the buffer before the receiver looked at the message. When the quiet receive turns out
/// smaller than the message, the message goes again by rendezvous from the kept copy,
/// truncated, and the slot frees itself once that write completed.
#[test]
fn a_refused_eager_message_goes_again_from_the_kept_copy_after_its_send_completed() {
    let mut p = quiet_after(4);
    let dst = dst_of(4);
    let slot = p.irecv(&[rbuf(dst, 40, 3)]).unwrap();
    let src = 4096;
    let original = p.sender_mem[src..src + 100].to_vec();
    let a = p.isend(sbuf(src as u64, 100, 3)).unwrap().unwrap();
    assert!(is_eager(&a));
    p.deliver_all();
    assert_eq!(
        p.send.poll_done(a.req),
        Some(100),
        "done with its own write"
    );
    p.send.release(a.req);
    p.sender_mem[src..src + 100].fill(0x5a);
    p.read_answers().unwrap();
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![40]), "truncated to the receive");
    assert_eq!(
        &p.recv_mem[dst as usize..dst as usize + 40],
        &original[..40]
    );
    assert_eq!(p.recv_mem[dst as usize + 40], 0xee);
    assert!(p.send.nothing_in_flight(), "nothing left in flight");
    p.recv.release(slot);
}

/// Credits bound what the sender may have in flight: with no receive posted, eager sends stop
/// when the bounce slots the last credit did not return come round again, and go on once
/// receives complete and a credit arrives.
#[test]
fn quiet_eager_sends_stop_until_a_credit_returns_their_bounce_slots() {
    let mut p = quiet_after(4);
    let mut sends = Vec::new();
    while let Some(a) = p.isend(sbuf(8 * sends.len() as u64, 8, 3)).unwrap() {
        assert!(is_eager(&a));
        sends.push(a);
        assert!(sends.len() <= SLOTS, "more in flight than bounce slots");
    }
    assert!(
        sends.len() >= SLOTS - eager::CREDIT_EVERY as usize,
        "only {} in flight",
        sends.len()
    );
    p.deliver_all();
    for (i, a) in sends.iter().enumerate() {
        assert_eq!(
            p.sent(a.req),
            Some(8),
            "done before any receive: kept copies"
        );
        p.send.release(a.req);
        let dst = dst_of(i as u64);
        let slot = p.irecv(&[rbuf(dst, 8, 3)]).unwrap();
        assert_eq!(p.received(slot), Some(vec![8]));
        assert_delivered(&p, dst, 8 * i as u64, 8);
        p.recv.release(slot);
        p.recv_mem[dst as usize..dst as usize + 8].fill(0xee);
    }
    let next = p.isend(sbuf(0, 8, 3)).unwrap();
    assert!(
        next.as_ref().is_some_and(is_eager),
        "a credit returned the slots"
    );
}
