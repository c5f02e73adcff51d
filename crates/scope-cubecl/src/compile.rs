//! cubecl kernels compiled for a scope server, once per kernel id.
//!
//! A cubecl kernel arrives as IR behind `Box<dyn CubeKernel>`; its
//! [`KernelId`] names the kernel's type, cube size, address width, execution
//! mode and comptime arguments, so it keys the cache. The checks cubecl's
//! own runtimes make before compiling — cube size, units per cube, then
//! shared memory once the compiler has said how much — come from
//! `cubecl-server`'s shared validation, so a refusal is the same typed
//! `ResourceLimitError` cubecl's callers match on.
//!
//! A failure is not cached: the next launch of the same kernel tries again
//! and fails the same way, which costs a compile but keeps no second record
//! of a failure beside scope's.

use std::sync::Arc;

use cubecl_core::ir::DeviceProperties;
use cubecl_runtime::id::KernelId;
use cubecl_runtime::kernel::{CubeKernel as CubeclKernel, define_kernel};
use cubecl_runtime::server::LaunchError;
use cubecl_server::validation::{validate_cube_dim, validate_shared_memory, validate_units};
use scope_cube::{CubeKernel, Target, Translation, translate_definition};

use scope_core::id::IdMap;

/// Compiled kernels, and the ones queued for compilation, for one device.
pub(crate) struct Kernels {
    to: CompileTarget,
    compiled: IdMap<KernelId, Arc<CubeKernel>>,
    queued: Vec<Box<dyn CubeclKernel>>,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("target", &self.to.target)
            .field("compiled", &self.compiled.len())
            .field("queued", &self.queued.len())
            .finish()
    }
}

/// What a compile needs to know about the device, fixed when the server
/// opens.
pub(crate) struct CompileTarget {
    pub(crate) target: Target,
    pub(crate) translation: Translation,
    pub(crate) properties: Arc<DeviceProperties>,
}

impl Kernels {
    /// No kernel yet, compiling for `to`.
    pub(crate) fn new(to: CompileTarget) -> Self {
        Self {
            to,
            compiled: IdMap::default(),
            queued: Vec::new(),
        }
    }

    /// Keep `kernel` for [`compile_queued`](Self::compile_queued).
    pub(crate) fn enqueue(&mut self, kernel: Box<dyn CubeclKernel>) {
        self.queued.push(kernel);
    }

    /// Compile every queued kernel. A failure is dropped here — nothing was
    /// asked to run — and found again by the launch that needs the kernel.
    pub(crate) fn compile_queued(&mut self) {
        for kernel in std::mem::take(&mut self.queued) {
            if let Err(error) = self.get(&*kernel) {
                tracing::debug!(kernel = kernel.name(), %error, "queued compile failed");
            }
        }
    }

    /// `kernel` compiled, from the cache or now.
    pub(crate) fn get(
        &mut self,
        kernel: &dyn CubeclKernel,
    ) -> Result<Arc<CubeKernel>, LaunchError> {
        let id = kernel.id();
        if let Some(compiled) = self.compiled.get(&id) {
            return Ok(compiled.clone());
        }
        let to = &self.to;
        validate_cube_dim(&to.properties, &id)?;
        validate_units(&to.properties, &id)?;
        let definition = define_kernel(kernel)?;
        // SAFETY: a kernel compiled here runs only through `Server::launch`,
        // an unsafe contract whose caller — cubecl's launcher, for
        // `launch_unchecked` — promises what an unchecked definition needs:
        // its launches stay inside their bindings and end their loops.
        let compiled = unsafe { translate_definition(definition, to.target, &to.translation) }?;
        validate_shared_memory(&to.properties, Some(compiled.shared_memory()))?;
        tracing::trace!(kernel = %compiled.name(), source = ?compiled.source(), "compiled");
        let compiled = Arc::new(compiled);
        self.compiled.insert(id, compiled.clone());
        Ok(compiled)
    }
}
