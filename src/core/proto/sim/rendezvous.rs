//! Rendezvous messages: sizes, layouts, tags, grouped receives, slots, striping.

use super::*;

#[test]
fn transfers_are_byte_exact_for_every_size_and_layout() {
    for size in [0, 1, 127, 128, 129, 1000, 4096, 65_537, 300_001] {
        transfer(1, false, size);
        transfer(4, false, size);
        transfer(4, true, size);
        transfer(3, true, size);
    }
}

#[test]
fn isend_returns_none_until_cts_arrives() {
    let mut p = Pair::new(1, false);
    assert_eq!(p.isend(sbuf(0, 10, 0)).unwrap(), None);
    p.irecv(&[rbuf(0, 10, 0)]).unwrap();
    assert!(p.isend(sbuf(0, 10, 0)).unwrap().is_some());
}

#[test]
fn oversized_send_is_truncated_to_the_posted_size() {
    let mut p = Pair::new(2, true);
    let slot = p.irecv(&[rbuf(1000, 600, 5)]).unwrap();
    let a = p.isend(sbuf(0, 1000, 5)).unwrap().unwrap();
    assert_eq!(a.truncated, Some((1000, 600)));
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![600]));
    assert_eq!(p.send.poll_done(a.req), Some(600));
    assert_eq!(&p.recv_mem[1000..1600], &p.sender_mem[0..600]);
    assert!(
        p.recv_mem[1600..1700].iter().all(|&b| b == 0xee),
        "guard bytes untouched"
    );
}

#[test]
fn grouped_receive_matches_sends_by_tag_in_any_order() {
    let mut p = Pair::new(2, false);
    let bufs: Vec<RecvBuf> = (0..8)
        .map(|i| rbuf(10_000 * (i + 1), 5000, i as i32))
        .collect();
    let slot = p.irecv(&bufs).unwrap();
    let mut accepted = Vec::new();
    for tag in [3, 0, 7, 1, 6, 2, 5, 4] {
        let size = 100 * (tag as u64 + 1);
        let a = p
            .isend(sbuf(tag as u64 * 1000, size, tag))
            .unwrap()
            .unwrap();
        assert_eq!(a.entry, tag as usize, "tag selects the buffer");
        assert_eq!(
            a.posts.is_empty(),
            tag != 4,
            "posts only once the group is complete"
        );
        accepted.push((tag, a));
    }
    p.deliver_all();
    let sizes: Vec<u64> = (0..8).map(|t| 100 * (t + 1)).collect();
    assert_eq!(p.received(slot), Some(sizes));
    for (tag, a) in accepted {
        let (dst, src, len) = (
            10_000 * (tag as usize + 1),
            tag as usize * 1000,
            100 * (tag as usize + 1),
        );
        assert_eq!(&p.recv_mem[dst..dst + len], &p.sender_mem[src..src + len]);
        assert_eq!(p.send.poll_done(a.req), Some(len as u64));
    }
}

/// The profiler's QP events (one per send per QP, as NCCL's transport reports): what each send
/// of a message carries on each QP, once the message's writes are out.
#[test]
fn qp_shares_name_each_sends_bytes_on_each_qp() {
    let slot_of_posts = |a: &Accepted| a.posts.iter().find_map(Post::message_slot).unwrap();
    // One send split over two QPs: two shares whose lengths add up to the message.
    let mut p = Pair::new(2, true);
    p.irecv(&[rbuf(0, 1 << 20, 1)]).unwrap();
    let a = p.isend(sbuf(0, 1 << 20, 1)).unwrap().unwrap();
    let shares = p.send.qp_shares(slot_of_posts(&a));
    assert_eq!(shares.iter().map(|s| s.qp).collect::<Vec<_>>(), [0, 1]);
    assert!(shares.iter().all(|s| s.req == a.req));
    assert_eq!(shares.iter().map(|s| s.len).sum::<u64>(), 1 << 20);

    // A grouped receive: nothing until the last send matched, then each send's own bytes,
    // written by plain writes (the sizes go through the sizes ring).
    let mut p = Pair::new(1, false);
    p.irecv(&[rbuf(0, 4096, 1), rbuf(4096, 4096, 2)]).unwrap();
    let first = p.isend(sbuf(0, 100, 1)).unwrap().unwrap();
    assert!(first.posts.is_empty());
    assert!(p.send.qp_shares(0).is_empty(), "nothing posted yet");
    let last = p.isend(sbuf(100, 300, 2)).unwrap().unwrap();
    let shares = p.send.qp_shares(slot_of_posts(&last));
    assert_eq!(
        shares,
        [
            QpShare {
                req: first.req,
                qp: 0,
                len: 100,
                with_imm: false
            },
            QpShare {
                req: last.req,
                qp: 0,
                len: 300,
                with_imm: false
            },
        ]
    );

    // An eager message: its one write-with-immediate.
    let mut p = Pair::eager(EAGER, 1);
    let a = p.isend(sbuf(0, 64, 1)).unwrap().unwrap();
    assert!(is_eager(&a));
    assert_eq!(
        p.send.qp_shares(slot_of_posts(&a)),
        [QpShare {
            req: a.req,
            qp: 0,
            len: 64,
            with_imm: true
        }]
    );
}

#[test]
fn tag_matching_no_unmatched_entry_is_retry_later() {
    let mut p = Pair::new(1, false);
    p.irecv(&[rbuf(0, 8, 1), rbuf(8, 8, 2)]).unwrap();
    p.isend(sbuf(0, 8, 1)).unwrap().unwrap();
    assert_eq!(
        p.isend(sbuf(0, 8, 1)).unwrap(),
        None,
        "tag 1 is already matched"
    );
    assert_eq!(p.isend(sbuf(0, 8, 9)).unwrap(), None, "no entry has tag 9");
    assert!(p.isend(sbuf(8, 8, 2)).unwrap().is_some());
}

#[test]
fn sends_retried_round_robin_over_tags_find_their_message() {
    // The receiver posts a single receive for tag 8, then a group for tags 0..7; the sender
    // offers 0, 8, 1, ..., 7 in a loop and retries every send that came back None.
    let mut p = Pair::new(2, false);
    let single = p.irecv(&[rbuf(90_000, 1000, 8)]).unwrap();
    let group: Vec<RecvBuf> = (0..8)
        .map(|t| rbuf(10_000 * (t + 1), 5000, t as i32))
        .collect();
    let grouped = p.irecv(&group).unwrap();
    let mut waiting: VecDeque<i32> = [0, 8, 1, 2, 3, 4, 5, 6, 7].into();
    let mut rounds = 0;
    while let Some(tag) = waiting.pop_front() {
        let size = 100 * (tag as u64 + 1);
        if p.isend(sbuf(tag as u64 * 1000, size, tag))
            .unwrap()
            .is_none()
        {
            waiting.push_back(tag);
        }
        rounds += 1;
        assert!(rounds < 100, "sends never matched: {waiting:?}");
    }
    p.deliver_all();
    assert_eq!(p.received(single), Some(vec![900]));
    assert_eq!(
        p.received(grouped),
        Some((0..8).map(|t| 100 * (t + 1)).collect())
    );
    for t in 0..9usize {
        let dst = if t == 8 { 90_000 } else { 10_000 * (t + 1) };
        let len = 100 * (t + 1);
        assert_eq!(
            &p.recv_mem[dst..dst + len],
            &p.sender_mem[t * 1000..t * 1000 + len]
        );
    }
}

#[test]
fn equal_tags_in_a_group_fill_in_posting_order() {
    let mut p = Pair::new(1, false);
    let group: Vec<RecvBuf> = (0..4).map(|i| rbuf(10_000 * (i + 1), 500, 5)).collect();
    let slot = p.irecv(&group).unwrap();
    for i in 0..4u64 {
        let a = p.isend(sbuf(i * 1000, 100 + i, 5)).unwrap().unwrap();
        assert_eq!(a.entry, i as usize, "send {i} takes buffer {i}");
    }
    p.deliver_all();
    assert_eq!(p.received(slot), Some(vec![100, 101, 102, 103]));
}

#[test]
fn thirty_two_receives_in_flight_then_slots_recycle() {
    let mut p = Pair::new(2, false);
    let slots: Vec<usize> = (0..SLOTS)
        .map(|i| p.irecv(&[rbuf(64 * i as u64, 64, 0)]).unwrap())
        .collect();
    assert_eq!(
        p.irecv(&[rbuf(0, 64, 0)]),
        None,
        "33rd receive waits for a free slot"
    );
    let sends: Vec<Accepted> = (0..SLOTS)
        .map(|i| p.isend(sbuf(i as u64, 64, 0)).unwrap().unwrap())
        .collect();
    p.deliver_all();
    for (slot, a) in slots.iter().zip(&sends) {
        assert_eq!(p.received(*slot), Some(vec![64]));
        p.recv.release(*slot);
        assert_eq!(p.send.poll_done(a.req), Some(64));
        p.send.release(a.req);
    }
    assert_eq!(p.recv.in_flight(), 0);
    for round in 0..3 * SLOTS {
        let slot = p.irecv(&[rbuf(0, 16, 9)]).unwrap();
        let a = p.isend(sbuf(round as u64, 16, 9)).unwrap().unwrap();
        p.deliver_all();
        assert_eq!(p.received(slot), Some(vec![16]));
        assert_eq!(p.recv_mem[0], p.sender_mem[round]);
        p.recv.release(slot);
        p.send.release(a.req);
    }
}

#[test]
fn sender_waits_for_its_own_completion_before_reusing_a_slot() {
    let mut p = Pair::new(1, false);
    let slot = p.irecv(&[rbuf(0, 8, 0)]).unwrap();
    let a = p.isend(sbuf(0, 8, 0)).unwrap().unwrap();
    p.deliver_all();
    p.recv.release(slot);
    // The receiver cycles through every slot while the sender never tests message 0.
    for _ in 1..SLOTS {
        let s = p.irecv(&[rbuf(0, 8, 0)]).unwrap();
        let b = p.isend(sbuf(0, 8, 0)).unwrap().unwrap();
        p.deliver_all();
        p.recv.release(s);
        p.send.release(b.req);
    }
    p.irecv(&[rbuf(0, 8, 0)]).unwrap();
    assert_eq!(
        p.isend(sbuf(0, 8, 0)).unwrap(),
        None,
        "slot 0 still owned by an untested send"
    );
    p.send.release(a.req);
    assert!(p.isend(sbuf(0, 8, 0)).unwrap().is_some());
}

#[test]
fn stray_completions_are_errors() {
    let mut r = RecvSide::new(Layout::single(2, false));
    assert_eq!(r.handle_completion(1, 0).unwrap_err().kind(), Kind::Remote);
    assert_eq!(r.handle_completion(9, 0).unwrap_err().kind(), Kind::Remote);
    let mut s = SendSide::new(Layout::single(1, false));
    assert_eq!(s.handle_completion(0).unwrap_err().kind(), Kind::Misuse);
}

#[test]
fn irecv_rejects_bad_group_sizes() {
    let mut r = RecvSide::new(Layout::single(1, false));
    assert_eq!(r.irecv(&[]).unwrap_err().kind(), Kind::Misuse);
    assert_eq!(
        r.irecv(&[rbuf(0, 1, 0); 9]).unwrap_err().kind(),
        Kind::Misuse
    );
}

#[test]
fn chunks_cover_the_payload_with_aligned_offsets() {
    for size in [0u64, 1, 127, 128, 1000, 4097, 1 << 20, 1_000_003] {
        for used in 1..=8 {
            let mut next = 0;
            for pos in 0..used {
                let (off, len) = Layout::chunk(size, pos, used);
                assert_eq!(off, next, "contiguous");
                assert!(off % CHUNK_ALIGN == 0 || len == 0, "aligned");
                next = off + len;
            }
            assert_eq!(next, size, "size={size} used={used}");
        }
    }
}

#[test]
fn rotation_spreads_messages_over_qps() {
    let l = Layout::single(3, false);
    let used: Vec<usize> = (0..6).map(|s| l.qps_for(s, 1 << 20).start).collect();
    assert_eq!(used, [0, 1, 2, 0, 1, 2]);
    assert_eq!(Layout::single(3, true).qps_for(5, 8), 0..3);
}

#[test]
fn fused_layouts_stripe_large_messages_and_rotate_small_ones() {
    let two = Layout {
        nqps: 4,
        split: false,
        local_members: 2,
        remote_members: 2,
        eager_bytes: 0,
        quiet: false,
        bounce_slots: SLOTS,
    };
    let big: Vec<_> = (0..4).map(|s| two.qps_for(s, STRIPE_MIN_BYTES)).collect();
    assert_eq!(
        big,
        [0..2, 2..4, 0..2, 2..4],
        "one QP per member, both members"
    );
    let small: Vec<usize> = (0..4).map(|s| two.qps_for(s, 8).start).collect();
    assert_eq!(small, [0, 1, 2, 3], "whole messages alternate members");
    let asym = Layout {
        nqps: 2,
        split: false,
        local_members: 1,
        remote_members: 2,
        eager_bytes: 0,
        quiet: false,
        bounce_slots: SLOTS,
    };
    assert_eq!((asym.local_member(1), asym.remote_member(1)), (0, 1));
}

#[test]
fn fused_transfers_use_every_member_with_its_own_keys() {
    for (send_members, recv_members) in [(2, 2), (1, 2), (2, 1), (4, 2)] {
        let rails = send_members.max(recv_members);
        for size in [8, 4096, STRIPE_MIN_BYTES, 300_001] {
            let mut p = Pair::fused(rails, false, send_members, recv_members);
            for round in 0..2 * rails as u64 {
                let slot = p.irecv(&[rbuf(4096, size, 0)]).unwrap();
                let a = p.isend(sbuf(round, size, 0)).unwrap().unwrap();
                p.deliver_all();
                assert_eq!(p.received(slot), Some(vec![size]));
                let (d, s) = (4096, size as usize);
                let r = round as usize;
                assert_eq!(&p.recv_mem[d..d + s], &p.sender_mem[r..r + s], "{size}");
                p.recv.release(slot);
                p.send.release(a.req);
            }
            assert!(
                p.writes_per_qp.iter().all(|&w| w > 0),
                "{send_members}x{recv_members} size {size}: every QP carried data {:?}",
                p.writes_per_qp
            );
        }
    }
}

/// Posts of a send of `size` bytes into a single receive of `capacity`, on one QP.
fn posts_for(capacity: u64, size: u64) -> (Vec<Post>, RecvSide) {
    let mut p = Pair::new(1, false);
    p.irecv(&[rbuf(0, capacity, 0)]).unwrap();
    let a = p.isend(sbuf(0, size, 0)).unwrap().unwrap();
    (a.posts, p.recv)
}

#[test]
fn a_message_just_over_2_gib_goes_as_1_gib_writes_with_the_size_in_the_immediate() {
    let size = (1 << 31) + 1;
    let (posts, _) = posts_for(size, size);
    let lens: Vec<u64> = posts
        .iter()
        .map(|p| match p {
            Post::Write(w) | Post::WriteImm { write: w, .. } => w.len,
            Post::Sizes { .. } | Post::Eager { .. } => {
                panic!("a capacity below 4 GiB needs no sizes ring")
            }
        })
        .collect();
    assert_eq!(lens, [1 << 30, 1 << 30, 1]);
    let Post::WriteImm { write, imm, .. } = posts[2] else {
        panic!("the last write carries the immediate: {posts:?}");
    };
    assert_eq!(u64::from(imm), size, "the immediate is the whole size");
    assert_eq!(write.remote_addr, 1 << 31, "pieces are contiguous");
}

#[test]
fn a_receive_of_4_gib_learns_its_size_from_the_sizes_ring() {
    let size = (3 << 30) + 5;
    let (posts, mut recv) = posts_for(MAX_MESSAGE_BYTES, size);
    let writes: Vec<&RdmaWrite> = posts
        .iter()
        .filter_map(|p| match p {
            Post::Write(w) => Some(w),
            _ => None,
        })
        .collect();
    assert_eq!(writes.len(), 4);
    assert_eq!(writes.iter().map(|w| w.len).sum::<u64>(), size);
    assert!(writes.iter().all(|w| w.len <= MAX_WRITE_BYTES));
    assert!(matches!(posts[4], Post::Sizes { sizes, .. } if sizes[0] == size));
    assert!(matches!(posts[5], Post::WriteImm { imm: 0, .. }));
    recv.handle_completion(0, 0).unwrap();
    let done = recv.poll_done(0).unwrap();
    assert!(done.ringed, "the receiver reads this size from the ring");
}

#[test]
fn messages_beyond_the_advertised_maximum_are_refused_naming_both_sizes() {
    let mut p = Pair::new(1, false);
    let e = p
        .recv
        .irecv(&[rbuf(0, MAX_MESSAGE_BYTES + 1, 0)])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("{} bytes", MAX_MESSAGE_BYTES + 1))
            && e.to_string()
                .contains(&format!("{MAX_MESSAGE_BYTES} bytes")),
        "{e}"
    );
    p.irecv(&[rbuf(0, 64, 0)]).unwrap();
    let e = p.isend(sbuf(0, MAX_MESSAGE_BYTES + 1, 0)).unwrap_err();
    assert_eq!(e.kind(), Kind::Misuse);
    assert!(e.to_string().contains("maxP2pBytes"), "{e}");
}

/// The sender's glue hands each message's posts back (`SendSide::recycle`): a stream of
/// messages then builds every message's posts in the same vector, no allocation per message
/// (on the general way; the single-write way builds no vector).
#[test]
fn recycled_posts_vector_is_reused_by_the_next_message() {
    let mut p = Pair::new(1, false);
    p.single = false;
    let mut vectors = Vec::new();
    for _ in 0..3 * SLOTS {
        let slot = p.irecv(&[rbuf(0, 8, 3)]).unwrap();
        let a = p.isend(sbuf(0, 8, 3)).unwrap().unwrap();
        assert_eq!(a.posts.len(), 1, "one write-with-immediate");
        vectors.push(a.posts.as_ptr());
        p.send.recycle(a.posts);
        p.deliver_all();
        assert_eq!(p.received(slot), Some(vec![8]));
        p.send.release(a.req);
        p.recv.release(slot);
    }
    assert!(
        vectors[1..].iter().all(|&v| v == vectors[0]),
        "every message reused the first message's vector"
    );
}
