//! The buffers of one (grouped) request, at most [`MAX_RECVS`] of them, kept inline: the data
//! path builds one per `irecv`, CTS read and `test`, and must not allocate per message.

use std::fmt;
use std::ops::{Deref, DerefMut};

use super::wire::MAX_RECVS;

/// Up to [`MAX_RECVS`] items, inline.
#[derive(Copy, Clone)]
pub struct Group<T> {
    items: [T; MAX_RECVS],
    len: usize,
}

impl<T: Copy + Default> Group<T> {
    /// A group of the single item `item`.
    pub fn one(item: T) -> Self {
        std::iter::once(item).collect()
    }
}

impl<T> Group<T> {
    /// Empty it (the items stay in place, unused).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Append `item`; a full group stays as it is (as with `collect`, every caller has checked
    /// the request's `n` against [`MAX_RECVS`] already).
    pub fn push(&mut self, item: T) {
        if let Some(slot) = self.items.get_mut(self.len) {
            *slot = item;
            self.len += 1;
        }
    }
}

impl<T: Copy + Default> Default for Group<T> {
    /// The empty group.
    fn default() -> Self {
        std::iter::empty().collect()
    }
}

impl<T: Copy + Default> FromIterator<T> for Group<T> {
    /// Keeps the first [`MAX_RECVS`] items: every caller has checked the request's `n` against
    /// that bound already (a longer request is refused before any group is built).
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut group = Self {
            items: [T::default(); MAX_RECVS],
            len: 0,
        };
        for item in iter.into_iter().take(MAX_RECVS) {
            group.push(item);
        }
        group
    }
}

impl<T> Deref for Group<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<T> DerefMut for Group<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len]
    }
}

impl<'a, T> IntoIterator for &'a Group<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<T: fmt::Debug> fmt::Debug for Group<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: PartialEq> PartialEq for Group<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for Group<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_was_collected_up_to_the_request_bound() {
        let g: Group<u64> = (1..=3).collect();
        assert_eq!(&*g, &[1, 2, 3]);
        assert_eq!(Group::one(7u64).len(), 1);
        let full: Group<u64> = (0..100).collect();
        assert_eq!(full.len(), MAX_RECVS);
        assert_eq!(full.last(), Some(&(MAX_RECVS as u64 - 1)));
        let empty: Group<u64> = std::iter::empty().collect();
        assert!(empty.is_empty());
        let mut pushed = full;
        pushed.push(99);
        assert_eq!(pushed, full, "a full group ignores a push");
        let mut grown = g;
        grown.push(4);
        assert_eq!(&*grown, &[1, 2, 3, 4]);
        grown.clear();
        assert!(grown.is_empty());
        grown.push(5);
        assert_eq!(&*grown, &[5]);
        assert_eq!(format!("{g:?}"), "[1, 2, 3]");
    }
}
