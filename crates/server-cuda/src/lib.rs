//! A scope server over the CUDA driver API, through `cudarc`.
//!
//! The crate is the CUDA answer to [`scope_core::Backend`] and nothing
//! more. Every rule of the failure model lives in `scope-core`'s `Server`;
//! this crate makes device calls. Its files follow the contract:
//!
//! - `device.rs`: loading the driver without panicking, the primary
//!   context, one cudarc stream per logical stream, event ordering, waits
//!   without the server's lock, [`probe`].
//! - `memory.rs`: a stream-ordered memory pool (`cuMemAllocFromPoolAsync`)
//!   that caches freed memory, and the pinned staging belt.
//! - `copy.rs`: host writes and reads, device copies.
//! - `launch.rs`: CUDA C++ through NVRTC, PTX through the JIT, launches
//!   under the rules CUDA shares with HIP ([`scope_native`]).
//! - `capture.rs`: stream capture into CUDA graphs, which keep their
//!   kernels' modules loaded; replay; destruction after replays.
//! - `collective.rs`: collectives through NCCL
//!   ([`scope_core::collective::device::DeviceCollectives`]), on
//!   non-blocking communicators an abort can always reach.
//! - `reopen.rs`: CUDA's calls for reopening a lost device
//!   ([`scope_native::reopen`]): a reset of the primary context, never
//!   under another client of the device.
//! - `error.rs`: `CUresult` → the core's [`Error`](scope_core::Error),
//!   with each fault's class: recoverable, sticky, or process-fatal.
//!
//! # Without CUDA
//!
//! cudarc is built with `dynamic-loading`: nothing links against CUDA. The
//! crate builds and its tests run with no toolkit and no GPU. cudarc would
//! panic on the first driver call there, so [`client`] and [`probe`] ask
//! first whether the library loads. They answer
//! [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) or
//! an empty probe.
//!
//! # Which CUDA
//!
//! cudarc needs one `cuda-*` feature, which picks the bindings and the
//! library names searched. This crate uses **`cuda-13000`**:
//!
//! - The bindings and the mock driver's values are CUDA 13.0's. The crate
//!   has not yet run on a real driver. A driver is backward compatible, so
//!   the choice matters for NVRTC.
//! - NVRTC is found by soname. `cuda-13000` searches `libnvrtc.so.13`
//!   first and falls back to `.so.12`, so both toolkits in use are found.
//! - Every driver entry point used exists since CUDA 11.4, except
//!   `cuFuncGetParamInfo` (12.4), which is looked up first. A 12.x driver
//!   runs this crate.
//! - NVRTC's release decides which driver runs the kernels. A driver JITs
//!   PTX of its own ISA version and older ([`CudaVersion::ptx_isa`]).
//!   NVRTC 12.2 ([`BUNDLED_NVRTC`]) writes ISA 8.2, which every driver from
//!   12.2 (Linux 535) JITs. A module refused for its PTX version is
//!   [`UnsupportedPtx`], naming the versions and the fix
//!   ([`cuda_driver_version`], [`nvrtc_version`]).
//! - Newer features (`cuda-13010`+) change struct layouts this crate fills
//!   in (`CUmemPoolProps`) and buy nothing it uses.
//!
//! # What is measured and what is not
//!
//! See the tests and `benches/launch.rs`. Device tests go through
//! `client_or_skip`: they print `skipped: no cuda device (...)` without
//! one, and fail with `SCOPE_REQUIRE=cuda`.
//!
//! **On a mock driver.** `tests/mock*.rs` run this crate's Rust, through
//! cudarc, against a mock CUDA driver (four devices) and NVRTC written in
//! C (`tests/mock/`), and the mock NCCL both servers share
//! (`scope-test/mock/`). They are built per test process and run on
//! every machine. They cover:
//!
//! - the conformance suite, with its collectives over NCCL;
//! - NVRTC's options and log, the JIT's log, `cuFuncGetParamInfo`, the
//!   launch limits read and enforced;
//! - the pool, a real out-of-memory with its trim and retry, pinned
//!   staging, deferred frees;
//! - capture and replay, graph destruction after replays, an invalidated
//!   capture, a sticky illegal address;
//! - recovery (`mock_recover.rs`): an ECC error reset, a reset refused
//!   beside another client, an illegal address refused with
//!   `RestartRequired`;
//! - PTX newer than the driver; an older driver (CUDA 12.2: no pools, no
//!   `cuFuncGetParamInfo`); NVRTC 13.0 beside a 12.2 driver;
//! - driver failures planted one call at a time.
//!
//! The mock refuses what real CUDA refuses or mishandles, and every test
//! asserts it refused nothing. It proves nothing about NVIDIA hardware.
//! Its memory is host memory, work runs when issued, its kernels are five
//! recognised test kernels, and its idea of what is legal is ours. Only
//! the device tests measure CUDA: `cargo xtask bundle --backend cuda`
//! builds them for an NVIDIA machine without a Rust toolchain.
//!
//! **On the real compilers, without a GPU.** `tests/toolchain.rs` compiles
//! every CUDA kernel the project emits through [`nvrtc_ptx`], on NVRTC
//! 12.2 for `compute_80` and `compute_90`. It assembles each PTX with the
//! same release's `ptxas`, the checks the JIT makes at load. It reports the
//! PTX ISA written (8.2). `ci/install-cuda-toolchain.sh` installs both;
//! without them the test is skipped. It proves the kernels compile, not
//! that they compute the right thing.

mod capture;
mod collective;
mod copy;
mod device;
mod error;
mod launch;
mod memory;
mod ptx;
mod reopen;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use scope_core::backend::Launch;
use scope_core::{Backend, Client, Kernel, Language, LaunchLimits, Result, StreamId};
use scope_native::ParamTable;

pub use capture::CudaGraph;
pub use collective::{load_nccl, nccl_can_shrink};
pub use device::{CudaStreamState, CudaWaiter, cuda_driver_version, probe, total_memory};
pub use launch::{CudaKernel, nvrtc_options, nvrtc_ptx, nvrtc_version};
pub use memory::CudaMemory;
pub use ptx::{BUNDLED_NVRTC, CudaVersion, PtxIsa, UnsupportedPtx, driver_jits};

use device::{DeviceInfo, StreamShared};
use memory::Pool;

/// The CUDA backend: one device's context, streams, pool and compiler.
pub struct Cuda {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    driver: (i32, i32),
    /// What one launch may ask for: read from the device once, reported by
    /// [`Backend::launch_limits`] and enforced by
    /// [`Backend::check_launch`] from this one copy, so the two agree.
    limits: LaunchLimits,
    /// `compute_XY` for NVRTC; `None` when NVRTC is not here (PTX only).
    nvrtc_arch: Option<String>,
    pool: Pool,
    /// Every logical stream, by index (the core's `StreamId`).
    streams: Vec<Arc<StreamShared>>,
    /// Whether each stream is inside a capture.
    capturing: Vec<bool>,
    /// Frees whose last user was capturing: `(stream, memory)`. Only
    /// [`Backend::free`] puts memory here, so each is given back once and
    /// named by no later call.
    deferred: Vec<(u32, CudaMemory)>,
    /// Launch parameters: exact for kernels whose signature the driver
    /// reports, padded with zeros for the others.
    params: ParamTable,
    /// This server's hold on the device, which a reset must not pull out
    /// from under another server's.
    holding: scope_native::Holding,
}

impl Cuda {
    /// Open device `ordinal`.
    ///
    /// # Errors
    ///
    /// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
    /// when there is no driver or no such device; the driver's error when
    /// starting fails.
    pub fn open(ordinal: usize) -> Result<Self> {
        // Held before the context is retained: a reset by another server
        // either refuses (it sees this hold) or ends before this one makes
        // anything (`scope_native::reopen`).
        let holding = scope_native::Holding::new(error::BACKEND, ordinal);
        let ctx = device::open_context(ordinal)?;
        let info = device::device_info(ordinal)?;
        let driver = device::driver_version()?;
        let rules = launch::api_rules(info.capability);
        let limits =
            scope_native::launch_limits(&device::launch_geometry(&ctx), info.total_memory, &rules);
        let nvrtc_arch = if device::nvrtc_present() {
            match launch::nvrtc_arch(info.capability) {
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

    /// The architecture NVRTC compiles for (`compute_90`), when NVRTC is
    /// here.
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
            // SAFETY: `deferred` holds only memory `Backend::free` was given,
            // whose contract is that nothing names it again; taken out of
            // the list, it is released here once.
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

    const NAME: &'static str = "cuda";
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
        // SAFETY: the contract of `Backend::free`: `memory` is this
        // backend's, given back once, and named by no later call.
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
/// [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable) when
/// there is no CUDA driver or device here (never a panic); the driver's error
/// when a present device fails to start.
pub fn client() -> Result<Client<Cuda>> {
    client_on(0)
}

/// A client of a new server on device `ordinal`.
///
/// # Errors
///
/// As [`client`].
pub fn client_on(ordinal: usize) -> Result<Client<Cuda>> {
    Client::new(Cuda::open(ordinal)?)
}
