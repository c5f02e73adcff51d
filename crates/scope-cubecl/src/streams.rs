//! cubecl's logical streams, folded onto scope streams.
//!
//! cubecl gives every thread its own stream id, and folds ids onto `max_streams` backend
//! streams. So does the adapter: slot `id % max_streams`, one scope stream per slot. A scope
//! stream is never destroyed, so the fold bounds their number. Ordering between streams is
//! scope's.

use cubecl_environment::stream::StreamId;
use cubecl_runtime::config::{CubeClRuntimeConfig, RuntimeConfig};
use cubecl_runtime::memory_management::MemoryAllocationMode;
use cubecl_runtime::server::{DeviceCaptures, ServerError, StreamCaptureState};
use scope_core::{Buffer, Capture, Client};

use crate::backend::CubeBackend;
use crate::error::to_server_error;
use scope_core::id::IdMap;

/// One scope stream and the capture cubecl sees on it.
pub(crate) struct Slot<B: CubeBackend> {
    pub(crate) client: Client<B>,
    /// The phase cubecl's clients read without reaching the server.
    pub(crate) phase: StreamCaptureState,
    /// The scope window while the phase is `Capture`.
    pub(crate) window: Option<Capture>,
    /// Where `memory_report` counts this stream's next allocations.
    pub(crate) mode: MemoryAllocationMode,
    /// Staged tensor metadata the open window's launches read, kept for the graph.
    pub(crate) pinned: Vec<Buffer>,
}

/// Every slot in use.
pub(crate) struct Streams<B: CubeBackend> {
    base: Client<B>,
    captures: DeviceCaptures,
    slots: IdMap<u64, Slot<B>>,
    /// The first cubecl id seen per slot, for `stream_ids`.
    seen: IdMap<u64, StreamId>,
    max: u64,
}

impl<B: CubeBackend> Streams<B> {
    pub(crate) fn new(base: Client<B>, captures: DeviceCaptures) -> Self {
        let max = u64::from(CubeClRuntimeConfig::get().streaming.max_streams.max(1))
            .min(scope_core::MAX_STREAMS as u64);
        Self {
            base,
            captures,
            slots: IdMap::default(),
            seen: IdMap::default(),
            max,
        }
    }

    /// The client of stream 0: for calls that name no stream.
    pub(crate) fn base(&self) -> &Client<B> {
        &self.base
    }

    /// The slot `stream` folds onto.
    pub(crate) fn key(&self, stream: StreamId) -> u64 {
        stream.value % self.max
    }

    /// The slot `stream` folds onto, made on first use.
    pub(crate) fn slot(&mut self, stream: StreamId) -> Result<&mut Slot<B>, ServerError> {
        let key = self.key(stream);
        if !self.slots.contains_key(&key) {
            self.seen.insert(key, stream);
            let client = if key == 0 {
                self.base.clone()
            } else {
                self.base.new_stream().map_err(|e| to_server_error(&e))?
            };
            let slot = Slot {
                client,
                phase: self.captures.stream(),
                window: None,
                mode: MemoryAllocationMode::Auto,
                pinned: Vec::new(),
            };
            self.slots.insert(key, slot);
        }
        Ok(self.slots.get_mut(&key).expect("inserted above"))
    }

    /// The scope client for `stream`.
    pub(crate) fn client(&mut self, stream: StreamId) -> Result<Client<B>, ServerError> {
        self.slot(stream).map(|slot| slot.client.clone())
    }

    /// A cubecl id per slot in use.
    pub(crate) fn ids(&self) -> Vec<StreamId> {
        self.seen.values().copied().collect()
    }

    /// Whether any slot has a capture prepared or recording.
    pub(crate) fn any_capture(&self) -> bool {
        self.slots.values().any(|slot| slot.phase.is_active())
    }
}
