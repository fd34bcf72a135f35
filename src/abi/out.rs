//! Out-parameters from NCCL: checked for NULL once, written at most once, only on success.

use crate::core::error::Result;

/// A non-NULL pointer NCCL gave us to write a result into.
#[derive(Debug)]
pub(super) struct Out<T> {
    ptr: *mut T,
}

impl<T> Out<T> {
    /// Wrap NCCL's out-pointer `ptr`, named `what` in the error if it is NULL.
    ///
    /// # Safety
    /// If non-NULL, `ptr` must be valid for a write of `T` until [`Out::write`] is called (NCCL's
    /// contract for every out-parameter).
    #[inline]
    pub(super) unsafe fn new(ptr: *mut T, what: &str) -> Result<Self> {
        if ptr.is_null() {
            return Err(super::handles::null_pointer(what));
        }
        Ok(Self { ptr })
    }

    /// Store the result.
    pub(super) fn write(self, value: T) {
        // SAFETY: non-NULL and valid for writes per the contract of `new`; `write` does not read
        // or drop the caller's (possibly uninitialised) previous contents.
        unsafe { self.ptr.write(value) };
    }
}
