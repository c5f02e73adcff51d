//! HIP's calls for opening a lost device again ([`scope_native::reopen`]).
//!
//! The core refuses CUDA's process-fatal faults (rule 52); any other loss may be reset. The
//! probe is a new stream, synchronised: `hipDeviceSynchronize` would wait for every client.
//! `hipDeviceReset` destroys every resource on the device **process-wide**. Untested on AMD
//! hardware: the mock runtime (`tests/mock/mock_hip.c`) implements all this.

use scope_core::Result;

use crate::device::{Hip, HipStream};
use crate::error::{BACKEND, Doing, HipError, RESTART};
use crate::pool::Pool;
use crate::staging::Staging;

impl scope_native::Reopen for Hip {
    type Stream = HipStream;
    const API: &'static str = BACKEND;
    const RESET: &'static str = "a reset";
    const RESTART: &'static str = RESTART;

    fn holding(&self) -> &scope_native::Holding {
        &self.holding
    }

    fn give_up(&mut self, streams: &mut [&mut HipStream]) -> Result<()> {
        let _ = self.make_current();
        self.pool = Pool::default();
        self.staging = Staging::default();
        self.streams.clear();
        for stream in streams.iter_mut() {
            Hip::detach(stream)?;
        }
        Ok(())
    }

    fn probe(&mut self) -> Result<()> {
        self.make_current()?;
        let probe = self
            .api
            .stream()
            .map_err(|e| e.into_error(Doing::Waiting(None)))?;
        probe
            .synchronize()
            .map_err(|e| e.into_error(Doing::Waiting(None)))
    }

    fn reset(&mut self) -> Result<()> {
        // SAFETY: no other server of this process holds or can open the device until this
        // returns (`scope_native::reopen` runs it alone), and this one destroyed all it made
        // on it (`give_up`, after the core gave back every memory, kernel and graph).
        unsafe { self.api.device_reset() }.map_err(|e: HipError| e.into_error(Doing::Other(None)))
    }

    fn renew(&mut self) -> Result<()> {
        self.params = scope_native::ParamTable::new(&crate::device::API_RULES);
        Ok(())
    }

    fn attach(&mut self, stream: &mut HipStream) -> Result<()> {
        Hip::attach(self, stream)
    }
}
