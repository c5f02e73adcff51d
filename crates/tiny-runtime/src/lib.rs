//! A minimal tensor runtime that links one scope server: what a runtime
//! author would copy.
//!
//! It is written only against the server contract — [`scope_core::Client`],
//! [`Buffer`](scope_core::Buffer), [`Kernel`](scope_core::Kernel),
//! [`Binding`](scope_core::Binding), [`Dispatch`](scope_core::Dispatch) — so
//! the same code runs on CUDA, HIP, Vulkan or wgpu, chosen by cargo feature
//! (`wgpu` by default). Its shape follows from what the contract promises:
//!
//! - **Generic over `B: Backend`, named in one place.** [`runtime`],
//!   [`mlp`], [`data_parallel`] and [`demo`] never mention a backend;
//!   [`backends`] is the only module with a `cfg` in it, one arm a server.
//! - **Kernels written once.** [`cube`] holds each operation as a cubecl
//!   `#[cube(launch)]` function, translated by `scope-cube` into the
//!   language [`scope_cube::Target::of`] gives the linked server (SPIR-V by
//!   device address on Vulkan, WGSL on wgpu, C++ on CUDA and HIP) and its
//!   arguments packed by [`scope_cube::Args`]. That is the default path.
//!   [`kernels`] keeps the same operations hand-written in WGSL and CUDA
//!   C++ as the native path ([`Runtime::native`]), which the tests and the
//!   demo's comparison line run too.
//! - **Issue everything, check at the read.** A failed or skipped launch is
//!   carried by its outputs, so the runtime does not stop a pass on one: the
//!   host read at the end returns the root cause and the chain of skipped
//!   kernels back to it ([`runtime`] explains the two kinds of launch error).
//! - **Allocate once, capture once.** A model owns every intermediate, so a
//!   pass allocates nothing and a captured pass replays into the same memory.
//! - **Across devices, the same rule.** [`data_parallel`] trains on a
//!   [`scope_core::collective::Group`] of devices: a failure in one rank's
//!   backward pass fails every rank's all-reduced gradient, the update that
//!   reads it is skipped everywhere, and every rank keeps the same weights.
//!
//! The binary (`cargo xtask demo`, or `cargo run -p tiny-runtime`) runs the
//! four acts of [`demo`]: a checked forward pass, a fault in the first
//! layer and what the user sees of it, capture/replay, and a data-parallel
//! training step on four devices — clean, with a fault on rank 2, and clean
//! again.

pub mod backends;
pub mod cube;
pub mod data_parallel;
pub mod demo;
pub mod elastic;
pub mod kernels;
pub mod mlp;
pub mod runtime;

pub use cube::CubeKernels;
pub use kernels::Kernels;
pub use mlp::{Mlp, Shape, Weights};
pub use runtime::{Path, Runtime, Tensor};

/// Linking one server into a runtime, whole: get a client, launch, read.
///
/// This is the README's example, compiled and run as a doctest. A machine
/// with no wgpu adapter returns early; a read names any failure upstream,
/// with the chain of skipped kernels back to it.
///
/// ```
/// use scope_core::{Binding, Dispatch, Error, Kernel};
///
/// let client = match server_wgpu::client() {
///     Ok(client) => client,
///     Err(Error::BackendUnavailable { reason, .. }) => return eprintln!("no device: {reason}"),
///     Err(other) => panic!("{other}"),
/// };
/// let double = Kernel::wgsl("double", "
///     @group(0) @binding(0) var<storage, read_write> v: array<f32>;
///     @compute @workgroup_size(64)
///     fn main(@builtin(global_invocation_id) i: vec3<u32>) {
///         if (i.x < arrayLength(&v)) { v[i.x] = 2.0 * v[i.x]; }
///     }");
/// let bytes: Vec<u8> = [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
/// let buffer = client.upload(&bytes).unwrap();
/// client.launch(&double, &[Binding::read_write(&buffer)], &[], Dispatch::linear(1)).unwrap();
/// let out = client.read(&buffer).unwrap(); // a failure upstream is reported here
/// assert_eq!(out[8..12], 6.0f32.to_le_bytes());
/// ```
#[cfg(feature = "wgpu")]
pub mod linking {}

/// The README's examples, checked as doctests (its linking example compiles;
/// the copy in [`linking`] also runs).
#[cfg(all(doctest, feature = "wgpu"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
