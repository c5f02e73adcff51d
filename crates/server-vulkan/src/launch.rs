//! Recording a launch: the launch checks, what a launch pushes, the count guard, the dispatch.
//!
//! **Why apart from compiling.** This runs on every launch, against a [`VulkanKernel`]
//! that `compile.rs` made, and makes no long-lived object: what it stages goes in the arena.
//! It is where the `Backend` contract's `unsafe` lands. Every `SAFETY` comment here cites
//! `Backend::launch`'s promise or [`check`].
//!
//! **Launch checks.** [`check`] runs before the core opens the launch's scope, so a launch no
//! device could run is an `InvalidArgument` that claims nothing. [`launch`] runs it again:
//! pushing descriptors a layout lacks is undefined behaviour.
//!
//! **What a launch pushes.** A descriptor kernel gets pushed storage-buffer descriptors.
//! A device-address kernel gets addresses, as push constants or a staged uniform table.
//! Either way the buffers are the launch's bindings, so the read and write sets agree.
//!
//! **Indirect counts** live in device memory, beyond any host check. Lavapipe runs
//! `u32::MAX` groups for hours. A guard kernel copies the counts to a scratch slot, zeroed if
//! any is past the limit: **an indirect count past the device's limit runs nothing**.

use ash::vk;
use scope_core::backend::{BoundDispatch, Launch};
use scope_core::{Error, Result};
use smallvec::SmallVec;

use crate::command::Recorder;
use crate::compile::{Interface, VulkanKernel};
use crate::device::Gpu;
use crate::error::launch_error;
use crate::memory::VulkanMemory;
use crate::stream::OpenStream;

/// What the device's limits say about `launch` of `kernel`, before the launch's scope opens.
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
    Ok(())
}

/// A scalar blob's staged size: padded to 16, a `vec4`'s alignment.
fn scalar_len(scalars: &[u8]) -> u64 {
    (scalars.len() as u64).div_ceil(16) * 16
}

/// Record `launch` of `kernel` on `stream`; an indirect launch needs the count guard.
///
/// # Safety
///
/// As for `Backend::launch`: all is alive on this device, each binding inside its memory at a
/// `binding_alignment` offset, indirect counts inside theirs, host counts within limits.
pub(crate) unsafe fn launch(
    stream: &mut OpenStream,
    kernel: &VulkanKernel,
    guard: Option<&VulkanKernel>,
    launch: &Launch<'_, VulkanMemory>,
) -> Result<()> {
    // A mismatch recorded anyway would push descriptors the layout lacks.
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
                // SAFETY: the Backend contract of `launch`: the 12 bytes lie inside `memory`.
                let (buffer, offset) =
                    unsafe { guard_counts(rec, guard, memory, *offset, min_offset)? };
                Counts::Device(buffer, offset)
            }
        };
        match kernel.interface {
            // SAFETY: the Backend contract of `launch`; `check` matched the bindings to the
            // layout and each length to `maxStorageBufferRange`.
            Interface::Descriptors(_) => unsafe {
                push_descriptors(rec, kernel, launch, min_offset)?
            },
            // SAFETY: the Backend contract of `launch`; `check` matched the address count.
            Interface::Addresses { table, .. } => unsafe {
                push_addresses(rec, kernel, launch, min_offset, table)?
            },
        }
        let cmd = rec.encoder.cmd;
        match dispatch {
            // SAFETY: `cmd` is recording, the pipeline bound and bindings pushed; the Backend
            // contract puts host counts within `maxComputeWorkGroupCount`.
            Counts::Host([x, y, z]) => unsafe { rec.gpu.vk().cmd_dispatch(cmd, x, y, z) },
            // SAFETY: as above; the guard wrote the counts, within limits or zero, and its
            // barrier makes them visible to the indirect read.
            Counts::Device(buffer, offset) => unsafe {
                rec.gpu.vk().cmd_dispatch_indirect(cmd, buffer, offset)
            },
        }
        Ok(())
    })
}

/// Where a dispatch's counts come from.
enum Counts {
    Host([u32; 3]),
    Device(vk::Buffer, u64),
}

/// Record the count guard: copy the counts at `offset` of `memory` to a scratch slot,
/// zeroed if any is past the limit. Returns the slot.
///
/// # Safety
///
/// `memory` is alive and `offset..offset + 12` lies inside it.
unsafe fn guard_counts(
    rec: &mut Recorder<'_>,
    guard: &VulkanKernel,
    memory: &VulkanMemory,
    offset: u64,
    min_offset: u64,
) -> Result<(vk::Buffer, u64)> {
    let scratch = rec.arena.reserve(12, min_offset)?;
    // A storage binding's offset must be aligned; the counts need only be 4-aligned.
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
    // SAFETY: `cmd` is recording with the guard bound, whose layout has two storage bindings.
    // The counts' range starts at an aligned offset inside the live allocation (this
    // function's contract); the scratch slot was just reserved in a chunk that travels along.
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
    rec.encoder.needs_barrier = true;
    rec.encoder.barrier(gpu);
    Ok((scratch.buffer(), scratch.offset()))
}

/// Bind a descriptor kernel and push its bindings and staged scalars.
///
///
/// # Safety
///
/// Every binding's memory is alive, its range inside it at an aligned offset, within
/// `maxStorageBufferRange`; the binding count is the layout's (`check`).
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
        // SAFETY: the kernel is bound, its layout `infos.len()` pushed storage bindings (this
        // function's contract). Every range is live, aligned and in range; the arena travels.
        unsafe { push_set(rec, kernel, vk::DescriptorType::STORAGE_BUFFER, &infos) };
    }
    Ok(())
}

/// Push `infos` as the bound kernel's set 0: the one place a launch writes descriptors.
///
/// # Safety
///
/// `kernel` is bound on the recording buffer; its push-descriptor layout has `infos.len()`
/// `kind` bindings. Every range is valid for `kind`, its buffer alive until completion.
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
    // SAFETY: the caller's promise is what vkCmdPushDescriptorSetKHR requires.
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

/// Bind a device-address kernel and give it the bindings' and the blob's addresses: as push
/// constants, or as a uniform table (`table`) staged in the arena.
///
/// # Safety
///
/// Every binding's memory is alive, its range inside it: the kernel may reach any byte.
/// The address count is the kernel's (`check`).
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
        // SAFETY: the kernel is bound; its layout is one pushed uniform buffer. The range is
        // aligned arena memory within `maxUniformBufferRange` (compile checked the size);
        // every address in it is live (this function's contract) or the staged blob.
        unsafe { push_set(rec, kernel, vk::DescriptorType::UNIFORM_BUFFER, &info) };
        return Ok(());
    }
    rec.encoder.bind(gpu, kernel.pipeline);
    // SAFETY: the kernel is bound; its layout has one push-constant range of `bytes.len()`
    // (`check`); every address is live (this function's contract) or arena memory.
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
