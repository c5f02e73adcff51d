//! Kernels: what a runtime hands a server to launch.
//!
//! A kernel is a source in one of the languages the servers accept, a name
//! for people, an entry point and (for the CUDA family) a block size. It is
//! compiled by the server on first launch and cached by a hash of the source,
//! so a runtime can build `Kernel` values freely and cheaply; the hash is
//! taken once, here, not on every launch.
//!
//! # The binding convention
//!
//! A launch binds buffers in order and may pass a small scalar blob. Every
//! backend maps them the same way, so one runtime can target any server:
//!
//! - **WGSL and SPIR-V**: binding *i* is `@group(0) @binding(i)` (descriptor
//!   set 0, binding *i*), a storage buffer. A non-empty scalar blob is one more
//!   read-only storage buffer at the next binding.
//! - **CUDA C++, PTX and HIP C++**: the parameters are the bindings' device
//!   pointers (already advanced by the binding's offset), in order, then the
//!   scalar blob by value when it is non-empty (declare it as a struct).
//! - **Host** (the reference server): the registered closure gets each
//!   binding's bytes and the blob.
//!
//! The dispatch count is in workgroups (blocks); the workgroup size is the
//! shader's own (`@workgroup_size`), or [`Kernel::block`] for the CUDA family.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// A kernel language.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Language {
    /// WGSL text.
    Wgsl,
    /// SPIR-V words.
    SpirV,
    /// CUDA C++, compiled with NVRTC.
    Cuda,
    /// PTX text.
    Ptx,
    /// HIP C++, compiled with hiprtc.
    Hip,
    /// A closure registered with the reference host server.
    Host,
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Language::Wgsl => "WGSL",
            Language::SpirV => "SPIR-V",
            Language::Cuda => "CUDA C++",
            Language::Ptx => "PTX",
            Language::Hip => "HIP C++",
            Language::Host => "host closure",
        })
    }
}

/// A kernel's source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelSource {
    /// WGSL text.
    Wgsl(Arc<str>),
    /// SPIR-V words.
    SpirV(Arc<[u32]>),
    /// CUDA C++ text.
    Cuda(Arc<str>),
    /// PTX text.
    Ptx(Arc<str>),
    /// HIP C++ text.
    Hip(Arc<str>),
    /// The name a closure was registered under with the host server.
    Host(Arc<str>),
}

impl KernelSource {
    /// Its language.
    pub fn language(&self) -> Language {
        match self {
            KernelSource::Wgsl(_) => Language::Wgsl,
            KernelSource::SpirV(_) => Language::SpirV,
            KernelSource::Cuda(_) => Language::Cuda,
            KernelSource::Ptx(_) => Language::Ptx,
            KernelSource::Hip(_) => Language::Hip,
            KernelSource::Host(_) => Language::Host,
        }
    }

    /// The text, for the languages that are text.
    pub fn text(&self) -> Option<&str> {
        match self {
            KernelSource::Wgsl(s)
            | KernelSource::Cuda(s)
            | KernelSource::Ptx(s)
            | KernelSource::Hip(s)
            | KernelSource::Host(s) => Some(s),
            KernelSource::SpirV(_) => None,
        }
    }
}

/// A hash of a kernel's source, entry point and block size: the key of every
/// server's compile cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId(pub u64);

/// A kernel to launch.
#[derive(Clone, Debug)]
pub struct Kernel {
    name: Arc<str>,
    entry: Arc<str>,
    source: KernelSource,
    block: [u32; 3],
    id: KernelId,
}

impl Kernel {
    /// A kernel from `source`, entry point `main`, block `[1, 1, 1]`.
    pub fn new(name: impl Into<Arc<str>>, source: KernelSource) -> Self {
        let mut kernel = Self {
            name: name.into(),
            entry: Arc::from("main"),
            source,
            block: [1, 1, 1],
            id: KernelId(0),
        };
        kernel.rehash();
        kernel
    }

    /// A WGSL kernel.
    pub fn wgsl(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        Self::new(name, KernelSource::Wgsl(source.into()))
    }

    /// A SPIR-V kernel.
    pub fn spirv(name: impl Into<Arc<str>>, words: impl Into<Arc<[u32]>>) -> Self {
        Self::new(name, KernelSource::SpirV(words.into()))
    }

    /// A CUDA C++ kernel; the entry point defaults to the name.
    pub fn cuda(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        Self::new(name.clone(), KernelSource::Cuda(source.into())).entry(name)
    }

    /// A PTX kernel; the entry point defaults to the name.
    pub fn ptx(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        Self::new(name.clone(), KernelSource::Ptx(source.into())).entry(name)
    }

    /// A HIP C++ kernel; the entry point defaults to the name.
    pub fn hip(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        Self::new(name.clone(), KernelSource::Hip(source.into())).entry(name)
    }

    /// A closure registered with the reference host server under `name`.
    pub fn host(name: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        Self::new(name.clone(), KernelSource::Host(name))
    }

    /// The same kernel with entry point `entry`.
    pub fn entry(mut self, entry: impl Into<Arc<str>>) -> Self {
        self.entry = entry.into();
        self.rehash();
        self
    }

    /// The same kernel with block (workgroup) size `block`, for the CUDA
    /// family; shader languages declare their own.
    pub fn block(mut self, block: [u32; 3]) -> Self {
        self.block = block;
        self.rehash();
        self
    }

    fn rehash(&mut self) {
        let mut hasher = DefaultHasher::new();
        self.source.hash(&mut hasher);
        self.entry.hash(&mut hasher);
        self.block.hash(&mut hasher);
        self.id = KernelId(hasher.finish());
    }

    /// The name people see in reports.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// The entry point.
    pub fn entry_point(&self) -> &str {
        &self.entry
    }

    /// The source.
    pub fn source(&self) -> &KernelSource {
        &self.source
    }

    /// The block size.
    pub fn block_size(&self) -> [u32; 3] {
        self.block
    }

    /// The compile-cache key.
    pub fn id(&self) -> KernelId {
        self.id
    }
}
