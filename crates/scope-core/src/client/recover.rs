//! [`Client::recover`]: a lost device opened again, every handle kept
//! (`server/recover.rs` says how, rules 51–53 what it promises).

use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::server::Recovered;

use super::{Client, reentrant};

/// How long a recovery waits for waits in flight on other threads, which
/// name the lost device's objects, to end. A wait on a lost device fails
/// fast; one on a device poisoned by an injected fault runs its course.
pub const RECOVER_PATIENCE: Duration = Duration::from_secs(10);

impl<B: Backend> Client<B> {
    /// Open this client's device again after a sticky fault poisoned it
    /// (rule 36), keeping the client and every handle: every buffer is
    /// made again on the new device and carries
    /// [`Error::LostWithDevice`] until rewritten (rules 51, 52); graphs
    /// recorded on the lost device refuse to replay and open captures are
    /// aborted (rule 53); kernels compile again on first use; the limits
    /// are asked again and [`limits`](Self::limits) reports the new ones.
    ///
    /// On a device that is not lost it changes nothing and answers
    /// [`Recovered::Healthy`]: of two threads that saw the poison and both
    /// recover, one reopens and the other learns it was done.
    ///
    /// # Errors
    ///
    /// [`Error::RestartRequired`] where the driver says the process cannot
    /// go on after the fault, and from a backend that cannot open a device
    /// again (the client stays poisoned, its releases still release; a
    /// group carries the work, rules 54–56); the error opening it again met (the client stays
    /// poisoned, and may try again); [`Error::Refused`] when a wait on
    /// another thread did not end within [`RECOVER_PATIENCE`]; the
    /// re-entrant call's error inside a `with_backend` closure.
    pub fn recover(&self) -> Result<Recovered> {
        let until = Instant::now() + RECOVER_PATIENCE;
        loop {
            let Some(mut server) = self.lock() else {
                return Err(reentrant());
            };
            let recovered = server.recover();
            if let Ok(Some(Recovered::Reopened { .. })) = &recovered {
                *self.shared.limits.write() = server.limits();
            }
            drop(server);
            self.shared.hooks.deliver();
            match recovered? {
                Some(recovered) => return Ok(recovered),
                None if Instant::now() >= until => {
                    return Err(Error::refused(format!(
                        "a wait on another thread did not end within {RECOVER_PATIENCE:?}, and \
                         it names the lost device: recover once it returns"
                    )));
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
}
