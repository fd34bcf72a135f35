//! The declarations of every environment variable: the plugin's own knobs with their defaults
//! and meanings ([`KNOBS`]), and the options of NCCL's IB transport that the plugin only names
//! ([`NOT_IMPLEMENTED`]). The doctor prints them; `tests/repository.rs` holds the documentation
//! to them. Parsing is the parent module's.

use std::ffi::OsString;

/// One knob: its name, its default, and what it means, as docs/configuration.md documents it.
#[derive(Debug)]
pub struct Knob {
    /// Environment variable name.
    pub name: &'static str,
    /// Value used when the variable is unset.
    pub default: &'static str,
    /// One-line meaning.
    pub meaning: &'static str,
}

/// Every variable the plugin honours. `tests/repository.rs` checks that docs/configuration.md
/// lists each, with this default.
pub const KNOBS: &[Knob] = &[
    Knob {
        name: "NCCL_IB_HCA",
        default: "unset",
        meaning: "device filter `[^][=]name[:port],...`",
    },
    Knob {
        name: "NCCL_IB_GID_INDEX",
        default: "-1",
        meaning: "RoCE GID index; -1 selects automatically",
    },
    Knob {
        name: "NCCL_IB_ROUTABLE_FLID_GID_INDEX",
        default: "1",
        meaning: "InfiniBand GID index offered when it carries a routable FLID",
    },
    Knob {
        name: "NCCL_IB_ADAPTIVE_ROUTING",
        default: "1 on InfiniBand, 0 on RoCE",
        meaning: "1 = a single-buffer send over NCCL_IB_AR_THRESHOLD goes as a write and a zero-byte write-with-immediate",
    },
    Knob {
        name: "NCCL_IB_AR_THRESHOLD",
        default: "8192",
        meaning: "bytes above which adaptive routing splits a send",
    },
    Knob {
        name: "NCCL_IB_ADDR_FAMILY",
        default: "AF_INET",
        meaning: "preferred GID family",
    },
    Knob {
        name: "NCCL_IB_ADDR_RANGE",
        default: "unset",
        meaning: "subnet (`address/prefix`, of NCCL_IB_ADDR_FAMILY) an automatically chosen RoCE GID must lie in",
    },
    Knob {
        name: "NCCL_IB_ROCE_VERSION_NUM",
        default: "2",
        meaning: "preferred RoCE version",
    },
    Knob {
        name: "NCCL_IB_TIMEOUT",
        default: "20",
        meaning: "QP ack timeout exponent (4.096 us * 2^t)",
    },
    Knob {
        name: "NCCL_IB_RETRY_CNT",
        default: "7",
        meaning: "QP transport retry count",
    },
    Knob {
        name: "NCCL_IB_SL",
        default: "unset",
        meaning: "InfiniBand service level",
    },
    Knob {
        name: "NCCL_IB_PKEY",
        default: "0",
        meaning: "index in each port's P_Key table of the partition every QP joins (checked against the table when set)",
    },
    Knob {
        name: "NCCL_IB_TC",
        default: "unset",
        meaning: "RoCE traffic class",
    },
    Knob {
        name: "NCCL_IB_FIFO_TC",
        default: "-1",
        meaning: "RoCE traffic class of the receiver's QPs (its clear-to-sends); -1 = the sender's",
    },
    Knob {
        name: "NCCL_IB_QPS_PER_CONNECTION",
        default: "1",
        meaning: "QPs per connection (1..16)",
    },
    Knob {
        name: "NCCL_IB_SPLIT_DATA_ON_QPS",
        default: "0",
        meaning: "1 = split every message over all QPs",
    },
    Knob {
        name: "NCCL_IB_MERGE_NICS",
        default: "1",
        meaning: "0 = never fuse ports or NICs into one device",
    },
    Knob {
        name: "NCCL_IB_MERGE_VFS",
        default: "0",
        meaning: "1 = fuse the SR-IOV VFs of one PF",
    },
    Knob {
        name: "NCCL_NET_RS_FUSE",
        default: "unset",
        meaning: "explicit fusions, e.g. `rxe0+rxe1` or `mlx5_0+mlx5_3,mlx5_1+mlx5_2`",
    },
    Knob {
        name: "NCCL_IB_PCI_RELAXED_ORDERING",
        default: "2",
        meaning: "0 off, 1 on, 2 auto (on for VFs and under a hypervisor)",
    },
    Knob {
        name: "NCCL_DMABUF_ENABLE",
        default: "1",
        meaning: "0 = do not probe or advertise DMA-BUF",
    },
    Knob {
        name: "NCCL_GDR_FLUSH_DISABLE",
        default: "0",
        meaning: "1 = no flush QP, iflush does nothing",
    },
    Knob {
        name: "NCCL_SOCKET_IFNAME",
        default: "unset",
        meaning: "interface for the out-of-band TCP exchange",
    },
    Knob {
        name: "NCCL_SOCKET_FAMILY",
        default: "unset",
        meaning: "AF_INET or AF_INET6: the out-of-band address's family where NCCL's rule picks it",
    },
    Knob {
        name: "NCCL_COMM_ID",
        default: "unset",
        meaning: "NCCL's bootstrap root; its subnet steers the out-of-band interface",
    },
    Knob {
        name: "NCCL_DEBUG",
        default: "unset",
        meaning: "NCCL's log level (WARN, INFO, TRACE)",
    },
    Knob {
        name: "NCCL_NET_RS_LOG",
        default: "unset",
        meaning: "plugin log filter, tracing syntax",
    },
    Knob {
        name: "NCCL_IB_RETURN_ASYNC_EVENTS",
        default: "1",
        meaning: "1 = a fatal device event fails every comm on the device; 0 = log it only",
    },
    Knob {
        name: "NCCL_NET_RS_CONNECT_TIMEOUT",
        default: "120",
        meaning: "seconds connect/accept may take",
    },
    Knob {
        name: "NCCL_NET_RS_EAGER_BYTES",
        default: "4096",
        meaning: "largest host-memory message sent without waiting for the clear-to-send (0 = never; at most 65536)",
    },
    Knob {
        name: "NCCL_NET_RS_EAGER_SLOTS",
        default: "8",
        meaning: "slots of a receive comm's eager bounce ring (a power of two, 1 to 32): eager messages in flight per comm, each slot pinning NCCL_NET_RS_EAGER_BYTES; a connection uses the smaller of both sides' values, 32 with quiet receives or a peer before 0.3.10",
    },
    Knob {
        name: "NCCL_NET_RS_QUIET",
        default: "0",
        meaning: "1 = offer quiet receives: while eager messages flow, a host-memory receive writes no clear-to-send (used when both sides offer it; a truncated eager send then reports the size it was given); 0 = every receive writes one, as NCCL's transport does (on rxe 1 shortens the latency up to 512 B and lowers the message rate at 64 B)",
    },
    Knob {
        name: "NCCL_NET_RS_QUIET_WAIT_US",
        default: "200",
        meaning: "how long (microseconds) a quiet receive waits for an eager message before it writes its clear-to-send anyway",
    },
    Knob {
        name: "NCCL_NET_RS_BATCH",
        default: "0",
        meaning: "1 = hold the clear-to-sends of back-to-back irecvs on a comm and write them as one write at the next other call (or the watcher thread's next tick, 10 to 80 ms apart, when the client makes none); 0 = write each inside its irecv, as NCCL's IB transport does",
    },
    Knob {
        name: "NCCL_NET_RS_SHARE_LINKS",
        default: "1",
        meaning: "1 = the out-of-band messages (liveness, failover) of every comm between two processes share one TCP connection per peer process and device; 0 = one connection per comm, as NCCL's IB transport keeps (either side's 0 decides)",
    },
    Knob {
        name: "NCCL_IB_RESILIENCY_PORT_FAILOVER",
        default: "1",
        meaning: "when a member port of a fused device fails, its connections carry on over the members left (both sides must agree; 0 = the comm fails, naming the port)",
    },
    Knob {
        name: "NCCL_IB_RESILIENCY_PORT_RECOVERY",
        default: "1",
        meaning: "when a failed member port is active again, traffic spreads over it again",
    },
];

/// Variables of NCCL's own IB transport (`src/transport/net_ib/`, `src/misc/ibvwrap.cc`, NCCL
/// 2.30) that this plugin does not implement: a site tuned for NCCL's transport may set them,
/// and with this plugin they change nothing. `default` is NCCL's; `meaning` what NCCL's
/// transport does with them. `init` names those set in one WARN line, the doctor in env.config.
pub const NOT_IMPLEMENTED: &[Knob] = &[
    Knob {
        name: "NCCL_IB_ECE_ENABLE",
        default: "1",
        meaning: "negotiate Enhanced Connection Establishment options (vendor features such as congestion control) between the two QPs",
    },
    Knob {
        name: "NCCL_IB_OOO_RQ",
        default: "0",
        meaning: "mlx5 out-of-order receive queues (packets of one QP taking several paths), with pre-posted receives",
    },
    Knob {
        name: "NCCL_IB_DATA_DIRECT",
        default: "1",
        meaning: "mlx5 Data Direct: register GPU memory for the NIC's direct DMA path",
    },
    Knob {
        name: "NCCL_IB_USE_INLINE",
        default: "0",
        meaning: "post the clear-to-send entry inline (this plugin inlines clear-to-sends and host-memory payloads up to 256 bytes always, 64 or none where the device grants less)",
    },
    Knob {
        name: "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS",
        default: "-2 (no)",
        meaning: "post the receive work requests ahead instead of with each irecv",
    },
    Knob {
        name: "NCCL_IB_RECEIVER_SIDE_MATCHING_SCHEME",
        default: "-2 (by index)",
        meaning: "how the receiver matches completions to requests (by index or by id)",
    },
    Knob {
        name: "NCCL_IB_SUBNET_AWARE_ROUTING",
        default: "0",
        meaning: "pick the local device on the peer's subnet (its GIDs travel in the listen handle)",
    },
    Knob {
        name: "NCCL_IB_SUBNET_PREFIX_LEN",
        default: "24",
        meaning: "prefix length of the subnets NCCL_IB_SUBNET_AWARE_ROUTING compares",
    },
    Knob {
        name: "NCCL_IB_WARN_RAIL_LOCAL",
        default: "0",
        meaning: "log when two fused devices share no physical device",
    },
    Knob {
        name: "NCCL_IB_DEVICE_PCI_ORDER",
        default: "1",
        meaning: "0 = keep the verbs device order instead of sorting the devices by PCI path (this plugin always sorts them by PCI path)",
    },
    Knob {
        name: "NCCL_IB_MQP_RETRY_ALL",
        default: "0",
        meaning: "retry a failed QP state change on any error, not only a timeout",
    },
    Knob {
        name: "NCCL_IB_MQP_RETRY_CNT",
        default: "34",
        meaning: "how often a QP state change that timed out is retried",
    },
    Knob {
        name: "NCCL_IB_MQP_RETRY_SLEEP_MSEC",
        default: "100",
        meaning: "the wait between those retries",
    },
    Knob {
        name: "NCCL_IB_QUERY_PORT_SPEED",
        default: "1",
        meaning: "read the port speed with ibv_query_port_speed where libibverbs has it",
    },
    Knob {
        name: "NCCL_IBVERBS_LIB",
        default: "libibverbs.so.1",
        meaning: "the libibverbs NCCL opens (this plugin links libibverbs.so.1)",
    },
];

/// `NAME=value` of each [`NOT_IMPLEMENTED`] variable `lookup` finds set (non-empty), in the
/// list's order.
pub fn not_implemented_set(lookup: impl Fn(&str) -> Option<OsString>) -> Vec<String> {
    NOT_IMPLEMENTED
        .iter()
        .filter_map(|knob| {
            let value = lookup(knob.name)?;
            let value = value.to_string_lossy();
            let value = value.trim();
            (!value.is_empty()).then(|| format!("{}={value}", knob.name))
        })
        .collect()
}
