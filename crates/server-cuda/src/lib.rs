//! A scope server over the CUDA driver API, through `cudarc`.
//!
//! The crate is the CUDA answer to [`scope_core::Backend`] and nothing more. Every rule of the
//! failure model lives in `scope-core`'s `Server`; this crate makes device calls. Its files stand
//! in layers over cudarc, each naming only those above it here:
//!
//! - `error.rs`, `ptx.rs`: `CUresult` → [`Error`](scope_core::Error); which PTX a driver JITs.
//! - `nvrtc.rs`, `driver.rs`: NVRTC; the driver loaded without a panic, [`probe`].
//! - `staging.rs`, `pool.rs`, `module.rs`: pinned staging, device memory, loaded PTX.
//! - `device.rs`: the context, streams, ordering, waits.
//! - `memory.rs`, `copy.rs`, `launch.rs`, `capture.rs`: work issued on a stream.
//! - `collective.rs`: NCCL; `reopen.rs`: a lost device reopened ([`scope_native::reopen`]).
//! - This file: [`Cuda`], holding a piece of each layer, and its `Backend` impl.
//!
//! # Without CUDA
//!
//! cudarc loads CUDA at run time, so the crate builds and tests with no toolkit or GPU. It panics
//! on a driver call without the library, so [`client`] and [`probe`] first ask whether it loads.
//! Without it they answer [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) or
//! an empty probe.
//!
//! # Which CUDA
//!
//! cudarc's **`cuda-13000`** feature picks the bindings and library names. It finds NVRTC 13 or 12
//! by soname. The driver entry points date from CUDA 11.4, except `cuFuncGetParamInfo` (12.4),
//! looked up first. Newer features change `CUmemPoolProps` and buy nothing. NVRTC's release decides
//! which drivers run the kernels ([`CudaVersion::ptx_isa`]): [`BUNDLED_NVRTC`] writes ISA 8.2,
//! which drivers from 12.2 (Linux 535) JIT. A refused module is [`UnsupportedPtx`]
//! ([`cuda_driver_version`], [`nvrtc_version`]).
//!
//! # What is measured
//!
//! `tests/mock*.rs` run this crate on every machine against a mock driver, NVRTC and NCCL written
//! in C; the mock proves nothing about NVIDIA hardware. `tests/toolchain.rs` compiles every kernel
//! through [`nvrtc_ptx`] and `ptxas`. Device tests skip without a device, unless
//! `SCOPE_REQUIRE=cuda`.

mod capture;
mod collective;
mod copy;
mod device;
mod driver;
mod error;
mod launch;
mod memory;
mod module;
mod nvrtc;
mod pool;
mod ptx;
mod reopen;
mod staging;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use scope_core::backend::Launch;
use scope_core::{Backend, Client, Kernel, Kind, Language, LaunchLimits, Result, StreamId};
use scope_native::ParamTable;

pub use capture::CudaGraph;
pub use collective::{load_nccl, nccl_can_shrink};
pub use device::{CudaStreamState, CudaWaiter};
pub use driver::{cuda_driver_version, probe, total_memory};
pub use launch::CudaKernel;
pub use nvrtc::{nvrtc_options, nvrtc_ptx, nvrtc_version};
pub use pool::CudaMemory;
pub use ptx::{BUNDLED_NVRTC, CudaVersion, PtxIsa, UnsupportedPtx, driver_jits};

use device::StreamShared;
use driver::DeviceInfo;
use pool::Pool;

/// The CUDA backend: one device's context, streams, pool and compiler.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    driver: (i32, i32),
    /// Read once; reported and enforced from this one copy, so the two agree.
    limits: LaunchLimits,
    /// `compute_XY` for NVRTC; `None` when NVRTC is not here (PTX only).
    nvrtc_arch: Option<String>,
    pool: Pool,
    /// Every logical stream, by index (the core's `StreamId`).
    streams: Vec<Arc<StreamShared>>,
    capturing: Vec<bool>,
    /// Frees whose last user was capturing: `(stream, memory)`.
    deferred: Vec<(u32, CudaMemory)>,
    /// Launch parameters: exact where the driver reports them, else zero-padded.
    params: ParamTable,
    /// This server's hold on the device, which a reset must not pull away.
    holding: scope_native::Holding,
}

impl Cuda {
    /// Open device `ordinal`.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) without a driver or the
    /// device; the driver's error when starting fails.
    pub fn open(ordinal: usize) -> Result<Self> {
        // Held before the context: a concurrent reset refuses, or ends first.
        let holding = scope_native::Holding::new(error::BACKEND, ordinal);
        let ctx = driver::open_context(ordinal)?;
        let info = driver::device_info(ordinal)?;
        let driver = driver::driver_version()?;
        let rules = launch::api_rules(info.capability);
        let limits =
            scope_native::launch_limits(&driver::launch_geometry(&ctx), info.total_memory, &rules);
        let nvrtc_arch = if nvrtc::nvrtc_present() {
            match nvrtc::nvrtc_arch(info.capability) {
                Ok(arch) => Some(arch),
                Err(error) => {
                    tracing::warn!("cuda: NVRTC unusable, PTX only: {error}");
                    None
                }
            }
        } else {
            None
        };
        let pool = Pool::new(&ctx, ordinal)?;
        Ok(Self {
            ctx,
            info,
            driver,
            limits,
            nvrtc_arch,
            pool,
            streams: Vec::new(),
            capturing: Vec::new(),
            deferred: Vec::new(),
            params: ParamTable::new(&rules),
            holding,
        })
    }

    /// The cudarc context, for a raw-API baseline.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The cudarc stream behind logical stream `index`.
    pub fn raw_stream(&self, index: u32) -> Option<Arc<CudaStream>> {
        self.streams.get(index as usize).map(|s| s.cu.clone())
    }

    /// The compute capability, `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.info.capability
    }

    /// The architecture NVRTC compiles for (`compute_90`), when NVRTC is here.
    pub fn nvrtc_arch(&self) -> Option<&str> {
        self.nvrtc_arch.as_deref()
    }

    /// Whether CUDA C++ kernels can be compiled here (NVRTC was found).
    pub fn has_nvrtc(&self) -> bool {
        self.nvrtc_arch.is_some()
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        let _ = self.bind();
        for (index, memory) in std::mem::take(&mut self.deferred) {
            // SAFETY: `deferred` holds freed memory nothing names again; released once.
            unsafe { self.release(Some(index), memory) };
        }
        self.pool.destroy();
    }
}

impl Backend for Cuda {
    type Memory = CudaMemory;
    type Stream = CudaStreamState;
    type Kernel = CudaKernel;
    type Graph = CudaGraph;
    type Waiter = CudaWaiter;

    const KIND: Kind = Kind::Server(error::KIND);
    const RESTART: &'static str = error::RESTART;

    fn describe(&self) -> String {
        format!(
            "{} #{} (sm_{}{}, {:.1} GiB, driver CUDA {}.{}, {})",
            self.info.name,
            self.info.ordinal,
            self.info.capability.0,
            self.info.capability.1,
            self.info.total_memory as f64 / (1u64 << 30) as f64,
            self.driver.0,
            self.driver.1,
            match &self.nvrtc_arch {
                Some(arch) => format!("NVRTC → {arch}"),
                None => "PTX only".to_owned(),
            }
        )
    }

    fn accepts(&self, language: Language) -> bool {
        match language {
            Language::Ptx => true,
            Language::Cuda => self.nvrtc_arch.is_some(),
            _ => false,
        }
    }

    fn max_allocation(&self) -> u64 {
        self.info.total_memory
    }

    fn launch_limits(&self) -> LaunchLimits {
        self.limits
    }

    unsafe fn create_stream(&mut self, id: StreamId) -> Result<CudaStreamState> {
        self.new_stream(id)
    }

    unsafe fn allocate(&mut self, stream: &mut CudaStreamState, size: u64) -> Result<CudaMemory> {
        self.allocate_block(stream, size)
    }

    unsafe fn free(&mut self, memory: CudaMemory) {
        // SAFETY: `Backend::free`'s contract: this backend's memory, given back once.
        unsafe { self.free_block(memory) };
    }

    fn trim(&mut self) {
        self.trim_pool();
    }

    fn bytes_reserved(&self) -> u64 {
        self.reserved()
    }

    unsafe fn write(
        &mut self,
        stream: &mut CudaStreamState,
        dst: &CudaMemory,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::write` is `write_bytes`'s.
        unsafe { self.write_bytes(stream, dst, offset, data) }
    }

    unsafe fn read(
        &mut self,
        stream: &mut CudaStreamState,
        src: &CudaMemory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::read` is `read_bytes`'s.
        unsafe { self.read_bytes(stream, src, offset, out) }
    }

    unsafe fn copy(
        &mut self,
        stream: &mut CudaStreamState,
        src: &CudaMemory,
        src_offset: u64,
        dst: &CudaMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::copy` is `copy_bytes`'s.
        unsafe { self.copy_bytes(stream, src, src_offset, dst, dst_offset, len) }
    }

    fn compile(&mut self, kernel: &Kernel) -> Result<CudaKernel> {
        self.compile_kernel(kernel)
    }

    fn check_launch(&self, kernel: &CudaKernel, launch: &Launch<'_, CudaMemory>) -> Result<()> {
        launch::check_launch(&self.limits, kernel, launch)
    }

    unsafe fn launch(
        &mut self,
        stream: &mut CudaStreamState,
        kernel: &CudaKernel,
        launch: &Launch<'_, CudaMemory>,
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::launch` is `launch_kernel`'s.
        unsafe { self.launch_kernel(stream, kernel, launch) }
    }

    unsafe fn sync(&mut self, stream: &mut CudaStreamState) -> Result<()> {
        self.sync_stream(stream)
    }

    unsafe fn begin_wait(&mut self, stream: &mut CudaStreamState) -> Result<Option<CudaWaiter>> {
        self.begin_wait_for(stream)
    }

    unsafe fn wait(waiter: &CudaWaiter) -> Result<()> {
        Cuda::wait_for(waiter)
    }

    unsafe fn end_wait(&mut self, stream: &mut CudaStreamState, waiter: CudaWaiter) -> Result<()> {
        self.end_wait_for(stream, waiter)
    }

    unsafe fn order(
        &mut self,
        first: &mut CudaStreamState,
        then: &mut CudaStreamState,
    ) -> Result<()> {
        self.order_streams(first, then)
    }

    unsafe fn begin_capture(&mut self, stream: &mut CudaStreamState) -> Result<()> {
        self.begin(stream)
    }

    unsafe fn end_capture(&mut self, stream: &mut CudaStreamState) -> Result<CudaGraph> {
        self.end(stream)
    }

    unsafe fn abort_capture(&mut self, stream: &mut CudaStreamState) {
        self.abort(stream);
    }

    unsafe fn replay(&mut self, stream: &mut CudaStreamState, graph: &CudaGraph) -> Result<()> {
        // SAFETY: the contract of `Backend::replay` is `replay_graph`'s.
        unsafe { self.replay_graph(stream, graph) }
    }

    unsafe fn reopen(
        &mut self,
        fault: &scope_core::Error,
        streams: &mut [&mut CudaStreamState],
    ) -> Result<()> {
        scope_native::reopen(self, fault, streams)
    }

    unsafe fn destroy_graph(&mut self, graph: CudaGraph) -> Result<()> {
        self.destroy(graph)
    }
}

/// A client of a new server on device 0.
///
/// # Errors
///
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) without a CUDA driver or
/// device (never a panic); the driver's error when one fails.
pub fn client() -> Result<Client<Cuda>> {
    client_on(0)
}

/// A client of a new server on device `ordinal`; errors as [`client`].
pub fn client_on(ordinal: usize) -> Result<Client<Cuda>> {
    Client::new(Cuda::open(ordinal)?)
}
