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
//!
//! # What is checked, and what the caller promises
//!
//! The failure model believes the bytes outside a launch's write set are
//! untouched by it. Whether that holds depends on the source language:
//!
//! - **WGSL** is checked: naga validates it, server-vulkan lowers it with
//!   every access restricted to its binding, and wgpu bounds-checks it. A
//!   WGSL kernel is safe to build ([`Kernel::wgsl`]). Those runtime checks
//!   cost a kernel that indexes heavily several times its speed (cubek's
//!   matmul runs four times slower with them on lavapipe), so a kernel
//!   whose author guarantees every access — to buffers *and* to workgroup
//!   and local arrays — stays inside can be vouched for with the `unsafe`
//!   [`Kernel::vouch_in_bounds`], and the servers then drop theirs. A
//!   promise that a checking pass keeps accesses inside is only as good as
//!   that pass: cubecl 0.12's checked mode clamps no index at all (its
//!   pass never matches a buffer, and was never meant for workgroup
//!   arrays), so scope-cube adds its own clamps to checked kernels and
//!   vouches none of them; only a kernel the caller vouches for, unsafely,
//!   runs without the servers' checks. Loops are bounded the same way, and
//!   vouched for with [`Kernel::vouch_terminates`].
//! - **Host closures** work on copies of their bindings: safe
//!   ([`Kernel::host`]).
//! - **SPIR-V words, CUDA C++, PTX and HIP C++** are machine-level code:
//!   through a raw pointer or a device address they can read and write any
//!   memory of the device, bytes of other buffers the failure model then
//!   believes clean, and an invalid SPIR-V module is undefined behaviour in
//!   the driver. No server can check them, so they are [`Unchecked`] and
//!   built only by `unsafe` constructors ([`Kernel::spirv`], [`Kernel::cuda`],
//!   [`Kernel::ptx`], [`Kernel::hip`]) whose caller promises what cannot be
//!   checked — as cudarc makes its launch `unsafe` for the same reason.

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

/// Source no server can check, vouched for by whoever made it (see the
/// [module docs](self)): made only by the `unsafe` [`Unchecked::vouched`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Unchecked<T>(T);

impl<T> Unchecked<T> {
    /// Vouch for `source`.
    ///
    /// # Safety
    ///
    /// The caller promises that `source` is a valid module for the devices
    /// it will be launched on, and that every launch of it — for the
    /// bindings, scalars and counts it is launched with — reads only the
    /// bytes of the bindings it reads, writes only the bytes of the bindings
    /// it writes, and touches no other memory: no raw pointer or device
    /// address is followed outside them. Breaking this can corrupt buffers
    /// the failure model reports as written, or be undefined behaviour in
    /// the driver.
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
    /// Set by [`vouch_in_bounds`](Self::vouch_in_bounds): the server may
    /// compile without runtime bounds checks.
    in_bounds: bool,
    /// Set by [`vouch_terminates`](Self::vouch_terminates): the server may
    /// compile without bounding its loops.
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
    /// As [`Unchecked::vouched`]: `words` are a valid SPIR-V module with a
    /// GLCompute entry point (named by [`entry`](Self::entry)) that follows
    /// the binding convention or the server's device-address interface, and
    /// whose every launch stays inside the bindings it is given.
    pub unsafe fn spirv(name: impl Into<Arc<str>>, words: impl Into<Arc<[u32]>>) -> Self {
        // SAFETY: the caller vouches for the module, as this function's
        // contract says.
        let words = unsafe { Unchecked::vouched(words.into()) };
        Self::new(name, KernelSource::SpirV(words))
    }

    /// A CUDA C++ kernel; the entry point defaults to the name.
    ///
    /// # Safety
    ///
    /// As [`Unchecked::vouched`]: the source declares the entry point
    /// `extern "C"` with the binding convention's parameters, and every
    /// launch of it dereferences only pointers into the bindings it is given,
    /// within their lengths.
    pub unsafe fn cuda(name: impl Into<Arc<str>>, source: impl Into<Arc<str>>) -> Self {
        let name = name.into();
        // SAFETY: the caller vouches for the source, as this function's
        // contract says.
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
        // SAFETY: the caller vouches for the source, as this function's
        // contract says.
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
        // SAFETY: the caller vouches for the source, as this function's
        // contract says.
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

    /// The same kernel with block (workgroup) size `block`, for the CUDA
    /// family; shader languages declare their own.
    pub fn block(mut self, block: [u32; 3]) -> Self {
        self.block = block;
        self.rehash();
        self
    }

    /// The same kernel, vouched to keep every access inside its bindings
    /// and its workgroup arrays by its own code, so that a server may
    /// compile it without the runtime bounds checks it adds to WGSL
    /// (wgpu's and naga's). The other languages are never checked by the
    /// server, so for them this changes nothing.
    ///
    /// # Safety
    ///
    /// As [`Unchecked::vouched`]: every launch of the kernel — for the
    /// bindings, scalars and counts it is launched with — indexes only
    /// inside the bindings and arrays it indexes. Without the server's
    /// checks an access outside them is undefined behaviour in the driver,
    /// and can write bytes of other buffers the failure model reports as
    /// written.
    pub unsafe fn vouch_in_bounds(mut self) -> Self {
        self.in_bounds = true;
        self.rehash();
        self
    }

    /// Whether the kernel was vouched for with
    /// [`vouch_in_bounds`](Self::vouch_in_bounds): a server may then skip
    /// its runtime bounds checks.
    pub fn vouched_in_bounds(&self) -> bool {
        self.in_bounds
    }

    /// The same kernel, vouched to end every loop it enters, so that a
    /// server may compile it without the loop bound naga adds to WGSL (a
    /// counter in every loop, which turns a loop that never ends — undefined
    /// behaviour to the driver's compiler — into one that does). The
    /// counter costs a loop-heavy kernel dearly: cubek's matmul runs four
    /// times slower with it on lavapipe.
    ///
    /// # Safety
    ///
    /// Every loop of every launch of the kernel ends. A loop that does not
    /// is undefined behaviour in the driver's compiler, which may miscompile
    /// what follows it, including the kernel's own bounds checks.
    pub unsafe fn vouch_terminates(mut self) -> Self {
        self.terminates = true;
        self.rehash();
        self
    }

    /// Whether the kernel was vouched for with
    /// [`vouch_terminates`](Self::vouch_terminates): a server may then
    /// leave its loops unbounded.
    pub fn vouched_terminates(&self) -> bool {
        self.terminates
    }

    fn rehash(&mut self) {
        let mut hasher = DefaultHasher::new();
        self.source.hash(&mut hasher);
        self.entry.hash(&mut hasher);
        self.block.hash(&mut hasher);
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
