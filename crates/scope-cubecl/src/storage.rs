//! What cubecl's `get_resource` hands out: a scope buffer and a range.
//!
//! Scope allocates on its own, so [`ScopeStorage`] never allocates. It names
//! [`ScopeResource`], which reaches the scope buffer behind a cubecl handle.

use std::marker::PhantomData;
use std::ops::Range;

use cubecl_environment::backtrace::BackTrace;
use cubecl_runtime::server::IoError;
use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId};
use scope_core::{Buffer, Client};

use crate::backend::CubeBackend;

/// The scope bytes behind a cubecl handle, after the check a read makes.
pub struct ScopeResource<B: CubeBackend> {
    /// The scope buffer of the handle's base allocation.
    pub buffer: Buffer,
    /// The handle's bytes within it.
    pub range: Range<u64>,
    /// A client of the server that owns the buffer.
    pub client: Client<B>,
}

impl<B: CubeBackend> std::fmt::Debug for ScopeResource<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopeResource")
            .field("buffer", &self.buffer)
            .field("range", &self.range)
            .field("client", &self.client)
            .finish()
    }
}

/// The storage type cubecl's `ServerStorage` names. Scope allocates; this refuses to.
#[derive(Debug)]
pub struct ScopeStorage<B>(PhantomData<fn() -> B>);

fn not_here() -> IoError {
    IoError::UnsupportedIoOperation {
        backtrace: BackTrace::capture(),
    }
}

impl<B: CubeBackend> ComputeStorage for ScopeStorage<B> {
    type Resource = ScopeResource<B>;

    fn alignment(&self) -> usize {
        256
    }

    fn get(&mut self, _handle: &StorageHandle) -> Result<Self::Resource, IoError> {
        Err(not_here())
    }

    fn alloc(&mut self, _size: u64) -> Result<StorageHandle, IoError> {
        Err(not_here())
    }

    fn dealloc(&mut self, _id: StorageId) {}

    fn flush(&mut self) {}

    fn bytes_allocated(&self) -> u64 {
        0
    }
}
