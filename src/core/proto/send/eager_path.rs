//! The sender's eager path (see [`crate::core::eager`]): messages written before their CTS,
//! the bounce slots they hold until the receiver shows it read them, the answers and credits
//! that free them, and the renumbering that ends the path on a connection.

use super::*;

impl SendSide {
    /// Whether the glue should read the credit word for [`Self::handle_credit`]: on a
    /// connection with quiet receives.
    pub fn wants_credit(&self) -> bool {
        self.layout.quiet
    }

    /// The receiver's credit: every message before `credit` completed. Each eager message
    /// among them whose answer was not read was copied (a refused one could not complete
    /// before the sender wrote it again), and its bounce slot was read.
    ///
    /// # Errors
    /// `Remote` when the credit covers an awaited eager message that is no longer in its slot.
    pub fn handle_credit(&mut self, credit: u64) -> Result<()> {
        if credit <= self.credit {
            return Ok(());
        }
        self.credit = credit;
        self.read_before(credit);
        while let Some(&seq) = self.awaiting.front().filter(|&&s| s < credit) {
            let slot = slot_of(seq);
            match self.slots[slot] {
                Some(SendSlot {
                    seq: s,
                    state: SlotState::Eager { .. },
                }) if s == seq => {}
                _ => {
                    return Err(Error::new(
                        Kind::Remote,
                        format!("credit {credit} covers message {seq}, which is not in its slot"),
                    ));
                }
            }
            self.awaiting.pop_front();
            self.delivered(slot);
        }
        Ok(())
    }

    /// The receiver read every bounce slot holding a message before `seq`. Nothing to do once
    /// the eager path is off: no eager message goes again.
    fn read_before(&mut self, seq: u64) {
        if !self.eager {
            return;
        }
        for u in &mut self.unread[..self.layout.bounce_slots] {
            *u = u.filter(|&s| s >= seq);
        }
    }

    /// What the CTS `entries` of the receive of their message (checked) show of the bounce
    /// ring. The receive was posted: receives are posted in order, each only once the receive a
    /// ring before it (in its message slot) completed, so every message a ring or more before it
    /// was received and its bounce slot read. On a ring of fewer bounce slots than message slots
    /// the entry also says how far the receiver has read ([`eager::read_through`]): every
    /// message before its oldest receive still waiting, acknowledged or copied as promised.
    pub(super) fn cts_arrived(&mut self, entries: &[Cts]) {
        let Some(seq) = entries.first().and_then(|c| c.seq_plus_one.checked_sub(1)) else {
            return;
        };
        let read_through = (self.layout.bounce_slots < SLOTS)
            .then(|| eager::read_through(&entries[0], seq))
            .flatten();
        let ring_before = (seq + 1).saturating_sub(SLOTS as u64);
        self.read_before(read_through.map_or(ring_before, |r| r.max(ring_before)));
    }

    /// Eager message `seq` was acknowledged: the receiver copied it, and it handled the arrivals
    /// of every eager message before it first (they come in order on the connection's one QP,
    /// and it polls their completions in order), copying each, keeping it for a receive posted
    /// before this one, or dropping it: every bounce slot holding a message up to `seq` was read.
    fn acknowledged(&mut self, seq: u64) {
        self.read_before(seq + 1);
    }

    /// The eager message in `slot` was delivered whole; the slot is free if NCCL already saw
    /// its send done.
    fn delivered(&mut self, slot: usize) {
        if let Some(SendSlot {
            state: SlotState::Eager { req, delivered, .. },
            ..
        }) = self.slots[slot].as_mut()
        {
            *delivered = true;
            if *req == DETACHED {
                self.slots[slot] = None;
            }
        }
    }

    /// The receiver's answer to eager message `seq`: an acknowledgement (it copied the message),
    /// or the CTS of its receive: one that promises the copy, one that refuses it (the message
    /// goes again by rendezvous), or one for another shape or tag (renumbering).
    pub(super) fn answer(&mut self, seq: u64, entries: &[Cts]) -> Result<Vec<Post>> {
        let slot = slot_of(seq);
        let Some(SendSlot {
            state: SlotState::Eager { req, buf, .. },
            ..
        }) = self.slots[slot]
        else {
            return Err(Error::misuse(format!("no eager message {seq} in its slot")));
        };
        let first = entries.first().copied().unwrap_or_default();
        let copied = if first.seq_plus_one > seq + 1 {
            // A later message's CTS in this slot: the receiver completed this message without
            // the sender, which only a copy does (of the whole message, see `fits`), and wrote
            // the next receive's CTS over the answer. It read the bounce slot.
            if !(first.seq_plus_one - 1 - seq).is_multiple_of(SLOTS as u64) {
                return Err(Error::new(
                    Kind::Remote,
                    format!(
                        "CTS for message {} in the slot of message {seq}",
                        first.seq_plus_one - 1
                    ),
                ));
            }
            true
        } else if first.nreqs == 0 && entries.len() == 1 {
            // Acknowledged after the copy: the bounce slot was read.
            if first.size != buf.size || first.seq_plus_one != seq + 1 {
                return Err(Error::new(
                    Kind::Remote,
                    format!(
                        "acknowledged {} bytes of eager message {seq} of {} bytes",
                        first.size, buf.size
                    ),
                ));
            }
            self.acknowledged(seq);
            true
        } else {
            let refusing = refused(entries);
            check_cts(seq, entries)?;
            let same = entries.len() == 1 && entries[0].tag == buf.tag;
            if !same {
                return Ok(self.renumber(seq, entries));
            }
            // The same message either way: copied on arrival as promised when it fits, or
            // written again by rendezvous into the buffer (in GPU memory, or too small: then
            // truncated) from the one NCCL still holds for us (or our copy of it).
            !refusing && buf.size <= entries[0].size
        };
        self.cts_arrived(entries);
        self.awaiting.pop_front();
        if copied {
            self.delivered(slot);
            return Ok(Vec::new());
        }
        self.expected_tag = None;
        self.start_rendezvous(seq, entries).take(buf, req);
        Ok(self.layout_posts(slot))
    }

    /// The receive of message `seq` is grouped or waits for another tag: the messages from `seq`
    /// on are numbered differently than the eager sends assumed. Take every eager send back and
    /// match them, in order, to the receiver's entries; the receiver drops their copies.
    fn renumber(&mut self, seq: u64, entries: &[Cts]) -> Vec<Post> {
        self.eager = false;
        for s in self.awaiting.drain(..) {
            let slot = slot_of(s);
            if let Some(SendSlot {
                state: SlotState::Eager { req, buf, .. },
                ..
            }) = self.slots[slot].take()
            {
                if let Some(r) = self.requests.get_mut(req) {
                    *r = Request::Held;
                }
                self.held.push_back((req, buf));
            }
        }
        self.next_seq = seq;
        self.start_rendezvous(seq, entries);
        self.match_held()
    }

    /// With quiet receives, whether a send into the single receive whose CTS is `cts` goes
    /// eagerly into the copy that CTS promised rather than by rendezvous: one write either
    /// way, and the receiver, seeing an eager message, may post the next receive quietly.
    #[inline(always)]
    pub(super) fn promise_takes(&self, cts: &Cts, buf: &SendBuf) -> bool {
        self.layout.quiet
            && cts.nreqs == 1
            && cts.tag == buf.tag
            && buf.size <= cts.size
            && self.eager_may_carry(buf)
    }

    /// Whether an eager send with no CTS yet may carry `buf`, for the tag the sender expects.
    pub(super) fn eager_fits(&self, buf: &SendBuf) -> bool {
        self.expected_tag == Some(buf.tag) && self.eager_may_carry(buf)
    }

    /// What every eager send needs: the eager path still in use, a host-memory buffer within the
    /// threshold, a bounce slot the receiver has read, and no sends held for renumbering.
    fn eager_may_carry(&self, buf: &SendBuf) -> bool {
        self.eager
            && self.unread[self.layout.bounce_slot(self.next_seq)].is_none()
            && buf.host
            && buf.size <= self.layout.eager_bytes
            && self.held.is_empty()
    }

    /// Send `buf` eagerly.
    pub(super) fn send_eager(&mut self, buf: SendBuf, how: Eager) -> Option<Accepted> {
        let seq = self.next_seq;
        let slot = slot_of(seq);
        let req = self.take_request(seq)?;
        // With quiet receives the payload is copied into the staging ring (by the glue, from
        // the post), and a refused message is written again from there.
        let kept = match self.staging {
            Some(st) => SendBuf {
                addr: st.addr
                    + eager::slot_offset(self.layout.bounce_slot(seq), self.layout.eager_bytes)
                    + eager::HEADER_BYTES as u64,
                lkeys: st.lkeys,
                ..buf
            },
            None => buf,
        };
        self.slots[slot] = Some(SendSlot {
            seq,
            state: SlotState::Eager {
                req,
                buf: kept,
                delivered: how == Eager::Promised,
                sent: false,
            },
        });
        if how != Eager::Promised {
            self.awaiting.push_back(seq);
        }
        self.unread[self.layout.bounce_slot(seq)] = Some(seq);
        self.next_seq += 1;
        let qp = self.layout.qps_for(seq, buf.size).start;
        let mut posts = std::mem::take(&mut self.spare_posts);
        posts.clear();
        let unit = Unit::Eager { slot, seq, buf };
        self.logs[qp].units.push_back(unit);
        posts.push(self.eager_post(qp, unit));
        Some(Accepted {
            req,
            entry: 0,
            truncated: None,
            posts,
        })
    }

    /// The write of eager unit `unit` on lane `qp`.
    pub(super) fn eager_post(&self, qp: usize, unit: Unit) -> Post {
        let Unit::Eager { slot, seq, buf } = unit else {
            unreachable!("eager_post of a rendezvous unit");
        };
        Post::Eager {
            qp,
            slot,
            bounce: self.layout.bounce_slot(seq),
            seq,
            tag: buf.tag,
            local_addr: buf.addr,
            lkey: buf.lkeys[self.routes[qp].0],
            len: buf.size,
            imm: eager::imm(seq, buf.size),
        }
    }
}
