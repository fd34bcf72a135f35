//! The opaque pointers handed to NCCL: listen, send and receive comms, memory handles and
//! requests. Each object starts with a tag word so a pointer of the wrong kind is reported as
//! NCCL misusing the ABI instead of being used as something it is not.
//!
//! Requests live in a per-comm array of tokens that never moves or shrinks while the comm
//! exists; a token names its comm and its request index, so `test` needs nothing but the token.

use std::collections::HashMap;
use std::ffi::c_void;
use std::time::{Duration, Instant};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::types::NCCL_NET_HANDLE_MAXSIZE;
use crate::core::error::{Error, Result};
use crate::core::wire::ListenHandle;
use crate::plugin::CommContext;
use crate::transport::{
    Connecting, ListenComm, MrHandle, RECV_REQUESTS, RecvComm, SEND_REQUESTS, SendComm, Tended,
    random_u64,
};

const LISTEN_TAG: u32 = 0x4c53_4e52; // "RNSL"
const SEND_TAG: u32 = 0x444e_4553;
const RECV_TAG: u32 = 0x5643_4552;
const MR_TAG: u32 = 0x524d_4752;
const TOKEN_TAG: u32 = 0x4b4f_5452;
const CONTEXT_TAG: u32 = 0x5854_4352;

#[repr(C)]
#[derive(Debug)]
pub(super) struct Tagged<T> {
    tag: u32,
    pub(super) value: T,
}

/// A send or receive comm and the tokens of its requests.
#[derive(Debug)]
pub(super) struct CommHandle<C> {
    pub(super) comm: C,
    tokens: Box<[Token]>,
}

/// What `connect` returns to NCCL.
pub(super) type SendHandle = CommHandle<Tended<SendComm>>;
/// What `accept` returns to NCCL.
pub(super) type RecvHandle = CommHandle<Tended<RecvComm>>;

/// What NCCL gets as a request pointer.
#[repr(C)]
#[derive(Debug)]
pub(super) struct Token {
    tag: u32,
    index: u32,
    owner_tag: u32,
    owner: *const c_void,
}

/// The comm a request token belongs to.
#[derive(Debug)]
pub(super) enum RequestOwner<'a> {
    Send(&'a SendHandle, usize),
    Recv(&'a RecvHandle, usize),
}

fn boxed<T>(tag: u32, value: T) -> Box<Tagged<T>> {
    Box::new(Tagged { tag, value })
}

fn tokens(owner: *const c_void, owner_tag: u32, n: usize) -> Box<[Token]> {
    (0..n)
        .map(|i| Token {
            tag: TOKEN_TAG,
            index: u32::try_from(i).unwrap_or(0),
            owner_tag,
            owner,
        })
        .collect()
}

pub(super) fn listen_into_raw(comm: ListenComm) -> *mut c_void {
    Box::into_raw(boxed(LISTEN_TAG, comm)).cast()
}

/// Box `comm` under `tag` with `requests` tokens that point back at it.
fn comm_into_raw<C>(tag: u32, comm: C, requests: usize) -> *mut c_void {
    let mut b = boxed(
        tag,
        CommHandle {
            comm,
            tokens: Box::new([]),
        },
    );
    let owner: *const c_void = std::ptr::from_ref(&*b).cast();
    b.value.tokens = tokens(owner, tag, requests);
    Box::into_raw(b).cast()
}

pub(super) fn send_into_raw(comm: Tended<SendComm>) -> *mut c_void {
    comm_into_raw(SEND_TAG, comm, SEND_REQUESTS)
}

pub(super) fn recv_into_raw(comm: Tended<RecvComm>) -> *mut c_void {
    comm_into_raw(RECV_TAG, comm, RECV_REQUESTS)
}

pub(super) fn mr_into_raw(mr: MrHandle) -> *mut c_void {
    Box::into_raw(boxed(MR_TAG, mr)).cast()
}

pub(super) fn context_into_raw(ctx: CommContext) -> *mut c_void {
    Box::into_raw(boxed(CONTEXT_TAG, ctx)).cast()
}

impl<C> CommHandle<C> {
    /// The request pointer NCCL gets for request `index` of this comm.
    pub(super) fn request(&self, index: usize) -> *mut c_void {
        std::ptr::from_ref(&self.tokens[index]).cast_mut().cast()
    }
}

/// The error of a NULL pointer NCCL passed as `what` (a handle, an array, an out-parameter).
/// Out of line, as [`foreign_handle`]: every data-path call checks its pointers, and their
/// success path should carry none of this.
#[cold]
#[inline(never)]
pub(super) fn null_pointer(what: &str) -> Error {
    Error::misuse(format!("NULL {what}"))
}

/// The error of a handle that is not one of this plugin's `what`s.
#[cold]
#[inline(never)]
fn foreign_handle(ptr: *mut c_void, what: &str) -> Error {
    Error::misuse(format!("{what} {ptr:p} is not a {what} of this plugin"))
}

/// # Safety
/// `ptr` is NULL or a pointer this module produced and that has not been taken back.
#[inline]
unsafe fn tag_of(ptr: *mut c_void, what: &str) -> Result<u32> {
    if ptr.is_null() {
        return Err(null_pointer(what));
    }
    // SAFETY: every object this module hands out starts with a u32 tag (repr(C)).
    Ok(unsafe { ptr.cast::<u32>().read() })
}

/// # Safety
/// `ptr` is NULL or a live pointer from this module; the borrow ends before it is taken back.
#[inline]
unsafe fn borrow<'a, T>(ptr: *mut c_void, tag: u32, what: &str) -> Result<&'a T> {
    // SAFETY: forwarded contract.
    if unsafe { tag_of(ptr, what) }? != tag {
        return Err(foreign_handle(ptr, what));
    }
    // SAFETY: the tag says `ptr` is a live Tagged<T> created by this module.
    Ok(unsafe { &(*ptr.cast::<Tagged<T>>()).value })
}

/// # Safety
/// As `borrow`; afterwards `ptr` is dangling and must not be used again.
unsafe fn take<T>(ptr: *mut c_void, tag: u32, what: &str) -> Result<Box<Tagged<T>>> {
    // SAFETY: forwarded contract.
    if unsafe { tag_of(ptr, what) }? != tag {
        return Err(foreign_handle(ptr, what));
    }
    // SAFETY: created by Box::into_raw of a Tagged<T> in this module; taken back once. The tag
    // is cleared so a second close is caught instead of freeing twice (while the memory is
    // not yet reused).
    let mut b = unsafe { Box::from_raw(ptr.cast::<Tagged<T>>()) };
    b.tag = 0;
    Ok(b)
}

/// # Safety
/// `ptr` is NULL or a listen comm from `listen_into_raw`, not yet closed.
pub(super) unsafe fn listen_comm<'a>(ptr: *mut c_void) -> Result<&'a ListenComm> {
    // SAFETY: forwarded contract.
    unsafe { borrow(ptr, LISTEN_TAG, "listen comm") }
}

/// # Safety
/// As `listen_comm`; the comm is freed.
pub(super) unsafe fn take_listen_comm(ptr: *mut c_void) -> Result<Box<Tagged<ListenComm>>> {
    // SAFETY: forwarded contract.
    unsafe { take(ptr, LISTEN_TAG, "listen comm") }
}

/// # Safety
/// `ptr` is NULL or a send comm from `send_into_raw`, not yet closed.
#[inline]
pub(super) unsafe fn send_comm<'a>(ptr: *mut c_void) -> Result<&'a SendHandle> {
    // SAFETY: forwarded contract.
    unsafe { borrow(ptr, SEND_TAG, "send comm") }
}

/// # Safety
/// As `send_comm`; the comm is freed.
pub(super) unsafe fn take_send_comm(ptr: *mut c_void) -> Result<Box<Tagged<SendHandle>>> {
    // SAFETY: forwarded contract.
    unsafe { take(ptr, SEND_TAG, "send comm") }
}

/// # Safety
/// `ptr` is NULL or a receive comm from `recv_into_raw`, not yet closed.
#[inline]
pub(super) unsafe fn recv_comm<'a>(ptr: *mut c_void) -> Result<&'a RecvHandle> {
    // SAFETY: forwarded contract.
    unsafe { borrow(ptr, RECV_TAG, "recv comm") }
}

/// # Safety
/// As `recv_comm`; the comm is freed.
pub(super) unsafe fn take_recv_comm(ptr: *mut c_void) -> Result<Box<Tagged<RecvHandle>>> {
    // SAFETY: forwarded contract.
    unsafe { take(ptr, RECV_TAG, "recv comm") }
}

/// The device context of a send or receive comm (regMr accepts either).
///
/// # Safety
/// `ptr` is NULL or a live send or receive comm of this plugin.
pub(super) unsafe fn any_comm_context<'a>(
    ptr: *mut c_void,
) -> Result<&'a std::sync::Arc<crate::transport::DeviceContext>> {
    // SAFETY: forwarded contract.
    match unsafe { tag_of(ptr, "comm") }? {
        // SAFETY: the tag identifies the object.
        SEND_TAG => Ok(unsafe { send_comm(ptr) }?.comm.context()),
        // SAFETY: the tag identifies the object.
        RECV_TAG => Ok(unsafe { recv_comm(ptr) }?.comm.context()),
        _ => Err(Error::misuse(format!(
            "comm {ptr:p} is not a send or receive comm of this plugin"
        ))),
    }
}

/// # Safety
/// `ptr` is NULL or a memory handle from `mr_into_raw`, not yet deregistered.
#[inline]
pub(super) unsafe fn mr<'a>(ptr: *mut c_void) -> Result<&'a MrHandle> {
    // SAFETY: forwarded contract.
    unsafe { borrow(ptr, MR_TAG, "mhandle") }
}

/// # Safety
/// As `mr`; the handle is freed.
pub(super) unsafe fn take_mr(ptr: *mut c_void) -> Result<Box<Tagged<MrHandle>>> {
    // SAFETY: forwarded contract.
    unsafe { take(ptr, MR_TAG, "mhandle") }
}

/// # Safety
/// `ptr` is NULL or a context from `context_into_raw`, not yet finalized.
pub(super) unsafe fn context<'a>(ptr: *mut c_void) -> Result<&'a CommContext> {
    // SAFETY: forwarded contract.
    unsafe { borrow(ptr, CONTEXT_TAG, "context") }
}

/// # Safety
/// As `context`; the context is freed.
pub(super) unsafe fn take_context(ptr: *mut c_void) -> Result<Box<Tagged<CommContext>>> {
    // SAFETY: forwarded contract.
    unsafe { take(ptr, CONTEXT_TAG, "context") }
}

/// # Safety
/// `ptr` is NULL or a request token of a comm that is still open.
#[inline]
pub(super) unsafe fn request<'a>(ptr: *mut c_void) -> Result<RequestOwner<'a>> {
    // SAFETY: forwarded contract.
    let token: &Token = unsafe { borrow_token(ptr) }?;
    let index = token.index as usize;
    match token.owner_tag {
        // SAFETY: tokens point at the live Tagged<SendHandle> that owns them.
        SEND_TAG => Ok(RequestOwner::Send(
            unsafe { &(*token.owner.cast::<Tagged<SendHandle>>()).value },
            index,
        )),
        // SAFETY: as above for receive comms.
        RECV_TAG => Ok(RequestOwner::Recv(
            unsafe { &(*token.owner.cast::<Tagged<RecvHandle>>()).value },
            index,
        )),
        _ => Err(Error::misuse("request with an unknown owner")),
    }
}

/// # Safety
/// As `request`.
#[inline]
unsafe fn borrow_token<'a>(ptr: *mut c_void) -> Result<&'a Token> {
    if ptr as usize == crate::abi::types::NCCL_NET_OPTIONAL_RECV_COMPLETION {
        return Err(Error::misuse("test on the 0x1 sentinel, not a request"));
    }
    // SAFETY: forwarded contract.
    if unsafe { tag_of(ptr, "request") }? != TOKEN_TAG {
        return Err(foreign_handle(ptr, "request"));
    }
    // SAFETY: the tag says this is a live token.
    Ok(unsafe { &*ptr.cast::<Token>() })
}

/// Where `connect` keeps its state between calls. NCCL passes the same handle buffer to every
/// call of one connect, but a handle crosses processes and hosts, so nothing in it is trusted as
/// in-process state: the buffer only carries a marker and a random token after the wire handle,
/// and the state lives here, keyed by that token. An unknown token starts a new connect from the
/// wire handle; a forged one can name nothing but another connect's random token.
const CONNECT_MARKER: u64 = 0x4e4e_4f43_4249_5352; // "RSIBCONN"
const MARKER_AT: usize = 96;

/// The parked connects, by token, and when the next sweep for abandoned ones is due.
struct Parked {
    connects: HashMap<u64, Box<Connecting>>,
    next_sweep: Instant,
}

/// How often parking a connect also sweeps out the abandoned ones: a sweep looks at every parked
/// connect, and NCCL parks each of up to 128 (or more) connects of a round at every call.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

static CONNECTS: Lazy<Mutex<Parked>> = Lazy::new(|| {
    Mutex::new(Parked {
        connects: HashMap::new(),
        next_sweep: Instant::now() + SWEEP_EVERY,
    })
});

/// The connect in progress for this handle, or a new one.
///
/// # Safety
/// `handle` points at NCCL's 128-byte handle buffer.
pub(super) unsafe fn resume_connect(
    handle: *mut u8,
    start: impl FnOnce(ListenHandle) -> Result<Connecting>,
) -> Result<Box<Connecting>> {
    // SAFETY: 128 readable and writable bytes (NCCL_NET_HANDLE_MAXSIZE).
    let bytes = unsafe { std::slice::from_raw_parts_mut(handle, NCCL_NET_HANDLE_MAXSIZE) };
    let tail = &mut bytes[MARKER_AT..MARKER_AT + 16];
    let marker = u64::from_le_bytes(tail[..8].try_into().unwrap_or_default());
    let token = u64::from_le_bytes(tail[8..].try_into().unwrap_or_default());
    tail.fill(0);
    if marker == CONNECT_MARKER
        && let Some(state) = CONNECTS.lock().connects.remove(&token)
    {
        return Ok(state);
    }
    Ok(Box::new(start(ListenHandle::parse(bytes)?)?))
}

/// Keep `state` for the next `connect` call on this handle buffer.
///
/// # Safety
/// As `resume_connect`.
pub(super) unsafe fn park_connect(handle: *mut u8, state: Box<Connecting>) {
    let mut parked = CONNECTS.lock();
    // Connects NCCL abandoned (never called again) go once their deadline is long past.
    let now = Instant::now();
    if now >= parked.next_sweep {
        parked.connects.retain(|_, c| !c.abandoned(now));
        parked.next_sweep = now + SWEEP_EVERY;
    }
    let table = &mut parked.connects;
    let token = loop {
        let t = random_u64();
        if !table.contains_key(&t) {
            break t;
        }
    };
    table.insert(token, state);
    let mut tail = [0u8; 16];
    tail[..8].copy_from_slice(&CONNECT_MARKER.to_le_bytes());
    tail[8..].copy_from_slice(&token.to_le_bytes());
    // SAFETY: bytes 96..112 of the 128-byte handle buffer, outside the wire handle.
    let at = unsafe { handle.add(MARKER_AT) }.cast::<[u8; 16]>();
    // SAFETY: writable handle bytes.
    unsafe { at.write_unaligned(tail) };
}

const _: () = assert!(ListenHandle::LEN <= MARKER_AT);
