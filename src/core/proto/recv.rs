//! The receiving side: posted buffers, their clear-to-sends and answers, completions, eager
//! arrivals and quiet receives.

use super::*;

/// A receive buffer NCCL posted, already registered.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RecvBuf {
    /// Buffer address.
    pub addr: u64,
    /// Capacity in bytes.
    pub size: u64,
    /// Remote keys of its registration, one per local member.
    pub rkeys: [u32; MAX_FUSED_MEMBERS],
    /// Expected tag.
    pub tag: i32,
    /// Registered as host memory: the eager path may copy into it.
    pub host: bool,
}

/// An eager message to copy out of the bounce ring before answering.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EagerCopy {
    /// Bounce slot holding the payload.
    pub bounce_slot: usize,
    /// Destination: the posted buffer.
    pub addr: u64,
    /// Bytes to copy (the message, clamped to the buffer).
    pub len: u64,
}

/// What `irecv` has the glue do: post receives, copy an eager message, and RDMA-write the
/// answer (CTS entries or an eager acknowledgement) into the sender's ring, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtsPost {
    /// Ring slot (entries go to `slot * MAX_RECVS` onwards).
    pub slot: usize,
    /// Post one receive on each of these QPs (empty when the message already arrived eagerly).
    pub recvs: std::ops::Range<usize>,
    /// The QP the answer is written on.
    pub qp: usize,
    /// What the entries say; [`Answer::entry`] spells them out. `None`: nothing is written (a
    /// quiet receive, or a copy the credit will account for).
    pub answer: Option<Answer>,
    /// Copy this first, when the message arrived eagerly and the receive can take it.
    pub copy: Option<EagerCopy>,
}

/// The receiver's answer to a message, as it goes into the sender's CTS ring.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// One CTS entry per buffer of the receive.
    Cts {
        /// The message.
        seq: u64,
        /// Flagged [`eager::REFUSED`]: an eager copy of this message is not taken, the sender
        /// writes it by rendezvous.
        refused: bool,
        /// Every message before this one completed, so every bounce slot that held one was
        /// read ([`eager::with_read_through`]); 0 where the connection does not carry it.
        read_through: u64,
    },
    /// The one entry that acknowledges an eager message copied into the receive.
    Ack {
        /// The message.
        seq: u64,
        /// Bytes copied.
        delivered: u64,
    },
}

impl Answer {
    /// How many entries it writes for a receive of `bufs` buffers.
    pub fn entries(&self, bufs: usize) -> usize {
        match self {
            Self::Cts { .. } => bufs,
            Self::Ack { .. } => 1,
        }
    }

    /// Entry `i` (below [`Self::entries`]) of the answer to the receive of `bufs`. One entry at a
    /// time, built where it is written: a single receive's `irecv` builds one.
    pub fn entry(&self, bufs: &[RecvBuf], i: usize) -> Cts {
        match *self {
            Self::Cts {
                seq,
                refused,
                read_through,
            } => {
                let nreqs = u32::try_from(bufs.len()).unwrap_or(0);
                Cts {
                    addr: bufs[i].addr,
                    size: bufs[i].size,
                    rkeys: eager::with_read_through(bufs[i].rkeys, read_through),
                    tag: bufs[i].tag,
                    nreqs: if refused {
                        nreqs | eager::REFUSED
                    } else {
                        nreqs
                    },
                    seq_plus_one: seq + 1,
                }
            }
            Self::Ack { seq, delivered } => eager::ack(seq, delivered),
        }
    }
}

/// A completed receive, as `test` reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RecvDone {
    /// Buffers in the request.
    pub n: usize,
    /// The sizes are in the sizes ring ([`Layout::uses_sizes_ring`]); otherwise `imm_sum` is the
    /// size.
    pub ringed: bool,
    /// Sum of the immediates: the received size of a single buffer not `ringed`.
    pub imm_sum: u64,
}

#[derive(Copy, Clone, Debug)]
struct RecvSlot {
    seq: u64,
    n: usize,
    ringed: bool,
    pending: usize,
    imm_sum: u64,
    /// The buffer of a single receive.
    single: Option<RecvBuf>,
    /// Its CTS promised to copy an eager message with its tag (a single host-memory receive).
    promised: bool,
    /// Posted quietly: no CTS written (yet).
    quiet: bool,
}

/// An eager message that arrived before its receive was posted.
#[derive(Copy, Clone, Debug)]
struct Arrival {
    seq: u64,
    size: u64,
    tag: i32,
}

/// An eager message's header as the glue read it from the bounce slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EagerHeader {
    /// The sequence number it names.
    pub seq: u64,
    /// The send's tag.
    pub tag: i32,
}

/// What became of an eager message that arrived.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arrived {
    /// Kept for its receive, which is not posted yet (the glue posts the receive its
    /// write-with-immediate used again).
    Kept,
    /// Dropped: the sender writes it again by rendezvous or renumbers it (receive posted again,
    /// as for `Kept`).
    Dropped,
    /// Its receive was posted first, with a CTS that promised the copy: copy it now, and the
    /// receive is done. No receive is posted again: the receive posted for the rendezvous write
    /// that will not come takes its place.
    Copied(EagerCopy),
}

/// The sequence numbers a QP's write-with-immediates complete, oldest first. A receive
/// expects one per QP it uses and at most [`SLOTS`] are in flight, so a fixed ring holds them:
/// `irecv` pushes and every receive completion pops without a bounds check or a growth test.
#[derive(Copy, Clone, Debug, Default)]
struct SeqRing {
    seqs: [u64; SLOTS],
    head: usize,
    len: usize,
}

impl SeqRing {
    /// Append `seq`; `false`, and nothing changed, when the ring is full. The slot check
    /// before every push keeps it from filling: a full ring is a bug, and fails the comm.
    #[inline(always)]
    #[must_use]
    fn push_back(&mut self, seq: u64) -> bool {
        if self.len == SLOTS {
            return false;
        }
        self.seqs[(self.head + self.len) % SLOTS] = seq;
        self.len += 1;
        true
    }

    #[inline(always)]
    fn pop_front(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let seq = self.seqs[self.head % SLOTS];
        self.head = (self.head + 1) % SLOTS;
        self.len -= 1;
        Some(seq)
    }

    /// Drop `seq`, wherever it is (an eager copy completed its receive), keeping the order of
    /// the rest.
    fn remove(&mut self, seq: u64) {
        let mut kept = 0;
        for i in 0..self.len {
            let s = self.seqs[(self.head + i) % SLOTS];
            if s != seq {
                // Writes trail reads: nothing unread is overwritten.
                self.seqs[(self.head + kept) % SLOTS] = s;
                kept += 1;
            }
        }
        self.len = kept;
    }
}

/// The error of a QP whose ring of expected messages is full (out of line: `irecv` never
/// builds it).
#[cold]
#[inline(never)]
fn ring_full(qp: usize) -> Error {
    Error::misuse(format!(
        "more than {SLOTS} messages expected on QP index {qp} (a bug of this plugin)"
    ))
}

/// Receiver side of one connection.
#[derive(Debug)]
pub struct RecvSide {
    layout: Layout,
    next_seq: u64,
    slots: [Option<RecvSlot>; SLOTS],
    /// Per QP, the messages whose write-with-immediate it completes next.
    expected: Vec<SeqRing>,
    /// The message at which the sender renumbers its eager sends (a grouped receive, or one
    /// for another tag): eager messages after it are dropped unanswered, none is copied from
    /// it on.
    stopped_at: Option<u64>,
    /// Per bounce slot, an eager message waiting for its receive.
    arrivals: [Option<Arrival>; SLOTS],
    /// The latest message that arrived eagerly: the next receive may be quiet.
    last_eager: Option<u64>,
    /// The latest message that arrived came eagerly (none came by rendezvous since): the
    /// sender's messages come eagerly, and a receive posted now may stay quiet.
    eager_flowing: bool,
    /// Quiet receives whose CTS must be written now, and whether it refuses a copy
    /// ([`Self::late_answer`]).
    late: Vec<(u64, bool)>,
    /// Every message before this one completed.
    done_through: u64,
    /// The last credit handed to the glue.
    credited: u64,
    /// The latest message that completed without an answer (a copy the credit accounts for):
    /// the sender learns of it from a credit only.
    last_silent: Option<u64>,
    /// Per lane (QP index), the write-with-immediates it completed in all (rendezvous and
    /// eager alike): a repair resumes the lane from there.
    consumed: Vec<u64>,
    /// Per slot, the lane the latest answer written into the sender's ring went on and its
    /// entries: a repair of that lane writes it again from staging (the newest answer of a
    /// slot is the only one the sender may still need).
    answered: [Option<(usize, usize)>; SLOTS],
}

impl RecvSide {
    /// A receiver whose first message is sequence 0.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            next_seq: 0,
            slots: [None; SLOTS],
            expected: vec![SeqRing::default(); layout.nqps],
            stopped_at: None,
            arrivals: [None; SLOTS],
            last_eager: None,
            eager_flowing: false,
            late: Vec::new(),
            done_through: 0,
            credited: 0,
            last_silent: None,
            consumed: vec![0; layout.nqps],
            answered: [None; SLOTS],
        }
    }

    /// The write-with-immediates lane `qp` completed in all.
    pub fn consumed(&self, qp: usize) -> u64 {
        self.consumed.get(qp).copied().unwrap_or(0)
    }

    /// What a repair of lane `qp` writes again: every slot whose latest answer went on that
    /// lane, with its number of entries (the glue writes the entries it staged for it).
    pub fn answers_on(&self, qp: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.answered
            .iter()
            .enumerate()
            .filter_map(move |(slot, a)| {
                a.filter(|(q, _)| *q == qp)
                    .map(|(_, entries)| (slot, entries))
            })
    }

    /// The write-with-immediates lane `qp` still owes (a receive each): a repair posts them on
    /// its new QP.
    pub fn expecting(&self, qp: usize) -> usize {
        self.expected.get(qp).map_or(0, |r| r.len)
    }

    /// Remember the answer `post` writes for a receive of `bufs` buffers as its slot's
    /// latest, with its lane.
    fn record(&mut self, post: &CtsPost, bufs: usize) {
        if let Some(answer) = post.answer {
            self.answered[post.slot] = Some((post.qp, answer.entries(bufs)));
        }
    }

    /// The connection's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether eager messages are still copied on this connection.
    pub fn eager_active(&self) -> bool {
        self.layout.eager_bytes > 0 && self.stopped_at.is_none()
    }

    /// The next receive's message and its bounce slot while eager messages are still copied:
    /// an eager message for it that landed carries that sequence number in the slot's header.
    pub fn next_eager(&self) -> Option<(u64, usize)> {
        self.eager_active()
            .then(|| (self.next_seq, self.layout.bounce_slot(self.next_seq)))
    }

    /// Whether eager message `seq` may be copied into its receive.
    fn copies(&self, seq: u64) -> bool {
        self.layout.eager_bytes > 0 && self.stopped_at.is_none_or(|at| seq < at)
    }

    /// The sender renumbers its eager sends from message `seq` on (see [`eager`]): receives
    /// from there on that were posted quietly get their CTS now.
    fn stop_at(&mut self, seq: u64) {
        if self.stopped_at.is_none() {
            self.stopped_at = Some(seq);
            for a in &mut self.arrivals {
                *a = a.filter(|a| a.seq <= seq);
            }
            for s in seq..self.next_seq {
                self.unquiet(s, true);
            }
        }
    }

    /// Quiet receive `seq` (if it is one) answers after all, with a CTS the glue writes from
    /// [`Self::late_answer`]: flagged refused, or a plain CTS that promises the copy.
    fn unquiet(&mut self, seq: u64, refused: bool) {
        let Some(s) = self.slots[slot_of(seq)]
            .as_mut()
            .filter(|s| s.seq == seq && s.quiet)
        else {
            return;
        };
        s.quiet = false;
        s.promised = !refused;
        self.late.push((seq, refused));
    }

    /// Every receive still quiet writes its CTS now (a plain one, which promises the copy): no
    /// eager message took them within the while the glue waits, so the sender may be holding a
    /// message that cannot go eagerly.
    pub fn announce_all(&mut self) {
        let quiet: Vec<u64> = self.quiet_receives().collect();
        for seq in quiet {
            self.unquiet(seq, false);
        }
    }

    /// Whether a receive is posted quietly (no CTS written yet).
    pub fn has_quiet(&self) -> bool {
        self.quiet_receives().next().is_some()
    }

    fn quiet_receives(&self) -> impl Iterator<Item = u64> + '_ {
        self.waiting().filter(|(_, s)| s.quiet).map(|(seq, _)| seq)
    }

    /// The receives whose message has not completed, in message order. None lies before
    /// [`Self::done_through`] (kept on connections with quiet receives), which only passes
    /// completed ones, nor a ring before the next: a ping-pong's poll looks at a slot or two.
    fn waiting(&self) -> impl Iterator<Item = (u64, &RecvSlot)> + '_ {
        let first = self
            .done_through
            .max(self.next_seq.saturating_sub(SLOTS as u64));
        (first..self.next_seq).filter_map(|seq| self.still_waiting(seq).map(|s| (seq, s)))
    }

    /// The receive of message `seq` when it is posted and its message has not completed.
    fn still_waiting(&self, seq: u64) -> Option<&RecvSlot> {
        self.slots[slot_of(seq)]
            .as_ref()
            .filter(|s| s.seq == seq && s.pending > 0)
    }

    /// The latest message that arrived eagerly.
    pub fn last_eager(&self) -> Option<u64> {
        self.last_eager
    }

    /// A CTS a quiet receive owes the sender now (an eager message it cannot take, a
    /// renumbering, or no message for a while), with the receive's buffer; `None` when none
    /// is owed.
    pub fn late_answer(&mut self) -> Option<(CtsPost, RecvBuf)> {
        let (seq, refused) = self.late.pop()?;
        let slot = slot_of(seq);
        let b = self.slots[slot].and_then(|s| s.single)?;
        let qp = self.layout.qps_for(seq, b.size).start;
        let post = CtsPost {
            slot,
            recvs: qp..qp,
            qp,
            answer: Some(Answer::Cts {
                seq,
                refused,
                read_through: 0,
            }),
            copy: None,
        };
        self.record(&post, 1);
        Some((post, b))
    }

    /// The credit to write as the receive comm closes, when it returns anything: the sender's
    /// comm may be waiting for it to let go of its kept copies.
    pub fn final_credit(&mut self) -> Option<u64> {
        if !self.layout.quiet {
            return None;
        }
        self.advance_done_through();
        (self.done_through > self.credited).then(|| self.take_credit())
    }

    /// What a CTS tells the sender of the bounce ring: every message before the oldest receive
    /// still waiting completed (an eager one copied or dropped, its bounce slot read), on
    /// connections whose ring has fewer slots than message slots (both sides of 0.3.10 or
    /// later: on a whole ring the next CTS in a message's slot tells it); else 0.
    fn read_through(&mut self) -> u64 {
        if self.layout.eager_bytes == 0 || self.layout.bounce_slots >= SLOTS {
            return 0;
        }
        self.advance_done_through();
        self.done_through
    }

    /// Move [`Self::done_through`] past every message whose receive completed.
    fn advance_done_through(&mut self) {
        // Past receives that are done, released, or released with their slot taken by a later
        // receive.
        while self.done_through < self.next_seq && self.still_waiting(self.done_through).is_none() {
            self.done_through += 1;
        }
    }

    /// The latest credit handed to the glue (0 before the first): what a repaired lane writes
    /// again, since the write may have been lost with the lane's old QP.
    pub fn credited(&self) -> u64 {
        self.credited
    }

    /// The credit to write now: every message before [`Self::done_through`].
    fn take_credit(&mut self) -> u64 {
        self.credited = self.done_through;
        self.credited
    }

    /// On a connection with quiet receives, the credit to write into the sender's credit word
    /// now (`answering`: a CTS is being written): every message before it completed, so its
    /// bounce slot was read. Due every [`eager::CREDIT_EVERY`] messages while eager messages
    /// come, and at once when a message completed without an answer while the sender may wait
    /// for a CTS (one being written, or one written for a receive still waiting): the sender
    /// reads answers in message order, so it needs the credit to get past that message.
    pub fn credit_due(&mut self, answering: bool) -> Option<u64> {
        if !self.layout.quiet {
            return None;
        }
        self.advance_done_through();
        if self.done_through <= self.credited {
            return None;
        }
        let silent = self
            .last_silent
            .is_some_and(|s| s >= self.credited && s < self.done_through);
        let eager_since = self.last_eager.is_some_and(|e| e >= self.credited);
        let periodic = eager_since && self.done_through >= self.credited + eager::CREDIT_EVERY;
        (periodic || (silent && (answering || self.answered_waiting()))).then(|| self.take_credit())
    }

    /// Whether a receive whose CTS went out still waits for its message: the sender may be
    /// waiting for a credit to get past a silent message before it.
    fn answered_waiting(&self) -> bool {
        self.waiting().any(|(_, s)| !s.quiet)
    }

    /// `Some` when `imm` announces an eager message on a connection that negotiated them;
    /// the glue then reads its header from the bounce slot and calls [`Self::eager_arrived`].
    pub fn announced(&self, imm: u32) -> Option<Announced> {
        Announced::from_imm(imm).filter(|_| self.layout.eager_bytes > 0)
    }

    /// An eager message arrived (its write-with-immediate completed). Kept for its receive
    /// when that is not posted yet. When the receive was posted first, its CTS already told the
    /// sender what happens: a CTS that promised the copy (a single host-memory receive for this
    /// tag that the whole message fits) gets it now; any other CTS made the sender write the
    /// message again by rendezvous or renumber it, and the copy is dropped. Messages the sender
    /// renumbers are dropped too.
    ///
    /// # Errors
    /// `Remote` when the message cannot be one the sender may have sent.
    pub fn eager_arrived(&mut self, a: Announced, header: EagerHeader) -> Result<Arrived> {
        // Eager messages travel on connections of one lane.
        self.consumed[0] += 1;
        let seq = a.seq_near(self.next_seq, SLOTS as u64);
        let slot = slot_of(seq);
        let bad = |what: String| Err(Error::new(Kind::Remote, what));
        if a.size > self.layout.eager_bytes {
            return bad(format!(
                "eager message {seq} of {} bytes exceeds the agreed {} bytes",
                a.size, self.layout.eager_bytes
            ));
        }
        // A bounce slot is written again only after the receiver showed it read it (see
        // `eager`): a newer header here is a sender that broke that rule.
        if header.seq != seq {
            return bad(format!(
                "eager message {seq} arrived with the header of message {}",
                header.seq
            ));
        }
        if self.stopped_at.is_some_and(|at| seq > at) {
            return Ok(Arrived::Dropped);
        }
        self.last_eager = Some(self.last_eager.map_or(seq, |l| l.max(seq)));
        self.eager_flowing = true;
        if seq >= self.next_seq {
            self.arrivals[slot] = Some(Arrival {
                seq,
                size: a.size,
                tag: header.tag,
            });
            return Ok(Arrived::Kept);
        }
        let copies = self.copies(seq);
        let Some(posted) = self.slots[slot].as_mut() else {
            return bad(format!(
                "eager message {seq} arrived after its receive completed"
            ));
        };
        match posted.single {
            Some(b) if posted.promised && fits(a.size, &b, header.tag) && copies => {
                let len = a.size;
                if posted.quiet {
                    self.last_silent = Some(seq);
                }
                posted.pending = 0;
                posted.imm_sum = len;
                posted.quiet = false;
                for q in self.layout.qps_for(seq, b.size) {
                    // Its write-with-immediate never comes: the copy completed the receive.
                    self.expected[q].remove(seq);
                }
                Ok(Arrived::Copied(EagerCopy {
                    bounce_slot: self.layout.bounce_slot(seq),
                    addr: b.addr,
                    len,
                }))
            }
            Some(b) if b.tag != header.tag => {
                // The sender renumbers from here on, having read a CTS for another tag (a
                // quiet receive writes it now).
                self.stop_at(seq);
                Ok(Arrived::Dropped)
            }
            _ => {
                // A message too large for the buffer: a quiet receive writes its CTS now, and
                // the sender writes the message again by rendezvous, truncated.
                self.unquiet(seq, true);
                Ok(Arrived::Dropped)
            }
        }
    }

    /// Post `bufs` as one request. `Ok(None)`: every slot is busy, NCCL retries later.
    /// On success returns the request's sequence number and what the glue must do: post the
    /// receives, then (after copying an eager message that already arrived, which completes
    /// the request at once) write the answer into the sender's ring.
    ///
    /// # Errors
    /// `Misuse` when `bufs` is empty or longer than [`MAX_RECVS`], or a buffer is larger than
    /// [`MAX_MESSAGE_BYTES`].
    #[inline(always)]
    pub fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<(u64, CtsPost)>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::misuse(format!(
                "irecv with n={} (must be 1..={MAX_RECVS})",
                bufs.len()
            )));
        }
        for b in bufs {
            check_message_size(b.size, "a receive buffer")?;
        }
        let seq = self.next_seq;
        let slot = slot_of(seq);
        if self.slots[slot].is_some() {
            return Ok(None);
        }
        let capacity = capacity(bufs.iter().map(|b| b.size));
        let qps = self.layout.qps_for(seq, capacity);
        let single = (bufs.len() == 1).then(|| bufs[0]);
        let promised = single.is_some_and(|b| b.host) && self.copies(seq);
        if bufs.len() > 1 {
            // The sender cannot tell a grouped receive from single ones: it renumbers.
            self.stop_at(seq);
        }
        let arrival = self.arrivals[slot].take().filter(|a| a.seq == seq);
        if let Some(a) = arrival {
            if let Some(b) = single
                && b.host
                && fits(a.size, &b, a.tag)
                && self.copies(seq)
            {
                let len = a.size;
                let silent = self.layout.quiet;
                if silent {
                    self.last_silent = Some(seq);
                }
                self.slots[slot] = Some(RecvSlot {
                    seq,
                    n: 1,
                    ringed: false,
                    pending: 0,
                    imm_sum: len,
                    single,
                    promised,
                    quiet: false,
                });
                self.next_seq += 1;
                let copy = EagerCopy {
                    bounce_slot: self.layout.bounce_slot(seq),
                    addr: b.addr,
                    len,
                };
                let post = CtsPost {
                    slot,
                    recvs: qps.start..qps.start,
                    qp: qps.start,
                    // With quiet receives, the credit accounts for the copy.
                    answer: (!silent).then_some(Answer::Ack {
                        seq,
                        delivered: len,
                    }),
                    copy: Some(copy),
                };
                self.record(&post, 1);
                return Ok(Some((seq, post)));
            }
            if single.is_some_and(|b| b.tag != a.tag) {
                self.stop_at(seq);
            }
        }
        // A message that arrived eagerly and was not copied above, or one the sender may have
        // sent eagerly already and that is not copied here, goes again by rendezvous.
        let refused = arrival.is_some() || (self.layout.eager_bytes > 0 && !promised);
        // The sender's latest message came eagerly, so this one likely will too (see the
        // module doc).
        let quiet = self.layout.quiet && promised && arrival.is_none() && self.eager_flowing;
        for q in qps.clone() {
            if !self.expected[q].push_back(seq) {
                return Err(ring_full(q));
            }
        }
        self.slots[slot] = Some(RecvSlot {
            seq,
            n: bufs.len(),
            ringed: self.layout.uses_sizes_ring(bufs.len(), capacity),
            pending: qps.len(),
            imm_sum: 0,
            single,
            promised,
            quiet,
        });
        self.next_seq += 1;
        let read_through = self.read_through();
        let post = CtsPost {
            slot,
            qp: qps.start,
            recvs: qps,
            answer: (!quiet).then_some(Answer::Cts {
                seq,
                refused,
                read_through,
            }),
            copy: None,
        };
        self.record(&post, bufs.len());
        Ok(Some((seq, post)))
    }

    /// Account for a write-with-immediate that completed on QP `qp`.
    ///
    /// # Errors
    /// `Remote` when no message was expected on that QP (the peer broke the protocol).
    pub fn handle_completion(&mut self, qp: usize, imm: u32) -> Result<()> {
        if let Some(c) = self.consumed.get_mut(qp) {
            *c += 1;
        }
        let seq = self
            .expected
            .get_mut(qp)
            .and_then(SeqRing::pop_front)
            .ok_or_else(|| {
                Error::new(
                    Kind::Remote,
                    format!("unexpected write-with-immediate on QP index {qp}"),
                )
            })?;
        let slot = self.slots[slot_of(seq)].as_mut().ok_or_else(|| {
            Error::new(
                Kind::Remote,
                format!("completion for message {seq} whose receive is gone"),
            )
        })?;
        slot.pending = slot.pending.saturating_sub(1);
        slot.imm_sum += u64::from(imm);
        self.eager_flowing = false;
        Ok(())
    }

    /// The result of the request in `slot`, once every completion arrived.
    pub fn poll_done(&self, slot: usize) -> Option<RecvDone> {
        let s = self.slots.get(slot)?.as_ref()?;
        (s.pending == 0).then_some(RecvDone {
            n: s.n,
            ringed: s.ringed,
            imm_sum: s.imm_sum,
        })
    }

    /// Free `slot` after NCCL saw it done.
    pub fn release(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = None;
        }
    }

    /// The message slot the next `irecv` takes.
    pub fn next_slot(&self) -> usize {
        slot_of(self.next_seq)
    }

    /// Requests posted and not yet released.
    pub fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }
}

#[cfg(test)]
mod seq_ring_tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Step {
        Push,
        Pop,
        /// Remove the entry this far from the front (modulo the length); `SLOTS`: a number
        /// not there.
        Remove(usize),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => Just(Step::Push),
            2 => Just(Step::Pop),
            1 => (0..SLOTS + 1).prop_map(Step::Remove),
        ]
    }

    proptest! {
        /// The ring answers as a queue of at most `SLOTS` would, through many wraps.
        #[test]
        fn the_ring_keeps_the_order_a_queue_keeps(steps in proptest::collection::vec(step(), 1..400)) {
            let mut ring = SeqRing::default();
            let mut model = VecDeque::new();
            let mut next = 0u64;
            for s in steps {
                match s {
                    Step::Push if model.len() < SLOTS => {
                        prop_assert!(ring.push_back(next));
                        model.push_back(next);
                        next += 1;
                    }
                    // A full ring refuses, and keeps what it holds (checked below).
                    Step::Push => prop_assert!(!ring.push_back(next)),
                    Step::Pop => prop_assert_eq!(ring.pop_front(), model.pop_front()),
                    Step::Remove(k) => {
                        let present = (k < SLOTS).then(|| model.get(k % model.len().max(1))).flatten();
                        let seq = present.copied().unwrap_or(u64::MAX);
                        ring.remove(seq);
                        model.retain(|&s| s != seq);
                    }
                }
                let held: Vec<u64> = (0..ring.len).map(|i| ring.seqs[(ring.head + i) % SLOTS]).collect();
                prop_assert_eq!(held, Vec::from(model.clone()));
            }
        }
    }
}
