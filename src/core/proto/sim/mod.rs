//! Two-sided simulation: a `SendSide` and a `RecvSide` wired together through simulated memory
//! and per-QP in-order queues, so every `Post` and `CtsPost` one side produces becomes the other
//! side's input. It tests the state machines (matching, slots, chunking, truncation), not a NIC.

use std::collections::VecDeque;

use super::*;
use crate::core::xorshift::Rng;

mod eager_path;
mod faults;
mod quiet;
mod random;
mod rendezvous;

const MEM: usize = 1 << 20;

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
    /// With faults: the receiver's writes and the sender's completions travel per lane, and a
    /// failed lane loses what was on it.
    faults: Option<Faults>,
}

/// What the fault mode adds: per lane, the receiver's writes on their way (answers, credits)
/// and the sender's completions not yet polled, and which lanes are down.
struct Faults {
    answers: Vec<VecDeque<Answering>>,
    acks: Vec<usize>,
    down: Vec<bool>,
    /// Per slot, the entries of its latest answer (the receiver's staging).
    staged: Vec<Vec<Cts>>,
    /// The latest credit the receiver wrote.
    credit: u64,
}

/// A write of the receiver into the sender's memory.
#[derive(Clone, Debug)]
enum Answering {
    Entries(usize, Vec<Cts>),
    Credit(u64),
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
        // Both sides of this version offer the default ring.
        let offer = crate::core::config::DEFAULT_EAGER_SLOTS;
        Self::eager_ring(
            eager_bytes,
            tag,
            quiet,
            eager::agreed_bounce_slots(offer, offer, quiet),
        )
    }

    /// [`Self::eager_with`], with a bounce ring of `bounce_slots`.
    fn eager_ring(eager_bytes: u64, tag: i32, quiet: bool, bounce_slots: usize) -> Self {
        let mut p = Self::new(1, false);
        let layout = Layout {
            eager_bytes,
            quiet,
            bounce_slots,
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
            bounce_slots: SLOTS,
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
            faults: None,
        }
    }

    /// Answers and completions from now on travel per lane and can be lost with it.
    fn with_faults(mut self) -> Self {
        let lanes = self.wire.len();
        self.faults = Some(Faults {
            answers: vec![VecDeque::new(); lanes],
            acks: vec![0; lanes],
            down: vec![false; lanes],
            staged: vec![Vec::new(); SLOTS],
            credit: self.credit,
        });
        self
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
        let Some(a) = cts.answer else { return };
        let entries: Vec<Cts> = (0..a.entries(bufs.len()))
            .map(|i| a.entry(bufs, i))
            .collect();
        match &mut self.faults {
            Some(f) => {
                f.staged[cts.slot] = entries.clone();
                if !f.down[cts.qp] {
                    f.answers[cts.qp].push_back(Answering::Entries(cts.slot, entries));
                }
            }
            None => self.write_entries(cts.slot, &entries),
        }
    }

    fn write_entries(&mut self, slot: usize, entries: &[Cts]) {
        for (i, e) in entries.iter().enumerate() {
            self.ring[slot * MAX_RECVS + i] = Some(*e);
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
            self.credit_writes += 1;
            match &mut self.faults {
                Some(f) => {
                    assert!(c > f.credit, "credits only grow");
                    f.credit = c;
                    if !f.down[0] {
                        f.answers[0].push_back(Answering::Credit(c));
                    }
                }
                None => {
                    assert!(c > self.credit, "credits only grow");
                    self.credit = c;
                }
            }
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
                bounce,
                local_addr,
                len,
                ..
            } = *p
                && self.send.layout().quiet
            {
                // The glue copies the payload into the staging ring at post time.
                let (from, n) = (local_addr as usize, len as usize);
                let to = (STAGING_AT + eager::slot_offset(bounce, EAGER)) as usize + 16;
                self.sender_mem.copy_within(from..from + n, to);
            }
            // A lane that is down takes nothing: the sender writes it again when it is
            // repaired.
            if self.faults.as_ref().is_none_or(|f| !f.down[p.qp()]) {
                self.wire[p.qp()].push_back(*p);
            }
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
        let (local, remote) = self.send.route(w.qp);
        assert_eq!(w.lkey, lkey_of(local), "lkey of QP {}", w.qp);
        assert_eq!(w.rkey, rkey_of(remote), "rkey of QP {}", w.qp);
        self.writes_per_qp[w.qp] += 1;
        let (l, r, n) = (
            w.local_addr as usize,
            w.remote_addr as usize,
            w.len as usize,
        );
        self.recv_mem[r..r + n].copy_from_slice(&self.sender_mem[l..l + n]);
    }

    /// Deliver everything, choosing the next QP at random (order within a QP is kept); with
    /// faults, the receiver's writes and the sender's completions too, each lane in order.
    fn deliver_all(&mut self) {
        while self.deliver_one() {}
        self.receiver_writes(false);
        if self.faults.is_some() {
            while self.deliver_one() {}
        }
    }

    /// Deliver one thing on a random lane; false when nothing is left.
    fn deliver_one(&mut self) -> bool {
        let lanes = self.wire.len();
        let busy: Vec<(usize, usize)> = (0..lanes)
            .flat_map(|q| [(q, 0), (q, 1), (q, 2)])
            .filter(|&(q, kind)| match (kind, &self.faults) {
                (0, _) => !self.wire[q].is_empty(),
                (1, Some(f)) => !f.answers[q].is_empty(),
                (2, Some(f)) => f.acks[q] > 0,
                _ => false,
            })
            .collect();
        if busy.is_empty() {
            return false;
        }
        let (qp, kind) = busy[(self.rng.next() % busy.len() as u64) as usize];
        match kind {
            0 => self.deliver_post(qp),
            1 => self.deliver_answer(qp),
            _ => {
                if let Some(f) = &mut self.faults {
                    f.acks[qp] -= 1;
                }
                self.send.handle_completion(qp).unwrap();
            }
        }
        true
    }

    /// The next post on lane `qp` arrives; its completion on the sender follows at once, or
    /// with faults when its acknowledgement is delivered.
    fn deliver_post(&mut self, qp: usize) {
        let closes = match self.wire[qp].pop_front().unwrap() {
            Post::Write(w) => {
                self.copy(&w);
                false
            }
            Post::Sizes { slot, sizes, .. } => {
                self.sizes_ring[slot] = sizes;
                false
            }
            Post::WriteImm { write, imm, .. } => {
                self.copy(&write);
                self.recv.handle_completion(write.qp, imm).unwrap();
                true
            }
            eager @ Post::Eager { .. } => {
                self.land(eager);
                true
            }
        };
        if closes {
            match &mut self.faults {
                Some(f) => f.acks[qp] += 1,
                None => self.send.handle_completion(qp).unwrap(),
            }
        }
    }

    /// The next write of the receiver on lane `qp` lands in the sender's memory.
    fn deliver_answer(&mut self, qp: usize) {
        let Some(f) = &mut self.faults else { return };
        match f.answers[qp].pop_front() {
            Some(Answering::Entries(slot, entries)) => self.write_entries(slot, &entries),
            Some(Answering::Credit(c)) => self.credit = self.credit.max(c),
            None => {}
        }
    }

    /// Lane `qp` fails: a random part of what was on it in each direction gets through (a
    /// prefix: a QP delivers in order, and may stop in the middle of a message), the rest is
    /// lost, and so are the sender's completions not yet polled beyond a random prefix. The
    /// lane takes nothing until [`Self::repair`].
    fn fail(&mut self, qp: usize) {
        let forward = self.rng.below(self.wire[qp].len() as u64 + 1) as usize;
        for _ in 0..forward {
            self.deliver_post(qp);
        }
        self.wire[qp].clear();
        let f = self.faults.as_mut().expect("fault mode");
        let answers = (self.rng.next() % (f.answers[qp].len() as u64 + 1)) as usize;
        let acks = (self.rng.next() % (f.acks[qp] as u64 + 1)) as usize;
        for _ in 0..answers {
            self.deliver_answer(qp);
        }
        let f = self.faults.as_mut().expect("fault mode");
        f.answers[qp].clear();
        f.acks[qp] = 0;
        for _ in 0..acks {
            self.send.handle_completion(qp).unwrap();
        }
        let f = self.faults.as_mut().expect("fault mode");
        f.down[qp] = true;
    }

    /// Lane `qp` is repaired onto members `route` (this side's, the peer's): the receiver
    /// writes again the latest answer of every slot that went on it (and its credit), and the
    /// sender writes again what the receiver did not take.
    fn repair(&mut self, qp: usize, route: (usize, usize)) {
        let f = self.faults.as_mut().expect("fault mode");
        f.down[qp] = false;
        let rewrites: Vec<Answering> = self
            .recv
            .answers_on(qp)
            .map(|(slot, _)| Answering::Entries(slot, f.staged[slot].clone()))
            .collect();
        f.answers[qp].extend(rewrites);
        if self.recv.layout().quiet && qp == 0 && self.recv.credited() > 0 {
            assert_eq!(self.recv.credited(), f.credit);
            f.answers[qp].push_back(Answering::Credit(self.recv.credited()));
        }
        self.send.set_route(qp, route.0, route.1);
        let posts = self.send.replay(qp, self.recv.consumed(qp)).unwrap();
        self.queue(&posts);
    }

    /// The receiver's side of an eager message: it lands in its bounce slot and the receiver
    /// handles the arrival (the sender's completion is the caller's).
    fn land(&mut self, eager: Post) {
        let Post::Eager {
            bounce,
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
            (STAGING_AT + eager::slot_offset(bounce, EAGER)) as usize + 16
        } else {
            local_addr as usize
        };
        let n = len as usize;
        self.bounce[bounce] = (
            EagerHeader { seq, tag },
            self.sender_mem[at..at + n].to_vec(),
        );
        let a = self.recv.announced(imm).expect("an eager immediate");
        let slots = self.recv.layout().bounce_slots;
        assert_eq!(a.slot(slots), bounce);
        let header = self.bounce[a.slot(slots)].0;
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

/// The eager threshold of the eager scenarios' connections.
const EAGER: u64 = 4096;

/// Where the warm-up message of `Pair::eager` lands, away from every test's buffers.
const WARM_UP_AT: u64 = MEM as u64 - 64;

/// `len` bytes from the sender's `src` arrived at the receiver's `dst`, and nothing past them.
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

/// Whether a send went eagerly (one eager write, no CTS awaited).
fn is_eager(a: &Accepted) -> bool {
    matches!(a.posts[..], [Post::Eager { .. }])
}

/// Messages `(index, request or slot)` in flight in a random-traffic test, oldest first; message
/// `i` carries `size(i)` bytes from `src(i)` into `dst(i)`.
struct InFlight<'a> {
    sends: VecDeque<(usize, usize)>,
    /// Each receive's messages, in the order of its entries, and its slot.
    recvs: VecDeque<(Vec<usize>, usize)>,
    size: &'a dyn Fn(usize) -> u64,
    src: &'a dyn Fn(usize) -> u64,
    dst: &'a dyn Fn(usize) -> u64,
}

impl InFlight<'_> {
    fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty()
    }

    /// Complete the oldest receive when it is done: each of its messages' size and bytes checked,
    /// their buffers wiped for the messages a ring later. True when it completed.
    fn finish_receive(&mut self, p: &mut Pair, round: usize) -> bool {
        let Some((messages, slot)) = self.recvs.front() else {
            return false;
        };
        let Some(sizes) = p.received(*slot) else {
            return false;
        };
        let expected: Vec<u64> = messages.iter().map(|&i| (self.size)(i)).collect();
        assert_eq!(sizes, expected, "round {round} messages {messages:?}");
        for &i in messages {
            let (size, dst) = ((self.size)(i), (self.dst)(i) as usize);
            assert_delivered(p, dst as u64, (self.src)(i), size);
            p.recv_mem[dst..=dst + size as usize].fill(0xee);
        }
        p.recv.release(*slot);
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
