//! Recording a launch: the launch checks, the descriptors or addresses a
//! launch pushes, the indirect-count guard, and the dispatch.
//!
//! **Why recording is a module apart from compiling.** Everything here runs
//! on every launch, inside the stream's `record`, against a
//! [`VulkanKernel`] that `compile.rs` made: it reads the kernel's
//! interface and never a module, and makes no long-lived object — what it
//! stages (scalar blobs, address tables, the guard's scratch slot) goes in
//! the stream's arena, which travels with the submission or the graph. It
//! is also the one place a launch's device commands are recorded on the
//! caller's offsets, so it is where the `Backend` contract's `unsafe`
//! lands: [`launch`] and its helpers are `unsafe fn`s whose Safety
//! sections are `Backend::launch`'s promise, and every `SAFETY` comment
//! here cites that promise or [`check`]. Compilation, which holds none of
//! those promises, stays out of the way of reading them.
//!
//! **Launch checks.** Everything about a launch that the device's limits
//! decide — the binding count against the kernel's layout, each binding's
//! size against `maxStorageBufferRange`, a device-address kernel's
//! bindings having addresses — is checked by [`check`], which the core
//! calls before it opens the launch's scope, so a launch no device could
//! run is an `InvalidArgument` that claims nothing. Host-side workgroup
//! counts are the core's to check, against `launch_limits`' grid
//! (`maxComputeWorkGroupCount`). [`launch`] runs `check` again before
//! recording: pushing descriptors a layout does not have is undefined
//! behaviour, and a few compares rule it out whoever the caller is.
//!
//! **What a launch pushes.** A descriptor kernel gets its bindings (and
//! the scalar blob, staged in the arena) as pushed storage-buffer
//! descriptors. A device-address kernel gets the addresses of its bindings
//! (offset included) and of the staged blob, in that order: as push
//! constants, or staged in the arena as a table pushed as its one
//! uniform-buffer descriptor. The buffers are still the launch's bindings,
//! with their access: the core's read and write sets, and so every rule of
//! the failure model, are the same for both.
//!
//! **Indirect counts** live in device memory, where no host check reaches
//! them, and a count past `maxComputeWorkGroupCount` is invalid usage
//! (lavapipe runs `u32::MAX` groups for hours). So an indirect launch first
//! runs a one-invocation guard kernel (compiled once, by
//! `Pipelines::guard`) that copies the three counts into a scratch slot of
//! the stream's arena — all three zeroed if any is past the device's limit
//! — and dispatches from the scratch slot: **an indirect count past the
//! device's limit runs nothing**, as wgpu's indirect validation does.

use ash::vk;
use scope_core::backend::{BoundDispatch, Launch};
use scope_core::{Error, Result};
use smallvec::SmallVec;

use crate::compile::{Interface, VulkanKernel};
use crate::device::Gpu;
use crate::error::launch_error;
use crate::memory::VulkanMemory;
use crate::stream::{OpenStream, Recorder};

/// What the device's limits say about `launch` of `kernel`: the core calls
/// this (`Backend::check_launch`) before it opens the launch's scope, so a
/// launch refused here is an invalid argument that claims nothing.
pub(crate) fn check(
    gpu: &Gpu,
    kernel: &VulkanKernel,
    launch: &Launch<'_, VulkanMemory>,
) -> Result<()> {
    let given = launch.bindings.len() as u32 + u32::from(!launch.scalars.is_empty());
    let invalid = |what: String, why: String| Err(Error::invalid(what, why));
    let what = || format!("the bindings of `{}`", launch.name);
    match kernel.interface {
        Interface::Descriptors(bindings) if given != bindings => {
            return invalid(
                what(),
                format!(
                    "the kernel declares {bindings} storage buffers in set 0; the launch binds \
                     {given} (bindings, then the scalar blob)"
                ),
            );
        }
        Interface::Addresses {
            count: addresses, ..
        } if given != addresses => {
            return invalid(
                what(),
                format!(
                    "the kernel takes {addresses} buffer addresses; the launch binds {given} \
                     (bindings, then the scalar blob)"
                ),
            );
        }
        _ => {}
    }
    let limits = &gpu.limits;
    match kernel.interface {
        Interface::Descriptors(_) => {
            let max_range = limits.max_storage_range;
            if let Some((i, b)) = launch
                .bindings
                .iter()
                .enumerate()
                .find(|(_, b)| b.len > max_range)
            {
                return invalid(
                    format!("binding {i} of `{}`", launch.name),
                    format!(
                        "{} bytes is past the device's maxStorageBufferRange of {max_range}",
                        b.len
                    ),
                );
            }
            if scalar_len(launch.scalars) > max_range {
                return invalid(
                    format!("the scalar blob of `{}`", launch.name),
                    format!(
                        "{} bytes is past the device's maxStorageBufferRange of {max_range}",
                        launch.scalars.len()
                    ),
                );
            }
        }
        Interface::Addresses { .. } => {
            if launch
                .bindings
                .iter()
                .any(|b| b.memory.device_address() == 0)
            {
                return invalid(
                    what(),
                    "a binding has no device address (bufferDeviceAddress is off)".to_owned(),
                );
            }
        }
    }
    // Host-given workgroup counts: the core checked them against
    // `launch_limits`' grid (maxComputeWorkGroupCount).
    Ok(())
}

/// The bytes a scalar blob takes when staged: padded to 16 (a `vec4`'s
/// alignment, which a blob struct may have).
fn scalar_len(scalars: &[u8]) -> u64 {
    (scalars.len() as u64).div_ceil(16) * 16
}

/// Record `launch` of `kernel` on `stream`. An indirect launch needs the
/// count guard (`Pipelines::guard`).
///
/// # Safety
///
/// As for `Backend::launch`: `kernel`, `guard` and every memory in
/// `launch` were made on `stream`'s device and are alive; every binding's range lies inside
/// its memory at a `binding_alignment` offset, an indirect dispatch's 12
/// bytes inside theirs, and host-given counts are within the device's
/// `maxComputeWorkGroupCount`.
pub(crate) unsafe fn launch(
    stream: &mut OpenStream,
    kernel: &VulkanKernel,
    guard: Option<&VulkanKernel>,
    launch: &Launch<'_, VulkanMemory>,
) -> Result<()> {
    // The Backend contract says `check_launch` accepted this launch; a
    // mismatch recorded anyway would push descriptors the layout does not
    // have (undefined behaviour), so a few compares make sure of it here
    // rather than trust a promise this crate can keep for itself.
    check(&stream.gpu, kernel, launch)?;
    let id = stream.id;
    let min_offset = stream.gpu.limits.min_storage_offset;
    stream.record(|rec| {
        let dispatch = match &launch.dispatch {
            BoundDispatch::Groups(groups) => Counts::Host(*groups),
            BoundDispatch::Indirect { memory, offset } => {
                let Some(guard) = guard else {
                    return Err(launch_error(
                        launch.name,
                        id,
                        "an indirect launch without the count guard",
                    ));
                };
                // SAFETY: the Backend contract of `launch`: the 12 bytes at
                // `offset` lie inside `memory`, which is alive.
                let (buffer, offset) =
                    unsafe { guard_counts(rec, guard, memory, *offset, min_offset)? };
                Counts::Device(buffer, offset)
            }
        };
        match kernel.interface {
            // SAFETY: the Backend contract of `launch`: every binding is a
            // live memory's range at an aligned offset; `check` matched the
            // binding count to the kernel's layout and each length to
            // `maxStorageBufferRange`.
            Interface::Descriptors(_) => unsafe {
                push_descriptors(rec, kernel, launch, min_offset)?
            },
            // SAFETY: the Backend contract of `launch`: every binding is a
            // live memory's range; `check` matched the binding count to the
            // kernel's address count.
            Interface::Addresses { table, .. } => unsafe {
                push_addresses(rec, kernel, launch, min_offset, table)?
            },
        }
        let cmd = rec.encoder.cmd;
        match dispatch {
            // SAFETY: `cmd` is recording with the kernel's pipeline bound
            // and every binding it reads pushed; the Backend contract of
            // `launch` puts host-given counts within `launch_limits`'
            // `max_workgroups`, which is the device's
            // maxComputeWorkGroupCount.
            Counts::Host([x, y, z]) => unsafe { rec.gpu.vk().cmd_dispatch(cmd, x, y, z) },
            // SAFETY: as above; the counts are 12 bytes the guard wrote at
            // a 4-aligned offset of an arena buffer with indirect usage,
            // each within the device's limits or all zero, and the barrier
            // after the guard makes them visible to the indirect read.
            Counts::Device(buffer, offset) => unsafe {
                rec.gpu.vk().cmd_dispatch_indirect(cmd, buffer, offset)
            },
        }
        Ok(())
    })
}

/// Where a dispatch's counts come from.
enum Counts {
    /// Given on the host.
    Host([u32; 3]),
    /// Checked by the guard, in this buffer at this offset.
    Device(vk::Buffer, u64),
}

/// Record the count guard: copy the three counts at `offset` of `memory`
/// into a fresh scratch slot, zeroed if any is past the device's limit,
/// and order the dispatch that reads the slot after it. Returns the slot.
///
/// # Safety
///
/// `memory` is alive and `offset..offset + 12` lies inside it: the guard
/// binds the block buffer up to those 12 bytes.
unsafe fn guard_counts(
    rec: &mut Recorder<'_>,
    guard: &VulkanKernel,
    memory: &VulkanMemory,
    offset: u64,
    min_offset: u64,
) -> Result<(vk::Buffer, u64)> {
    let scratch = rec.arena.reserve(12, min_offset)?;
    // The counts are the last three words of a binding that starts at the
    // alignment below them (a storage binding's offset must be aligned;
    // the counts need only be 4-aligned).
    let at = memory.offset + offset;
    let start = at / min_offset * min_offset;
    let infos = [
        vk::DescriptorBufferInfo {
            buffer: memory.buffer,
            offset: start,
            range: at - start + 12,
        },
        vk::DescriptorBufferInfo {
            buffer: scratch.buffer(),
            offset: scratch.offset(),
            range: 12,
        },
    ];
    let gpu = rec.gpu;
    rec.encoder.bind(gpu, guard.pipeline);
    let cmd = rec.encoder.cmd;
    let write = vk::WriteDescriptorSet::default()
        .dst_binding(0)
        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
        .buffer_info(&infos);
    // SAFETY: `cmd` is recording with the guard bound; its layout has two
    // push-descriptor storage bindings, filled here from binding 0: the
    // counts' range, from the aligned offset at or below them (an
    // allocation starts at an `ALIGN`ed offset, a multiple of the device's
    // alignment) to their end, inside the live allocation by this
    // function's contract; and the scratch slot just reserved at an
    // aligned offset of an arena chunk that travels with the submission
    // (or graph).
    unsafe {
        gpu.push().cmd_push_descriptor_set(
            cmd,
            vk::PipelineBindPoint::COMPUTE,
            guard.layout,
            0,
            &[write],
        );
        gpu.vk().cmd_dispatch(cmd, 1, 1, 1);
    }
    // The dispatch's indirect read must see the guard's write.
    rec.encoder.needs_barrier = true;
    rec.encoder.barrier(gpu);
    Ok((scratch.buffer(), scratch.offset()))
}

/// Bind a descriptor kernel and push its bindings and staged scalars.
///
/// # Safety
///
/// Every binding's memory is alive and its range lies inside it at an
/// offset aligned to `min_offset`, at most `maxStorageBufferRange` long;
/// the launch's binding count (with the blob) is the kernel's layout's
/// (`check`).
unsafe fn push_descriptors(
    rec: &mut Recorder<'_>,
    kernel: &VulkanKernel,
    launch: &Launch<'_, VulkanMemory>,
    min_offset: u64,
) -> Result<()> {
    let mut infos: SmallVec<[vk::DescriptorBufferInfo; 8]> = launch
        .bindings
        .iter()
        .map(|b| vk::DescriptorBufferInfo {
            buffer: b.memory.buffer,
            offset: b.memory.offset + b.offset,
            range: b.len,
        })
        .collect();
    if !launch.scalars.is_empty() {
        let padded = scalar_len(launch.scalars);
        let staged = rec.arena.push(launch.scalars, padded, min_offset)?;
        infos.push(vk::DescriptorBufferInfo {
            buffer: staged.buffer(),
            offset: staged.offset(),
            range: padded,
        });
    }
    rec.encoder.bind(rec.gpu, kernel.pipeline);
    if !infos.is_empty() {
        // SAFETY: the kernel is bound; its layout is a push-descriptor
        // layout of exactly `infos.len()` storage-buffer bindings (this
        // function's contract); every range lies in a live buffer at an
        // aligned offset and within maxStorageBufferRange (the bindings by
        // this function's contract, the arena's scalars at `min_offset`,
        // padded to at most the range `check` allowed), and the arena
        // travels with the submission.
        unsafe { push_set(rec, kernel, vk::DescriptorType::STORAGE_BUFFER, &infos) };
    }
    Ok(())
}

/// Push `infos` as the bound kernel's set 0, one `kind` descriptor per
/// binding from 0 — the one place a launch writes descriptors.
///
/// # Safety
///
/// `kernel` is bound on `rec`'s recording command buffer; its layout was
/// made with the push-descriptor flag and has exactly `infos.len()` `kind`
/// bindings of one element each; every range is valid for `kind` (usage,
/// offset alignment, size limit) and its buffer lives until the submission
/// completes.
unsafe fn push_set(
    rec: &mut Recorder<'_>,
    kernel: &VulkanKernel,
    kind: vk::DescriptorType,
    infos: &[vk::DescriptorBufferInfo],
) {
    let write = vk::WriteDescriptorSet::default()
        .dst_binding(0)
        .descriptor_type(kind)
        .buffer_info(infos);
    // SAFETY: the caller's promise above is exactly what
    // vkCmdPushDescriptorSetKHR requires of the command buffer, the layout
    // and the descriptors.
    unsafe {
        rec.gpu.push().cmd_push_descriptor_set(
            rec.encoder.cmd,
            vk::PipelineBindPoint::COMPUTE,
            kernel.layout,
            0,
            &[write],
        )
    };
}

/// Bind a device-address kernel and give it the addresses of the bindings
/// and of the staged scalar blob, in that order: as push constants, or,
/// for a kernel that takes them as a uniform table (`table`), staged in the
/// arena and pushed as its one uniform-buffer descriptor.
///
/// # Safety
///
/// Every binding's memory is alive and its range lies inside it: the
/// kernel may reach any byte of the addresses given. The launch's address
/// count (with the blob) is the kernel's (`check`).
unsafe fn push_addresses(
    rec: &mut Recorder<'_>,
    kernel: &VulkanKernel,
    launch: &Launch<'_, VulkanMemory>,
    min_offset: u64,
    table: bool,
) -> Result<()> {
    let mut addresses: SmallVec<[u64; 16]> = launch
        .bindings
        .iter()
        .map(|b| b.memory.device_address() + b.offset)
        .collect();
    if !launch.scalars.is_empty() {
        let padded = scalar_len(launch.scalars);
        let staged = rec.arena.push(launch.scalars, padded, min_offset.max(16))?;
        if staged.address() == 0 {
            return Err(Error::invalid(
                format!("the scalar blob of `{}`", launch.name),
                "the staging memory has no device address (bufferDeviceAddress is off)",
            ));
        }
        addresses.push(staged.address());
    }
    let bytes: SmallVec<[u8; 128]> = addresses.iter().flat_map(|a| a.to_le_bytes()).collect();
    let gpu = rec.gpu;
    if table {
        let len = bytes.len() as u64;
        let staged =
            rec.arena
                .push(&bytes, len.div_ceil(16) * 16, gpu.limits.min_uniform_offset)?;
        rec.encoder.bind(gpu, kernel.pipeline);
        let info = [vk::DescriptorBufferInfo {
            buffer: staged.buffer(),
            offset: staged.offset(),
            range: len,
        }];
        // SAFETY: the kernel is bound; its layout is the push-descriptor
        // table layout, one uniform buffer at binding 0; the range is arena
        // memory with uniform usage, at a `minUniformBufferOffsetAlignment`
        // offset, within `maxUniformBufferRange` (compile checked the
        // table's size), and travels with the submission; every address in
        // it is of a live binding range (this function's contract) or of
        // the staged blob.
        unsafe { push_set(rec, kernel, vk::DescriptorType::UNIFORM_BUFFER, &info) };
        return Ok(());
    }
    rec.encoder.bind(gpu, kernel.pipeline);
    // SAFETY: the command buffer is recording with the kernel bound; the
    // layout has one compute push-constant range of exactly `bytes.len()`
    // bytes (the interface's address count, checked against the launch by
    // `check`); every address is of a live binding range (this function's
    // contract), or of arena memory that travels with the submission.
    unsafe {
        gpu.vk().cmd_push_constants(
            rec.encoder.cmd,
            kernel.layout,
            vk::ShaderStageFlags::COMPUTE,
            0,
            &bytes,
        )
    };
    Ok(())
}
