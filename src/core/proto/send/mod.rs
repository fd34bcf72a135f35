//! The sending side: captured clear-to-sends, matching sends to them, the writes that carry a
//! message; the eager path is in `eager_path`.

use super::rendezvous::{Rendezvous, entries_mask};
use super::*;

mod eager_path;

/// Requests a send side can have in flight: every entry of every slot, plus the eager sends a
/// renumbering holds back (one per slot).
pub const SEND_REQUESTS: usize = SLOTS * (MAX_RECVS + 1);

/// How an eager message goes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Eager {
    /// Before its CTS: the receiver answers it, or (quiet receive) the credit accounts for it.
    Unannounced,
    /// Into a receive whose CTS promised the copy: delivered once written.
    Promised,
}

/// The request of an eager send NCCL already saw done (its payload is in the staging ring):
/// what is left of it completes without NCCL.
pub(super) const DETACHED: usize = usize::MAX;

/// The sender's staging ring for eager messages on a connection with quiet receives: slot `s`
/// at [`eager::slot_offset`]`(s)`, a header and then the payload, as in the bounce ring.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Staging {
    /// Address of slot 0.
    pub addr: u64,
    /// Local keys of its registration, one per local member.
    pub lkeys: [u32; MAX_FUSED_MEMBERS],
}

#[derive(Copy, Clone, Debug)]
enum SlotState {
    /// Sent eagerly; `delivered` (whole) once the receiver acknowledged it, promised the copy
    /// or went past it, `sent` once the sender's own write completed (NCCL may then reuse the
    /// buffer). With quiet receives, `buf` is the copy in the staging ring and the send is
    /// done once sent; NCCL may release it before it is delivered (`req` is then [`DETACHED`]).
    Eager {
        req: usize,
        buf: SendBuf,
        delivered: bool,
        sent: bool,
    },
    /// By rendezvous: the slot's [`Rendezvous`] holds its CTS and matched sends.
    Rendezvous,
}

#[derive(Copy, Clone, Debug)]
struct SendSlot {
    seq: u64,
    state: SlotState,
}

/// Where a request stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Request {
    Free,
    /// Part of message `seq`.
    In(u64),
    /// An eager send whose message was renumbered, waiting for a CTS entry with its tag.
    Held,
}

/// One message's last write on one lane (QP index): the write-with-immediate the receiver counts,
/// with whatever writes of the message on that lane precede it.
#[derive(Copy, Clone, Debug)]
enum Unit {
    /// An eager message, written from `buf` (NCCL's buffer, held until the send completes).
    Eager { slot: usize, seq: u64, buf: SendBuf },
    /// The lane's part of a message that goes by rendezvous.
    Rendezvous { slot: usize, seq: u64 },
}

/// What one lane carried and the sender has not seen complete, oldest first: completions on a
/// QP come in posting order, so each pops the front; a repair writes again what the receiver
/// did not take.
#[derive(Clone, Debug, Default)]
struct LaneLog {
    /// Units of this lane before `units[0]`, all complete.
    taken: u64,
    units: VecDeque<Unit>,
}

/// Sender side of one connection.
#[derive(Debug)]
pub struct SendSide {
    layout: Layout,
    /// The message the next send joins.
    next_seq: u64,
    slots: [Option<SendSlot>; SLOTS],
    /// Per slot, the CTS and matched sends of the message in it while it goes by rendezvous.
    rendezvous: Vec<Rendezvous>,
    requests: Vec<Request>,
    free_requests: Vec<usize>,
    /// Eager messages whose answer has not been read, oldest first.
    awaiting: VecDeque<u64>,
    /// Eager sends a renumbering took back, in sending order, for the next CTS entries.
    held: VecDeque<(usize, SendBuf)>,
    /// The eager path is negotiated and no renumbering switched it off.
    eager: bool,
    /// The tag of the last single receive whose CTS arrived: only a send with this tag goes
    /// eager. A connection's first message, and a send for another tag, wait for their CTS as
    /// with NCCL's own transport (a tag nobody receives stays a NULL request, and a guess that
    /// would renumber the messages is not made).
    expected_tag: Option<i32>,
    /// Per lane, the units it carries that have not completed.
    logs: Vec<LaneLog>,
    /// Per lane, the members its QP connects (this side's, the peer's): the layout's, until a
    /// repair moves the lane.
    routes: Vec<(usize, usize)>,
    /// Per bounce slot (the first [`Layout::bounce_slots`]), the eager message written into it
    /// that the receiver has not yet shown it read: an acknowledgement of it or of a later eager
    /// message shows it (written after the copy, see `acknowledged`), and so do a CTS (of a
    /// receive a ring of [`SLOTS`] or more later, or one that says how far the receiver has
    /// read: `cts_arrived`) and a credit past it. A promise or a refusal does not: the receiver
    /// reads the bounce slot when it handles the arrival, which may come after the sender's own
    /// write completed. No eager message goes into such a slot.
    unread: [Option<u64>; SLOTS],
    /// The vector the next [`Accepted::posts`] is built in, handed back by [`Self::recycle`]
    /// so that sending allocates nothing once it has grown to a message's posts.
    spare_posts: Vec<Post>,
    /// Where eager payloads are copied with quiet receives.
    staging: Option<Staging>,
    /// The latest credit taken.
    credit: u64,
}

impl SendSide {
    /// A sender whose first message is sequence 0.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            next_seq: 0,
            slots: [None; SLOTS],
            rendezvous: vec![Rendezvous::default(); SLOTS],
            requests: vec![Request::Free; SEND_REQUESTS],
            free_requests: (0..SEND_REQUESTS).rev().collect(),
            awaiting: VecDeque::with_capacity(SLOTS),
            held: VecDeque::with_capacity(SLOTS),
            eager: layout.eager_bytes > 0,
            expected_tag: None,
            logs: (0..layout.nqps)
                .map(|_| LaneLog {
                    taken: 0,
                    units: VecDeque::with_capacity(2 * SLOTS),
                })
                .collect(),
            routes: (0..layout.nqps)
                .map(|qp| (layout.local_member(qp), layout.remote_member(qp)))
                .collect(),
            unread: [None; SLOTS],
            credit: 0,
            spare_posts: Vec::new(),
            staging: None,
        }
    }

    /// A sender on a connection with quiet receives, whose eager payloads go through `staging`.
    pub fn with_staging(layout: Layout, staging: Staging) -> Self {
        Self {
            staging: Some(staging),
            ..Self::new(layout)
        }
    }

    /// The connection's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Whether the eager path is still in use on this connection.
    pub fn eager_active(&self) -> bool {
        self.eager
    }

    /// Give back the posts of an [`Accepted`] once they were posted, for the next message.
    pub fn recycle(&mut self, posts: Vec<Post>) {
        self.spare_posts = posts;
    }

    /// Whether sends wait on the CTS ring for more than the next `isend`: eager messages for
    /// their answers, held sends for their CTS. `test` then reads the ring too.
    pub fn waits_on_ring(&self) -> bool {
        !self.awaiting.is_empty() || !self.held.is_empty()
    }

    /// `Some((seq, slot))`: the glue should read that CTS ring slot and, once its entries
    /// carry `seq + 1`, pass them to [`Self::handle_cts`]; when the first entry carries a later
    /// number, pass that entry alone. The oldest eager message's answer comes first; otherwise
    /// the next message's CTS, when its slot is free. Inlined: `isend` asks once per call.
    #[inline(always)]
    pub fn wants_cts(&self) -> Option<(u64, usize)> {
        if let Some(&seq) = self.awaiting.front() {
            return Some((seq, slot_of(seq)));
        }
        let slot = slot_of(self.next_seq);
        self.slots[slot].is_none().then_some((self.next_seq, slot))
    }

    /// Take the entries the glue read for [`Self::wants_cts`]'s message (all `nreqs` of them,
    /// or the one acknowledgement of an eager message). Returns posts to make now: a refused
    /// eager message written again by rendezvous, or held sends that completed a message.
    ///
    /// An eager message's answer can be gone before the sender reads it: a receive that copied
    /// the message completes without the sender, and NCCL may post the next receive in that
    /// slot (a ring later), whose CTS overwrites the answer. Such a later entry is taken as the
    /// answer: the message was copied whole. (A message that goes by rendezvous cannot be
    /// overtaken so: its receive waits for the sender's write.)
    ///
    /// # Errors
    /// `Remote` when the entries are inconsistent (the receiver broke the protocol).
    pub fn handle_cts(&mut self, entries: &[Cts]) -> Result<Vec<Post>> {
        if let Some(&seq) = self.awaiting.front() {
            return self.answer(seq, entries);
        }
        self.take_cts(entries)?;
        Ok(self.match_held())
    }

    /// The next message goes by rendezvous into the receive whose CTS is `entries`.
    #[inline(always)]
    fn take_cts(&mut self, entries: &[Cts]) -> Result<&mut Rendezvous> {
        let seq = self.next_seq;
        let refusing = refused(entries);
        check_cts(seq, entries)?;
        self.cts_arrived(entries);
        if entries.len() > 1 {
            // A grouped receive: the receiver stops taking eager messages too.
            self.eager = false;
        }
        // Only a receive that would take a copy predicts the next message's.
        self.expected_tag = (entries.len() == 1 && !refusing).then(|| entries[0].tag);
        Ok(self.start_rendezvous(seq, entries))
    }

    /// Where the CTS [`Self::isend_single`] takes lies: `Some((seq, slot))` when no eager
    /// message awaits its answer, no send is held and the next message's slot is free, so
    /// that reading the ring would hand [`Self::handle_cts`] that message's CTS and nothing
    /// before it.
    #[inline(always)]
    pub fn single_cts(&self) -> Option<(u64, usize)> {
        if !self.awaiting.is_empty() || !self.held.is_empty() {
            return None;
        }
        self.wants_cts()
    }

    /// NCCL's usual send in one step: what [`Self::handle_cts`] with the single entry `cts`
    /// (read for [`Self::single_cts`]) and then [`Self::isend`] of `buf` do, when `buf`
    /// matches that entry and the message goes as one write on one QP. `Ok(None)`, with
    /// nothing changed, for anything else: the caller then takes the general way.
    ///
    /// # Errors
    /// `Misuse` when `buf` is larger than [`MAX_MESSAGE_BYTES`].
    #[inline(always)]
    pub fn isend_single(&mut self, cts: &Cts, buf: SendBuf) -> Result<Option<SingleSend>> {
        check_message_size(buf.size, "a send")?;
        let seq = self.next_seq;
        let slot = slot_of(seq);
        if self.promise_takes(cts, &buf) {
            // It goes eagerly into the promised copy instead (see `isend`).
            return Ok(None);
        }
        let single = cts.seq_plus_one == seq + 1
            && cts.nreqs & !eager::REFUSED == 1
            && cts.tag == buf.tag
            && self.single_cts().is_some()
            && !self.free_requests.is_empty();
        let Some(qp) = single
            .then(|| self.one_write(seq, cts.size, buf.size))
            .flatten()
        else {
            return Ok(None);
        };
        let members = self.routes[qp];
        self.take_cts(std::slice::from_ref(cts))?;
        let req = self.take_request(seq).unwrap_or_default();
        let rendezvous = &mut self.rendezvous[slot];
        let truncated = rendezvous.take_entry(0, buf, req);
        let write = RdmaWrite::chunk(qp, members, cts, &rendezvous.sends[0].0, 0, 1);
        rendezvous.pending = 1;
        rendezvous.posted = true;
        self.logs[qp]
            .units
            .push_back(Unit::Rendezvous { slot, seq });
        self.next_seq += 1;
        Ok(Some(SingleSend {
            req,
            truncated,
            post: Post::WriteImm {
                write,
                imm: u32::try_from(write.len).unwrap_or(u32::MAX),
                slot,
            },
        }))
    }

    /// The QP, when message `seq` of a `size`-byte send into a single receive of `capacity`
    /// bytes goes as one write-with-immediate on one QP (NCCL's usual message): its size
    /// travels in the immediate and one write carries the payload.
    #[inline(always)]
    fn one_write(&self, seq: u64, capacity: u64, size: u64) -> Option<usize> {
        let qps = self.layout.qps_for(seq, capacity);
        let single = qps.len() == 1
            && !self.layout.uses_sizes_ring(1, capacity)
            && size.min(capacity) <= MAX_WRITE_BYTES;
        single.then_some(qps.start)
    }

    /// Message `seq` goes by rendezvous into the receive that posted `entries`.
    #[inline(always)]
    fn start_rendezvous(&mut self, seq: u64, entries: &[Cts]) -> &mut Rendezvous {
        let slot = slot_of(seq);
        self.slots[slot] = Some(SendSlot {
            seq,
            state: SlotState::Rendezvous,
        });
        let rendezvous = &mut self.rendezvous[slot];
        rendezvous.reset(entries);
        rendezvous
    }

    /// Match held sends, oldest first, to the next message's CTS entries; its posts once every
    /// entry is matched.
    fn match_held(&mut self) -> Vec<Post> {
        let seq = self.next_seq;
        let slot = slot_of(seq);
        let Some(rendezvous) = rendezvous_at(&self.slots, &mut self.rendezvous, seq) else {
            return Vec::new();
        };
        let mut k = 0;
        while k < self.held.len() {
            let (req, buf) = self.held[k];
            if rendezvous.take(buf, req).is_some() {
                if let Some(r) = self.requests.get_mut(req) {
                    *r = Request::In(seq);
                }
                self.held.remove(k);
            } else {
                k += 1;
            }
        }
        if !rendezvous.all_matched() {
            return Vec::new();
        }
        self.next_seq += 1;
        self.layout_posts(slot)
    }

    /// Accept `buf` for the next message: matched to the first unmatched entry of its CTS
    /// with the same tag (entries with equal tags fill in posting order), or sent eagerly when
    /// its CTS has not arrived and the eager path may take it. `Ok(None)`: neither is possible
    /// yet (no CTS, or no unmatched entry with this tag); NCCL retries later, as with its own
    /// transport (`ncclIbIsend` returns a NULL request after the tag loop, net_ib/p2p.cc).
    ///
    /// The glue reads the ring for [`Self::wants_cts`] first, so "no CTS" means it had not
    /// arrived at that moment.
    ///
    /// # Errors
    /// `Misuse` when `buf` is larger than [`MAX_MESSAGE_BYTES`].
    pub fn isend(&mut self, buf: SendBuf) -> Result<Option<Accepted>> {
        check_message_size(buf.size, "a send")?;
        if self.held.iter().any(|(_, h)| h.tag == buf.tag) {
            // An earlier send with this tag is still unmatched: this one must not overtake it.
            return Ok(None);
        }
        let slot = slot_of(self.next_seq);
        match &self.slots[slot] {
            Some(SendSlot {
                seq,
                state: SlotState::Rendezvous,
            }) if *seq == self.next_seq && !self.rendezvous[slot].posted => {
                let r = &self.rendezvous[slot];
                if r.cts.len() == 1 && r.matched == 0 && self.promise_takes(&r.cts[0], &buf) {
                    return Ok(self.send_eager(buf, Eager::Promised));
                }
                Ok(self.match_send(buf))
            }
            None if self.awaiting.len() < SLOTS && self.eager_fits(&buf) => {
                Ok(self.send_eager(buf, Eager::Unannounced))
            }
            _ => Ok(None),
        }
    }

    #[inline(always)]
    fn take_request(&mut self, seq: u64) -> Option<usize> {
        let req = self.free_requests.pop()?;
        self.requests[req] = Request::In(seq);
        Some(req)
    }

    fn match_send(&mut self, buf: SendBuf) -> Option<Accepted> {
        let seq = self.next_seq;
        let slot = slot_of(seq);
        // Peek first: a request is taken only for a send that matches.
        let entry = self.rendezvous[slot].free_entry(buf.tag)?;
        let req = self.take_request(seq)?;
        let rendezvous = &mut self.rendezvous[slot];
        let truncated = rendezvous.take_entry(entry, buf, req);
        let mut accepted = Accepted {
            req,
            entry,
            truncated,
            posts: Vec::new(),
        };
        if rendezvous.all_matched() {
            accepted.posts = self.layout_posts(slot);
            self.next_seq += 1;
        }
        Some(accepted)
    }

    fn layout_posts(&mut self, slot_index: usize) -> Vec<Post> {
        let Some(SendSlot {
            seq,
            state: SlotState::Rendezvous,
        }) = self.slots[slot_index]
        else {
            return Vec::new();
        };
        let slot = &self.rendezvous[slot_index];
        let capacity = capacity(slot.cts.iter().map(|c| c.size));
        let qps = self.layout.qps_for(seq, capacity);
        let used = qps.len();
        let mut posts = std::mem::take(&mut self.spare_posts);
        posts.clear();
        for qp in qps {
            self.lane_posts(slot_index, qp, &mut posts);
            self.logs[qp].units.push_back(Unit::Rendezvous {
                slot: slot_index,
                seq,
            });
        }
        let slot = &mut self.rendezvous[slot_index];
        slot.pending = used;
        slot.posted = true;
        posts
    }

    /// The writes lane `qp` carries of the rendezvous message in `slot_index` (every entry
    /// matched), with the keys of the lane's route, ending with its write-with-immediate.
    fn lane_posts(&self, slot_index: usize, qp: usize, posts: &mut Vec<Post>) {
        let Some(SendSlot { seq, .. }) = self.slots[slot_index] else {
            return;
        };
        let slot = &self.rendezvous[slot_index];
        let n = slot.cts.len();
        let capacity = capacity(slot.cts.iter().map(|c| c.size));
        let qps = self.layout.qps_for(seq, capacity);
        let (pos, used) = (qp - qps.start, qps.len());
        let members = self.routes[qp];
        // Every entry is matched, so the first one is.
        let first = slot.sends[0].0;
        if !self.layout.uses_sizes_ring(n, capacity) {
            // The payload's last write carries the immediate: the bytes this QP delivered
            // (they fit: the capacity does).
            let write = RdmaWrite::chunk(qp, members, &slot.cts[0], &first, pos, used);
            let imm = u32::try_from(write.len).unwrap_or(u32::MAX);
            if write.len <= MAX_WRITE_BYTES {
                // NCCL's usual message: one write carries it.
                posts.push(Post::WriteImm {
                    write,
                    imm,
                    slot: slot_index,
                });
                return;
            }
            let mut pieces = write.pieces().peekable();
            while let Some(piece) = pieces.next() {
                posts.push(if pieces.peek().is_some() {
                    Post::Write(piece)
                } else {
                    Post::WriteImm {
                        write: piece,
                        imm,
                        slot: slot_index,
                    }
                });
            }
            return;
        }
        let mut sizes = [0u64; MAX_RECVS];
        for (i, (buf, _)) in slot.sends[..n].iter().enumerate() {
            sizes[i] = buf.size;
            let write = RdmaWrite::chunk(qp, members, &slot.cts[i], buf, pos, used);
            posts.extend(write.pieces().filter(|w| w.len > 0).map(Post::Write));
        }
        posts.push(Post::Sizes {
            qp,
            members,
            slot: slot_index,
            sizes,
        });
        // A zero-length write-with-immediate closes the message on this QP.
        let write = RdmaWrite {
            len: 0,
            ..RdmaWrite::chunk(qp, members, &slot.cts[0], &first, 0, 1)
        };
        posts.push(Post::WriteImm {
            write,
            imm: 0,
            slot: slot_index,
        });
    }

    /// The members lane `qp`'s QP connects (this side's, the peer's).
    pub fn route(&self, qp: usize) -> (usize, usize) {
        self.routes[qp]
    }

    /// Lane `qp` now connects this side's member `local` to the peer's `remote`: its writes
    /// use their keys.
    pub fn set_route(&mut self, qp: usize, local: usize, remote: usize) {
        self.routes[qp] = (local, remote);
    }

    /// A repair of lane `qp` resumes with `consumed` of its messages taken by the receiver:
    /// those complete (whether or not this side saw their completions), and the rest are
    /// written again, in order, with the lane's route. Returns those writes.
    ///
    /// # Errors
    /// `Remote` when the receiver says it took more than the lane carried.
    pub fn replay(&mut self, qp: usize, consumed: u64) -> Result<Vec<Post>> {
        let Some(log) = self.logs.get(qp) else {
            return Ok(Vec::new());
        };
        let carried = log.taken + log.units.len() as u64;
        if consumed < log.taken || consumed > carried {
            return Err(Error::new(
                Kind::Remote,
                format!(
                    "the receiver took {consumed} messages on QP index {qp}, which carried \
                     {carried} ({} complete here)",
                    log.taken
                ),
            ));
        }
        while self.logs[qp].taken < consumed {
            self.handle_completion(qp)?;
        }
        let units: Vec<Unit> = self.logs[qp].units.iter().copied().collect();
        let mut posts = Vec::new();
        for unit in units {
            match unit {
                Unit::Eager { .. } => posts.push(self.eager_post(qp, unit)),
                Unit::Rendezvous { slot, .. } => self.lane_posts(slot, qp, &mut posts),
            }
        }
        Ok(posts)
    }

    /// Account for the oldest unit of lane `qp` completing (the write-with-immediate that
    /// closes it; completions on a QP come in posting order).
    ///
    /// # Errors
    /// `Misuse` for a lane with nothing in flight (a stray completion).
    pub fn handle_completion(&mut self, qp: usize) -> Result<()> {
        let Some(unit) = self.logs.get_mut(qp).and_then(|l| l.units.pop_front()) else {
            return Err(Error::misuse(format!(
                "send completion on QP index {qp}, which carries nothing"
            )));
        };
        self.logs[qp].taken += 1;
        match unit {
            Unit::Eager { slot, seq, .. } => {
                // An eager write whose message went on by rendezvous, or was renumbered, before
                // this completion arrived has nothing left to account for.
                if let Some(SendSlot {
                    seq: s,
                    state: SlotState::Eager { sent, .. },
                }) = self.slots[slot].as_mut()
                    && *s == seq
                {
                    *sent = true;
                }
            }
            Unit::Rendezvous { slot, seq } => {
                let here = matches!(
                    self.slots[slot],
                    Some(SendSlot {
                        seq: s,
                        state: SlotState::Rendezvous,
                    }) if s == seq
                );
                let r = &mut self.rendezvous[slot];
                if !here || r.pending == 0 {
                    return Err(Error::misuse(format!(
                        "send completion for message {seq}, which is not in flight"
                    )));
                }
                r.pending -= 1;
                if r.pending == 0 && r.tested == entries_mask(r.cts.len()) {
                    // Only sends NCCL saw done before (detached eager ones): nobody tests it.
                    self.slots[slot] = None;
                }
            }
        }
        Ok(())
    }

    /// The slot of request `req`'s message, while the request is in flight.
    fn slot_of_request(&self, req: usize) -> Option<usize> {
        let Request::In(seq) = *self.requests.get(req)? else {
            return None;
        };
        let slot = slot_of(seq);
        self.slots[slot]
            .as_ref()
            .is_some_and(|s| s.seq == seq)
            .then_some(slot)
    }

    /// No message slot holds anything (the simulation's end-of-scenario check).
    #[cfg(test)]
    pub(super) fn nothing_in_flight(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// Whether messages whose requests may be done still need this side: eager messages whose
    /// fate is not known (a refusal is written again from the kept copy), held sends, and
    /// rendezvous writes in flight.
    pub fn undelivered(&self) -> bool {
        !self.awaiting.is_empty()
            || !self.held.is_empty()
            || self.slots.iter().zip(&self.rendezvous).any(|(s, r)| {
                matches!(
                    s,
                    Some(SendSlot {
                        state: SlotState::Rendezvous,
                        ..
                    })
                ) && r.pending > 0
            })
    }

    /// Bytes delivered by request `req`, once its message completed (an eager one once the
    /// receiver acknowledged it).
    pub fn poll_done(&self, req: usize) -> Option<u64> {
        let slot = self.slot_of_request(req)?;
        match &self.slots[slot].as_ref()?.state {
            SlotState::Eager {
                buf,
                delivered,
                sent,
                ..
            } => {
                let kept = self.staging.is_some();
                (*sent && (*delivered || kept)).then_some(buf.size)
            }
            SlotState::Rendezvous => {
                let r = &self.rendezvous[slot];
                (r.posted && r.pending == 0)
                    .then(|| r.entry_of(req))
                    .flatten()
                    .map(|e| r.sends[e].0.size)
            }
        }
    }

    /// What each send of the message in `slot` carries on each QP, once its writes were
    /// handed out: the eager message's one write, or each matched send's chunk on every QP
    /// the message uses (as [`Self::isend`] laid them out). Empty for a slot with nothing
    /// posted.
    pub fn qp_shares(&self, slot: usize) -> Vec<QpShare> {
        let Some(Some(s)) = self.slots.get(slot) else {
            return Vec::new();
        };
        match s.state {
            SlotState::Eager { req, buf, .. } => vec![QpShare {
                req,
                qp: self.layout.qps_for(s.seq, buf.size).start,
                len: buf.size,
                with_imm: true,
            }],
            SlotState::Rendezvous => {
                let r = &self.rendezvous[slot];
                if !r.posted {
                    return Vec::new();
                }
                let n = r.cts.len();
                let capacity = capacity(r.cts.iter().map(|c| c.size));
                let with_imm = !self.layout.uses_sizes_ring(n, capacity);
                let qps = self.layout.qps_for(s.seq, capacity);
                let used = qps.len();
                qps.enumerate()
                    .flat_map(|(pos, qp)| {
                        r.sends[..n].iter().map(move |&(buf, req)| QpShare {
                            req,
                            qp,
                            len: Layout::chunk(buf.size, pos, used).1,
                            with_imm,
                        })
                    })
                    .collect()
            }
        }
    }

    /// NCCL saw request `req` done; a message's slot is freed when all its requests were.
    pub fn release(&mut self, req: usize) {
        let Some(slot) = self.slot_of_request(req) else {
            return;
        };
        let free = match self.slots[slot].as_mut().map(|s| &mut s.state) {
            Some(SlotState::Rendezvous) => {
                let r = &mut self.rendezvous[slot];
                if let Some(e) = r.entry_of(req) {
                    r.tested |= 1 << e;
                }
                r.tested == entries_mask(r.cts.len())
            }
            Some(SlotState::Eager {
                delivered: false,
                req,
                ..
            }) => {
                // A send whose copy is in the staging ring: the slot stays until delivered.
                *req = DETACHED;
                false
            }
            _ => true,
        };
        if free {
            self.slots[slot] = None;
        }
        self.requests[req] = Request::Free;
        self.free_requests.push(req);
    }
}

/// The captured CTS of message `seq`, when its slot holds one.
fn rendezvous_at<'a>(
    slots: &[Option<SendSlot>],
    rendezvous: &'a mut [Rendezvous],
    seq: u64,
) -> Option<&'a mut Rendezvous> {
    let slot = slot_of(seq);
    match slots[slot] {
        Some(SendSlot {
            state: SlotState::Rendezvous,
            ..
        }) => Some(&mut rendezvous[slot]),
        _ => None,
    }
}

/// Whether the receiver flagged `entries` [`eager::REFUSED`].
fn refused(entries: &[Cts]) -> bool {
    entries
        .first()
        .is_some_and(|e| e.nreqs & eager::REFUSED != 0)
}

/// Check that `entries` are the whole CTS of message `seq`: 1..=MAX_RECVS entries, each
/// carrying `seq + 1` and the entry count (the refusal flag aside).
#[inline(always)]
fn check_cts(seq: u64, entries: &[Cts]) -> Result<()> {
    let n = entries.len();
    let consistent = (1..=MAX_RECVS).contains(&n)
        && entries
            .iter()
            .all(|e| e.seq_plus_one == seq + 1 && (e.nreqs & !eager::REFUSED) as usize == n);
    if consistent {
        return Ok(());
    }
    Err(Error::new(
        Kind::Remote,
        format!("inconsistent CTS for message {seq}"),
    ))
}
