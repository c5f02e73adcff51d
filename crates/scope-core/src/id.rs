//! Typed-number ids and the hasher for maps keyed by them. None keeps anything
//! alive: a recording naming a buffer does not stop its free (rule 32).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::num::NonZeroU64;

/// One failure in a device's store, never reused, so a stale id can only
/// miss; non-zero so `Option<FailureId>` is one word (rule 1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FailureId(NonZeroU64);

impl FailureId {
    /// The id whose number is `n`, or `None` for zero.
    pub fn new(n: u64) -> Option<Self> {
        NonZeroU64::new(n).map(Self)
    }

    /// The number.
    pub fn get(self) -> u64 {
        self.0.get()
    }
}

impl fmt::Debug for FailureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "F{}", self.0)
    }
}

impl fmt::Display for FailureId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failure #{}", self.0)
    }
}

/// A logical stream of one server; every client starts on stream 0.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
pub struct StreamId(pub u32);

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

/// A buffer of one server: a reused slot and a generation that is not, so
/// a freed handle cannot reach whatever buffer took its slot.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId {
    pub(crate) slot: u32,
    pub(crate) generation: u32,
}

impl BufferId {
    /// A buffer id from its slot and generation, for the benches' stores.
    pub fn from_parts(slot: u32, generation: u32) -> Self {
        Self { slot, generation }
    }

    /// The slot in the server's buffer table.
    pub fn slot(self) -> u32 {
        self.slot
    }

    /// How many times the slot had been used before this buffer.
    pub fn generation(self) -> u32 {
        self.generation
    }
}

impl fmt::Debug for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "B{}.{}", self.slot, self.generation)
    }
}

impl fmt::Display for BufferId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.generation == 0 {
            write!(f, "buffer #{}", self.slot)
        } else {
            write!(f, "buffer #{}.{}", self.slot, self.generation)
        }
    }
}

/// A captured graph of one server.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct GraphId(pub(crate) u64);

impl fmt::Display for GraphId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "graph #{}", self.0)
    }
}

/// One server in this process, so another's handle is refused by name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ServerId(pub(crate) u64);

impl ServerId {
    pub(crate) fn next() -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A half-open byte range of one allocation; `Copy`, unlike `Range<u64>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ByteRange {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

impl ByteRange {
    /// `start..end`; an `end` before `start` gives the empty range at `start`.
    pub const fn new(start: u64, end: u64) -> Self {
        Self {
            start,
            end: if end < start { start } else { end },
        }
    }

    /// The bytes `offset..offset + len`, or `None` when that overflows.
    pub const fn at(offset: u64, len: u64) -> Option<Self> {
        match offset.checked_add(len) {
            Some(end) => Some(Self { start: offset, end }),
            None => None,
        }
    }

    /// How many bytes.
    pub const fn len(self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Whether it holds no byte.
    pub const fn is_empty(self) -> bool {
        self.end <= self.start
    }

    /// Whether the two share a byte (rule 12: an empty range never does).
    pub const fn intersects(self, other: Self) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// Whether the two overlap or touch, so that merging them gives one range.
    pub const fn touches(self, other: Self) -> bool {
        self.start <= other.end && other.start <= self.end
    }
}

impl fmt::Debug for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

impl fmt::Display for ByteRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bytes {}..{}", self.start, self.end)
    }
}

impl From<std::ops::Range<u64>> for ByteRange {
    fn from(r: std::ops::Range<u64>) -> Self {
        Self::new(r.start, r.end)
    }
}

/// Bytes of one buffer: what a launch binds, a copy writes, a read checks.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct BufferRange {
    /// The buffer.
    pub buffer: BufferId,
    /// The bytes of it.
    pub range: ByteRange,
}

impl fmt::Display for BufferRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.buffer, self.range)
    }
}

/// A hasher for keys with no adversary, since SipHash was a measurable part
/// of every launch; FxHash's step mixes each word, so long keys still spread.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
        for &b in chunks.remainder() {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by ids, hashed with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hash};

    use super::*;

    fn hash(key: impl Hash) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(key)
    }

    #[test]
    fn the_id_hasher_spreads_one_word_and_every_word_of_several() {
        // One word: a single multiply, so counted ids land apart.
        assert_eq!(hash(3u64), 3u64.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        assert_ne!(hash(1u64) >> 57, hash(2u64) >> 57);
        assert_ne!(hash([1u64, 2, 3]), hash([1u64, 2, 4]));
        assert_ne!(hash([1u64, 2, 3]), hash([3u64, 2, 1]));
        // Bytes: whole words, then the remainder byte by byte.
        let bytes = |b: &[u8]| {
            let mut h = IdHasher::default();
            h.write(b);
            h.finish()
        };
        assert_eq!(bytes(&7u64.to_le_bytes()), hash(7u64));
        assert_ne!(bytes(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), bytes(&[0; 9]));
        assert_eq!(hash(7u32), hash(7u64));
    }
}
