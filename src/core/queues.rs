//! What a queue pair and a completion queue cost in memory, by each provider's sizing rules,
//! so that the doctor's memlock estimate and the scale benchmark's expectations come from the
//! same depths the plugin creates its queues with (`transport::conn`).
//!
//! The rules, read from the providers (not copied):
//! - **mlx5** (rdma-core `providers/mlx5/verbs.c`): the queues live in user memory that the
//!   kernel pins, so they count against `RLIMIT_MEMLOCK`. A send-queue entry of an RC QP is its
//!   overhead (a 16-byte control segment plus the larger of the atomic and remote-address
//!   segments and the memory-window bind segments: 192 bytes) plus the larger of the
//!   scatter/gather entries (16 bytes each) and the inline data (a 4-byte header, the data,
//!   16-byte aligned), rounded up to 64-byte blocks; the send queue is the next power of two of
//!   depth x entry. A receive entry is 16 bytes per scatter/gather entry rounded to a power of
//!   two, times the depth rounded to a power of two (at least 64 bytes). Both queues share one
//!   page-aligned buffer. A CQ holds the next power of two above its entries, 64 bytes each.
//!   The comms of a process share their CQs (`transport::shared_cq`), so a comm's part of one
//!   is its entries.
//! - **rxe** (Soft-RoCE, the kernel's `drivers/infiniband/sw/rxe`): the queues are kernel memory
//!   (`vmalloc_user`) mapped into the process: not pinned, not counted against memlock, but
//!   kernel memory and, once touched, resident in the process too. An entry is the WQE header
//!   (208 bytes for a send, 40 for a receive) plus the larger of the scatter/gather entries
//!   (16 bytes each) and the inline data, rounded up to a power of two of at least 64; a queue
//!   holds the next power of two above depth + 1 entries behind a 384-byte header.

/// Queue depths and inline size of a QP, as the plugin asks for them.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Bytes a work request may carry inline (copied into the WQE at post time, so the NIC
    /// need not fetch them). Every entry of the send queue is sized for it, so only QPs whose
    /// small writes pay for it ask; a QP takes the most its device grants of this, 64 or
    /// nothing.
    pub max_inline: u32,
}

/// Scatter/gather entries per send request (an eager message's header and payload).
pub const SEND_SGES: u32 = 2;
/// Scatter/gather entries per receive request.
pub const RECV_SGES: u32 = 1;

const PAGE: u64 = 4096;

/// How a device's provider keeps its queues.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum QueueMemory {
    /// In user memory the kernel pins (mlx5, and the rule assumed for other hardware).
    Pinned,
    /// In kernel memory mapped into the process (rxe).
    Kernel,
}

impl QueueMemory {
    /// The rule for RDMA device `name`: Soft-RoCE devices are named `rxe*` by `rdma link add`
    /// and the VM scripts; any other is taken as hardware that pins its queues (mlx5's rule).
    pub fn of_device(name: &str) -> Self {
        if name.starts_with("rxe") {
            Self::Kernel
        } else {
            Self::Pinned
        }
    }

    /// Bytes of one QP's queues.
    pub fn qp_bytes(self, caps: QpCaps) -> u64 {
        match self {
            Self::Pinned => mlx5_qp_bytes(caps),
            Self::Kernel => {
                rxe_queue_bytes(caps.max_send_wr, rxe_send_entry(caps))
                    + rxe_queue_bytes(caps.max_recv_wr, RXE_RECV_WQE + 16 * u64::from(RECV_SGES))
            }
        }
    }

    /// Bytes a comm's room of `entries` on a CQ its process's comms share costs: the entries
    /// themselves (the shared CQ's rounding to a power of two and its page are spread over its
    /// comms, and a CQ of thousands of entries rounds up by little).
    pub fn cq_share_bytes(self, entries: u32) -> u64 {
        u64::from(entries)
            * match self {
                Self::Pinned => MLX5_CQE,
                Self::Kernel => RXE_CQE,
            }
    }

    /// Whether these queues count against the locked-memory limit.
    pub fn counts_against_memlock(self) -> bool {
        self == Self::Pinned
    }
}

/// mlx5's RC send overhead: control segment plus the memory-window bind segments (the larger).
const MLX5_RC_OVERHEAD: u64 = 192;
const MLX5_SEND_BLOCK: u64 = 64;
const MLX5_CQE: u64 = 64;
const RXE_SEND_WQE: u64 = 208;
const RXE_RECV_WQE: u64 = 40;
/// rxe's completion entry: the kernel's work completion (larger than the 48-byte uverbs one it
/// holds in a union), one cache line.
const RXE_CQE: u64 = 64;
const RXE_QUEUE_HEADER: u64 = 384;

fn next_pow2(n: u64) -> u64 {
    n.max(1).next_power_of_two()
}

fn page_align(n: u64) -> u64 {
    n.div_ceil(PAGE) * PAGE
}

fn mlx5_qp_bytes(caps: QpCaps) -> u64 {
    let sq = if caps.max_send_wr == 0 {
        0
    } else {
        let sges = MLX5_RC_OVERHEAD + 16 * u64::from(SEND_SGES);
        let inline = if caps.max_inline == 0 {
            0
        } else {
            MLX5_RC_OVERHEAD + (4 + u64::from(caps.max_inline)).div_ceil(16) * 16
        };
        let entry = sges.max(inline).div_ceil(MLX5_SEND_BLOCK) * MLX5_SEND_BLOCK;
        next_pow2(u64::from(caps.max_send_wr) * entry)
    };
    let rq = if caps.max_recv_wr == 0 {
        0
    } else {
        (next_pow2(u64::from(caps.max_recv_wr)) * next_pow2(16 * u64::from(RECV_SGES))).max(64)
    };
    page_align(sq + rq)
}

fn rxe_send_entry(caps: QpCaps) -> u64 {
    RXE_SEND_WQE + u64::from(caps.max_inline).max(16 * u64::from(SEND_SGES))
}

fn rxe_queue_bytes(depth: u32, entry: u64) -> u64 {
    let entry = next_pow2(entry.max(64));
    page_align(RXE_QUEUE_HEADER + next_pow2(u64::from(depth) + 1) * entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn caps(max_send_wr: u32, max_recv_wr: u32, max_inline: u32) -> QpCaps {
        QpCaps {
            max_send_wr,
            max_recv_wr,
            max_inline,
        }
    }

    #[test]
    fn mlx5_send_entries_follow_the_inline_size() {
        // 256 bytes inline: 192 + 272 -> 464, in 64-byte blocks a 512-byte entry (the stride
        // the 0.3.6 send QP paid); 1,152 x 512 -> 1 MiB.
        assert_eq!(mlx5_qp_bytes(caps(1152, 0, 256)), 1 << 20);
        // Two SGEs and no inline (or up to 32 bytes): 224 -> 256-byte entries.
        assert_eq!(mlx5_qp_bytes(caps(127, 0, 0)), 32 << 10);
        assert_eq!(mlx5_qp_bytes(caps(127, 0, 32)), 32 << 10);
        // 64 bytes inline: 192 + 68 -> 272 -> 320-byte entries; 127 x 320 rounds up to 64 KiB.
        assert_eq!(mlx5_qp_bytes(caps(127, 0, 64)), 64 << 10);
    }

    #[test]
    fn mlx5_receive_queue_and_a_cq_share() {
        // 64 receives of one SGE: 64 x 16 = 1 KiB, in the QP's page.
        assert_eq!(mlx5_qp_bytes(caps(0, 64, 0)), PAGE);
        // A comm's room on a shared CQ: 64 bytes an entry, on either provider.
        assert_eq!(QueueMemory::Pinned.cq_share_bytes(255), 255 * 64);
        assert_eq!(QueueMemory::Kernel.cq_share_bytes(48), 3 << 10);
    }

    #[test]
    fn rxe_queues_round_depth_plus_one_and_the_entry() {
        let rxe = QueueMemory::Kernel;
        // 127 sends of 208 + 32 -> 256-byte entries, 128 slots, plus the header: 9 pages.
        assert_eq!(
            rxe.qp_bytes(caps(127, 0, 32)) - rxe_queue_bytes(0, 64),
            9 * PAGE
        );
        // 64 bytes inline: 272 -> 512-byte entries, twice as much.
        assert_eq!(
            rxe.qp_bytes(caps(127, 0, 64)) - rxe_queue_bytes(0, 64),
            17 * PAGE
        );
        // A depth of 128 needs 256 slots.
        assert_eq!(rxe_queue_bytes(128, 256), 17 * PAGE);
    }

    #[test]
    fn only_hardware_queues_count_against_memlock() {
        assert_eq!(QueueMemory::of_device("rxe0"), QueueMemory::Kernel);
        assert_eq!(QueueMemory::of_device("mlx5_0"), QueueMemory::Pinned);
        assert!(QueueMemory::Pinned.counts_against_memlock());
        assert!(!QueueMemory::Kernel.counts_against_memlock());
    }
}
