//! Device memory: a pool of large blocks, and host-visible arenas.
//!
//! **Why a pool of our own rather than `gpu-allocator`.** `gpu-allocator`
//! 0.28 does use ash 0.38, but it hands out raw `VkDeviceMemory` ranges, to
//! which each allocation must bind a `VkBuffer` of its own — a
//! `vkCreateBuffer` and `vkBindBufferMemory` per allocation, and a buffer
//! handle per binding in every descriptor push. A compute server binds only
//! storage buffers, so each block here is one `VkDeviceMemory` with one
//! `VkBuffer` over all of it, and an allocation is an offset into that
//! buffer: allocating is a free-list search with no driver call, and a
//! binding is (block buffer, offset). The pool also has to hold freed ranges
//! back until the work using them is done, which an allocator's `free`
//! cannot know; that bookkeeping is the larger half either way.
//!
//! - Blocks are [`BLOCK_SIZE`] (clamped to the driver's limits); a request
//!   over half a block gets a dedicated block of its own size.
//! - Offsets are multiples of [`ALIGN`], which covers every
//!   `minStorageBufferOffsetAlignment` in practice and is checked against
//!   the device's at start.
//! - A freed range is *pending* until every stream has completed the
//!   timeline value it had reached when the range was freed (a [`Stamp`]);
//!   only then does it rejoin its block's free list (first fit, coalescing).
//! - A request past the heap, `maxMemoryAllocationSize` or `maxBufferSize`
//!   never reaches the driver: it is past the backend's largest allocation
//!   (`Backend::max_allocation`), which the core refuses as an invalid
//!   argument — the device could never give it, where a request within it
//!   that the driver cannot meet now is out-of-memory (rule 37). Handing
//!   the driver such a request would be invalid usage (the validation layer
//!   flags it).
//!
//! The [`Arena`] is the host-visible side: bump allocation from mapped,
//! coherent chunks, for scalar blobs, staged writes and readbacks. A
//! stream's chunk travels with the submission that used it and comes back
//! when that submission completes; a graph's chunks belong to the graph.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ash::vk;
use scope_core::{Error, Result};
use smallvec::SmallVec;

use crate::device::Gpu;
use crate::error::{NAME, Site, classify};
use crate::stream::Track;

/// The size of a pooled block.
pub(crate) const BLOCK_SIZE: u64 = 64 << 20;
/// The alignment of every pooled allocation's offset.
pub(crate) const ALIGN: u64 = 256;
/// The size of an arena chunk.
pub(crate) const CHUNK_SIZE: u64 = 256 << 10;

/// A pointer into mapped memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostPtr(NonNull<u8>);

// SAFETY: the pointer is into a persistent mapping owned by a block or
// chunk; the backend is used under the server's lock, so it is never
// dereferenced from two threads at once.
unsafe impl Send for HostPtr {}

// SAFETY: as for `Send`: every dereference happens under the server's
// lock, so shared references to a `HostPtr` never race.
unsafe impl Sync for HostPtr {}

impl HostPtr {
    /// The pointer to byte `offset` of the mapping.
    ///
    /// # Safety
    ///
    /// The mapping `self` points at is still mapped (its block or chunk is
    /// alive) and `offset` is at most its length, so the result points into
    /// it or one past its end. `pointer::add` past that is undefined
    /// behaviour even if the pointer is never read.
    unsafe fn at(self, offset: u64) -> *mut u8 {
        // SAFETY: the caller's promise: `offset` stays inside one live
        // mapping, which lies in the address space, so it fits a `usize`
        // and the sum does not wrap.
        unsafe { self.0.as_ptr().add(offset as usize) }
    }
}

fn round_up(value: u64, align: u64) -> Option<u64> {
    value.checked_add(align - 1).map(|v| v / align * align)
}

/// A buffer and its memory, created together and destroyed together.
struct Backing {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    mapped: Option<HostPtr>,
    address: u64,
}

fn storage_usage(gpu: &Gpu) -> vk::BufferUsageFlags {
    let mut usage = vk::BufferUsageFlags::STORAGE_BUFFER
        | vk::BufferUsageFlags::TRANSFER_SRC
        | vk::BufferUsageFlags::TRANSFER_DST
        | vk::BufferUsageFlags::INDIRECT_BUFFER;
    if gpu.bda {
        usage |= vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS;
    }
    usage
}

/// Create a buffer of `size` bytes over fresh memory of `memory_type`.
fn create_backing(
    gpu: &Gpu,
    size: u64,
    memory_type: u32,
    map: bool,
    usage: vk::BufferUsageFlags,
    what: &str,
) -> Result<Backing> {
    let device = gpu.vk();
    let info = vk::BufferCreateInfo::default()
        .size(size)
        .usage(usage)
        .sharing_mode(vk::SharingMode::EXCLUSIVE);
    // SAFETY: a valid create info on a live device.
    let buffer = unsafe { device.create_buffer(&info, None) }
        .map_err(|e| classify(e, Site::Allocate, what, size))?;
    // SAFETY: `buffer` was just created on this device.
    let needs = unsafe { device.get_buffer_memory_requirements(buffer) };
    let destroy_buffer = || {
        // SAFETY: the buffer is unbound and unused.
        unsafe { device.destroy_buffer(buffer, None) }
    };
    if needs.memory_type_bits & (1 << memory_type) == 0 {
        destroy_buffer();
        return Err(Error::OutOfMemory {
            backend: NAME,
            requested: size,
            detail: format!("{what}: the pooled memory type cannot hold storage buffers"),
        });
    }
    let mut flags =
        vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
    let mut alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(needs.size)
        .memory_type_index(memory_type);
    if gpu.bda {
        alloc = alloc.push_next(&mut flags);
    }
    // SAFETY: a valid allocate info; the size is within the limits the
    // pool checked.
    let memory = match unsafe { device.allocate_memory(&alloc, None) } {
        Ok(memory) => memory,
        Err(e) => {
            destroy_buffer();
            return Err(classify(e, Site::Allocate, what, size));
        }
    };
    let free_all = || {
        // SAFETY: neither object is in use yet.
        unsafe {
            device.destroy_buffer(buffer, None);
            device.free_memory(memory, None);
        }
    };
    // SAFETY: the memory is fresh, of a type the buffer accepts, at offset 0.
    if let Err(e) = unsafe { device.bind_buffer_memory(buffer, memory, 0) } {
        free_all();
        return Err(classify(e, Site::Allocate, what, size));
    }
    let mapped = if map {
        // SAFETY: host-visible memory, mapped once for its whole life.
        match unsafe { device.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()) } {
            Ok(ptr) => NonNull::new(ptr.cast::<u8>()).map(HostPtr),
            Err(e) => {
                free_all();
                return Err(classify(e, Site::Allocate, what, size));
            }
        }
    } else {
        None
    };
    let address = if gpu.bda {
        // SAFETY: the buffer has SHADER_DEVICE_ADDRESS usage and bound memory
        // allocated with the DEVICE_ADDRESS flag.
        unsafe {
            device.get_buffer_device_address(&vk::BufferDeviceAddressInfo::default().buffer(buffer))
        }
    } else {
        0
    };
    Ok(Backing {
        buffer,
        memory,
        mapped,
        address,
    })
}

fn destroy_backing(gpu: &Gpu, backing: &Backing) {
    // SAFETY: callers destroy a backing only once no submitted work uses it.
    unsafe {
        gpu.vk().destroy_buffer(backing.buffer, None);
        gpu.vk().free_memory(backing.memory, None);
    }
}

/// Pooled device memory: what the core holds as `Backend::Memory`.
#[derive(Debug)]
pub struct VulkanMemory {
    pub(crate) block: usize,
    pub(crate) offset: u64,
    pub(crate) reserved: u64,
    pub(crate) buffer: vk::Buffer,
    pub(crate) mapped: Option<HostPtr>,
    address: u64,
}

impl VulkanMemory {
    /// The buffer device address of its first byte, when the device has
    /// `bufferDeviceAddress` (0 otherwise).
    pub fn device_address(&self) -> u64 {
        if self.address == 0 {
            0
        } else {
            self.address + self.offset
        }
    }

    /// Whether the device memory is host-visible and mapped, so
    /// [`host`](Self::host) answers.
    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Pointer to byte `offset` of it, when it is mapped.
    ///
    /// # Safety
    ///
    /// `self` is alive (not given to [`Pool::free`]) and `offset` is at
    /// most the size it was allocated with — what the `Backend` contract
    /// promises of every range the core names on a memory.
    pub(crate) unsafe fn host(&self, offset: u64) -> Option<*mut u8> {
        // SAFETY: a live allocation is `reserved` bytes at `self.offset` of
        // its block, and a mapped block is mapped whole for its life, so
        // `self.offset + offset` is inside that mapping (the caller's
        // promise bounds `offset` by the allocation's size).
        self.mapped.map(|p| unsafe { p.at(self.offset + offset) })
    }
}

struct Block {
    backing: Backing,
    size: u64,
    /// Free ranges, sorted by start, disjoint and not touching.
    free: Vec<(u64, u64)>,
    dedicated: bool,
}

impl Block {
    fn take(&mut self, len: u64) -> Option<u64> {
        let i = self.free.iter().position(|&(_, l)| l >= len)?;
        let (start, l) = self.free[i];
        if l == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, l - len);
        }
        Some(start)
    }

    fn give(&mut self, start: u64, len: u64) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    fn empty(&self) -> bool {
        self.free.len() == 1 && self.free[0] == (0, self.size)
    }
}

/// The timeline values a freed range waits for: one per stream that had
/// work not yet complete when it was freed.
pub(crate) type Stamp = SmallVec<[(Arc<Track>, u64); 2]>;

/// The pool of device blocks.
pub(crate) struct Pool {
    gpu: Arc<Gpu>,
    blocks: Vec<Option<Block>>,
    pending: Vec<(usize, u64, u64, Stamp)>,
    block_size: u64,
    reserved: u64,
}

impl Pool {
    pub(crate) fn new(gpu: Arc<Gpu>) -> Self {
        let limits = &gpu.limits;
        let block_size = BLOCK_SIZE
            .min(limits.max_memory_allocation)
            .min(limits.max_buffer_size)
            .min(limits.device_heap / 4)
            .max(ALIGN);
        Self {
            gpu,
            blocks: Vec::new(),
            pending: Vec::new(),
            block_size,
            reserved: 0,
        }
    }

    /// Bytes of device memory held in blocks, in use or free.
    pub(crate) fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The largest request that could ever be met: the least of the heap,
    /// `maxMemoryAllocationSize` and `maxBufferSize`, rounded down to
    /// [`ALIGN`].
    pub(crate) fn largest(&self) -> u64 {
        let limits = &self.gpu.limits;
        limits
            .device_heap
            .min(limits.max_memory_allocation)
            .min(limits.max_buffer_size)
            / ALIGN
            * ALIGN
    }

    fn capacity_check(&self, size: u64) -> Result<u64> {
        let limits = &self.gpu.limits;
        let oom = |why: String| Error::OutOfMemory {
            backend: NAME,
            requested: size,
            detail: why,
        };
        let len = round_up(size, ALIGN).ok_or_else(|| oom("the size overflows".to_owned()))?;
        if len > limits.device_heap {
            return Err(oom(format!(
                "the device heap holds {} bytes",
                limits.device_heap
            )));
        }
        if len > limits.max_memory_allocation {
            return Err(oom(format!(
                "the driver's largest allocation (maxMemoryAllocationSize) is {} bytes",
                limits.max_memory_allocation
            )));
        }
        if len > limits.max_buffer_size {
            return Err(oom(format!(
                "the driver's largest buffer is {} bytes",
                limits.max_buffer_size
            )));
        }
        Ok(len)
    }

    /// `size` bytes at an [`ALIGN`]ed offset of some block.
    pub(crate) fn allocate(&mut self, size: u64) -> Result<VulkanMemory> {
        let len = self.capacity_check(size)?;
        self.reclaim();
        if len <= self.block_size / 2 {
            for (index, slot) in self.blocks.iter_mut().enumerate() {
                if let Some(block) = slot
                    && !block.dedicated
                    && let Some(offset) = block.take(len)
                {
                    return Ok(Self::memory(index, block, offset, len));
                }
            }
        }
        let (block_len, dedicated) = if len <= self.block_size / 2 {
            (self.block_size, false)
        } else {
            (len, true)
        };
        let limits = &self.gpu.limits;
        let backing = create_backing(
            &self.gpu,
            block_len,
            limits.device_type,
            limits.device_mappable,
            storage_usage(&self.gpu),
            "pooled block",
        )
        .map_err(|e| match e {
            Error::OutOfMemory { detail, .. } => Error::OutOfMemory {
                backend: NAME,
                requested: size,
                detail,
            },
            other => other,
        })?;
        let mut block = Block {
            backing,
            size: block_len,
            free: vec![(0, block_len)],
            dedicated,
        };
        self.reserved += block_len;
        let offset = block.take(len).unwrap_or(0);
        let index = match self.blocks.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.blocks.push(None);
                self.blocks.len() - 1
            }
        };
        let memory = Self::memory(index, &block, offset, len);
        self.blocks[index] = Some(block);
        Ok(memory)
    }

    fn memory(index: usize, block: &Block, offset: u64, len: u64) -> VulkanMemory {
        VulkanMemory {
            block: index,
            offset,
            reserved: len,
            buffer: block.backing.buffer,
            mapped: block.backing.mapped,
            address: block.backing.address,
        }
    }

    /// Give `memory` back once `stamp` has completed.
    pub(crate) fn free(&mut self, memory: VulkanMemory, stamp: Stamp) {
        self.pending
            .push((memory.block, memory.offset, memory.reserved, stamp));
        self.reclaim();
    }

    /// Return completed pending ranges to their blocks; release dedicated
    /// blocks that became empty.
    pub(crate) fn reclaim(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.pending.len() {
            let done = self.pending[i]
                .3
                .iter()
                .all(|(track, value)| track.reached(*value));
            if !done {
                i += 1;
                continue;
            }
            let (index, offset, len, _) = self.pending.swap_remove(i);
            let release = match self.blocks.get_mut(index).and_then(Option::as_mut) {
                Some(block) => {
                    block.give(offset, len);
                    block.dedicated && block.empty()
                }
                None => false,
            };
            if release && let Some(block) = self.blocks[index].take() {
                destroy_backing(&self.gpu, &block.backing);
                self.reserved -= block.size;
            }
        }
    }

    /// Release every block nothing uses (rule 37's reclaim before a retry).
    pub(crate) fn trim(&mut self) {
        self.reclaim();
        for slot in &mut self.blocks {
            if slot.as_ref().is_some_and(Block::empty)
                && let Some(block) = slot.take()
            {
                destroy_backing(&self.gpu, &block.backing);
                self.reserved -= block.size;
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if self.gpu.is_hung() {
            tracing::error!(
                bytes = self.reserved,
                "leaking device memory: a wait for the device gave up, so work may still use it"
            );
            return;
        }
        // SAFETY: waiting for the device before freeing what it may use.
        let _ = unsafe { self.gpu.vk().device_wait_idle() };
        for block in self.blocks.drain(..).flatten() {
            destroy_backing(&self.gpu, &block.backing);
        }
    }
}

/// A mapped, host-visible chunk of staging memory.
pub(crate) struct Chunk {
    gpu: Arc<Gpu>,
    backing: Backing,
    ptr: HostPtr,
    size: u64,
    used: u64,
}

impl Chunk {
    fn new(gpu: &Arc<Gpu>, size: u64) -> Result<Chunk> {
        // Staged scalar blobs are storage buffers; a device-address
        // kernel's table of addresses is a uniform buffer.
        let usage = storage_usage(gpu) | vk::BufferUsageFlags::UNIFORM_BUFFER;
        let backing = create_backing(
            gpu,
            size,
            gpu.limits.host_type,
            true,
            usage,
            "staging chunk",
        )?;
        let Some(ptr) = backing.mapped else {
            destroy_backing(gpu, &backing);
            return Err(Error::OutOfMemory {
                backend: NAME,
                requested: size,
                detail: "staging memory could not be mapped".to_owned(),
            });
        };
        Ok(Chunk {
            gpu: gpu.clone(),
            backing,
            ptr,
            size,
            used: 0,
        })
    }

    /// Whether it is the standard size, so worth keeping for reuse.
    pub(crate) fn standard(&self) -> bool {
        self.size == CHUNK_SIZE
    }

    pub(crate) fn reset(&mut self) {
        self.used = 0;
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        destroy_backing(&self.gpu, &self.backing);
    }
}

/// Where staged bytes landed: `len` bytes at `offset` of an arena chunk.
///
/// Only [`Arena::reserve`] makes one, and its fields are private to this
/// module, so `offset..offset + len` always lies inside the chunk's mapping:
/// [`host`](Self::host) needs its caller to promise only that the chunk is
/// still alive.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Staged {
    buffer: vk::Buffer,
    offset: u64,
    len: u64,
    ptr: HostPtr,
    /// The device address of the first byte; 0 without `bufferDeviceAddress`.
    address: u64,
}

impl Staged {
    /// The chunk's buffer.
    pub(crate) fn buffer(&self) -> vk::Buffer {
        self.buffer
    }

    /// Where in the chunk's buffer the bytes start.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The device address of the first byte; 0 without
    /// `bufferDeviceAddress`.
    pub(crate) fn address(&self) -> u64 {
        self.address
    }

    /// The host pointer to its first byte, valid for its `len` bytes.
    ///
    /// # Safety
    ///
    /// The chunk it was reserved from is still alive: held by the arena, a
    /// submission in flight or a graph, or recycled but not yet released
    /// (see [`Arena::recycle`]).
    pub(crate) unsafe fn host(&self) -> *mut u8 {
        // SAFETY: `Arena::reserve` made `self` with `offset + len` at most
        // the chunk's size, and the chunk is mapped whole while it lives
        // (the caller's promise).
        unsafe { self.ptr.at(self.offset) }
    }
}

/// Bump allocation from mapped chunks.
pub(crate) struct Arena {
    gpu: Arc<Gpu>,
    current: Option<Chunk>,
    /// Chunks filled since they were last handed out by [`take`](Self::take).
    full: Vec<Chunk>,
    spare: Vec<Chunk>,
    /// Chunks recycled but not kept as spares, released at the arena's
    /// next [`reserve`](Self::reserve) or [`take`](Self::take) rather than
    /// at once: a stream recycles right after it submits, and may find that
    /// submission done already, while the read that staged into one of its
    /// chunks has yet to copy out of it.
    retired: Vec<Chunk>,
}

impl Arena {
    pub(crate) fn new(gpu: Arc<Gpu>) -> Self {
        Self {
            gpu,
            current: None,
            full: Vec::new(),
            spare: Vec::new(),
            retired: Vec::new(),
        }
    }

    /// Room for `len` bytes (at least 4) at an `align`ed offset.
    pub(crate) fn reserve(&mut self, len: u64, align: u64) -> Result<Staged> {
        self.retired.clear();
        let len = len.max(4);
        let fits = |c: &Chunk| round_up(c.used, align).is_some_and(|start| start + len <= c.size);
        if !self.current.as_ref().is_some_and(fits) {
            if let Some(old) = self.current.take() {
                self.full.push(old);
            }
            let chunk = if len > CHUNK_SIZE {
                Chunk::new(&self.gpu, round_up(len, ALIGN).unwrap_or(len))?
            } else {
                match self.spare.pop() {
                    Some(chunk) => chunk,
                    None => Chunk::new(&self.gpu, CHUNK_SIZE)?,
                }
            };
            self.current = Some(chunk);
        }
        let Some(chunk) = self.current.as_mut() else {
            return Err(Error::internal(
                "an arena chunk left the table while in use",
            ));
        };
        let offset = round_up(chunk.used, align).unwrap_or(chunk.used);
        chunk.used = offset + len;
        Ok(Staged {
            buffer: chunk.backing.buffer,
            offset,
            len,
            ptr: chunk.ptr,
            address: if chunk.backing.address == 0 {
                0
            } else {
                chunk.backing.address + offset
            },
        })
    }

    /// Copy `data` in, padded with zeros to `padded` bytes.
    pub(crate) fn push(&mut self, data: &[u8], padded: u64, align: u64) -> Result<Staged> {
        let staged = self.reserve(padded.max(data.len() as u64), align)?;
        // SAFETY: `staged` was reserved from the arena's current chunk,
        // which the arena holds.
        let dst = unsafe { staged.host() };
        // SAFETY: `dst` is `staged.len` (at least `data.len()`) fresh bytes
        // of a live mapping that no submitted work uses (a chunk is reused
        // only after the work that used it completed), and `data` is a
        // caller's slice, not in that mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
            std::ptr::write_bytes(dst.add(data.len()), 0, staged.len as usize - data.len());
        }
        Ok(staged)
    }

    /// Every chunk used since the last call, to travel with a submission
    /// (or a graph).
    pub(crate) fn take(&mut self) -> Vec<Chunk> {
        self.retired.clear();
        let mut out = std::mem::take(&mut self.full);
        if let Some(chunk) = self.current.take_if(|c| c.used > 0) {
            out.push(chunk);
        }
        out
    }

    /// A chunk whose work completed (or was never submitted), back for
    /// reuse. Whether kept as a spare or retired, it stays mapped and
    /// unwritten until the arena's next `reserve` or `take`, so a
    /// [`Staged`] of it may still be read until then.
    pub(crate) fn recycle(&mut self, mut chunk: Chunk) {
        if chunk.standard() && self.spare.len() < 8 {
            chunk.reset();
            self.spare.push(chunk);
        } else {
            self.retired.push(chunk);
        }
    }
}

/// What a range freed now must wait for: each stream's covering value
/// that it was not already seen to have reached.
pub(crate) fn stamp_now(tracks: &[Arc<Track>]) -> Stamp {
    tracks
        .iter()
        .filter_map(|t| {
            let covering = t.covering.load(Ordering::Acquire);
            (!t.reached_cached(covering)).then(|| (t.clone(), covering))
        })
        .collect()
}
