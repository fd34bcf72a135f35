//! Two-sided simulation: a `SendSide` and a `RecvSide` wired together through simulated memory
//! and per-QP in-order queues, so every `Post` and `CtsPost` one side produces becomes the other
//! side's input. It tests the state machines (matching, slots, chunking, truncation), not a NIC.

use std::collections::VecDeque;

use super::*;

const MEM: usize = 1 << 20;

/// Deterministic xorshift, so failures reproduce.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Pair {
    send: SendSide,
    recv: RecvSide,
    ring: Vec<Option<Cts>>,
    sizes_ring: Vec<[u64; MAX_RECVS]>,
    sender_mem: Vec<u8>,
    recv_mem: Vec<u8>,
    wire: Vec<VecDeque<Post>>,
    rng: Rng,
    /// Writes seen per QP, to check striping.
    writes_per_qp: Vec<usize>,
    /// The receiver's bounce ring: per slot its header and its payload.
    bounce: Vec<(EagerHeader, Vec<u8>)>,
    /// `isend` tries [`SendSide::isend_single`] first, as the glue does.
    single: bool,
    /// Sends that went the single-write way.
    singles: usize,
    /// The sender's credit word (quiet receives).
    credit: u64,
    /// Answers the receiver wrote into the ring, and credits.
    cts_writes: usize,
    credit_writes: usize,
}

/// Where the sender's staging ring lies in its memory (quiet receives).
const STAGING_AT: u64 = (MEM / 2) as u64;

/// Keys of member `m`: the simulation checks every write uses the pair its QP connects.
const fn lkey_of(m: usize) -> u32 {
    3 + 10 * m as u32
}
const fn rkey_of(m: usize) -> u32 {
    7 + 10 * m as u32
}

impl Pair {
    fn new(nqps: usize, split: bool) -> Self {
        Self::fused(nqps, split, 1, 1)
    }

    /// A one-QP connection that agreed on eager messages of up to `eager_bytes` and carried one
    /// message for `tag` (eager sends follow the tag of the last receive).
    fn eager(eager_bytes: u64, tag: i32) -> Self {
        Self::eager_with(eager_bytes, tag, false)
    }

    /// [`Self::eager`], with quiet receives when `quiet`.
    fn eager_with(eager_bytes: u64, tag: i32, quiet: bool) -> Self {
        let mut p = Self::new(1, false);
        let layout = Layout {
            eager_bytes,
            quiet,
            ..p.send.layout()
        };
        let staging = Staging {
            addr: STAGING_AT,
            lkeys: std::array::from_fn(lkey_of),
        };
        p.send = if quiet {
            SendSide::with_staging(layout, staging)
        } else {
            SendSide::new(layout)
        };
        p.recv = RecvSide::new(layout);
        let slot = p.irecv(&[rbuf(WARM_UP_AT, 8, tag)]).unwrap();
        let a = p.isend(sbuf(0, 8, tag)).unwrap().unwrap();
        p.deliver_all();
        assert_eq!(p.received(slot), Some(vec![8]));
        assert_eq!(p.sent(a.req), Some(8));
        p.send.release(a.req);
        p.recv.release(slot);
        p
    }

    /// A sender with `send_members` ports against a receiver with `recv_members`.
    fn fused(nqps: usize, split: bool, send_members: usize, recv_members: usize) -> Self {
        let layout = Layout {
            nqps,
            split,
            local_members: send_members,
            remote_members: recv_members,
            eager_bytes: 0,
            quiet: false,
        };
        let mirrored = Layout {
            local_members: recv_members,
            remote_members: send_members,
            ..layout
        };
        let sender_mem = (0..MEM).map(|i| (i % 251) as u8).collect();
        Self {
            send: SendSide::new(layout),
            recv: RecvSide::new(mirrored),
            ring: vec![None; SLOTS * MAX_RECVS],
            sizes_ring: vec![[0; MAX_RECVS]; SLOTS],
            sender_mem,
            recv_mem: vec![0xee; MEM],
            wire: vec![VecDeque::new(); nqps],
            rng: Rng(0x2545_f491_4f6c_dd1d),
            writes_per_qp: vec![0; nqps],
            bounce: vec![(EagerHeader { seq: 0, tag: 0 }, Vec::new()); SLOTS],
            single: true,
            singles: 0,
            credit: 0,
            cts_writes: 0,
            credit_writes: 0,
        }
    }

    /// What the receiver's glue does: post, copy an eager message that arrived, answer.
    fn irecv(&mut self, bufs: &[RecvBuf]) -> Option<usize> {
        let (_, cts) = self.recv.irecv(bufs).unwrap()?;
        assert_eq!(cts.recvs.is_empty(), cts.copy.is_some());
        self.answer(&cts, bufs);
        self.receiver_writes(cts.answer.is_some());
        Some(cts.slot)
    }

    /// Copy an eager message out of the bounce ring, then write the entries into the ring.
    fn answer(&mut self, cts: &CtsPost, bufs: &[RecvBuf]) {
        if let Some(c) = cts.copy {
            self.copy_eager(c);
        }
        self.cts_writes += usize::from(cts.answer.is_some());
        if let Some(a) = cts.answer {
            for i in 0..a.entries(bufs.len()) {
                self.ring[cts.slot * MAX_RECVS + i] = Some(a.entry(bufs, i));
            }
        }
    }

    /// What the receiver's glue does once quiet receives waited long enough: each writes its
    /// CTS.
    fn time_passes(&mut self) {
        self.recv.announce_all();
        self.receiver_writes(false);
    }

    /// What the receiver's glue writes after handling something: the CTS quiet receives owe,
    /// and the credit when one is due.
    fn receiver_writes(&mut self, answered: bool) {
        let mut answering = answered;
        while let Some((cts, buf)) = self.recv.late_answer() {
            self.answer(&cts, &[buf]);
            answering = true;
        }
        if let Some(c) = self.recv.credit_due(answering) {
            assert!(c > self.credit, "credits only grow");
            self.credit = c;
            self.credit_writes += 1;
        }
    }

    fn copy_eager(&mut self, c: EagerCopy) {
        let (at, len) = (c.addr as usize, c.len as usize);
        let payload = &self.bounce[c.bounce_slot].1;
        self.recv_mem[at..at + len].copy_from_slice(&payload[..len]);
    }

    /// What the sender's glue does: the single-write way when the next message's CTS allows
    /// it, else take what arrived in the CTS ring, then `isend`.
    fn isend(&mut self, buf: SendBuf) -> Result<Option<Accepted>> {
        if let Some(single) = self.isend_single(buf)? {
            self.singles += 1;
            self.queue(&[single.post]);
            return Ok(Some(Accepted {
                req: single.req,
                entry: 0,
                truncated: single.truncated,
                posts: vec![single.post],
            }));
        }
        self.read_answers()?;
        let accepted = self.send.isend(buf)?;
        if let Some(a) = &accepted {
            self.queue(&a.posts);
        }
        Ok(accepted)
    }

    fn isend_single(&mut self, buf: SendBuf) -> Result<Option<SingleSend>> {
        let Some((seq, slot)) = self.send.single_cts().filter(|_| self.single) else {
            return Ok(None);
        };
        match self.ring[slot * MAX_RECVS].filter(|c| c.seq_plus_one == seq + 1) {
            Some(cts) => self.send.isend_single(&cts, buf),
            None => Ok(None),
        }
    }

    fn queue(&mut self, posts: &[Post]) {
        for p in posts {
            if let Post::Eager {
                slot,
                local_addr,
                len,
                ..
            } = *p
                && self.send.layout().quiet
            {
                // The glue copies the payload into the staging ring at post time.
                let (from, n) = (local_addr as usize, len as usize);
                let to = (STAGING_AT + eager::slot_offset(slot, EAGER)) as usize + 16;
                self.sender_mem.copy_within(from..from + n, to);
            }
            self.wire[p.qp()].push_back(*p);
        }
    }

    /// Read the CTS ring as the glue does, in the order the sender asks for (the credit word
    /// first).
    fn read_answers(&mut self) -> Result<()> {
        if self.send.wants_credit() {
            self.send.handle_credit(self.credit)?;
        }
        while let Some((seq, slot)) = self.send.wants_cts() {
            let first = self.ring[slot * MAX_RECVS].filter(|c| c.seq_plus_one > seq);
            let Some(first) = first else { return Ok(()) };
            // A later message's CTS stands for an eager message's answer: its first entry alone.
            let n = if first.seq_plus_one > seq + 1 {
                1
            } else {
                ((first.nreqs & !eager::REFUSED) as usize).max(1)
            };
            let entries: Group<Cts> = self.ring[slot * MAX_RECVS..slot * MAX_RECVS + n]
                .iter()
                .flatten()
                .copied()
                .collect();
            let posts = self.send.handle_cts(&entries)?;
            self.queue(&posts);
        }
        Ok(())
    }

    /// What `test` on a send request reports (it reads the ring only when sends wait on it).
    fn sent(&mut self, req: usize) -> Option<u64> {
        if self.send.waits_on_ring() {
            self.read_answers().unwrap();
        }
        self.send.poll_done(req)
    }

    fn copy(&mut self, w: &RdmaWrite) {
        let layout = self.send.layout();
        assert_eq!(
            w.lkey,
            lkey_of(layout.local_member(w.qp)),
            "lkey of QP {}",
            w.qp
        );
        assert_eq!(
            w.rkey,
            rkey_of(layout.remote_member(w.qp)),
            "rkey of QP {}",
            w.qp
        );
        self.writes_per_qp[w.qp] += 1;
        let (l, r, n) = (
            w.local_addr as usize,
            w.remote_addr as usize,
            w.len as usize,
        );
        self.recv_mem[r..r + n].copy_from_slice(&self.sender_mem[l..l + n]);
    }

    /// Deliver everything, choosing the next QP at random (order within a QP is kept).
    fn deliver_all(&mut self) {
        while let Some(qp) = {
            let busy: Vec<usize> = (0..self.wire.len())
                .filter(|&q| !self.wire[q].is_empty())
                .collect();
            (!busy.is_empty()).then(|| busy[(self.rng.next() % busy.len() as u64) as usize])
        } {
            match self.wire[qp].pop_front().unwrap() {
                Post::Write(w) => self.copy(&w),
                Post::Sizes { slot, sizes, .. } => self.sizes_ring[slot] = sizes,
                Post::WriteImm { write, imm, slot } => {
                    self.copy(&write);
                    self.recv.handle_completion(write.qp, imm).unwrap();
                    self.send.handle_completion(slot).unwrap();
                }
                eager @ Post::Eager { slot, .. } => {
                    self.land(eager);
                    self.send.handle_completion(slot).unwrap();
                }
            }
        }
        self.receiver_writes(false);
    }

    /// The receiver's side of an eager message: it lands in its bounce slot and the receiver
    /// handles the arrival (the sender's completion is the caller's).
    fn land(&mut self, eager: Post) {
        let Post::Eager {
            slot,
            seq,
            tag,
            local_addr,
            len,
            imm,
            ..
        } = eager
        else {
            panic!("not an eager message: {eager:?}");
        };
        // With quiet receives the payload leaves from the staging copy.
        let at = if self.send.layout().quiet {
            (STAGING_AT + eager::slot_offset(slot, EAGER)) as usize + 16
        } else {
            local_addr as usize
        };
        let n = len as usize;
        self.bounce[slot] = (
            EagerHeader { seq, tag },
            self.sender_mem[at..at + n].to_vec(),
        );
        let a = self.recv.announced(imm).expect("an eager immediate");
        assert_eq!(a.slot(SLOTS), slot);
        let header = self.bounce[a.slot(SLOTS)].0;
        if let Arrived::Copied(c) = self.recv.eager_arrived(a, header).unwrap() {
            self.copy_eager(c);
        }
    }

    /// Deliver what is on the wire (an eager message) and post a receive of `buf`, the receive
    /// first or the delivery first; the receive's slot.
    fn land_and_receive(&mut self, receive_first: bool, buf: RecvBuf) -> usize {
        if receive_first {
            let slot = self.irecv(&[buf]).unwrap();
            self.deliver_all();
            slot
        } else {
            self.deliver_all();
            self.irecv(&[buf]).unwrap()
        }
    }

    /// Received sizes of the request in `slot`, as `test` reports them.
    fn received(&self, slot: usize) -> Option<Vec<u64>> {
        let done = self.recv.poll_done(slot)?;
        Some(if !done.ringed {
            vec![done.imm_sum]
        } else {
            self.sizes_ring[slot][..done.n].to_vec()
        })
    }
}

fn rbuf(addr: u64, size: u64, tag: i32) -> RecvBuf {
    RecvBuf {
        addr,
        size,
        rkeys: std::array::from_fn(rkey_of),
        tag,
        host: true,
    }
}
fn sbuf(addr: u64, size: u64, tag: i32) -> SendBuf {
    SendBuf {
        addr,
        size,
        lkeys: std::array::from_fn(lkey_of),
        tag,
        host: true,
    }
}

fn transfer(nqps: usize, split: bool, size: u64) {
    let mut p = Pair::new(nqps, split);
    let dst = 4096;
    let slot = p.irecv(&[rbuf(dst, size, 1)]).unwrap();
    let a = p.isend(sbuf(100, size, 1)).unwrap().unwrap();
    assert_eq!((a.entry, a.truncated), (0, None));
    assert_eq!(slot, 0);
    assert_eq!(p.send.poll_done(a.req), None, "not done before delivery");
    p.deliver_all();
    assert_eq!(
        p.received(slot),
        Some(vec![size]),
        "nqps={nqps} split={split} size={size}"
    );
    assert_eq!(p.send.poll_done(a.req), Some(size));
    let (d, s) = (dst as usize, size as usize);
    assert_eq!(
        &p.recv_mem[d..d + s],
        &p.sender_mem[100..100 + s],
        "payload"
    );
    assert_eq!(p.recv_mem[d + s], 0xee, "nothing written past the message");
}

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

// The eager path (see `core::eager`): every scenario below runs on a one-QP connection that
// agreed on eager messages of up to 4096 bytes.

const EAGER: u64 = 4096;

/// Where the warm-up message of `Pair::eager` lands, away from every test's buffers.
const WARM_UP_AT: u64 = MEM as u64 - 64;

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

fn assert_delivered(p: &Pair, dst: u64, src: u64, len: u64) {
    let (d, s, n) = (dst as usize, src as usize, len as usize);
    assert_eq!(
        &p.recv_mem[d..d + n],
        &p.sender_mem[s..s + n],
        "payload at {dst}"
    );
    assert_eq!(
        p.recv_mem[d + n],
        0xee,
        "nothing written past the message at {dst}"
    );
}

fn is_eager(a: &Accepted) -> bool {
    matches!(a.posts[..], [Post::Eager { .. }])
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
fn credits_run_out_after_a_ring_of_unanswered_eager_messages() {
    let mut p = Pair::eager(EAGER, 1);
    let sends: Vec<Accepted> = (0..SLOTS as u64)
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
    assert_eq!(
        p.isend(sbuf(0, 8, 1)).unwrap(),
        None,
        "the slot is NCCL's until tested"
    );
    assert_eq!(p.sent(sends[0].req), Some(8));
    p.send.release(sends[0].req);
    let next = p.isend(sbuf(512, 8, 1)).unwrap().unwrap();
    assert!(is_eager(&next), "the acknowledgement returned the credit");
    for (i, a) in sends.iter().enumerate().skip(1) {
        let s = p.irecv(&[rbuf(8192 + 64 * i as u64, 8, 1)]).unwrap();
        assert_eq!(p.received(s), Some(vec![8]));
        assert_delivered(&p, 8192 + 64 * i as u64, i as u64 * 8, 8);
        assert_eq!(p.sent(a.req), Some(8));
    }
}

/// The race a pipelined benchmark hit on rxe (32 in flight): an eager message whose receive
/// was posted first is promised, the sender's write completes and NCCL reuses the request,
/// but the receiver has not handled the arrival yet. When the ring comes round to that slot,
/// the next message must not be written into the bounce slot the receiver is still to read
/// (it read the newer header: "eager message N arrived with the header of message N+32").
#[test]
fn a_bounce_slot_is_not_written_again_before_the_receiver_read_it() {
    let mut p = Pair::eager(EAGER, 1);
    let a = p.isend(sbuf(0, 8, 1)).unwrap().unwrap();
    assert!(is_eager(&a));
    let promised = p.irecv(&[rbuf(4096, 8, 1)]).unwrap();
    let qp = a.posts[0].qp();
    let held = p.wire[qp].pop_front().unwrap();
    let Post::Eager { slot, .. } = held else {
        panic!("not an eager message: {held:?}");
    };
    p.send.handle_completion(slot).unwrap();
    assert_eq!(
        p.sent(a.req),
        Some(8),
        "promised and written: done for NCCL"
    );
    p.send.release(a.req);
    // Round the ring: every other slot carries an eager message, acknowledged.
    for i in 1..SLOTS as u64 {
        let b = p.isend(sbuf(8 * i, 8, 1)).unwrap().unwrap();
        assert!(is_eager(&b), "message {i} after the promised one");
        p.deliver_all();
        let r = p.irecv(&[rbuf(4096 + 64 * i, 8, 1)]).unwrap();
        assert_eq!(p.received(r), Some(vec![8]));
        assert_eq!(p.sent(b.req), Some(8));
        p.send.release(b.req);
        p.recv.release(r);
    }
    assert_eq!(
        p.isend(sbuf(512, 8, 1)).unwrap(),
        None,
        "the promised message's bounce slot is unread: wait for the CTS"
    );
    p.land(held);
    assert_eq!(p.received(promised), Some(vec![8]));
    assert_delivered(&p, 4096, 0, 8);
    p.recv.release(promised);
    let r = p.irecv(&[rbuf(8192, 8, 1)]).unwrap();
    let c = p.isend(sbuf(512, 8, 1)).unwrap().unwrap();
    assert!(!is_eager(&c), "went with its CTS");
    p.deliver_all();
    assert_eq!(p.received(r), Some(vec![8]));
    assert_delivered(&p, 8192, 512, 8);
    let d = p.isend(sbuf(520, 8, 1)).unwrap().unwrap();
    assert!(
        is_eager(&d),
        "the CTS showed the slot read: eager again after it"
    );
}

/// Messages `(index, request or slot)` in flight in a random-traffic test, oldest first; message
/// `i` carries `size(i)` bytes from `src(i)` into `dst(i)`.
struct InFlight<'a> {
    sends: VecDeque<(usize, usize)>,
    recvs: VecDeque<(usize, usize)>,
    size: &'a dyn Fn(usize) -> u64,
    src: &'a dyn Fn(usize) -> u64,
    dst: &'a dyn Fn(usize) -> u64,
}

impl InFlight<'_> {
    fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty()
    }

    /// Complete the oldest receive when it is done: its size and bytes checked, its buffer wiped
    /// for the message a ring later. True when it completed.
    fn finish_receive(&mut self, p: &mut Pair, round: usize) -> bool {
        let Some(&(i, slot)) = self.recvs.front() else {
            return false;
        };
        let Some(sizes) = p.received(slot) else {
            return false;
        };
        let (size, dst) = ((self.size)(i), (self.dst)(i));
        assert_eq!(sizes, vec![size], "round {round} message {i}");
        assert_delivered(p, dst, (self.src)(i), size);
        p.recv_mem[dst as usize..dst as usize + 8192].fill(0xee);
        p.recv.release(slot);
        self.recvs.pop_front();
        true
    }

    /// Complete the oldest send when it is done, checking the size it reports. True when it
    /// completed.
    fn finish_send(&mut self, p: &mut Pair, round: usize) -> bool {
        let Some(&(i, req)) = self.sends.front() else {
            return false;
        };
        let Some(size) = p.sent(req) else {
            return false;
        };
        assert_eq!(size, (self.size)(i), "round {round} send {i}");
        p.send.release(req);
        self.sends.pop_front();
        true
    }
}

/// Random interleavings of both paths: each message is posted receive-first or send-first,
/// sized around the threshold, sent from host or GPU memory, with deliveries at random points
/// (receives stay in host memory: one refusal ends the eager path, tested on its own). Every
/// message must arrive byte-exact in its own buffer and both sides must report its size.
#[test]
fn eager_and_rendezvous_messages_mix_in_any_order() {
    for quiet in [false, true] {
        mix_in_any_order(quiet);
    }
}

fn mix_in_any_order(quiet: bool) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..40 {
        let mut p = Pair::eager_with(EAGER, 3, quiet);
        let count = 3 * SLOTS;
        let (mut sent, mut posted, mut eager) = (0, 0, 0);
        let size = |i: usize| [0, 8, EAGER - 1, EAGER, EAGER + 1, 100][i % 6] + (i / 6) as u64;
        let src = |i: usize| (i as u64 * 97) % 4096;
        let dst = |i: usize| 16_384 + (i % SLOTS) as u64 * 8192;
        let mut fly = InFlight {
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            size: &size,
            src: &src,
            dst: &dst,
        };
        let mut steps = 0;
        while sent < count || posted < count || !fly.is_empty() {
            steps += 1;
            if steps == 200_000 {
                eprintln!("{:#?}\n{:#?}\ncredit {}", p.send, p.recv, p.credit);
                panic!("round {round}: stalled at send {sent}, receive {posted}");
            }
            match rng.next() % 4 {
                0 if sent < count && fly.sends.len() < SLOTS => {
                    let host = !rng.next().is_multiple_of(5);
                    let buf = SendBuf {
                        host,
                        ..sbuf(src(sent), size(sent), 3)
                    };
                    if let Some(a) = p.isend(buf).unwrap() {
                        eager += usize::from(is_eager(&a));
                        fly.sends.push_back((sent, a.req));
                        sent += 1;
                    }
                }
                // In odd rounds receives lag: message i's receive only after send i - 1.
                1 if posted < count
                    && fly.recvs.len() < SLOTS / 2
                    && (round % 2 == 0 || posted <= sent) =>
                {
                    if let Some(slot) = p.irecv(&[rbuf(dst(posted), 2 * EAGER, 3)]) {
                        fly.recvs.push_back((posted, slot));
                        posted += 1;
                    }
                }
                2 => {
                    p.deliver_all();
                    // Sometimes long enough for quiet receives to announce themselves.
                    if rng.next().is_multiple_of(3) {
                        p.time_passes();
                    }
                }
                _ => {
                    fly.finish_receive(&mut p, round);
                    fly.finish_send(&mut p, round);
                }
            }
        }
        assert!(
            p.send.eager_active() && p.recv.eager_active(),
            "single receives never stop it"
        );
        assert!(
            round % 2 == 0 || eager > count / 8,
            "round {round}: {eager} of {count} went eager"
        );
    }
}

/// Both sides with a full ring in flight, as a pipelined benchmark runs them (32 sends and 32
/// receives outstanding, each completed in order), at random relative speeds: in some rounds
/// the sender rarely looks at its ring, so the receiver copies eager messages and goes round
/// the ring before their answers are read. Every message arrives byte-exact and both sides
/// finish: a stall (no progress in many steps) fails the test.
#[test]
fn a_full_ring_in_flight_on_both_sides_never_stalls() {
    for quiet in [false, true] {
        full_ring_never_stalls(quiet);
    }
}

fn full_ring_never_stalls(quiet: bool) {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for round in 0..60 {
        let mut p = Pair::eager_with(EAGER, 3, quiet);
        let count = 6 * SLOTS;
        // The sender's share of the steps: from one in two down to one in 256.
        let sender_every = 2 << (round % 8);
        let (mut sent, mut posted, mut idle) = (0, 0, 0);
        let size = |i: usize| (i as u64 * 37) % (EAGER + 64);
        let src = |i: usize| (i as u64 * 97) % 4096;
        let dst = |i: usize| 16_384 + (i % SLOTS) as u64 * 8192;
        let mut fly = InFlight {
            sends: VecDeque::new(),
            recvs: VecDeque::new(),
            size: &size,
            src: &src,
            dst: &dst,
        };
        while sent < count || !fly.is_empty() {
            idle += 1;
            if idle >= 10_000 {
                eprintln!("{:#?}\n{:#?}\ncredit {}", p.send, p.recv, p.credit);
            }
            assert!(
                idle < 10_000,
                "round {round}: stalled at send {sent}, receive {posted}"
            );
            let sender_turn = rng.next().is_multiple_of(sender_every);
            let progressed = match (sender_turn, rng.next() % 3) {
                (true, 0) if sent < count && fly.sends.len() < SLOTS => {
                    let accepted = p.isend(sbuf(src(sent), size(sent), 3)).unwrap();
                    accepted
                        .map(|a| {
                            fly.sends.push_back((sent, a.req));
                            sent += 1;
                        })
                        .is_some()
                }
                (true, _) => fly.finish_send(&mut p, round),
                (false, 0) if posted < count && fly.recvs.len() < SLOTS => {
                    let slot = p.irecv(&[rbuf(dst(posted), 2 * EAGER, 3)]);
                    slot.map(|slot| {
                        fly.recvs.push_back((posted, slot));
                        posted += 1;
                    })
                    .is_some()
                }
                (false, 1) => {
                    p.deliver_all();
                    if rng.next().is_multiple_of(3) {
                        p.time_passes();
                    }
                    false
                }
                (false, _) => fly.finish_receive(&mut p, round),
            };
            if progressed {
                idle = 0;
            }
        }
    }
}

/// One seeded random schedule of sends and receives (tags 3 and 4, single and grouped
/// receives, sizes around the eager threshold and above the receive, host and GPU sends),
/// every call's outcome written down.
fn schedule_trace(seed: u64, single: bool, quiet: bool) -> (Vec<String>, usize) {
    let mut rng = Rng(seed);
    let mut p = Pair::eager_with(EAGER, 3, quiet);
    (p.single, p.singles) = (single, 0);
    let mut trace = Vec::new();
    let (mut sends, mut recvs) = (VecDeque::new(), VecDeque::new());
    for step in 0..600 {
        let tag = 3 + i32::from(rng.next().is_multiple_of(4));
        match rng.next() % 5 {
            0 | 1 if sends.len() < SLOTS => {
                let size = [0, 8, EAGER, EAGER + 1, 3000, 9000][(rng.next() % 6) as usize];
                let buf = SendBuf {
                    host: !rng.next().is_multiple_of(6),
                    ..sbuf((step % 64) * 16, size, tag)
                };
                let a = p.isend(buf).unwrap();
                if let Some(a) = &a {
                    sends.push_back(a.req);
                }
                trace.push(format!("isend {buf:?}: {a:?}"));
            }
            2 if recvs.len() < SLOTS / 2 => {
                let dst = 16_384 + (step % SLOTS as u64) * 16_384;
                let bufs = if rng.next().is_multiple_of(8) {
                    vec![rbuf(dst, 4096, tag), rbuf(dst + 8192, 4096, 7 - tag)]
                } else {
                    vec![rbuf(dst, 4096, tag)]
                };
                let slot = p.irecv(&bufs);
                if let Some(slot) = slot {
                    recvs.push_back(slot);
                }
                trace.push(format!("irecv {bufs:?}: {slot:?}"));
            }
            3 => {
                p.deliver_all();
                if rng.next().is_multiple_of(3) {
                    p.time_passes();
                }
            }
            _ => {
                if let Some(&req) = sends.front()
                    && let Some(size) = p.sent(req)
                {
                    p.send.release(req);
                    sends.pop_front();
                    trace.push(format!("sent {req}: {size}"));
                }
                if let Some(&slot) = recvs.front()
                    && let Some(sizes) = p.received(slot)
                {
                    p.recv.release(slot);
                    recvs.pop_front();
                    trace.push(format!("received {slot}: {sizes:?}"));
                }
            }
        }
    }
    let memory = p
        .recv_mem
        .iter()
        .fold(0u64, |h, &b| h.rotate_left(5) ^ u64::from(b));
    trace.push(format!("memory {memory:x}"));
    (trace, p.singles)
}

/// The single-write way (`isend_single`, taken by the glue when the next message's CTS is a
/// single receive with the send's tag) is only a shortcut: over random schedules, with it and
/// without it, every call returns the same, every message lands the same.
#[test]
fn the_single_write_way_changes_no_outcome() {
    for (seed, quiet) in (1..=40u64).flat_map(|s| [(s, false), (s, true)]) {
        let seed = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let ((with, singles), (without, none)) = (
            schedule_trace(seed, true, quiet),
            schedule_trace(seed, false, quiet),
        );
        let started = with
            .iter()
            .filter(|t| t.starts_with("isend") && t.contains("Some"))
            .count();
        // With quiet receives most sends go eagerly, a few by the single-write way.
        assert!(
            (quiet || singles > 10) && started > singles,
            "seed {seed:#x}: {singles} of {started} sends went the single-write way"
        );
        assert_eq!(none, 0);
        assert_eq!(with, without, "seed {seed:#x}");
    }
}

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
    assert!(
        p.send.slots.iter().all(Option::is_none),
        "nothing left in flight"
    );
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
