//! Capture: a window's work recorded once into a reusable command buffer.
//!
//! Vulkan needs no capture API: a `SIMULTANEOUS_USE` command buffer can be submitted again
//! while an earlier submission still runs. A window records into its own command pool, so the
//! graph outlives nothing it depends on. A replay queues that buffer into the stream's next
//! submission, with no re-recording and no descriptor sets.
//!
//! A host write inside a window keeps the bytes given at call time for every replay: inline
//! up to 64 KiB (`vkCmdUpdateBuffer`), else in a staging chunk the graph owns.
//!
//! Each replay in flight holds an `Arc` of the graph, so destroying one never frees a command
//! buffer the device may still run. Destroying waits for the latest submitted replay on each
//! stream (rule 35), so a replay's fault surfaces there and joins the graph's write set.
//!
//! The recording and the graph's buffer are `command.rs`, since the stream holds them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use scope_core::Result;

use crate::command::{GraphInner, Recording};
use crate::stream::OpenStream;
use crate::timeline::wait_tracks;

/// A captured graph: what the core holds as `Backend::Graph`.
pub struct VulkanGraph(pub(crate) Arc<GraphInner>);

impl VulkanGraph {
    /// How many commands (launches, copies, writes) it replays.
    pub fn commands(&self) -> usize {
        self.0.commands
    }
}

/// Start recording `stream`'s work into a new command buffer.
pub(crate) fn begin(stream: &mut OpenStream) -> Result<()> {
    stream.recording = Some(Recording::new(&stream.gpu)?);
    Ok(())
}

/// Seal the recording into a graph.
pub(crate) fn end(stream: &mut OpenStream) -> Result<VulkanGraph> {
    let Some(recording) = stream.recording.take() else {
        return Err(scope_core::Error::internal(
            "the stream was asked to end a capture it was not recording",
        ));
    };
    Ok(VulkanGraph(Arc::new(recording.seal()?)))
}

/// Throw the recording away.
pub(crate) fn abort(stream: &mut OpenStream) {
    stream.recording = None;
}

/// Submit a replay of `graph` on `stream`.
pub(crate) fn replay(stream: &mut OpenStream, graph: &VulkanGraph) -> Result<()> {
    stream.submit_graph(&graph.0)
}

/// Destroy `graph` once its submitted replays are done (rule 35).
pub(crate) fn destroy(graph: VulkanGraph) -> Result<()> {
    let mut replays = std::mem::take(&mut *graph.0.replays.lock());
    // A replay whose batch failed was never submitted, and signals nothing.
    replays.retain(|(track, value)| *value <= track.submitted.load(Ordering::Acquire));
    let waited = wait_tracks(&graph.0.gpu, &replays);
    drop(graph);
    waited
}
