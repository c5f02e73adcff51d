//! HIP's calls for opening a lost device again ([`scope_native::reopen`]).
//!
//! The core has refused the faults HIP shares with CUDA's process-fatal
//! list (rule 52); every other loss may be reset. Giving up destroys this
//! backend's streams, events, pinned staging and pooled memory on the
//! device they were made on. The probe is a new stream, synchronised:
//! `hipDeviceSynchronize` would wait for every other client of the device.
//! A broken device is reset with `hipDeviceReset`, which destroys every
//! resource on it **for the whole process**.
//!
//! Untested on AMD hardware: the mock HIP runtime (`tests/mock/mock_hip.c`)
//! implements the reset and the sticky codes as described here.

use scope_core::Result;

use crate::device::{Hip, HipStream};
use crate::error::{BACKEND, Doing, HipError, RESTART};
use crate::memory::{Pool, Staging};

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
        self.read_buffer = None;
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
        // SAFETY: no other server of this process holds the device or can
        // open it until this returns (`scope_native::reopen` runs it
        // alone), and this one destroyed every object it made on it
        // (`give_up`; the core gave back every memory, kernel and graph
        // before asking to reopen).
        unsafe { self.api.device_reset() }.map_err(|e: HipError| e.into_error(Doing::Other(None)))
    }

    fn renew(&mut self) -> Result<()> {
        self.params = scope_native::ParamTable::new(&crate::launch::API_RULES);
        Ok(())
    }

    fn attach(&mut self, stream: &mut HipStream) -> Result<()> {
        Hip::attach(self, stream)
    }
}
