//! A backend that does nothing, at once: wgpu-hal's `noop` for scope. What
//! runs over it is the core alone, for the launch-path bench, and for a test
//! backend scripting one behaviour ([`Script`]) instead of two dozen calls.

use std::sync::Arc;

use crate::backend::{Backend, Launch};
use crate::error::{Error, Result};
use crate::id::StreamId;
use crate::kernel::{Kernel, Language};
use crate::limits::LaunchLimits;
use crate::probe::Kind;

/// What a test backend adds: each method is asked at the call of its name.
pub trait Script: Send + 'static {
    /// The waiter the stream's next wait blocks on; none by default.
    fn begin_wait(&mut self, stream: StreamId) -> Option<NullWaiter> {
        let _ = stream;
        None
    }

    /// What the stream's wait reports once it returned, `Ok` by default.
    ///
    /// # Errors
    ///
    /// Whatever the script makes the device report.
    fn end_wait(&mut self, stream: StreamId) -> Result<()> {
        let _ = stream;
        Ok(())
    }

    /// What a launch of `kernel` on `stream` reports, `Ok` by default.
    ///
    /// # Errors
    ///
    /// Whatever the script makes the device report.
    fn launch(&mut self, stream: StreamId, kernel: &str) -> Result<()> {
        let _ = (stream, kernel);
        Ok(())
    }

    /// What opening the device again after `fault` reports, `Ok` by default.
    ///
    /// # Errors
    ///
    /// Whatever the script makes the reopen report.
    fn reopen(&mut self, fault: &Error) -> Result<()> {
        let _ = fault;
        Ok(())
    }
}

/// No script: every call succeeds at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Script for Quiet {}

/// A wait a [`Script`] hands out, run without the server's lock.
#[derive(Clone)]
pub struct NullWaiter(Arc<dyn Fn() -> Result<()> + Send + Sync>);

impl NullWaiter {
    /// A waiter that runs `wait` when the core waits.
    pub fn new(wait: impl Fn() -> Result<()> + Send + Sync + 'static) -> Self {
        Self(Arc::new(wait))
    }
}

impl std::fmt::Debug for NullWaiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NullWaiter")
    }
}

/// A null allocation: its size, and no bytes.
#[derive(Debug)]
pub struct NullMemory {
    size: u64,
}

/// A null stream: its id, and whether it is recording.
#[derive(Debug)]
pub struct NullStream {
    id: StreamId,
    recording: bool,
}

/// A null kernel, which runs nothing.
#[derive(Debug)]
pub struct NullKernel;

/// A null graph, which replays nothing.
#[derive(Debug)]
pub struct NullGraph;

/// The backend that does nothing; see the [module docs](self).
#[derive(Debug, Default)]
pub struct Null<S: Script = Quiet> {
    script: S,
    reserved: u64,
    alignment: Option<u64>,
}

impl Null {
    /// A null backend with no script.
    pub fn new() -> Self {
        Self::default()
    }
}

impl<S: Script> Null<S> {
    /// A null backend that asks `script` at its device calls.
    pub fn scripted(script: S) -> Self {
        Self {
            script,
            reserved: 0,
            alignment: None,
        }
    }

    /// A null backend reporting `alignment`, to test the offset check.
    pub fn with_binding_alignment(mut self, alignment: u64) -> Self {
        self.alignment = Some(alignment);
        self
    }

    /// The script.
    pub fn script(&self) -> &S {
        &self.script
    }
}

/// The largest null allocation: anything the core can index.
const MAX_ALLOCATION: u64 = 1 << 48;

impl<S: Script> Backend for Null<S> {
    type Memory = NullMemory;
    type Stream = NullStream;
    type Kernel = NullKernel;
    type Graph = NullGraph;
    type Waiter = NullWaiter;

    const KIND: Kind = Kind::Null;

    fn describe(&self) -> String {
        "no device (null backend: every call succeeds and does nothing)".to_owned()
    }

    fn accepts(&self, _language: Language) -> bool {
        true
    }

    fn max_allocation(&self) -> u64 {
        MAX_ALLOCATION
    }

    fn binding_alignment(&self) -> u64 {
        self.alignment.unwrap_or(4)
    }

    fn launch_limits(&self) -> LaunchLimits {
        LaunchLimits {
            max_bindings: u32::MAX,
            max_binding_size: MAX_ALLOCATION,
            max_scalar_bytes: u32::MAX,
            max_workgroups: [u32::MAX; 3],
            ..LaunchLimits::default()
        }
    }

    unsafe fn create_stream(&mut self, id: StreamId) -> Result<NullStream> {
        Ok(NullStream {
            id,
            recording: false,
        })
    }

    unsafe fn allocate(&mut self, _stream: &mut NullStream, size: u64) -> Result<NullMemory> {
        self.reserved += size;
        Ok(NullMemory { size })
    }

    unsafe fn free(&mut self, memory: NullMemory) {
        self.reserved -= memory.size;
    }

    fn bytes_reserved(&self) -> u64 {
        self.reserved
    }

    unsafe fn write(
        &mut self,
        _stream: &mut NullStream,
        _dst: &NullMemory,
        _offset: u64,
        _data: &[u8],
    ) -> Result<()> {
        Ok(())
    }

    unsafe fn read(
        &mut self,
        _stream: &mut NullStream,
        _src: &NullMemory,
        _offset: u64,
        _out: &mut [u8],
    ) -> Result<()> {
        Ok(())
    }

    unsafe fn copy(
        &mut self,
        _stream: &mut NullStream,
        _src: &NullMemory,
        _src_offset: u64,
        _dst: &NullMemory,
        _dst_offset: u64,
        _len: u64,
    ) -> Result<()> {
        Ok(())
    }

    fn compile(&mut self, _kernel: &Kernel) -> Result<NullKernel> {
        Ok(NullKernel)
    }

    unsafe fn launch(
        &mut self,
        stream: &mut NullStream,
        _kernel: &NullKernel,
        launch: &Launch<'_, NullMemory>,
    ) -> Result<()> {
        if stream.recording {
            return Ok(());
        }
        self.script.launch(stream.id, launch.name)
    }

    unsafe fn begin_wait(&mut self, stream: &mut NullStream) -> Result<Option<NullWaiter>> {
        Ok(self.script.begin_wait(stream.id))
    }

    unsafe fn wait(waiter: &NullWaiter) -> Result<()> {
        (waiter.0)()
    }

    unsafe fn end_wait(&mut self, stream: &mut NullStream, _waiter: NullWaiter) -> Result<()> {
        self.script.end_wait(stream.id)
    }

    unsafe fn order(&mut self, _first: &mut NullStream, _then: &mut NullStream) -> Result<()> {
        Ok(())
    }

    unsafe fn begin_capture(&mut self, stream: &mut NullStream) -> Result<()> {
        stream.recording = true;
        Ok(())
    }

    unsafe fn end_capture(&mut self, stream: &mut NullStream) -> Result<NullGraph> {
        if !std::mem::take(&mut stream.recording) {
            return Err(Error::internal(
                "the null stream was asked to end a capture it was not recording",
            ));
        }
        Ok(NullGraph)
    }

    unsafe fn abort_capture(&mut self, stream: &mut NullStream) {
        stream.recording = false;
    }

    unsafe fn replay(&mut self, _stream: &mut NullStream, _graph: &NullGraph) -> Result<()> {
        Ok(())
    }

    unsafe fn destroy_graph(&mut self, _graph: NullGraph) -> Result<()> {
        Ok(())
    }

    /// Nothing to open: every stream stops recording, nothing is held.
    unsafe fn reopen(
        &mut self,
        fault: &crate::Error,
        streams: &mut [&mut NullStream],
    ) -> Result<()> {
        self.script.reopen(fault)?;
        for stream in streams {
            stream.recording = false;
        }
        self.reserved = 0;
        Ok(())
    }
}
