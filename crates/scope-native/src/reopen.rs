//! Opening a lost CUDA or HIP device again, written once: the two APIs differ only in
//! their calls, which each server supplies ([`Reopen`]) and [`reopen`] runs in order.
//!
//! A loss the driver never saw passes the probe: no reset. The core refuses a process-fatal
//! loss first (rule 52). A reset is process-wide, so it runs only while no other server holds
//! the device.

use scope_core::{Error, Result};

use crate::holding::{self, Holding};

/// The vendor calls of one API's reopen, in the order [`reopen`] makes them.
pub trait Reopen {
    /// A logical stream's device state.
    type Stream;
    /// The API's name in errors: `cuda`, `hip`.
    const API: &'static str;
    /// What a reset is called in a refusal: "a reset".
    const RESET: &'static str;
    /// Why a process-fatal fault needs a new process (`Backend::RESTART`).
    const RESTART: &'static str;

    /// This server's hold on its device.
    fn holding(&self) -> &Holding;
    /// Step 1: destroy what this backend made on the lost device, and detach every stream.
    fn give_up(&mut self, streams: &mut [&mut Self::Stream]) -> Result<()>;
    /// Step 2: fail unless the device still runs work, not waiting on other clients' streams.
    fn probe(&mut self) -> Result<()>;
    /// Step 3: reset the device for the whole process, and open it again.
    fn reset(&mut self) -> Result<()>;
    /// Step 4: the memory pool and parameter table, made anew.
    fn renew(&mut self) -> Result<()>;
    /// Step 5: new device state for a detached stream.
    fn attach(&mut self, stream: &mut Self::Stream) -> Result<()>;
}

/// Open `device` again after `fault`: [`Error::RestartRequired`] for a process-fatal
/// probe, [`Error::Refused`] when a reset is needed and another server holds the device.
pub fn reopen<D: Reopen>(
    device: &mut D,
    fault: &Error,
    streams: &mut [&mut D::Stream],
) -> Result<()> {
    device.give_up(streams)?;
    let key = device.holding().key();
    if let Err(broken) = device.probe() {
        broken.refuse_process_fatal(D::API, D::RESTART)?;
        holding::reset_alone(key, D::RESET, &broken, || device.reset())?;
        tracing::warn!(backend = D::API, device = key.1, "reset after {broken}");
    }
    device.renew()?;
    for stream in streams.iter_mut() {
        device.attach(stream)?;
    }
    tracing::info!(
        backend = D::API,
        device = key.1,
        "the device is open again after {fault}"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use scope_core::{DeviceFault, FaultClass};

    use super::*;

    struct Steps {
        holding: Holding,
        broken: Option<FaultClass>,
        done: Vec<&'static str>,
    }

    impl Reopen for Steps {
        type Stream = u32;
        const API: &'static str = "test-reopen";
        const RESET: &'static str = "a reset";
        const RESTART: &'static str = "said";

        fn holding(&self) -> &Holding {
            &self.holding
        }
        fn give_up(&mut self, _streams: &mut [&mut u32]) -> Result<()> {
            self.done.push("give up");
            Ok(())
        }
        fn probe(&mut self) -> Result<()> {
            self.done.push("probe");
            match self.broken {
                Some(class) => Err(fault(class)),
                None => Ok(()),
            }
        }
        fn reset(&mut self) -> Result<()> {
            self.done.push("reset");
            Ok(())
        }
        fn renew(&mut self) -> Result<()> {
            self.done.push("renew");
            Ok(())
        }
        fn attach(&mut self, stream: &mut u32) -> Result<()> {
            *stream += 1;
            self.done.push("attach");
            Ok(())
        }
    }

    fn fault(class: FaultClass) -> Error {
        Error::Fault(DeviceFault {
            backend: "test-reopen",
            code: "BROKEN".to_owned(),
            class,
            stream: None,
            detail: String::new(),
        })
    }

    fn run(ordinal: usize, broken: Option<FaultClass>) -> (Result<()>, Vec<&'static str>) {
        let mut steps = Steps {
            holding: Holding::new("test-reopen", ordinal),
            broken,
            done: Vec::new(),
        };
        let (mut a, mut b) = (0, 0);
        let done = reopen(
            &mut steps,
            &fault(FaultClass::Sticky),
            &mut [&mut a, &mut b],
        );
        (done, steps.done)
    }

    #[test]
    fn a_device_that_still_works_is_not_reset() {
        let (done, steps) = run(0, None);
        done.unwrap();
        assert_eq!(steps, ["give up", "probe", "renew", "attach", "attach"]);
    }

    #[test]
    fn a_broken_device_is_reset() {
        let (done, steps) = run(1, Some(FaultClass::Sticky));
        done.unwrap();
        assert_eq!(
            steps,
            ["give up", "probe", "reset", "renew", "attach", "attach"]
        );
    }

    #[test]
    fn a_process_fatal_probe_is_refused_without_a_reset() {
        let (done, steps) = run(2, Some(FaultClass::ProcessFatal));
        assert!(
            matches!(
                &done,
                Err(Error::RestartRequired { backend: "test-reopen", reason, .. }) if reason == "said"
            ),
            "{done:?}"
        );
        assert_eq!(steps, ["give up", "probe"]);
    }

    #[test]
    fn a_reset_under_another_holder_is_refused() {
        let _other = Holding::new("test-reopen", 3);
        let (done, steps) = run(3, Some(FaultClass::Sticky));
        assert!(
            matches!(&done, Err(Error::Refused { reason }) if reason.contains("1 other client")),
            "{done:?}"
        );
        assert_eq!(steps, ["give up", "probe"]);
    }
}
