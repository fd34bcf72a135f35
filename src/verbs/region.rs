//! Host memory the plugin owns and registers on the PDs of a device's member ports: the control
//! rings. Many comms' rings of one size are carved from one allocation registered once per PD
//! (a [`RegionPool`]), so a comm registers and deregisters no memory of its own: setting up and
//! closing thousands of comms makes no `ibv_reg_mr` or `ibv_dereg_mr` per comm.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::HashMap;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{Ordering, fence};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::{Access, MemoryRegion, ProtectionDomain};
use crate::core::error::{Error, Result};

const PAGE: usize = 4096;

/// Pieces of a pool's first allocation of a size; each later one has a quarter more pieces than
/// the one before (rounded up), up to [`MOST_PIECES`]: a process with one comm pins one ring,
/// one with thousands at most a quarter more than its rings (doubling would pin up to twice
/// them) or one allocation's worth.
const FIRST_PIECES: usize = 1;
/// Pieces of one allocation at most (64 receive rings of 52 KiB with the defaults: 3.3 MiB).
const MOST_PIECES: usize = 64;

/// Page-aligned zeroed heap memory, freed on drop.
#[derive(Debug)]
struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Result<Self> {
        let layout = Layout::from_size_align(len.max(1), PAGE)
            .map_err(|_| Error::misuse(format!("control region of {len} bytes")))?;
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or_else(|| {
            Error::system(
                "allocating a control region",
                io::Error::from_raw_os_error(libc::ENOMEM),
            )
        })?;
        Ok(Self { ptr, layout })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// One allocation of `pieces` equal pieces, registered on each PD.
#[derive(Debug)]
struct Chunk {
    // Field order matters: the registrations are dropped before the memory they cover.
    mrs: Vec<MemoryRegion>,
    buf: AlignedBuf,
    /// Bytes of a piece (whole pages).
    piece: usize,
    free: Mutex<FreePieces>,
    /// The pool's shelf this chunk goes back on when a piece comes free; none for a region
    /// of its own.
    shelf: Weak<Mutex<Shelves>>,
    key: Key,
}

#[derive(Debug, Default)]
struct FreePieces {
    /// Pieces given back by their regions (the rings they held are in them).
    returned: Vec<usize>,
    /// The first piece never handed out (as allocated: zero), up to `pieces`.
    fresh: usize,
    pieces: usize,
    /// It is on its pool's shelf.
    shelved: bool,
}

impl FreePieces {
    /// A free piece, and whether a region had it before (so it must be zeroed).
    fn take(&mut self) -> Option<(usize, bool)> {
        if let Some(index) = self.returned.pop() {
            return Some((index, true));
        }
        (self.fresh < self.pieces).then(|| {
            self.fresh += 1;
            (self.fresh - 1, false)
        })
    }
}

impl Chunk {
    fn new(
        pds: &[Arc<ProtectionDomain>],
        (piece, pieces): (usize, usize),
        access: Access,
        (shelf, key): (Weak<Mutex<Shelves>>, Key),
    ) -> Result<Self> {
        let buf = AlignedBuf::new(piece * pieces)?;
        let mrs = pds
            .iter()
            .map(|pd| {
                // SAFETY: `buf` outlives the registrations (field order); Rust code only touches
                // it through raw pointers.
                unsafe { pd.register(buf.ptr.as_ptr() as u64, buf.layout.size(), access) }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            mrs,
            buf,
            piece,
            // Piece 0 goes to the caller.
            free: Mutex::new(FreePieces {
                returned: Vec::new(),
                fresh: 1,
                pieces,
                shelved: false,
            }),
            shelf,
            key,
        })
    }
}

// SAFETY: the buffer is only accessed through raw-pointer copies, volatile reads and the NIC
// (by the regions carved from it, each its own piece); the free list is behind a lock.
unsafe impl Send for Chunk {}
// SAFETY: as above.
unsafe impl Sync for Chunk {}

/// A pool's chunks of one piece size and access.
type Key = (usize, u32);

/// Per piece size and access, the chunks that had a free piece when last seen (the one to try
/// first last), and the pieces of the latest chunk made.
type Shelves = HashMap<Key, (Vec<Weak<Chunk>>, usize)>;

/// The control rings of one device's comms, carved from shared registrations.
#[derive(Debug)]
pub struct RegionPool {
    /// Every chunk is registered on each of them (a device's member ports).
    pds: Vec<Arc<ProtectionDomain>>,
    shelves: Arc<Mutex<Shelves>>,
}

impl RegionPool {
    /// A pool whose regions are registered on every PD of `pds`.
    pub fn new(pds: Vec<Arc<ProtectionDomain>>) -> Self {
        Self {
            pds,
            shelves: Arc::default(),
        }
    }

    /// `len` zeroed bytes (rounded up to whole pages) registered with `access` on every PD of
    /// the pool: a free piece of an earlier allocation, or a new one.
    ///
    /// # Errors
    /// `System` when allocation or a registration fails.
    pub fn carve(&self, len: usize, access: Access) -> Result<HostRegion> {
        let piece = len.max(1).div_ceil(PAGE) * PAGE;
        let key = (piece, access.bits());
        let mut shelves = self.shelves.lock();
        let (shelf, latest) = shelves.entry(key).or_default();
        while let Some(top) = shelf.last() {
            if let Some(chunk) = top.upgrade() {
                let mut free = chunk.free.lock();
                if let Some((index, reused)) = free.take() {
                    drop(free);
                    return Ok(HostRegion::piece_of(chunk, (index, reused), len));
                }
                free.shelved = false;
            }
            shelf.pop();
        }
        let pieces = next_pieces(*latest);
        let chunk = Arc::new(Chunk::new(
            &self.pds,
            (piece, pieces),
            access,
            (Arc::downgrade(&self.shelves), key),
        )?);
        *latest = pieces;
        if pieces > 1 {
            chunk.free.lock().shelved = true;
            shelf.push(Arc::downgrade(&chunk));
        }
        Ok(HostRegion::piece_of(chunk, (0, false), len))
    }
}

/// Pieces of the next chunk after one of `latest`.
fn next_pieces(latest: usize) -> usize {
    latest
        .saturating_add(latest.div_ceil(4))
        .clamp(FIRST_PIECES, MOST_PIECES)
}

/// Zeroed host memory owned by the plugin and registered on one PD per member port of a device:
/// the control rings. The NIC may write it at any time, so Rust never forms references into it:
/// the words that say a write landed are read volatilely ([`Self::read_u64_acquire`]), and
/// whole entries are copied in or out only while the protocol holds the NIC off them. A piece
/// of a chunk that other regions share: its registrations cover the whole chunk.
#[derive(Debug)]
pub struct HostRegion {
    chunk: Arc<Chunk>,
    index: usize,
    len: usize,
    base: NonNull<u8>,
}

// SAFETY: the buffer is only accessed through raw-pointer copies, volatile reads and the NIC;
// no references.
unsafe impl Send for HostRegion {}
// SAFETY: as above.
unsafe impl Sync for HostRegion {}

impl HostRegion {
    /// Allocate `len` zeroed bytes and register them with `access` on every PD in `pds`, for
    /// this region alone.
    ///
    /// # Errors
    /// `System` when allocation or a registration fails.
    pub fn new(pds: &[Arc<ProtectionDomain>], len: usize, access: Access) -> Result<Self> {
        let piece = len.max(1).div_ceil(PAGE) * PAGE;
        let chunk = Chunk::new(pds, (piece, 1), access, (Weak::new(), (0, 0)))?;
        Ok(Self::piece_of(Arc::new(chunk), (0, false), len))
    }

    /// Piece `index` of `chunk`, `len` bytes; zeroed here when an earlier region had it
    /// (`reused`), as allocated otherwise.
    fn piece_of(chunk: Arc<Chunk>, (index, reused): (usize, bool), len: usize) -> Self {
        // SAFETY: `index` is below the chunk's pieces, so the piece lies in its allocation.
        let base = unsafe { chunk.buf.ptr.add(index * chunk.piece) };
        if reused {
            // SAFETY: the piece is this region's alone (taken off the free list), and no NIC
            // writes it: the comm that had it destroyed its QPs before it gave the piece back.
            unsafe { base.as_ptr().write_bytes(0, chunk.piece) };
        }
        Self {
            chunk,
            index,
            len,
            base,
        }
    }

    /// The registration on the `member`-th PD.
    ///
    /// # Panics
    /// When `member` is not below the number of PDs given to `new` (a caller bug).
    pub fn mr(&self, member: usize) -> &MemoryRegion {
        &self.chunk.mrs[member]
    }

    /// Address of byte `offset`.
    pub fn addr(&self, offset: usize) -> u64 {
        self.base.as_ptr() as u64 + offset as u64
    }

    fn at(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(
            offset + len <= self.len,
            "control region access out of bounds"
        );
        // SAFETY: in bounds of the piece (checked above).
        unsafe { self.base.as_ptr().add(offset) }
    }

    /// Copy `bytes` into the region at `offset` (memory the NIC reads after a later post). A
    /// fixed size: the copy is a few moves, not a `memcpy` call (a CTS entry per `irecv`).
    pub fn write<const N: usize>(&self, offset: usize, bytes: &[u8; N]) {
        let base = self.at(offset, N).cast::<[u8; N]>();
        // SAFETY: in bounds (checked by `at`), alignment 1; the NIC reads this memory only
        // after a later post, which is an opaque call the compiler cannot move this copy across.
        unsafe { base.write_unaligned(*bytes) };
    }

    /// Read the little-endian u64 at `offset` (8-aligned); later reads see at least what the NIC
    /// wrote before it (acquire).
    pub fn read_u64_acquire(&self, offset: usize) -> u64 {
        assert_eq!(offset % 8, 0, "unaligned control word");
        let word = self.at(offset, 8).cast::<u64>();
        // SAFETY: in bounds and aligned (checked); volatile: the NIC writes it concurrently.
        let v = unsafe { word.read_volatile() };
        fence(Ordering::Acquire);
        u64::from_le(v)
    }

    /// The little-endian u64 at `offset` (any alignment) as it is now, while the NIC may be
    /// writing it: a hint, never a value to act on without a completion that covers it.
    pub fn peek_u64(&self, offset: usize) -> u64 {
        let at = self.at(offset, 8);
        if at.addr().is_multiple_of(8) {
            // SAFETY: in bounds (checked by `at`) and aligned; volatile: the NIC writes it
            // concurrently. One load where the word is aligned (the default eager threshold):
            // a volatile [u8; 8] is read a byte at a time.
            return u64::from_le(unsafe { at.cast::<u64>().read_volatile() });
        }
        // SAFETY: in bounds (checked by `at`), alignment 1; volatile as above (a torn value is
        // only ever compared, and a mismatch is harmless).
        u64::from_le_bytes(unsafe { at.cast::<[u8; 8]>().read_volatile() })
    }

    /// Copy `len` bytes at `offset` to `dst`.
    ///
    /// # Safety
    /// `dst..dst + len` must be valid for writes and must not overlap the region; the NIC must
    /// not be writing the copied bytes (the protocol holds the peer off them).
    pub unsafe fn copy_to(&self, offset: usize, dst: *mut u8, len: usize) {
        let src = self.at(offset, len);
        // SAFETY: the source is in bounds (checked by `at`); the rest is the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }

    /// Copy `len` bytes from `src` into the region at `offset` (memory the NIC reads after a
    /// later post).
    ///
    /// # Safety
    /// `src..src + len` must be valid for reads and must not overlap the region; the NIC must
    /// not be reading the bytes replaced (the protocol holds it off them).
    pub unsafe fn copy_from(&self, offset: usize, src: *const u8, len: usize) {
        let dst = self.at(offset, len);
        // SAFETY: the destination is in bounds (checked by `at`); the rest is the caller's
        // contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
    }

    /// Copy `N` bytes out of the region at `offset`, once the NIC finished writing them: after
    /// the completion of the write that carried them, or after [`Self::read_u64_acquire`]
    /// saw the word the peer writes with them. (A plain copy: a volatile `[u8; N]` read is
    /// lowered to `N` single-byte loads, and this runs once per message.)
    pub fn read<const N: usize>(&self, offset: usize) -> [u8; N] {
        let at = self.at(offset, N).cast::<[u8; N]>();
        // SAFETY: in bounds (checked by `at`), alignment 1; the protocol keeps the NIC off
        // these bytes until the message they belong to is answered (see above), and the acquire
        // read or completion before this call orders the copy after the NIC's write.
        unsafe { at.read_unaligned() }
    }
}

impl Drop for HostRegion {
    fn drop(&mut self) {
        let shelve = {
            let mut free = self.chunk.free.lock();
            free.returned.push(self.index);
            let shelve = !free.shelved;
            free.shelved = true;
            shelve
        };
        // Back on the shelf with a free piece; outside the chunk's lock, as `carve` takes the
        // shelves' before a chunk's. The last region of a chunk frees it (its registrations).
        if shelve && let Some(shelves) = self.chunk.shelf.upgrade() {
            let mut shelves = shelves.lock();
            if let Some((shelf, _)) = shelves.get_mut(&self.chunk.key) {
                shelf.push(Arc::downgrade(&self.chunk));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_grow_by_a_quarter_from_one_piece_up_to_the_most() {
        assert_eq!(next_pieces(0), 1);
        assert_eq!(next_pieces(1), 2);
        assert_eq!(next_pieces(4), 5);
        assert_eq!(next_pieces(5), 7);
        assert_eq!(next_pieces(48), 60);
        assert_eq!(next_pieces(60), MOST_PIECES);
        assert_eq!(next_pieces(MOST_PIECES), MOST_PIECES);
    }
}
