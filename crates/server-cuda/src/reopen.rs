//! CUDA's calls for opening a lost device again ([`scope_native::reopen`]).
//!
//! The core refused the process-fatal faults (rule 52); any other loss may be reset. Giving up
//! destroys this backend's objects on their own context. The probe is a new stream, synchronised:
//! `cuCtxSynchronize` would wait for every client of the shared primary context. A broken context
//! is reset with `cuDevicePrimaryCtxReset`, **for the whole process**, and retained again.

use cudarc::driver::result;
use cudarc::driver::sys;
use scope_core::{Error, Result};

use crate::Cuda;
use crate::device::CudaStreamState;
use crate::driver::open_context;
use crate::error::{BACKEND, Doing, RESTART, driver as driver_error};
use crate::launch;
use crate::pool::Pool;

impl scope_native::Reopen for Cuda {
    type Stream = CudaStreamState;
    const API: &'static str = BACKEND;
    const RESET: &'static str = "a reset of its primary context";
    const RESTART: &'static str = RESTART;

    fn holding(&self) -> &scope_native::Holding {
        &self.holding
    }

    /// Deferred frees, the pool and every stream's objects go, on the lost context.
    fn give_up(&mut self, streams: &mut [&mut CudaStreamState]) -> Result<()> {
        let _ = self.bind();
        for (index, memory) in std::mem::take(&mut self.deferred) {
            // SAFETY: `deferred` holds freed memory nothing names again; released once.
            unsafe { self.release(Some(index), memory) };
        }
        self.pool.destroy();
        self.streams.clear();
        self.capturing.clear();
        for stream in streams.iter_mut() {
            stream.detach()?;
        }
        Ok(())
    }

    fn probe(&mut self) -> Result<()> {
        self.bind()?;
        let probe = |what| move |e| driver_error(e, Doing::Wait { stream: None, what });
        let stream = self
            .ctx
            .new_stream()
            .map_err(probe("a new stream, after the loss"))?;
        stream
            .synchronize()
            .map_err(probe("a new stream, after the loss"))
    }

    fn reset(&mut self) -> Result<()> {
        let ordinal = self.info.ordinal;
        let device =
            i32::try_from(ordinal).map_err(|_| Error::invalid("device ordinal", "too large"))?;
        let start = |what| move |e| driver_error(e, Doing::Start { what });
        let device = result::device::get(device).map_err(start("cuDeviceGet"))?;
        // SAFETY: a valid device; `scope_native::reopen` runs this alone, after `give_up` destroyed
        // every object on the context. The old handle outlives the new retain, as CUDA allows.
        unsafe { sys::cuDevicePrimaryCtxReset_v2(device) }
            .result()
            .map_err(start("cuDevicePrimaryCtxReset"))?;
        self.ctx = open_context(ordinal)?;
        Ok(())
    }

    fn renew(&mut self) -> Result<()> {
        self.pool = Pool::new(&self.ctx, self.info.ordinal)?;
        self.params = scope_native::ParamTable::new(&launch::api_rules(self.info.capability));
        Ok(())
    }

    fn attach(&mut self, stream: &mut CudaStreamState) -> Result<()> {
        let handles = self.stream_handles()?;
        self.streams.push(stream.attach(handles)?);
        self.capturing.push(false);
        Ok(())
    }
}
