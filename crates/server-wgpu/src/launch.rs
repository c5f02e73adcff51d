//! Launches: checked against the device's limits, bound, and encoded into
//! the stream's open pass. Compiling is `compile.rs`; this file stands on it
//! and on the stream, and a capture window's launches are recorded above it.
//!
//! A launch finds or makes the bind group for its exact buffers and ranges.
//! It then encodes set-pipeline, set-bind-group and dispatch into the open
//! pass, skipping what is already bound. No error scope is pushed per
//! dispatch: recording cannot fail in wgpu 30, and three scopes would double
//! a launch's cost.

use std::cell::Cell;
use std::num::NonZeroU64;

use scope_core::backend::{Bound, BoundDispatch, Launch};
use scope_core::id::IdMap;
use scope_core::{Error, StreamId};
use smallvec::SmallVec;

use crate::compile::{Pipeline, Slot};
use crate::error::{lost_first, message, scoped};
use crate::memory::{Memory, mark, tag_value};
use crate::stream::{ARENA_BYTES, Arena, BATCH_LIMIT, Batch, Dispatch, Submitter};

#[inline]
pub(crate) fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// The last launch [`check`] accepted, as the check reads it. A loop repeats
/// one launch, and comparing is a fraction of checking again. The rest is fixed
/// by the same ids: ids are never reused, and a reopened device starts anew.
pub(crate) struct Checked {
    /// Pipeline, blob length and indirect buffer (`u64::MAX` for host counts);
    /// all zero while nothing is remembered.
    head: Cell<[u64; 3]>,
    /// How many bindings it had; `usize::MAX` while nothing is remembered.
    count: Cell<usize>,
    bound: [Cell<[u64; 3]>; CHECKED_BINDINGS],
}

/// The most bindings [`Checked`] remembers; a launch with more is checked
/// every time. Cells, not a vector, keep the comparison to loads with no
/// heap pointer to follow.
const CHECKED_BINDINGS: usize = 6;

impl Checked {
    /// Whether `launch` of `kernel` is the launch last accepted.
    #[inline(always)]
    pub(crate) fn is_last(&self, kernel: &Pipeline, launch: &Launch<'_, Memory>) -> bool {
        if self.count.get() != launch.bindings.len()
            || !same_words(self.head.get(), Self::head(kernel, launch))
        {
            return false;
        }
        // A loop, not `zip(..).all(..)`, which compiled to an out-of-line call.
        for (k, b) in self.bound.iter().zip(launch.bindings) {
            if !same_words(k.get(), [b.memory.id, b.offset, b.len]) {
                return false;
            }
        }
        true
    }

    /// Remember `launch` of `kernel` as last accepted, unless it has too many bindings.
    pub(crate) fn remember(&self, kernel: &Pipeline, launch: &Launch<'_, Memory>) {
        if launch.bindings.len() > CHECKED_BINDINGS {
            self.count.set(usize::MAX);
            return;
        }
        self.head.set(Self::head(kernel, launch));
        for (k, b) in self.bound.iter().zip(launch.bindings) {
            k.set([b.memory.id, b.offset, b.len]);
        }
        self.count.set(launch.bindings.len());
    }

    /// What is checked besides bindings. `u64::MAX`, no memory's id, marks host counts.
    #[inline]
    fn head(kernel: &Pipeline, launch: &Launch<'_, Memory>) -> [u64; 3] {
        let indirect = match &launch.dispatch {
            BoundDispatch::Indirect { memory, .. } => memory.id,
            BoundDispatch::Groups(_) => u64::MAX,
        };
        [kernel.id, launch.scalars.len() as u64, indirect]
    }
}

impl Default for Checked {
    fn default() -> Self {
        Self {
            head: Cell::new([0; 3]),
            count: Cell::new(usize::MAX),
            bound: Default::default(),
        }
    }
}

/// What wgpu would refuse about `launch` when the batch is finished,
/// refused now instead, as an invalid argument naming the launch.
pub(crate) fn check(
    limits: &wgpu::Limits,
    kernel: &Pipeline,
    launch: &Launch<'_, Memory>,
) -> Result<(), Error> {
    check_parts(limits, kernel, launch)
        .map_err(|(what, why)| Error::invalid(format!("{what} of `{}`", kernel.name), why))
}

/// [`check`]'s findings: which part of the launch, and what is wrong.
fn check_parts(
    limits: &wgpu::Limits,
    kernel: &Pipeline,
    launch: &Launch<'_, Memory>,
) -> Result<(), (String, String)> {
    let bindings = || "the bindings".to_owned();
    let scalar = usize::from(!launch.scalars.is_empty());
    if launch.bindings.len() + scalar != kernel.slots.len() {
        return Err((
            bindings(),
            format!(
                "the shader declares {} binding{} at @group(0), and the launch binds {} buffer{}{}",
                kernel.slots.len(),
                if kernel.slots.len() == 1 { "" } else { "s" },
                launch.bindings.len(),
                if launch.bindings.len() == 1 { "" } else { "s" },
                if scalar == 1 {
                    " and a scalar blob"
                } else {
                    ""
                }
            ),
        ));
    }
    let fits = |i: usize, slot: &Slot, len: u64| -> Result<(), (String, String)> {
        // Named only on error: no string per binding on the success path.
        let what = || format!("binding {i}");
        let max = if slot.uniform {
            limits.max_uniform_buffer_binding_size
        } else {
            limits.max_storage_buffer_binding_size
        };
        if len > max {
            return Err((
                what(),
                format!(
                    "{len} bytes is past the device's largest {} binding of {max} bytes",
                    if slot.uniform { "uniform" } else { "storage" }
                ),
            ));
        }
        if len < slot.min_size {
            return Err((
                what(),
                format!(
                    "{len} bytes is less than the shader's type for it needs: at least {}",
                    slot.min_size
                ),
            ));
        }
        Ok(())
    };
    for (i, (bound, slot)) in launch.bindings.iter().zip(&kernel.slots).enumerate() {
        fits(i, slot, bound.len)?;
        if bound.offset + bound.len > bound.memory.capacity {
            return Err((
                format!("binding {i}"),
                format!(
                    "{}..{} runs past the end of its {}-byte buffer",
                    bound.offset,
                    bound.offset + bound.len,
                    bound.memory.capacity
                ),
            ));
        }
        if slot.uniform && bound.offset % u64::from(limits.min_uniform_buffer_offset_alignment) != 0
        {
            return Err((
                format!("binding {i}"),
                format!(
                    "a uniform buffer at offset {}, not a multiple of {}",
                    bound.offset, limits.min_uniform_buffer_offset_alignment
                ),
            ));
        }
    }
    if scalar == 1 {
        let i = launch.bindings.len();
        if launch.scalars.len() as u64 > ARENA_BYTES {
            return Err((
                "the scalar blob".to_owned(),
                format!(
                    "{} bytes; a launch may pass at most {ARENA_BYTES}",
                    launch.scalars.len()
                ),
            ));
        }
        fits(
            i,
            &kernel.slots[i],
            round_up(launch.scalars.len() as u64, 4),
        )?;
    }
    // One dispatch is one usage scope: a buffer is read-only or writable, not both.
    let indirect = match &launch.dispatch {
        BoundDispatch::Indirect { memory, .. } => Some(memory.id),
        BoundDispatch::Groups(_) => None,
    };
    for (i, (a, slot)) in launch.bindings.iter().zip(&kernel.slots).enumerate() {
        if slot.read_only {
            continue;
        }
        let clash = launch
            .bindings
            .iter()
            .zip(&kernel.slots)
            .position(|(b, other)| b.memory.id == a.memory.id && other.read_only);
        if let Some(j) = clash {
            return Err((
                format!("bindings {i} and {j}"),
                "the same buffer, writable in one and read-only in the other; wgpu forbids that \
                 within one dispatch"
                    .to_owned(),
            ));
        }
        if indirect == Some(a.memory.id) {
            return Err((
                format!("binding {i}"),
                "writable, and its buffer also holds the indirect dispatch counts; wgpu forbids that"
                    .to_owned(),
            ));
        }
    }
    // Host-given counts were checked by the core against `launch_limits`.
    Ok(())
}

impl Checked {
    /// [`check`] a launch unlike the last accepted, remembering it if it passes.
    /// Out of line, so a repeated launch carries only the comparison.
    #[inline(never)]
    pub(crate) fn check_anew(
        &self,
        limits: &wgpu::Limits,
        kernel: &Pipeline,
        launch: &Launch<'_, Memory>,
    ) -> Result<(), Error> {
        check(limits, kernel, launch)?;
        self.remember(kernel, launch);
        Ok(())
    }
}

/// Append a new scalar blob to `batch`'s arena image, `padded` to whole
/// words; returns its offset. A full arena submits the batch first. Out of
/// line: a loop that repeats its blob never comes here.
#[inline(never)]
fn append_scalars(
    submitter: &mut Submitter<'_>,
    batch: &mut Batch,
    scalars: &[u8],
    padded: u64,
) -> Result<u64, Error> {
    let mut offset = round_up(batch.scalars.len() as u64, submitter.gpu.scalar_alignment());
    if batch.arena.is_some() && offset + padded > ARENA_BYTES {
        submitter.flush(batch)?;
        offset = 0;
    }
    if batch.arena.is_none() {
        batch.arena = Some(submitter.arena()?);
    }
    let start = offset as usize;
    batch.scalars.resize(start, 0);
    batch.scalars.extend_from_slice(scalars);
    batch.scalars.resize(start + padded as usize, 0);
    batch.last_scalars = start..start + scalars.len();
    Ok(offset)
}

/// Encode `launch` into `batch`'s pass, stream `s`'s.
pub(crate) fn launch(
    submitter: &mut Submitter<'_>,
    batch: &mut Batch,
    s: usize,
    bind_groups: &mut BindGroups,
    kernel: &Pipeline,
    launch: &Launch<'_, Memory>,
) -> Result<(), Error> {
    submitter.gpu.sink.check_lost()?;
    // The core ran `check` before the launch's scope opened. Were it
    // skipped, wgpu would refuse the batch at submission: a late fault.
    let stream = batch.stream;
    let padded = round_up(launch.scalars.len() as u64, 4);
    let mut scalar_offset = 0u64;
    if !launch.scalars.is_empty() {
        let last = batch.last_scalars.clone();
        let same = batch.arena.is_some()
            && batch
                .scalars
                .get(last.clone())
                .is_some_and(|blob| same_bytes(blob, launch.scalars));
        scalar_offset = if same {
            last.start as u64
        } else {
            append_scalars(submitter, batch, launch.scalars, padded)?
        };
    }
    let gpu = submitter.gpu;
    let group = match &kernel.layout {
        None => None,
        Some(_) => {
            // With a dynamic offset, one group names the arena at 0 for every blob.
            let arena = match &batch.arena {
                Some(arena) if !launch.scalars.is_empty() => Some(if kernel.dynamic {
                    (arena, 0, Some(scalar_offset as u32))
                } else {
                    (arena, scalar_offset, None)
                }),
                _ => None,
            };
            let dynamic = match arena {
                Some((_, _, dynamic)) => dynamic,
                None => kernel.dynamic.then_some(0u32),
            };
            let extra = arena.map(|(arena, offset, _)| [arena.id, offset, padded]);
            let found = match bind_groups.last_for(kernel.id, launch.bindings, extra) {
                Some(found) => Ok(found),
                None => bind_groups.look_up(
                    &gpu.device,
                    kernel,
                    launch.bindings,
                    arena.map(|(arena, offset, _)| (arena, offset, padded)),
                    submitter.next_id,
                ),
            };
            let (id, group) = match found {
                Ok(found) => found,
                Err(detail) => {
                    lost_first(&gpu.device, &gpu.sink)?;
                    return Err(launch_error(kernel, stream, detail));
                }
            };
            Some((id, group, dynamic))
        }
    };
    let dispatch = match &launch.dispatch {
        BoundDispatch::Groups(groups) => Dispatch::Groups(*groups),
        BoundDispatch::Indirect { memory, offset } => Dispatch::Indirect(&memory.buffer, *offset),
    };
    batch.dispatch(&gpu.device, (kernel.id, &kernel.pipeline), group, dispatch);
    let tag = tag_value(s, batch.number);
    for bound in launch.bindings {
        mark(&bound.memory.tag, tag);
    }
    if let BoundDispatch::Indirect { memory, .. } = &launch.dispatch {
        mark(&memory.tag, tag);
    }
    if batch.dispatches >= BATCH_LIMIT {
        submitter.flush(batch)?;
    }
    Ok(())
}

/// Whether two keys are the same, word by word. `==` on arrays compared them
/// as vectors, and a 16-byte load over two fresh 8-byte stores stalls: a
/// fifth of the core's part of a launch on llvmpipe-GL.
#[inline(always)]
fn same_words(a: [u64; 3], b: [u64; 3]) -> bool {
    (a[0] == b[0]) & (a[1] == b[1]) & (a[2] == b[2])
}

/// Whether two scalar blobs are the same bytes, eight at a time, inline.
/// A slice comparison called `bcmp`, a call on every repeated launch.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let (words_a, words_b) = (a.chunks_exact(8), b.chunks_exact(8));
    let tails = words_a
        .remainder()
        .iter()
        .zip(words_b.remainder())
        .all(|(x, y)| x == y);
    tails
        && words_a
            .zip(words_b)
            .all(|(x, y)| u64::from_ne_bytes(word(x)) == u64::from_ne_bytes(word(y)))
}

#[inline(always)]
fn word(chunk: &[u8]) -> [u8; 8] {
    let mut word = [0; 8];
    word.copy_from_slice(chunk);
    word
}

/// The launch error for `kernel` on `stream`.
pub(crate) fn launch_error(kernel: &Pipeline, stream: StreamId, detail: String) -> Error {
    Error::Launch {
        kernel: kernel.name.clone(),
        stream,
        detail,
    }
}

/// A bind group's identity: pipeline and each entry's `[buffer id, offset, size]`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct BindKey {
    pub(crate) pipeline: u64,
    pub(crate) entries: SmallVec<[[u64; 3]; 6]>,
}

/// Bind groups by key, cleared when full or when a key's buffer is destroyed.
#[derive(Default)]
pub(crate) struct BindGroups {
    map: IdMap<BindKey, (u64, wgpu::BindGroup)>,
    /// The last group found, with its key. A loop repeats one launch, and
    /// comparing its entries costs a tenth of a keyed lookup.
    last: Option<(BindKey, u64, wgpu::BindGroup)>,
}

/// Cached bind groups before the cache starts over.
const BIND_GROUPS: usize = 8192;

/// One entry of a bind group to make.
pub(crate) struct Entry<'a> {
    pub(crate) buffer: &'a wgpu::Buffer,
    pub(crate) id: u64,
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

impl BindGroups {
    /// The last group found, if it matches `bindings` of `pipeline` and the blob's
    /// entry `extra`. Compared in place, so the common launch builds no entry list.
    #[inline]
    pub(crate) fn last_for(
        &self,
        pipeline: u64,
        bindings: &[Bound<'_, Memory>],
        extra: Option<[u64; 3]>,
    ) -> Option<(u64, &wgpu::BindGroup)> {
        let (key, id, group) = self.last.as_ref()?;
        let (bound, rest) = key.entries.split_at_checked(bindings.len())?;
        if key.pipeline != pipeline {
            return None;
        }
        for (k, b) in bound.iter().zip(bindings) {
            if !same_words(*k, [b.memory.id, b.offset, b.len]) {
                return None;
            }
        }
        let same = match (rest, extra) {
            ([], None) => true,
            ([k], Some(e)) => same_words(*k, e),
            _ => false,
        };
        same.then_some((*id, group))
    }

    /// The bind group for `bindings` and the blob's entry, when
    /// [`last_for`](Self::last_for) missed. Out of line, off every launch's frame.
    #[inline(never)]
    pub(crate) fn look_up(
        &mut self,
        device: &wgpu::Device,
        kernel: &Pipeline,
        bindings: &[Bound<'_, Memory>],
        scalars: Option<(&Arena, u64, u64)>,
        next_id: &mut u64,
    ) -> Result<(u64, &wgpu::BindGroup), String> {
        let mut entries: SmallVec<[Entry<'_>; 6]> = bindings
            .iter()
            .map(|b| Entry {
                buffer: &b.memory.buffer,
                id: b.memory.id,
                offset: b.offset,
                size: b.len,
            })
            .collect();
        if let Some((arena, offset, size)) = scalars {
            entries.push(Entry {
                buffer: &arena.buffer,
                id: arena.id,
                offset,
                size,
            });
        }
        self.get(device, kernel, &entries, next_id)
    }

    /// The bind group for `entries`, cached or made, with its id; kept as the last.
    fn get(
        &mut self,
        device: &wgpu::Device,
        kernel: &Pipeline,
        entries: &[Entry<'_>],
        next_id: &mut u64,
    ) -> Result<(u64, &wgpu::BindGroup), String> {
        let key = BindKey {
            pipeline: kernel.id,
            entries: entries.iter().map(|e| [e.id, e.offset, e.size]).collect(),
        };
        let (id, group) = match self.map.get(&key) {
            Some((id, group)) => (*id, group.clone()),
            None => {
                let group = make_group(device, kernel, entries)?;
                if self.map.len() >= BIND_GROUPS {
                    self.map.clear();
                }
                *next_id += 1;
                self.map.insert(key.clone(), (*next_id, group.clone()));
                (*next_id, group)
            }
        };
        self.last = Some((key, id, group));
        match &self.last {
            Some((_, id, group)) => Ok((*id, group)),
            None => Err("the bind group cache lost its last group".to_owned()),
        }
    }

    /// Forget bind groups that name buffer `id`.
    pub(crate) fn evict(&mut self, id: u64) {
        self.map
            .retain(|k, _| !k.entries.iter().any(|e| e[0] == id));
        if self
            .last
            .as_ref()
            .is_some_and(|(k, _, _)| k.entries.iter().any(|e| e[0] == id))
        {
            self.last = None;
        }
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.last = None;
    }
}

/// Make a bind group for `entries` of `kernel`, inside error scopes.
pub(crate) fn make_group(
    device: &wgpu::Device,
    kernel: &Pipeline,
    entries: &[Entry<'_>],
) -> Result<wgpu::BindGroup, String> {
    let Some(layout) = &kernel.layout else {
        return Err("the kernel has no bindings".to_owned());
    };
    let wgpu_entries: SmallVec<[wgpu::BindGroupEntry<'_>; 6]> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| wgpu::BindGroupEntry {
            binding: i as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: e.buffer,
                offset: e.offset,
                size: NonZeroU64::new(e.size),
            }),
        })
        .collect();
    let (group, error) = scoped(device, || {
        device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(&*kernel.name),
            layout,
            entries: &wgpu_entries,
        })
    });
    match error {
        Some(error) => Err(message(&error)),
        None => Ok(group),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_the_same_only_byte_for_byte() {
        let blob: Vec<u8> = (0..37).collect();
        for len in 0..=blob.len() {
            let a = &blob[..len];
            let copy = a.to_vec();
            assert!(same_bytes(a, &copy), "{len} bytes against a copy");
            for i in 0..len {
                let mut other = a.to_vec();
                other[i] ^= 1;
                assert!(!same_bytes(a, &other), "{len} bytes, byte {i} differs");
            }
            if len > 0 {
                assert!(
                    !same_bytes(a, &a[..len - 1]),
                    "{len} bytes against one fewer"
                );
            }
        }
    }
}
