//! cubecl kernels compiled for a scope server, once per kernel id.
//!
//! A [`KernelId`] names everything a compile depends on, so it keys the cache. The limit
//! checks come from `cubecl-server`'s own validation, so a refusal is the typed
//! `ResourceLimitError` cubecl's callers match on. A failure is not cached: a retry costs a
//! compile, but no failure is recorded twice.

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

/// What a compile needs to know about the device, fixed when the server opens.
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

    /// Compile every queued kernel. A failure is found again by the launch that needs it.
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
        // SAFETY: a kernel compiled here runs only through the unsafe `Server::launch`, whose
        // caller promises its launches stay inside their bindings and end their loops.
        let compiled = unsafe { translate_definition(definition, to.target, &to.translation) }?;
        validate_shared_memory(&to.properties, Some(compiled.shared_memory()))?;
        tracing::trace!(kernel = %compiled.name(), source = ?compiled.source(), "compiled");
        let compiled = Arc::new(compiled);
        self.compiled.insert(id, compiled.clone());
        Ok(compiled)
    }
}
