//! The eager path (see `core::eager`): every scenario runs on a one-QP connection that agreed on
//! eager messages of up to [`EAGER`] bytes: copies at irecv, promises, refusals, renumbering,
//! credits.

use super::*;

#[test]
fn the_first_message_and_sends_for_another_tag_wait_for_their_cts() {
    let mut p = Pair::new(1, false);
    let layout = Layout {
        eager_bytes: EAGER,
        ..p.send.layout()
    };
    p.send = SendSide::new(layout);
    p.recv = RecvSide::new(layout);
    assert_eq!(p.isend(sbuf(0, 8, 1)).unwrap(), None, "no receive seen yet");
    let slot = p.irecv(&[rbuf(8192, 8, 1)]).unwrap();
    let a = p.isend(sbuf(0, 8, 1)).unwrap().unwrap();
    assert!(!is_eager(&a));
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![8]));
    assert_eq!(
        p.isend(sbuf(0, 8, 2)).unwrap(),
        None,
        "the last receive was for tag 1"
    );
    assert!(is_eager(&p.isend(sbuf(0, 8, 1)).unwrap().unwrap()));
}

#[test]
fn an_eager_message_sent_before_its_receive_is_copied_at_irecv_and_acknowledged() {
    for size in [0, 1, 8, 127, EAGER - 1, EAGER] {
        let mut p = Pair::eager(EAGER, 1);
        let a = p
            .isend(sbuf(100, size, 1))
            .unwrap()
            .expect("sent without a CTS");
        assert!(is_eager(&a), "{size}: {:?}", a.posts);
        p.deliver_all();
        assert_eq!(p.sent(a.req), None, "done only once acknowledged");
        // The glue's irecv polls for an arrival only when the header of the next message is in
        // the bounce slot `next_eager` names: where this one landed.
        let [Post::Eager { slot, seq, .. }] = a.posts[..] else {
            panic!("{:?}", a.posts)
        };
        assert_eq!(p.recv.next_eager(), Some((seq, slot)));
        assert_eq!(p.bounce[slot].0.seq, seq);
        let slot = p.irecv(&[rbuf(8192, 2 * EAGER, 1)]).unwrap();
        assert_eq!(p.received(slot), Some(vec![size]), "complete at irecv");
        assert_delivered(&p, 8192, 100, size);
        assert_eq!(p.sent(a.req), Some(size));
        assert!(p.send.eager_active() && p.recv.eager_active());
    }
}

#[test]
fn messages_over_the_threshold_and_gpu_buffers_wait_for_the_cts() {
    let mut p = Pair::eager(EAGER, 1);
    assert_eq!(p.isend(sbuf(0, EAGER + 1, 1)).unwrap(), None);
    let gpu = SendBuf {
        host: false,
        ..sbuf(0, 8, 1)
    };
    assert_eq!(
        p.isend(gpu).unwrap(),
        None,
        "a CUDA registration never goes eager"
    );
    let slot = p.irecv(&[rbuf(8192, 2 * EAGER, 1)]).unwrap();
    let a = p.isend(sbuf(0, EAGER + 1, 1)).unwrap().unwrap();
    assert!(!is_eager(&a));
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![EAGER + 1]));
    assert_delivered(&p, 8192, 0, EAGER + 1);
}

/// The glue lets the provider copy a write's source with the CPU (inline data) only for host
/// memory: each data write says which its source is, and a GPU buffer's few bytes are read by
/// the NIC (NCCL's transport posts no data inline).
#[test]
fn data_writes_say_whether_their_source_is_host_memory() {
    for host in [true, false] {
        let mut p = Pair::eager(EAGER, 1);
        let slot = p.irecv(&[rbuf(8192, 64, 1)]).unwrap();
        let a = p
            .isend(SendBuf {
                host,
                ..sbuf(10, 8, 1)
            })
            .unwrap()
            .unwrap();
        let [Post::WriteImm { write, .. }] = a.posts[..] else {
            panic!("{:?}", a.posts)
        };
        assert_eq!(write.host, host);
        p.deliver_all();
        assert_eq!(p.received(slot), Some(vec![8]));
        assert_delivered(&p, 8192, 10, 8);
    }
}

#[test]
fn a_receive_posted_first_takes_the_rendezvous_path() {
    let mut p = Pair::eager(EAGER, 1);
    let slot = p.irecv(&[rbuf(8192, 64, 1)]).unwrap();
    let a = p.isend(sbuf(10, 8, 1)).unwrap().unwrap();
    assert!(
        matches!(a.posts[..], [Post::WriteImm { .. }]),
        "{:?}",
        a.posts
    );
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![8]));
    assert_eq!(p.sent(a.req), Some(8));
    assert_delivered(&p, 8192, 10, 8);
}

/// The receive is posted first (its CTS goes out) and the eager message lands after it: the
/// receiver copies it there and acknowledges; the sender needs no further call for the data to
/// arrive (a ping-pong that waits only on its receive must not hang on its own send).
#[test]
fn an_eager_message_landing_after_its_receive_was_posted_is_copied_there() {
    let mut p = Pair::eager(EAGER, 1);
    let a = p.isend(sbuf(100, 200, 1)).unwrap().unwrap();
    assert!(is_eager(&a));
    let slot = p.irecv(&[rbuf(8192, 200, 1)]).unwrap();
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![200]), "copied");
    assert_delivered(&p, 8192, 100, 200);
    assert_eq!(p.sent(a.req), Some(200));
    assert!(p.send.eager_active() && p.recv.eager_active());
    p.send.release(a.req);
    p.recv.release(slot);
    // The rendezvous receive the CTS posted is not left expecting a message.
    let next = p.irecv(&[rbuf(16_384, 64, 1)]).unwrap();
    let b = p.isend(sbuf(7, 64, 1)).unwrap().unwrap();
    assert!(!is_eager(&b), "its CTS was there");
    p.deliver_all();
    assert_eq!(p.received(next), Some(vec![64]));
    assert_delivered(&p, 16_384, 7, 64);
}

/// A copy is only ever of the whole message (so the sender knows what was delivered without the
/// answer's size): an eager message larger than its receive goes again by rendezvous and is
/// truncated there, as any send is (`ncclIbIsend` clamps to the posted size), whether it landed
/// before the receive was posted or after.
#[test]
fn an_eager_message_larger_than_its_receive_goes_again_by_rendezvous_truncated() {
    for receive_first in [false, true] {
        let mut p = Pair::eager(EAGER, 1);
        let a = p.isend(sbuf(100, 300, 1)).unwrap().unwrap();
        assert!(is_eager(&a));
        let slot = p.land_and_receive(receive_first, rbuf(8192, 200, 1));
        assert_eq!(p.received(slot), None, "not copied: it does not fit");
        assert_eq!(
            p.sent(a.req),
            None,
            "the answer made the sender write it again"
        );
        p.deliver_all();
        assert_eq!(
            p.received(slot),
            Some(vec![200]),
            "receive first: {receive_first}"
        );
        assert_delivered(&p, 8192, 100, 200);
        assert_eq!(p.sent(a.req), Some(200));
        assert!(p.send.eager_active() && p.recv.eager_active());
    }
}

/// The hang a pipelined benchmark hit on rxe with 32 in flight: a receive that copied an eager
/// message completes without the sender, NCCL posts the receives that follow, and the one a
/// ring later writes its CTS over the answer the sender had not read yet. The sender must take
/// that CTS as the answer (the message was copied whole), not wait for the overwritten one
/// forever while the receiver waits for the next message.
#[test]
fn an_answer_overwritten_by_the_receive_a_ring_later_still_completes_the_send() {
    for receive_first in [false, true] {
        let mut p = Pair::eager(EAGER, 1);
        let a = p.isend(sbuf(100, 64, 1)).unwrap().unwrap();
        assert!(is_eager(&a));
        let first = p.land_and_receive(receive_first, rbuf(8192, 64, 1));
        assert_eq!(p.received(first), Some(vec![64]));
        assert_delivered(&p, 8192, 100, 64);
        p.recv.release(first);
        // A ring of receives, the last one in the copied message's slot.
        let dst = |i: u64| 16_384 + 64 * i;
        let recvs: Vec<usize> = (0..SLOTS as u64)
            .map(|i| p.irecv(&[rbuf(dst(i), 64, 1)]).unwrap())
            .collect();
        assert_eq!(
            recvs.last(),
            Some(&first),
            "the answer's slot was written again"
        );
        assert_eq!(p.sent(a.req), Some(64), "receive first: {receive_first}");
        p.send.release(a.req);
        for (i, &slot) in recvs.iter().enumerate() {
            let i = i as u64;
            let s = p.isend(sbuf(1000 + i, 64, 1)).unwrap().unwrap();
            assert!(!is_eager(&s), "its CTS is there");
            p.deliver_all();
            assert_eq!(p.received(slot), Some(vec![64]));
            assert_delivered(&p, dst(i), 1000 + i, 64);
            assert_eq!(p.sent(s.req), Some(64));
            p.send.release(s.req);
            p.recv.release(slot);
        }
    }
}

#[test]
fn a_receive_in_gpu_memory_posted_first_refuses_the_message_when_it_lands() {
    let mut p = Pair::eager(EAGER, 1);
    let a = p.isend(sbuf(100, 64, 1)).unwrap().unwrap();
    let gpu = RecvBuf {
        host: false,
        ..rbuf(8192, 64, 1)
    };
    let slot = p.irecv(&[gpu]).unwrap();
    p.deliver_all();
    assert_eq!(p.received(slot), None, "never copied into GPU memory");
    assert_eq!(
        p.sent(a.req),
        None,
        "the refusal made the sender write it again"
    );
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![64]));
    assert_delivered(&p, 8192, 100, 64);
    assert_eq!(p.sent(a.req), Some(64));
    assert!(
        p.send.eager_active() && p.recv.eager_active(),
        "nothing renumbered"
    );
    p.send.release(a.req);
    p.recv.release(slot);
    assert_eq!(
        p.isend(sbuf(0, 16, 1)).unwrap(),
        None,
        "a receive in GPU memory predicts no copy: the next send waits for its CTS"
    );
}

#[test]
fn a_receive_in_gpu_memory_refuses_the_copy_and_later_messages_wait_for_their_cts() {
    let mut p = Pair::eager(EAGER, 1);
    let a = p.isend(sbuf(100, 64, 1)).unwrap().unwrap();
    let b = p.isend(sbuf(200, 32, 1)).unwrap().unwrap();
    assert!(is_eager(&a) && is_eager(&b));
    p.deliver_all();
    let gpu = RecvBuf {
        host: false,
        ..rbuf(8192, 64, 1)
    };
    let slot = p.irecv(&[gpu]).unwrap();
    assert_eq!(p.received(slot), None, "never copied into GPU memory");
    assert_eq!(p.sent(a.req), None);
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![64]));
    assert_eq!(p.sent(a.req), Some(64));
    assert_delivered(&p, 8192, 100, 64);
    // The eager message already on its way keeps its number and is copied.
    let second = p.irecv(&[rbuf(16_384, 64, 1)]).unwrap();
    assert_eq!(p.received(second), Some(vec![32]));
    assert_delivered(&p, 16_384, 200, 32);
    assert_eq!(p.sent(b.req), Some(32));
    p.send.release(a.req);
    p.send.release(b.req);
    assert_eq!(p.isend(sbuf(0, 16, 1)).unwrap(), None, "waits for its CTS");
}

#[test]
fn a_grouped_receive_renumbers_the_eager_sends_and_stops_the_eager_path() {
    let mut p = Pair::eager(EAGER, 0);
    let a = p.isend(sbuf(0, 100, 0)).unwrap().unwrap();
    let b = p.isend(sbuf(1000, 200, 0)).unwrap().unwrap();
    assert!(is_eager(&a) && is_eager(&b));
    p.deliver_all();
    // One grouped receive takes both sends (NCCL's grouped p2p): not two messages.
    let slot = p
        .irecv(&[rbuf(10_000, 500, 0), rbuf(20_000, 500, 0)])
        .unwrap();
    assert!(
        !p.recv.eager_active(),
        "the receiver stops at the grouped CTS"
    );
    assert_eq!(p.recv.next_eager(), None, "irecv polls for no arrival");
    p.read_answers().unwrap();
    assert!(!p.send.eager_active());
    p.deliver_all();
    assert_eq!(
        p.received(slot),
        Some(vec![100, 200]),
        "equal tags fill in sending order"
    );
    assert_delivered(&p, 10_000, 0, 100);
    assert_delivered(&p, 20_000, 1000, 200);
    assert_eq!((p.sent(a.req), p.sent(b.req)), (Some(100), Some(200)));
    p.send.release(a.req);
    p.send.release(b.req);
    p.recv.release(slot);
    // The next message has the same number on both sides and goes by rendezvous.
    assert_eq!(p.isend(sbuf(0, 8, 0)).unwrap(), None);
    let next = p.irecv(&[rbuf(30_000, 8, 0)]).unwrap();
    let c = p.isend(sbuf(5, 8, 0)).unwrap().unwrap();
    assert!(!is_eager(&c));
    p.deliver_all();
    assert_eq!(p.received(next), Some(vec![8]));
    assert_delivered(&p, 30_000, 5, 8);
}

/// The end of both renumbering scenarios: receive `first` (tag 1) got `t1`'s 20 bytes from 100,
/// receive `second` (tag 0) the held eager send `t0`'s 10 bytes from 0.
fn assert_swapped(p: &mut Pair, (first, second): (usize, usize), (t0, t1): (usize, usize)) {
    p.read_answers().unwrap();
    p.deliver_all();
    assert_eq!(p.received(first), Some(vec![20]));
    assert_eq!(p.received(second), Some(vec![10]));
    assert_delivered(p, 10_000, 100, 20);
    assert_delivered(p, 20_000, 0, 10);
    assert_eq!((p.sent(t0), p.sent(t1)), (Some(10), Some(20)));
}

#[test]
fn a_receive_for_another_tag_renumbers_and_held_sends_keep_their_order() {
    let mut p = Pair::eager(EAGER, 0);
    let t0 = p.isend(sbuf(0, 10, 0)).unwrap().unwrap();
    assert!(is_eager(&t0));
    p.deliver_all();
    // Message 0 is for tag 1, message 1 for tag 0 (as `ncclIbIsend` would match them).
    let first = p.irecv(&[rbuf(10_000, 64, 1)]).unwrap();
    let second = p.irecv(&[rbuf(20_000, 64, 0)]).unwrap();
    assert!(!p.recv.eager_active());
    assert_eq!(
        p.isend(sbuf(50, 10, 0)).unwrap(),
        None,
        "a later tag-0 send waits behind the held one"
    );
    let t1 = p.isend(sbuf(100, 20, 1)).unwrap().unwrap();
    assert_swapped(&mut p, (first, second), (t0.req, t1.req));
}

#[test]
fn an_eager_message_landing_after_a_cts_for_another_tag_stops_the_receiver_too() {
    let mut p = Pair::eager(EAGER, 0);
    let t0 = p.isend(sbuf(0, 10, 0)).unwrap().unwrap();
    let first = p.irecv(&[rbuf(10_000, 64, 1)]).unwrap();
    assert!(p.recv.eager_active(), "the receiver cannot know yet");
    p.deliver_all();
    assert!(
        !p.recv.eager_active(),
        "the arrival names tag 0, the CTS asked for tag 1"
    );
    let t1 = p.isend(sbuf(100, 20, 1)).unwrap().unwrap();
    assert!(!p.send.eager_active());
    let second = p.irecv(&[rbuf(20_000, 64, 0)]).unwrap();
    assert_swapped(&mut p, (first, second), (t0.req, t1.req));
}

#[test]
fn credits_run_out_after_a_bounce_ring_of_unanswered_eager_messages() {
    let mut p = Pair::eager(EAGER, 1);
    let bounce_slots = p.send.layout().bounce_slots as u64;
    assert_eq!(bounce_slots, 8, "the default ring");
    let sends: Vec<Accepted> = (0..bounce_slots)
        .map(|i| p.isend(sbuf(i * 8, 8, 1)).unwrap().unwrap())
        .collect();
    assert!(sends.iter().all(is_eager));
    assert_eq!(
        p.isend(sbuf(0, 8, 1)).unwrap(),
        None,
        "every bounce slot is taken"
    );
    p.deliver_all();
    let slot = p.irecv(&[rbuf(8192, 8, 1)]).unwrap();
    assert_eq!(p.received(slot), Some(vec![8]));
    // Message 8's message slot is free and its bounce slot, message 0's, was acknowledged.
    let next = p.isend(sbuf(512, 8, 1)).unwrap().unwrap();
    assert!(is_eager(&next), "the acknowledgement returned the credit");
    assert_eq!(p.sent(sends[0].req), Some(8));
    p.send.release(sends[0].req);
    for (i, a) in sends.iter().enumerate().skip(1) {
        let s = p.irecv(&[rbuf(8192 + 64 * i as u64, 8, 1)]).unwrap();
        assert_eq!(p.received(s), Some(vec![8]));
        assert_delivered(&p, 8192 + 64 * i as u64, i as u64 * 8, 8);
        assert_eq!(p.sent(a.req), Some(8));
    }
}

/// The race a pipelined benchmark hit on rxe (32 in flight): eager messages whose receives were
/// posted first are promised, the sender's writes complete and NCCL reuses the requests, but
/// the receiver has not handled the arrivals yet. When the ring comes round to the first slot,
/// the next message must not be written into the bounce slot the receiver is still to read (it
/// read the newer header: "eager message N arrived with the header of message N+32"). On a ring
/// of a slot per message slot (a peer before 0.3.10), where the next CTS in the slot shows it
/// read. The arrivals wait on the wire in order, as they do in the receiver's CQ.
#[test]
fn a_bounce_slot_is_not_written_again_before_the_receiver_read_it() {
    let mut p = Pair::eager_ring(EAGER, 1, false, SLOTS);
    let (promised, held): (Vec<usize>, Vec<Post>) = (0..SLOTS as u64)
        .map(|i| promise_and_write_without_landing(&mut p, 8 * i, 4096 + 64 * i))
        .unzip();
    assert_eq!(
        p.isend(sbuf(512, 8, 1)).unwrap(),
        None,
        "the promised message's bounce slot is unread: wait for the CTS"
    );
    for (i, (m, r)) in held.into_iter().zip(promised).enumerate() {
        p.land(m);
        assert_eq!(p.received(r), Some(vec![8]));
        assert_delivered(&p, 4096 + 64 * i as u64, 8 * i as u64, 8);
        p.recv.release(r);
    }
    let r = p.irecv(&[rbuf(8192, 8, 1)]).unwrap();
    let c = p.isend(sbuf(512, 8, 1)).unwrap().unwrap();
    p.deliver_all();
    assert_eq!(p.received(r), Some(vec![8]));
    assert_delivered(&p, 8192, 512, 8);
    assert_eq!(p.sent(c.req), Some(8));
}

/// The same race on a ring of fewer bounce slots than message slots (0.3.10's default, 8): the
/// promised message's bounce slot is shown read by the acknowledgement of any later eager
/// message (the receiver handled the arrivals in order before it copied that one).
#[test]
fn a_later_acknowledgement_frees_a_promised_bounce_slot_of_a_small_ring() {
    let mut p = Pair::eager(EAGER, 1);
    let bounce_slots = p.send.layout().bounce_slots as u64;
    assert!(bounce_slots < SLOTS as u64, "the default ring");
    let (promised, held) = promise_and_write_without_landing(&mut p, 0, 4096);
    p.land(held);
    assert_eq!(p.received(promised), Some(vec![8]));
    p.recv.release(promised);
    for i in 1..=bounce_slots {
        // Message `bounce_slots` lands where the promised one did.
        eager_then_received(&mut p, 8 * i, 8192 + 64 * i, &format!("message {i}"));
    }
}

/// Without acknowledgements (each receive posted after its eager send but before the receiver
/// handled the arrival, so each message goes into a promised copy) the receiver's CTS says how
/// far it has read: every message before its oldest receive still waiting. While the first
/// message's arrival waits in the receiver's CQ, no CTS says so and the message that would
/// land in its bounce slot waits for its own CTS; once the arrivals are handled, every send
/// goes eagerly again.
#[test]
fn a_cts_says_how_far_the_receiver_has_read_promised_bounce_slots() {
    let mut p = Pair::eager(EAGER, 1);
    let bounce_slots = p.send.layout().bounce_slots as u64;
    let (promised, held): (Vec<usize>, Vec<Post>) = (0..bounce_slots)
        .map(|i| promise_and_write_without_landing(&mut p, 8 * i, 4096 + 64 * i))
        .unzip();
    assert_eq!(
        p.isend(sbuf(512, 8, 1)).unwrap(),
        None,
        "message {bounce_slots}: the receiver has not read message 0's bounce slot"
    );
    for (i, (m, r)) in (0..).zip(held.into_iter().zip(promised)) {
        p.land(m);
        assert_eq!(p.received(r), Some(vec![8]), "message {i}");
        assert_delivered(&p, 4096 + 64 * i, 8 * i, 8);
        p.recv.release(r);
    }
    for i in bounce_slots..=SLOTS as u64 + bounce_slots {
        let (src, dst) = (8 * (i % 16), 8192 + 64 * (i % 16));
        let r = if i == bounce_slots {
            // Its CTS says every message before it completed.
            let r = p.irecv(&[rbuf(dst, 8, 1)]).unwrap();
            let s = p.isend(sbuf(src, 8, 1)).unwrap().unwrap();
            assert!(!is_eager(&s), "message {i} went with its CTS");
            p.deliver_all();
            assert_eq!(p.sent(s.req), Some(8));
            p.send.release(s.req);
            r
        } else {
            let s = p.isend(sbuf(src, 8, 1)).unwrap().unwrap();
            assert!(
                is_eager(&s),
                "message {i}: the last CTS showed its bounce slot read"
            );
            let r = p.irecv(&[rbuf(dst, 8, 1)]).unwrap();
            p.deliver_all();
            assert_eq!(p.sent(s.req), Some(8), "message {i}");
            p.send.release(s.req);
            r
        };
        assert_eq!(p.received(r), Some(vec![8]), "message {i}");
        assert_delivered(&p, dst, src, 8);
        p.recv.release(r);
    }
}

/// An 8-byte eager send from `src` whose receive at `dst` is posted before it lands (so its CTS
/// promises the copy), its write complete and NCCL done with it, the message itself held back
/// on the wire: the promised receive's slot and the held message.
fn promise_and_write_without_landing(p: &mut Pair, src: u64, dst: u64) -> (usize, Post) {
    let a = p.isend(sbuf(src, 8, 1)).unwrap().unwrap();
    assert!(is_eager(&a), "the send from {src}");
    let promised = p.irecv(&[rbuf(dst, 8, 1)]).unwrap();
    let qp = a.posts[0].qp();
    let held = p.wire[qp].pop_front().unwrap();
    let Post::Eager { .. } = held else {
        panic!("not an eager message: {held:?}");
    };
    p.send.handle_completion(qp).unwrap();
    assert_eq!(
        p.sent(a.req),
        Some(8),
        "promised and written: done for NCCL"
    );
    p.send.release(a.req);
    (promised, held)
}

/// An 8-byte send from `src` that goes eagerly, lands, and is copied into a receive at `dst`
/// posted after it; both requests done and released.
fn eager_then_received(p: &mut Pair, src: u64, dst: u64, what: &str) {
    let s = p.isend(sbuf(src, 8, 1)).unwrap().unwrap();
    assert!(is_eager(&s), "{what}: eager");
    p.deliver_all();
    let r = p.irecv(&[rbuf(dst, 8, 1)]).unwrap();
    assert_eq!(p.received(r), Some(vec![8]), "{what}");
    assert_delivered(p, dst, src, 8);
    assert_eq!(p.sent(s.req), Some(8), "{what}");
    p.send.release(s.req);
    p.recv.release(r);
}
