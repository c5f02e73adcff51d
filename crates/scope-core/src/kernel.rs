//! Kernels to launch, hashed once, here: servers cache compiled kernels by the hash.
//!
//! Bindings map the same on every backend: WGSL and SPIR-V binding *i* is
//! `@group(0) @binding(i)`, a non-empty scalar blob one more read-only
//! binding; the CUDA family gets the pointers, then the blob by value.
//!
//! The failure model believes a launch writes only its write set. WGSL is
//! checked and host closures work on copies; other languages reach any
//! memory through a pointer, so they are [`Unchecked`], built only `unsafe`.

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

/// Source no server can check, vouched for by whoever made it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Unchecked<T>(T);

impl<T> Unchecked<T> {
    /// Vouch for `source`.
    ///
    /// # Safety
    ///
    /// `source` is valid; a launch touches only its bindings, as their access says.
    pub unsafe fn vouched(source: T) -> Self {
        Self(source)
    }

    /// The source.
    pub fn get(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::Deref for Unchecked<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// A kernel's source.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelSource {
    /// WGSL text.
    Wgsl(Arc<str>),
    /// SPIR-V words.
    SpirV(Unchecked<Arc<[u32]>>),
    /// CUDA C++ text.
    Cuda(Unchecked<Arc<str>>),
    /// PTX text.
    Ptx(Unchecked<Arc<str>>),
    /// HIP C++ text.
    Hip(Unchecked<Arc<str>>),
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
            KernelSource::Wgsl(s) | KernelSource::Host(s) => Some(s),
            KernelSource::Cuda(s) | KernelSource::Ptx(s) | KernelSource::Hip(s) => Some(s.get()),
            KernelSource::SpirV(_) => None,
        }
    }
}

/// A hash of source, entry point and block size: the compile-cache key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelId(pub u64);

/// A kernel to launch.
#[derive(Clone, Debug)]
pub struct Kernel {
    name: Arc<str>,
    entry: Arc<str>,
    source: KernelSource,
    block: [u32; 3],
    dynamic_shared: u32,
    in_bounds: bool,
    terminates: bool,
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
            dynamic_shared: 0,
            in_bounds: false,
            terminates: false,
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
    ///
    /// # Safety
    ///
    /// As [`Unchecked::vouched`], with a GLCompute entry point.
    pub unsafe fn spirv(name: impl Into<Arc<str>>, words: impl Into<Arc<[u32]>>) -> Self {
        // SAFETY: the caller vouches for the module, per this function's contract.
        let words = unsafe { Unchecked::vouched(words.into()) };
        Self::new(name, KernelSource::SpirV(words))
    }

    /// A CUDA C++ kernel; the entry point defaults to the name.
    ///
    /// # Safety
    ///
    /// As [`Unchecked::vouched`], with an `extern "C"` entry point.
    pub unsafe fn cuda(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        // SAFETY: the caller vouches for the source, per this function's contract.
        let source = unsafe { Unchecked::vouched(source.into()) };
        Self::new(name.clone(), KernelSource::Cuda(source)).entry(name)
    }

    /// A PTX kernel; the entry point defaults to the name.
    ///
    /// # Safety
    ///
    /// As for [`cuda`](Self::cuda).
    pub unsafe fn ptx(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        // SAFETY: the caller vouches for the source, per this function's contract.
        let source = unsafe { Unchecked::vouched(source.into()) };
        Self::new(name.clone(), KernelSource::Ptx(source)).entry(name)
    }

    /// A HIP C++ kernel; the entry point defaults to the name.
    ///
    /// # Safety
    ///
    /// As for [`cuda`](Self::cuda).
    pub unsafe fn hip(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        // SAFETY: the caller vouches for the source, per this function's contract.
        let source = unsafe { Unchecked::vouched(source.into()) };
        Self::new(name.clone(), KernelSource::Hip(source)).entry(name)
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

    /// The same kernel with block size `block`, for the CUDA family.
    pub fn block(mut self, block: [u32; 3]) -> Self {
        self.block = block;
        self.rehash();
        self
    }

    /// The same kernel with `bytes` of dynamic shared memory, for the CUDA
    /// family; without it a source using some writes outside its block's.
    ///
    /// # Safety
    ///
    /// `bytes` covers every byte of dynamic shared memory the source uses.
    pub unsafe fn dynamic_shared_memory(mut self, bytes: u32) -> Self {
        self.dynamic_shared = bytes;
        self.rehash();
        self
    }

    /// Bytes of dynamic (`extern __shared__`) memory each launch gets.
    pub fn dynamic_shared_memory_bytes(&self) -> u32 {
        self.dynamic_shared
    }

    /// Vouched in bounds, so a server may drop WGSL's bounds checks.
    ///
    /// # Safety
    ///
    /// Every launch indexes only inside its bindings and arrays.
    pub unsafe fn vouch_in_bounds(mut self) -> Self {
        self.in_bounds = true;
        self.rehash();
        self
    }

    /// Whether the kernel was vouched in bounds.
    pub fn vouched_in_bounds(&self) -> bool {
        self.in_bounds
    }

    /// Vouched to end every loop, so a server may drop naga's loop counter.
    ///
    /// # Safety
    ///
    /// Every loop of every launch ends.
    pub unsafe fn vouch_terminates(mut self) -> Self {
        self.terminates = true;
        self.rehash();
        self
    }

    /// Whether the kernel was vouched to terminate.
    pub fn vouched_terminates(&self) -> bool {
        self.terminates
    }

    fn rehash(&mut self) {
        let mut hasher = DefaultHasher::new();
        self.source.hash(&mut hasher);
        self.entry.hash(&mut hasher);
        self.block.hash(&mut hasher);
        self.dynamic_shared.hash(&mut hasher);
        self.in_bounds.hash(&mut hasher);
        self.terminates.hash(&mut hasher);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_vouched_in_bounds_is_another_compiled_kernel() {
        let checked = Kernel::wgsl("k", "@compute @workgroup_size(1) fn main() {}");
        assert!(!checked.vouched_in_bounds());
        // SAFETY: the kernel touches no memory at all.
        let vouched = unsafe { checked.clone().vouch_in_bounds() };
        assert!(vouched.vouched_in_bounds());
        // Servers cache compiled kernels by id: the two must not share one.
        assert_ne!(checked.id(), vouched.id());
        assert_eq!(vouched.clone().entry("main").id(), vouched.id());
        // SAFETY: the kernel has no loop.
        let ends = unsafe { vouched.clone().vouch_terminates() };
        assert!(ends.vouched_terminates() && !vouched.vouched_terminates());
        assert_ne!(ends.id(), vouched.id());
    }
}
