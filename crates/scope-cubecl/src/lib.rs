//! Every scope server as a cubecl runtime.
//!
//! A cubecl program names [`ScopeRuntime<B>`] where it would name
//! `cubecl_wgpu::WgpuRuntime`, and its kernels, buffers, reads and graphs
//! run on scope server `B` — wgpu, raw Vulkan, CUDA or HIP — with scope's
//! failure model underneath. The design, and what each cubecl call becomes,
//! is `docs/CUBECL.md`. Its decisions:
//!
//! 1. **An adapter over the contract, not a second server.** cubecl 0.12
//!    carries a failure model of its own (the ancestor of scope's). The
//!    adapter uses none of it: [`ScopeServer`] owns a
//!    [`scope_core::Client`] and keeps only translation tables — cubecl
//!    memory ids to scope buffers, streams to scope streams, kernel ids to
//!    compiled kernels, graph ids to graphs. Every question "were these
//!    bytes written?" is asked of scope, so the books are kept once.
//! 2. **A failure found by the adapter lands where a launch's would.** A
//!    cubecl compiler refusal, a resource limit, a binding scope cannot
//!    take: each becomes [`scope_core::Client::fail_writing`] on the
//!    launch's outputs, with cubecl's own typed `ServerError` kept inside
//!    [`scope_core::Error::External`], so a read three skipped kernels
//!    downstream still answers `is_refusal()` as cubecl's tests expect.
//! 3. **cubecl's compilers, scope's launch path.** Kernels are compiled by
//!    the compilers cubecl's runtimes use, through `scope-cube`, and
//!    launched as ordinary scope kernels: the whole info struct (scalars,
//!    buffer lengths, tensor shapes and strides) is the scope convention's
//!    scalar blob.
//! 4. **The device cubecl sees is the server's.** `DeviceProperties` come
//!    from [`scope_core::Client::limits`], never from what the same GPU
//!    could do under another runtime: a kernel library specialises on
//!    them, and a promise the server does not keep is a refused launch.
//! 5. **Profiling is by system time.** scope's contract has no device
//!    timestamps; a window that a failure fell in is reported as an error,
//!    never as a timing, through [`scope_core::Client::failures_seen`].
//!
//! # What Burn would need
//!
//! Burn's cubecl backend takes its device from `cubecl::Device`, an enum
//! closed over cubecl's own runtimes, so `ScopeRuntime` cannot be one of
//! Burn's devices without patching published crates, which this crate does
//! not do. Upstream, cubecl would need a registered-runtime variant
//! (`Device::External { runtime, id }` with a registry of each runtime's
//! `client`, `can_read_tensor` and enumeration functions); `burn-cubecl`
//! would need nothing more as long as it reaches runtimes only through that
//! enum's methods; `burn` would need a feature that registers the runtime
//! at start-up. See `docs/CUBECL.md`, section 7.

mod backend;
mod compile;
mod device;
mod error;
mod memory;
mod properties;
mod runtime;
mod server;
mod storage;
mod streams;

pub use backend::CubeBackend;
pub use device::ScopeDevice;
pub use runtime::ScopeRuntime;
pub use server::ScopeServer;
pub use storage::{ScopeResource, ScopeStorage};
