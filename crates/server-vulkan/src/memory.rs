//! Device memory: a pool of large blocks, and host-visible arenas.
//!
//! **Why our own pool, not `gpu-allocator`.** It hands out raw `VkDeviceMemory` ranges, each
//! needing a `VkBuffer` of its own: two driver calls per allocation, a handle per binding.
//! Here a block is one `VkDeviceMemory` under one `VkBuffer`, and an allocation an offset.
//! Allocating is a free-list search with no driver call. Holding freed ranges back until
//! their work is done, the larger half, is ours either way.
//!
//! - A request over half a [`BLOCK_SIZE`] block gets a dedicated block.
//! - Offsets are multiples of [`ALIGN`], checked against the device's at start.
//! - A freed range is *pending* until every stream passes its [`Stamp`], then rejoins its block.
//! - A request past `Backend::max_allocation` never reaches the driver: an invalid argument,
//!   where one the driver cannot meet now is out-of-memory (rule 37).
//!
//! The [`Arena`] bumps through mapped chunks for scalars, staged writes and readbacks.
//! A stream's chunk travels with its submission; a graph's belong to the graph.

use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;
use scope_core::{Error, Result};

use crate::device::Gpu;
use crate::error::{NAME, Site, classify};
use crate::timeline::Stamp;

pub(crate) const BLOCK_SIZE: u64 = 64 << 20;
pub(crate) const ALIGN: u64 = 256;
pub(crate) const CHUNK_SIZE: u64 = 256 << 10;

/// A pointer into mapped memory.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HostPtr(NonNull<u8>);

// SAFETY: the pointer is into a persistent mapping owned by a block or chunk, only
// dereferenced under the server's lock.
unsafe impl Send for HostPtr {}

// SAFETY: as for `Send`: every dereference happens under the server's lock.
unsafe impl Sync for HostPtr {}

impl HostPtr {
    /// The pointer to byte `offset` of the mapping.
    ///
    /// # Safety
    ///
    /// The mapping is still alive and `offset` at most its length: `pointer::add` past
    /// that is undefined even unread.
    unsafe fn at(self, offset: u64) -> *mut u8 {
        // SAFETY: the caller's promise keeps `offset` inside one live mapping, so no wrap.
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
    // SAFETY: a valid allocate info, within the limits the pool checked.
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
        // SAFETY: the buffer has device-address usage and memory with the DEVICE_ADDRESS flag.
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
    /// The buffer device address of its first byte; 0 without `bufferDeviceAddress`.
    pub fn device_address(&self) -> u64 {
        if self.address == 0 {
            0
        } else {
            self.address + self.offset
        }
    }

    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Pointer to byte `offset` of it, when it is mapped.
    ///
    /// # Safety
    ///
    /// `self` is alive and `offset` at most its size, as the `Backend` contract promises.
    pub(crate) unsafe fn host(&self, offset: u64) -> Option<*mut u8> {
        // SAFETY: a live allocation lies in its block's whole-life mapping, and the caller
        // bounds `offset` by its size.
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

    /// The largest request that could ever be met, rounded down to [`ALIGN`].
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

    /// Return completed pending ranges to their blocks; release empty dedicated blocks.
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
        // Scalar blobs are storage buffers; an address table is a uniform buffer.
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

/// Where staged bytes landed: `len` bytes at `offset` of an arena chunk. Only
/// [`Arena::reserve`] makes one, so the range always lies inside the chunk's mapping.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Staged {
    buffer: vk::Buffer,
    offset: u64,
    len: u64,
    ptr: HostPtr,
    address: u64,
}

impl Staged {
    pub(crate) fn buffer(&self) -> vk::Buffer {
        self.buffer
    }

    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The device address of the first byte; 0 without `bufferDeviceAddress`.
    pub(crate) fn address(&self) -> u64 {
        self.address
    }

    /// The host pointer to its first byte, valid for its `len` bytes.
    ///
    /// # Safety
    ///
    /// The chunk it came from is alive: in the arena, a submission or a graph, or retired.
    pub(crate) unsafe fn host(&self) -> *mut u8 {
        // SAFETY: `Arena::reserve` kept `offset + len` inside the chunk, mapped while it
        // lives (the caller's promise).
        unsafe { self.ptr.at(self.offset) }
    }
}

/// Bump allocation from mapped chunks.
pub(crate) struct Arena {
    gpu: Arc<Gpu>,
    current: Option<Chunk>,
    full: Vec<Chunk>,
    spare: Vec<Chunk>,
    /// Recycled chunks, released at the next [`reserve`](Self::reserve) or
    /// [`take`](Self::take): a read may not have copied out of one yet.
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
        // SAFETY: `staged` came from the arena's current chunk, which it holds.
        let dst = unsafe { staged.host() };
        // SAFETY: `dst` is `staged.len` fresh bytes of a live mapping no submitted work uses;
        // `data` lies outside it.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
            std::ptr::write_bytes(dst.add(data.len()), 0, staged.len as usize - data.len());
        }
        Ok(staged)
    }

    /// Every chunk used since the last call, to travel with a submission or graph.
    pub(crate) fn take(&mut self) -> Vec<Chunk> {
        self.retired.clear();
        let mut out = std::mem::take(&mut self.full);
        if let Some(chunk) = self.current.take_if(|c| c.used > 0) {
            out.push(chunk);
        }
        out
    }

    /// A chunk whose work completed, back for reuse. It stays mapped and unwritten until the
    /// next `reserve` or `take`, so a [`Staged`] of it may be read until then.
    pub(crate) fn recycle(&mut self, mut chunk: Chunk) {
        if chunk.standard() && self.spare.len() < 8 {
            chunk.reset();
            self.spare.push(chunk);
        } else {
            self.retired.push(chunk);
        }
    }
}
