//! A minimal tensor runtime over one scope server: what a runtime author
//! would copy.
//!
//! It uses only the server contract ([`scope_core::Client`] and its types),
//! so the same code runs on CUDA, HIP, Vulkan or wgpu, chosen by feature.
//! Its shape follows from what the contract promises:
//!
//! - **Generic over `B: Backend`.** Only [`backends`] has a `cfg`.
//! - **Kernels written once.** [`cube`] holds each operation as cubecl,
//!   translated for [`scope_cube::Target::of`] and packed by [`scope_cube::Args`].
//!   [`kernels`] keeps them hand-written as the native path ([`Runtime::native`]).
//! - **Issue everything, check at the read.** A failed launch is carried by its
//!   outputs; the host read names the root cause and the skipped chain ([`runtime`]).
//! - **Allocate once, capture once.** A model owns every intermediate, so a
//!   captured pass replays into the same memory.
//! - **Across devices, the same rule.** One rank's fault fails every rank's
//!   reduced gradient, so no rank updates ([`data_parallel`]).
//!
//! The binary (`cargo xtask demo`) runs the four acts of [`demo`].

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

/// Linking one server into a runtime, whole: get a client, launch, read. The README's
/// example, run as a doctest; with no wgpu adapter it returns early.
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

/// The README's examples, checked as doctests ([`linking`] also runs one).
#[cfg(all(doctest, feature = "wgpu"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
