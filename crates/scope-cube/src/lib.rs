//! Single-source kernels: a kernel written once with `cubecl-core`'s
//! `#[cube(launch)]`, run on every scope server.
//!
//! A scope server is told a kernel as source in its own language and a launch
//! as bindings plus a scalar blob (the [binding convention](scope_core::kernel)).
//! A cubecl kernel is IR with its own argument model: buffers, then an "info"
//! struct holding the scalars (grouped by type) and each buffer's length. The
//! two meet without either side learning the other's vocabulary:
//!
//! - **Source** ([`translate`]). The kernel's definition goes through the cubecl
//!   compiler of the target's language — CUDA C++ and HIP C++ from
//!   `cubecl-cpp`, SPIR-V from `cubecl-spirv`, WGSL from `cubecl-wgpu`'s
//!   compiler — and comes out as a plain [`scope_core::Kernel`] with the
//!   entry point (which carries a per-build hash, so it is read from the
//!   definition, never guessed) and, for the CUDA family, the cube size as the
//!   block.
//! - **Arguments** ([`Args`]). The buffers become the launch's bindings, in
//!   order, and the info struct, packed with cubecl's own
//!   [`InfoBuilder`](cubecl_core::InfoBuilder), becomes the scalar blob. That
//!   one packing is right for all four servers because each compiler puts the
//!   info where that server's convention puts the blob:
//!   - WGSL: `var<storage, read>` at `@binding(n)` after the n buffers;
//!   - CUDA/HIP: compiled with `grid_constants`, the info is the last kernel
//!     parameter, a struct passed by value;
//!   - SPIR-V: cubecl reaches buffers through buffer device addresses in a
//!     push-constant block, the info's address last. `server-vulkan`
//!     recognises that interface from the module itself and fills the block
//!     with the addresses of the launch's bindings and of the blob it stages,
//!     so the buffers are still ordinary bindings with their access.
//!
//! The failure model depends on the bindings' access being right: a buffer the
//! kernel writes but the launch calls read-only would never carry a failure.
//! So every translated kernel keeps the compiler's own answer for each buffer
//! (its visibility analysis), [`Args`] can bind with that answer, and a launch
//! whose declared access does not cover it is refused before anything runs.
//!
//! The failure model also depends on a launch touching only its bindings.
//! [`translate`] is safe because it makes a checked kernel's bounds checks
//! itself: cubecl 0.12's checked mode clamps no index at all (and was never
//! meant to clamp a workgroup array's), so every index into a buffer, a
//! workgroup array or a local array is clamped to it before the compiler
//! runs, and the WGSL servers keep their own checks on top
//! ([`translate_definition`] says what is checked; `tests/workgroup_bounds.rs`
//! indexes past both kinds of array on every server here).
//!
//! What [`translate`] and [`Args`] do not cover: kernels that read tensor
//! metadata (a `Tensor`'s shapes and strides travel in a dynamic metadata
//! area that `Args`, which packs buffers and scalars, does not build; such
//! a kernel is refused there for every target, tested in `tests/args.rs`).
//! A runtime that packs cubecl's whole info struct itself (`scope-cubecl`)
//! translates it with [`translate_definition`], and
//! [`CubeKernel::split_info`] says where the metadata goes: inside the blob
//! for WGSL and SPIR-V, one more read-only binding for CUDA and HIP.
//! On Vulkan, a kernel whose buffer addresses do not fit in 128 bytes of push
//! constants (more than fifteen buffers and the info struct) gets them in a
//! uniform table instead, which server-vulkan binds
//! (`tests/servers.rs`, a twenty-one-buffer kernel under validation).

mod args;
mod checks;
pub mod kernels;
mod target;
mod translate;

pub use args::Args;
pub use target::{Target, Translation, register_portable_types};
pub use translate::{CubeKernel, translate, translate_definition};

/// The cubecl crates, re-exported so a runtime writes kernels against the same
/// versions this crate compiles.
pub use cubecl_core;
