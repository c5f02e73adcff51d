//! [`Client::recover`]: a lost device opened again, every handle kept
//! (`server/recover.rs` says how, rules 51–53 what it promises).

use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::server::Recovered;

use super::{Client, reentrant};

/// How long a recovery waits for waits on other threads to end.
pub const RECOVER_PATIENCE: Duration = Duration::from_secs(10);

impl<B: Backend> Client<B> {
    /// Open the device again after a sticky fault (rule 36), keeping every
    /// handle. Buffers carry [`Error::LostWithDevice`] until rewritten (rules
    /// 51, 52); old graphs refuse to replay (rule 53).
    ///
    /// # Errors
    ///
    /// - [`Error::RestartRequired`]: a process-fatal fault, or no reopen.
    /// - The error the reopen met; the client may try again.
    /// - [`Error::Refused`]: a wait on another thread outlasted [`RECOVER_PATIENCE`].
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
            let waits = server.waits();
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
                None => waits.wait_out(until),
            }
        }
    }
}
