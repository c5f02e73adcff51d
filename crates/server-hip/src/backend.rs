//! The contract: [`Backend`] for [`Hip`], one line per call, routed to the file owning its
//! subject, so it reads as all the HIP server does on the device. The failure model (scopes,
//! taint, windows, poison, fault injection) is the core's `Server<Hip>`.

use scope_core::backend::Launch;
use scope_core::{Backend, Kernel, Kind, Language, LaunchLimits, Result, StreamId};

use crate::capture::HipGraph;
use crate::device::{Hip, HipStream, HipWaiter};
use crate::launch::HipKernel;
use crate::memory::HipMemory;

impl Backend for Hip {
    type Memory = HipMemory;
    type Stream = HipStream;
    type Kernel = HipKernel;
    type Graph = HipGraph;
    type Waiter = HipWaiter;

    const KIND: Kind = Kind::Server(crate::error::KIND);
    const RESTART: &'static str = crate::error::RESTART;

    fn describe(&self) -> String {
        Hip::describe(self)
    }

    fn accepts(&self, language: Language) -> bool {
        language == Language::Hip
    }

    fn max_allocation(&self) -> u64 {
        self.info.total_memory
    }

    fn launch_limits(&self) -> LaunchLimits {
        self.limits
    }

    unsafe fn create_stream(&mut self, id: StreamId) -> Result<HipStream> {
        Hip::create_stream(self, id)
    }

    unsafe fn allocate(&mut self, _stream: &mut HipStream, size: u64) -> Result<HipMemory> {
        Hip::allocate(self, size)
    }

    unsafe fn free(&mut self, memory: HipMemory) {
        Hip::free(self, memory);
    }

    unsafe fn reopen(
        &mut self,
        fault: &scope_core::Error,
        streams: &mut [&mut HipStream],
    ) -> Result<()> {
        scope_native::reopen(self, fault, streams)
    }

    fn trim(&mut self) {
        self.pool.trim();
    }

    fn bytes_reserved(&self) -> u64 {
        self.pool.reserved()
    }

    unsafe fn write(
        &mut self,
        stream: &mut HipStream,
        dst: &HipMemory,
        offset: u64,
        data: &[u8],
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::write` is `Hip::write`'s.
        unsafe { Hip::write(self, stream, dst, offset, data) }
    }

    unsafe fn read(
        &mut self,
        stream: &mut HipStream,
        src: &HipMemory,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::read` is `Hip::read`'s.
        unsafe { Hip::read(self, stream, src, offset, out) }
    }

    unsafe fn copy(
        &mut self,
        stream: &mut HipStream,
        src: &HipMemory,
        src_offset: u64,
        dst: &HipMemory,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::copy` is `Hip::copy`'s.
        unsafe { Hip::copy(self, stream, src, src_offset, dst, dst_offset, len) }
    }

    fn compile(&mut self, kernel: &Kernel) -> Result<HipKernel> {
        Hip::compile(self, kernel)
    }

    fn check_launch(&self, kernel: &HipKernel, launch: &Launch<'_, HipMemory>) -> Result<()> {
        crate::launch::check_launch(&self.limits, kernel, launch)
    }

    unsafe fn launch(
        &mut self,
        stream: &mut HipStream,
        kernel: &HipKernel,
        launch: &Launch<'_, HipMemory>,
    ) -> Result<()> {
        // SAFETY: the contract of `Backend::launch` is `Hip::launch`'s.
        unsafe { Hip::launch(self, stream, kernel, launch) }
    }

    unsafe fn begin_wait(&mut self, stream: &mut HipStream) -> Result<Option<HipWaiter>> {
        Hip::begin_wait(self, stream)
    }

    unsafe fn wait(waiter: &HipWaiter) -> Result<()> {
        Hip::wait(waiter)
    }

    unsafe fn end_wait(&mut self, stream: &mut HipStream, waiter: HipWaiter) -> Result<()> {
        Hip::end_wait(self, stream, waiter)
    }

    unsafe fn order(&mut self, first: &mut HipStream, then: &mut HipStream) -> Result<()> {
        Hip::order(self, first, then)
    }

    unsafe fn begin_capture(&mut self, stream: &mut HipStream) -> Result<()> {
        Hip::begin_capture(self, stream)
    }

    unsafe fn end_capture(&mut self, stream: &mut HipStream) -> Result<HipGraph> {
        Hip::end_capture(self, stream)
    }

    unsafe fn abort_capture(&mut self, stream: &mut HipStream) {
        Hip::abort_capture(self, stream);
    }

    unsafe fn replay(&mut self, stream: &mut HipStream, graph: &HipGraph) -> Result<()> {
        // SAFETY: the contract of `Backend::replay` is `Hip::replay`'s.
        unsafe { Hip::replay(self, stream, graph) }
    }

    unsafe fn destroy_graph(&mut self, graph: HipGraph) -> Result<()> {
        Hip::destroy_graph(self, graph)
    }
}
