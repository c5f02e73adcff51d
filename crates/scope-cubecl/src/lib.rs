//! Every scope server as a cubecl runtime.
//!
//! A cubecl program names [`ScopeRuntime<B>`] where it would name `cubecl_wgpu::WgpuRuntime`,
//! and its kernels, buffers, reads and graphs run on scope server `B` with scope's failure
//! model underneath. The design is `docs/CUBECL.md`. Its decisions:
//!
//! 1. **An adapter over the contract, not a second server.** [`ScopeServer`] owns a
//!    [`scope_core::Client`] and keeps only translation tables: memory, streams, kernels and
//!    graphs. cubecl's own failure model goes unused. Whether bytes were written is asked of
//!    scope, so the books are kept once.
//! 2. **A failure found by the adapter lands where a launch's would.** A compiler refusal, a
//!    resource limit or an unbindable argument becomes [`scope_core::Client::fail_writing`]
//!    on the launch's outputs. cubecl's typed `ServerError` stays inside
//!    [`scope_core::Error::External`], so a read downstream still answers `is_refusal()`.
//! 3. **cubecl's compilers, scope's launch path.** Kernels compile through `scope-cube` and
//!    launch as scope kernels. The info struct is the scalar blob. CUDA and HIP take shapes
//!    and strides as one more read-only binding.
//! 4. **The device cubecl sees is the server's.** `DeviceProperties` come from
//!    [`scope_core::Client::limits`]. A kernel library specialises on them, and a promise the
//!    server does not keep is a refused launch.
//! 5. **Profiling is by system time.** scope has no device timestamps. A window a failure
//!    fell in is an error, never a timing ([`scope_core::Client::failures_seen`]).
//!
//! # What runs
//!
//! cubecl-core's runtime tests run on the wgpu server (`tests/runtime_wgpu.rs`) and the
//! Vulkan server (`tests/runtime_vulkan.rs`), and cubek's matmul and reductions on both
//! (`tests/cubek.rs`). `docs/CUBECL.md` 4.3 and 9 list what does not run, and why. Planes
//! narrower than 32 lanes get no `Plane::Ops`: cubecl's plane tests assume 32.
//!
//! # Several devices, and the collectives
//!
//! `SCOPE_LOGICAL_DEVICES=N` (or [`split_into_logical_devices`]) splits the wgpu or Vulkan
//! server's one adapter into `N` logical devices, each a scope server of its own. CUDA and
//! HIP number their real devices.
//!
//! `ServerCommunication` runs over [`scope_core::collective`], staged through the host, with
//! scope's failure rules across devices (`docs/ERROR_MODEL.md` 41–46). A part refused on its
//! device leaves its destination carrying the refusal, and a failed part breaks its group.
//! [`communication_counts`] lets `tests/collectives.rs` fail a family that moved nothing.
//! Reductions take scope's element types (rule 45). Ranks in other processes are out of reach.
//!
//! The Vulkan server compiles cubecl's kernels as WGSL by default. Under
//! `SCOPE_CUBECL_VULKAN=spirv`, a kernel with workgroup memory and a barrier crashes lavapipe.
//!
//! On CUDA and HIP the adapter builds but has not run on a GPU. cubecl's C++ takes tensor
//! metadata through a pointer, so the adapter binds it as a read-only buffer
//! ([`scope_cube::CubeKernel::split_info`]). `tests/runtime_cuda.rs` and
//! `tests/runtime_hip.rs` skip where there is no device.
//!
//! # What Burn would need
//!
//! Burn takes its device from `cubecl::Device`, an enum closed over cubecl's own runtimes.
//! So `ScopeRuntime` cannot be a Burn device without patching published crates. Upstream
//! would need a registered-runtime variant, and an arm in `burn-dispatch`'s `match` on
//! `RuntimeId` (`docs/CUBECL.md`, section 7).

mod backend;
mod communication;
mod compile;
mod device;
mod error;
mod graphs;
mod memory;
mod peers;
mod properties;
mod runtime;
mod server;
mod storage;
mod streams;

pub use backend::CubeBackend;
pub use communication::{CommunicationCounts, communication_counts};
pub use device::{LOGICAL_DEVICES_VAR, ScopeDevice, logical_devices, split_into_logical_devices};
pub use runtime::ScopeRuntime;
pub use server::ScopeServer;
pub use storage::{ScopeResource, ScopeStorage};
