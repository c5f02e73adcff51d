//! Single-source kernels: written once with `#[cube(launch)]`, run on every scope server.
//!
//! A server takes source in its own language, bindings and a scalar blob (the
//! [binding convention](scope_core::kernel)). A cubecl kernel takes buffers, then an "info"
//! struct of scalars and buffer lengths. [`translate`] compiles the source for the target.
//! [`Args`] binds the buffers in order and packs the info struct as the blob, where each
//! compiler puts it.
//!
//! The failure model needs each binding's declared access to cover the kernel's: a written
//! buffer bound read-only would never carry a failure, so a launch declaring less is refused.
//! It also needs a launch to touch only its bindings. cubecl 0.12's checked mode clamps no
//! index, so [`translate`] clamps every index itself.
//!
//! Kernels that read tensor metadata are refused by `Args`. A runtime that packs the whole
//! info struct (`scope-cubecl`) uses [`translate_definition`] and [`CubeKernel::split_info`].

mod args;
mod checks;
pub mod kernels;
mod target;
mod translate;

pub use args::Args;
pub use target::{Target, Translation, register_portable_types};
pub use translate::{CubeKernel, translate, translate_definition};

/// The cubecl crates, re-exported so a runtime builds against the same versions.
pub use cubecl_core;
