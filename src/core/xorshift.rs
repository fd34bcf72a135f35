//! A deterministic xorshift generator for the simulations' random schedules, so a failing
//! schedule reproduces from its seed.

/// Xorshift64; the seed must not be zero.
#[derive(Debug)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next value.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (not zero).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
