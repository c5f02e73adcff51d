//! Collectives in captured graphs: recorded by every rank, replayed by
//! every rank together (rule 50).
//!
//! A graph holding a collective is a promise to peers: replayed alone, or
//! over a failed input, it hangs them or sends them garbage. So:
//!
//! 1. **Recording is a round**, met and decided, then recorded on every
//!    rank. Host staging cannot be recorded and is refused.
//! 2. **Replaying is a round.** [`Rank::replay`] meets on the graph's
//!    rounds and inputs; a mismatch or a failed input skips every replay.
//! 3. **After is as after a call** (rules 47, 49).
//!
//! NCCL asks the same of capture; here the ranks check it before launch.

use super::Rank;
use super::device::readiness;
use super::round::{Input, Kind, Outcome, Part, Written};
use crate::backend::Backend;
use crate::capture::{CaptureState, RecordedRound};
use crate::error::{Error, Result};
use crate::handle::Graph;

impl<B: Backend> Rank<B> {
    /// Replay `graph` together with every other rank's graph of the same
    /// rounds (rule 50), only if every rank's inputs are clean.
    ///
    /// # Errors
    ///
    /// [`Error::Collective`]: a failed input on some rank, claimed on every
    /// graph's outputs. A rank late or failing to start, which breaks the
    /// group. A refusal claiming nothing: different rounds, another group,
    /// a recording stream. A broken group.
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
            None => readiness(client.sync(), || client.check_graph(graph)),
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
                let issued = client.replay_in_group(graph, group);
                self.settle(kind, len, issued, written)
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
