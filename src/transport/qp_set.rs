//! The QPs of one connection: its lanes (a QP each, striped over the member ports) and the
//! CQs they complete on.

use std::sync::Arc;

use parking_lot::RwLock;

use super::DeviceContext;
use super::conn::{cq_entries, lanes_on_cq, path_params};
use super::held::PostQueue;
use super::shared_cq::CqShare;
use crate::core::config::Traffic;
use crate::core::error::Result;
use crate::core::wire::{Endpoint, Hello};
use crate::topology::GidEntry;
use crate::verbs::{Access, Completion, QpCaps, QueuePair, RemoteEndpoint};

/// One lane of a connection (a QP index): its QP, the queue its posts go through, and the
/// member port it lives on. Failover replaces a broken lane's QP with one on another member.
#[derive(Debug)]
pub(super) struct Lane {
    pub(super) qp: Arc<QueuePair>,
    /// Its posts: at once, or held for a batch with `NCCL_NET_RS_BATCH` (see `held`).
    pub(super) queue: PostQueue,
    /// The local member the QP lives on.
    pub(super) member: usize,
    /// The peer's member it connects to.
    pub(super) remote: usize,
}

impl Lane {
    fn new(qp: QueuePair, (member, remote): (usize, usize), holds: bool) -> Self {
        let qp = Arc::new(qp);
        Self {
            queue: PostQueue::new(Arc::clone(&qp), holds),
            qp,
            member,
            remote,
        }
    }
}

/// The QPs of one connection, striped over the device's member ports, with its room on one
/// shared CQ per member.
#[derive(Debug)]
pub(super) struct QpSet {
    /// Per member, the comm's room on one of its shared CQs.
    pub(super) cqs: Vec<CqShare>,
    /// Per lane, its QP. A lane is replaced only under the comm's state lock; the lock here
    /// lets the data path read it without holding that lock's borrow.
    pub(super) lanes: Vec<RwLock<Lane>>,
    /// The members' GIDs this connection uses, in its hello and its QPs alike (taken once:
    /// see [`PortContext::current_gid`]).
    pub(super) gids: Vec<GidEntry>,
    caps: QpCaps,
    access: Access,
}

impl QpSet {
    /// Create `n` QPs in INIT with `access` rights for the peer, QP `i` on member
    /// `i % members` (which uses `gids[i % members]`) towards the peer's member
    /// `i % remote_members`. With `movable`, each CQ has room for every lane, as
    /// failover may move any lane to any member. `holds`: the lanes' queues may hold posts.
    pub(super) fn new(
        ctx: &DeviceContext,
        gids: Vec<GidEntry>,
        (n, remote_members): (usize, usize),
        (caps, access): (QpCaps, Access),
        (holds, movable): (bool, bool),
    ) -> Result<Self> {
        let members = ctx.ports.len();
        let cqs = ctx
            .ports
            .iter()
            .enumerate()
            .map(|(m, port)| {
                let here = lanes_on_cq(m, n, members, movable);
                port.cqs.share(cq_entries(caps, here))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut set = Self {
            cqs,
            lanes: Vec::with_capacity(n),
            gids,
            caps,
            access,
        };
        for i in 0..n {
            let qp = set.create(ctx, i % members)?;
            let route = (i % members, i % remote_members.max(1));
            set.lanes.push(RwLock::new(Lane::new(qp, route, holds)));
        }
        Ok(set)
    }

    /// A new QP in INIT on `member`, as the connection's others.
    pub(super) fn create(&self, ctx: &DeviceContext, member: usize) -> Result<QueuePair> {
        let port = &ctx.ports[member];
        let share = &self.cqs[member];
        let qp = QueuePair::new(&port.pd, share.cq(), self.caps)?;
        share.adopt(qp.qpn());
        if let Err(e) = qp.to_init(port.port_num(), port.pkey_index, self.access) {
            share.disown(qp.qpn());
            return Err(e);
        }
        Ok(qp)
    }

    /// Lane `lane` from now on: `qp` on `member`, towards the peer's `remote`. The old QP
    /// (drained) is destroyed here.
    pub(super) fn replace(
        &self,
        lane: usize,
        qp: QueuePair,
        (member, remote): (usize, usize),
        holds: bool,
    ) {
        let new = Lane::new(qp, (member, remote), holds);
        let old = std::mem::replace(&mut *self.lanes[lane].write(), new);
        self.cqs[old.member].disown(old.qp.qpn());
        drop(old);
    }

    /// Lane `lane`'s QP.
    pub(super) fn qp(&self, lane: usize) -> Arc<QueuePair> {
        Arc::clone(&self.lanes[lane].read().qp)
    }

    /// Lane `lane`'s QP number.
    pub(super) fn qpn(&self, lane: usize) -> u32 {
        self.lanes[lane].read().qp.qpn()
    }

    /// Lanes of the connection.
    pub(super) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Post what every lane's queue holds.
    pub(super) fn flush_queues(&self) -> Result<()> {
        self.lanes.iter().try_for_each(|l| l.read().queue.flush())
    }

    /// Hand every completion in every CQ, with the member whose CQ it came from, to `each`,
    /// until the CQs are empty or `each` fails.
    pub(super) fn drain(
        &self,
        mut each: impl FnMut(usize, &Completion) -> Result<()>,
    ) -> Result<()> {
        for (member, share) in self.cqs.iter().enumerate() {
            share.poll(|c| each(member, c))?;
        }
        // The completions made room in the send queues: post what waits for it.
        self.lanes
            .iter()
            .try_for_each(|l| l.read().queue.post_waiting())
    }

    /// `"traffic class 106, service level 3; the QP reports traffic class 106"`: what the
    /// connection asked for and what the device reports for the first QP's path (RoCE carries
    /// no service level, so it is not read back), for the connection's debug line.
    pub(super) fn describe_qos(&self, traffic: Traffic) -> String {
        let reported = match self.lanes.first().map(|l| l.read().qp.qos()) {
            Some(Ok((class, _))) => format!("traffic class {class}"),
            Some(Err(e)) => format!("nothing ({e})"),
            None => "nothing (no QPs)".to_owned(),
        };
        format!(
            "traffic class {}, service level {}; the QP reports {reported}",
            traffic.class, traffic.level
        )
    }

    /// QP index of the QP numbered `qpn` on `member` (QP numbers are unique per device only,
    /// so two members may both have a QP 0x11).
    pub(super) fn index_of(&self, member: usize, qpn: u32) -> Option<usize> {
        self.lanes.iter().position(|l| {
            let l = l.read();
            l.member == member && l.qp.qpn() == qpn
        })
    }

    /// Bring every QP to RTS towards the peer's QPs, pairwise: QP `i` on local member
    /// `i % members` to the peer's QP `i` on its member `i % remote members`.
    pub(super) fn connect(
        &self,
        ctx: &DeviceContext,
        remote: &Hello,
        traffic: Traffic,
    ) -> Result<()> {
        for (i, &qpn) in remote.qpns.iter().enumerate().take(self.lanes.len()) {
            let lane = self.lanes[i].read();
            let peer = &remote.members[i % remote.members.len()];
            self.connect_qp(ctx, &lane.qp, lane.member, (peer, qpn), traffic)?;
        }
        Ok(())
    }

    /// Bring `qp` on `member` to RTS towards the peer's QP `qpn` on its member `peer`.
    pub(super) fn connect_qp(
        &self,
        ctx: &DeviceContext,
        qp: &QueuePair,
        member: usize,
        (peer, qpn): (&Endpoint, u32),
        traffic: Traffic,
    ) -> Result<()> {
        let path = path_params(
            &ctx.ports[member],
            &self.gids[member],
            &ctx.config,
            peer,
            traffic,
        );
        qp.to_rtr(&RemoteEndpoint { qpn, gid: peer.gid }, &path)?;
        qp.to_rts(&path)
    }
}
