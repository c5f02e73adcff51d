//! Host memory, the bottom of the host server: bytes behind a lock, and the ranges into them.
//!
//! The loopback transport and the server's stream both reach the same bytes, so both name this
//! module and neither names the other's.

use std::sync::Arc;

use parking_lot::Mutex;

/// Host memory: shared so that a recorded graph can reach it on replay.
pub type HostMemory = Arc<Mutex<Vec<u8>>>;

/// Bytes `offset..offset + len` as an index range.
pub(super) fn range(offset: u64, len: u64) -> std::ops::Range<usize> {
    offset as usize..(offset + len) as usize
}
