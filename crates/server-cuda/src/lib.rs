//! A scope server over the CUDA driver API, through `cudarc`.
//!
//! The crate is the CUDA answer to [`scope_core::Backend`] and nothing more:
//! every rule of the failure model — taint, scopes, capture windows, poison,
//! in-flight attribution, fault injection — lives in `scope-core`'s
//! `Server`, and this crate makes device calls. Its files follow the
//! contract:
//!
//! - `device.rs`: loading the driver without panicking, the
//!   primary context, one cudarc stream per logical stream, cross-stream
//!   ordering with events, waits on an event without the server's lock,
//!   [`probe`].
//! - `memory.rs`: a stream-ordered memory pool
//!   (`cuMemAllocFromPoolAsync`) that caches and reuses freed memory, and the
//!   pinned staging belt host copies go through.
//! - `copy.rs`: host writes and reads, device copies.
//! - `launch.rs`: CUDA C++ through NVRTC for the device's
//!   architecture, PTX through the JIT, and launches per the binding
//!   convention, under the launch rules CUDA shares with HIP
//!   ([`scope_native`]) with CUDA's numbers.
//! - `capture.rs`: stream capture into instantiated CUDA
//!   graphs, which keep the modules of the kernels they launch loaded,
//!   replay, destruction after the replays in flight.
//! - `collective.rs`: the collectives on the devices through NCCL
//!   ([`scope_core::collective::device::DeviceCollectives`], for
//!   `Group::over_device`), on non-blocking communicators that an abort
//!   can always reach.
//! - `reopen.rs`: a lost device opened again as CUDA allows it — refused
//!   with `RestartRequired` after the faults CUDA's documentation calls
//!   process-fatal ([`PROCESS_FATAL`]), a reset of the primary context
//!   after the others, and never a reset under another client of the same
//!   device.
//! - [`error`] (`error.rs`): `CUresult` → the core's [`Error`](scope_core::Error); which
//!   codes are sticky.
//!
//! # Without CUDA
//!
//! cudarc is built with `dynamic-loading`: nothing links against CUDA, so the
//! crate builds, and its tests run, on a machine with no toolkit and no GPU.
//! There cudarc would panic on the first driver call, so [`client`] and
//! [`probe`] ask first whether the library can be loaded (once per process)
//! and answer [`Error::BackendUnavailable`](scope_core::Error::BackendUnavailable)
//! or an empty probe.
//!
//! # Which CUDA
//!
//! cudarc needs one `cuda-*` feature; it picks the bindings and the library
//! names searched at run time. This crate uses **`cuda-13000`**:
//!
//! - The bindings are CUDA 13.0's, and so are the mock driver's values; the
//!   crate has not yet run on a GPU or a real driver. A driver is backward
//!   compatible, so any of cudarc's 12.x or 13.0 bindings would call a 13.x
//!   one correctly; the choice matters for NVRTC.
//! - NVRTC is found by soname. With `cuda-12080`, cudarc searches
//!   `libnvrtc.so`, `.so.12`, `.so.11`, … and would miss a CUDA 13 toolkit's
//!   `libnvrtc.so.13` unless the development symlink is installed. With
//!   `cuda-13000` it searches `.so.13` first and still falls back to `.so.12`,
//!   so both toolkits in use today are found.
//! - Every driver entry point this crate calls exists since CUDA 11.4 except
//!   `cuFuncGetParamInfo` (12.4), which is looked up before it is used, so
//!   the 13.0 bindings do not raise the driver requirement: a 12.x driver
//!   runs this crate (with a 12.x NVRTC whose PTX it can JIT).
//! - What decides which driver runs the kernels is NVRTC's release, not the
//!   bindings: a driver JITs PTX of its own CUDA release's ISA version and
//!   older, never newer, and NVRTC writes its release's ISA
//!   ([`CudaVersion::ptx_isa`]). NVRTC 12.2 ([`BUNDLED_NVRTC`], what the
//!   CUDA bundle carries) writes ISA 8.2, which every driver from 12.2
//!   (Linux 535) on JITs; a module the driver refuses for its PTX version
//!   is [`UnsupportedPtx`], naming the driver's version ([`cuda_driver_version`]),
//!   the PTX's, NVRTC's ([`nvrtc_version`]) and the fix.
//! - Newer features (`cuda-13010`+) change struct layouts this crate fills
//!   in (`CUmemPoolProps`) and would buy nothing it uses.
//!
//! # What is measured and what is not
//!
//! See the crate's tests and `benches/launch.rs`; the device tests go
//! through `client_or_skip` and print `skipped: no cuda device (...)` where
//! there is none, and fail with `SCOPE_REQUIRE=cuda`.
//!
//! **On a mock driver.** `tests/mock.rs` and `tests/mock_poison.rs` run
//! this crate's Rust, through cudarc, against a mock CUDA driver (four
//! devices), NVRTC and NCCL written in C (`tests/mock/`), built per test
//! process and loaded ahead of cudarc's own lookup by soname. They run on
//! every machine, with no GPU: the conformance suite, its collective
//! behaviours over NCCL on the four devices, plus NVRTC's options and log, the JIT's log for
//! bad PTX, the launch-time parameter check against `cuFuncGetParamInfo`,
//! the launch limits read from `cuDeviceGetAttribute` and enforced,
//! the pool's props and attributes, a real out-of-memory and the trim and
//! retry after it, pinned staging, capture and replay (also after the
//! kernel a graph launches was dropped), deferred frees,
//! graph destruction after replays, a capture the driver invalidates, a
//! sticky illegal address, and recovery (`tests/mock_recover.rs`: an
//! uncorrectable ECC error reset with `cuDevicePrimaryCtxReset`, the reset
//! refused while another client holds the device, an illegal address
//! refused with `RestartRequired`; the conformance suite's recovery
//! behaviours, whose injected losses reopen without a reset); PTX newer
//! than the driver refused as [`UnsupportedPtx`]; built as an older driver
//! (CUDA 12.2, no memory pools, no `cuFuncGetParamInfo`, beside NVRTC
//! 12.2), the plain-allocation and padded-scalar paths and NVRTC 13.0's PTX
//! refused by name; a 12.2 driver under NVRTC 13.0
//! (`mock_nvrtc_newer_than_driver.rs`); and
//! driver failures planted one call at a time (a launch out of resources, a
//! module load, pinned staging or graph instantiation out of memory, a
//! stream or event that cannot be created). The mock also refuses the calls real CUDA
//! refuses or mis-handles (synchronising a capturing stream, waiting across
//! a capture boundary, non-relaxed capture, allocating or freeing into a
//! graph, freed pointers, foreign frees, calls with no current context, an
//! NVRTC compile without the device's `compute_XY`, memory used on a stream
//! not yet ordered after its stream-ordered allocation, a launch or graph
//! replay of a function whose module was unloaded), and every test
//! asserts it refused nothing and destroyed no graph under a replay.
//!
//! The mock proves nothing about NVIDIA hardware or the real driver: its
//! "device" memory is host memory, work runs when it is issued (so a
//! missing cross-stream wait shows only where the mock checks order — at
//! the first use of a stream-ordered allocation — never as wrong data), its kernels are five
//! recognised test kernels, its values are CUDA 13.0's header values taken
//! from cudarc's bindings, and its idea of which calls are legal is ours,
//! not NVIDIA's. Only the device tests, on a GPU, measure CUDA: `cargo
//! xtask bundle --backend cuda` builds them on one machine to run on an
//! NVIDIA GPU machine without a Rust toolchain.
//!
//! **On the real compilers, without a GPU.** `tests/toolchain.rs` compiles
//! every CUDA kernel the project emits — this crate's test kernels,
//! tiny-runtime's, scope-cube's translations, and the CUDA C++ cubecl-cpp
//! writes for cubecl-core's runtime tests and cubek on `ScopeRuntime<Cuda>`
//! — through [`nvrtc_ptx`] (the server's own NVRTC call) on NVIDIA's NVRTC
//! 12.2 for `compute_80` and `compute_90`, and assembles each PTX with
//! the `ptxas` of the same release for `sm_80` and `sm_90`, the checks the
//! driver's JIT makes when the module loads; it reports the PTX ISA version
//! written (8.2). `ci/install-cuda-toolchain.sh` installs
//! both from PyPI; without them the test is skipped. It proves the kernels
//! compile and assemble, not that they compute the right thing.

mod capture;
mod collective;
mod copy;
mod device;
pub mod error;
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
pub use reopen::{PROCESS_FATAL, ends_the_process};

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
        // Held before the context is retained, so a reset by another server
        // of the device either refuses (it sees this one) or ends before
        // this one makes anything (`scope_native::Holding::alone`).
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
        self.reopen_device(fault, streams)
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
