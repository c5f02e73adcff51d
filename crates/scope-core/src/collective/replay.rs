//! Collectives in captured graphs: recorded by every rank, replayed by
//! every rank together (rule 50).
//!
//! A graph holding a collective is a promise to peers: its replay waits on
//! the device for theirs. Replayed alone, or over a failed input, it hangs
//! them or sends them garbage. So:
//!
//! 1. **Recording is a round.** A collective called while the stream
//!    records is met and decided like any other, then recorded on every
//!    rank. Every rank must record it. Host staging cannot be recorded and
//!    is refused, claiming nothing.
//! 2. **Replaying is a round.** [`Rank::replay`] meets with which rounds
//!    the graph holds and whether its inputs are clean. Different rounds
//!    are refused everywhere; a failed input on any rank skips every
//!    replay, and each graph's outputs carry it. [`Client::replay`] refuses
//!    such a graph.
//! 3. **After is as after a call.** A replay that fails to start aborts
//!    the communicators and breaks the group (rule 47); across processes
//!    it is waited for within the deadline (rule 49).
//!
//! NCCL states the contract from its side: capture is uniform over the
//! ranks, and a captured graph is launched by all of them. Here the ranks
//! check it before any launch. Each rank replays from its own thread, as
//! NCCL advises ([`Group::run`](super::Group::run)).
//!
//! [`Client::replay`]: crate::Client::replay

use super::Rank;
use super::device::readiness;
use super::round::{Input, Kind, Outcome, Part, Written};
use crate::backend::Backend;
use crate::capture::{CaptureState, RecordedRound};
use crate::error::{Error, Result};
use crate::handle::Graph;

impl<B: Backend> Rank<B> {
    /// Replay `graph` — captured on this rank's client, recording this
    /// group's collectives — together with every other rank, each replaying
    /// its own graph of the same rounds (rule 50). Every rank checks its
    /// graph's inputs first, and no rank replays unless all are clean.
    ///
    /// # Errors
    ///
    /// [`Error::Collective`]: an input that carries a failure on some rank
    /// (everything every rank's graph writes then carries it, naming that
    /// rank; nothing was replayed), a rank that did not replay in time, a
    /// replay that failed to start on some rank (the group breaks), a
    /// refusal claiming nothing — graphs of different rounds, a graph of
    /// another group or server, a recording stream — and a broken group.
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

/// The rounds a graph recorded, summed up so that ranks can compare them
/// in a fixed-size ballot: FNV-1a over their numbers, in order.
fn digest(rounds: &[RecordedRound]) -> u64 {
    rounds.iter().fold(0xcbf2_9ce4_8422_2325, |hash, r| {
        r.round.to_le_bytes().iter().fold(hash, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
    })
}
