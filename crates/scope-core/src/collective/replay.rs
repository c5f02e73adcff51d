//! Collectives in captured graphs (rule 50). Replayed alone, or over a
//! failed input, a graph holding a collective hangs its peers or sends
//! them garbage, so:
//!
//! 1. **Recording is a round**, met and decided; host staging is refused.
//! 2. **Replaying is a round** ([`Rank::replay`]); a mismatch or a failed
//!    input skips every replay.
//! 3. **After is as after a call** (rules 47, 49).

use super::Rank;
use super::device::readiness;
use super::round::{Input, Kind, Outcome, Part, Written};
use super::watchdog::Writes;
use crate::backend::Backend;
use crate::capture::{CaptureState, RecordedRound};
use crate::error::{Error, Result};
use crate::handle::Graph;

impl<B: Backend> Rank<B> {
    /// Replay `graph` with every rank's graph of the same rounds, if every
    /// rank's inputs are clean (rule 50).
    ///
    /// # Errors
    ///
    /// [`Error::Collective`]: a failed input, claimed on every output; a late
    /// rank, which breaks the group; a refusal claiming nothing; a broken group.
    pub fn replay(&self, graph: &Graph) -> Result<()> {
        self.usable()?;
        let client = self.client();
        let group = self.shared.id;
        let (kind, len, refused) = match client.graph_rounds(graph) {
            Err(error) => (Kind::Replay { digest: 0 }, 0, Some(format!("{error}"))),
            Ok(rounds) if rounds.iter().any(|r| r.group != group) => (
                Kind::Replay { digest: 0 },
                0,
                Some("replays a graph that recorded another group's collectives".to_owned()),
            ),
            Ok(rounds) => (
                Kind::Replay {
                    digest: digest(&rounds),
                },
                rounds.len() as u64,
                None,
            ),
        };
        let input = match refused {
            Some(why) => Input::Refused(why),
            None if client.capture_state() != CaptureState::NoCapture => {
                Input::Refused("replays on a stream that is recording a capture".to_owned())
            }
            None => readiness(self.drained(false, &[]), || client.check_graph(graph)),
        };
        let part = Part {
            kind,
            len,
            epoch: self.shared.epoch,
            recorded: false,
            input,
        };
        let written = Written::Graph(graph);
        match &*self.meet_or_claim(part, written)? {
            Outcome::Agreed => {
                let round = self.recorded_round().round;
                let writes = Writes::Graph(graph.clone());
                let issued = self.fly((round, "replay"), writes, || {
                    let Some(device) = &self.shared.device else {
                        return client.replay_in_group(graph, group).map(|()| None);
                    };
                    device.replay(self.rank, &mut || client.replay_in_group(graph, group))?;
                    device.watch_replay(self.rank, client)
                });
                self.after_issue((kind, len, round), issued, written, false)
            }
            Outcome::Refused(error) => Err(error.clone()),
            Outcome::Failed(error) => {
                self.claim(written, error.clone())?;
                Err(error.clone())
            }
            Outcome::Written(_) => Err(Error::internal(
                "a replay's meeting computed bytes: a replay moves none through the host",
            )),
        }
    }
}

/// The rounds a graph recorded, hashed (FNV-1a) for a fixed-size ballot.
fn digest(rounds: &[RecordedRound]) -> u64 {
    rounds.iter().fold(0xcbf2_9ce4_8422_2325, |hash, r| {
        r.round.to_le_bytes().iter().fold(hash, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}
