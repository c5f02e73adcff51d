//! Collectives in captured graphs: recorded by every rank, replayed by
//! every rank together.
//!
//! NCCL can be captured into a CUDA graph (RCCL into a HIP graph), and a
//! training step that is one graph per rank is where collectives pay off
//! most. But a graph holding a collective is a promise to peers: its
//! replay waits on the device for every other rank's replay of the same
//! calls. Replayed alone, or with an input that carries a failure, it
//! either hangs its peers or sends them bytes that are not what they seem.
//! So the rules of one collective carry over to the graph (rule 50):
//!
//! 1. **Recording is a round.** A collective called while the rank's
//!    stream records is met and decided like any other — every rank must
//!    record it (a rank that runs it while a peer records is refused on
//!    both), an input that already carries a failure dooms every rank's
//!    window, a mismatched call is refused everywhere — and then recorded
//!    on every rank, not run. Its window remembers the round, so the graph
//!    knows which of its group's rounds it holds. Host staging cannot be
//!    recorded (its bytes move through the host when the call runs) and is
//!    refused, claiming nothing.
//! 2. **Replaying is a round.** A graph that recorded rounds is replayed
//!    with [`Rank::replay`], on every rank at once. Each rank checks its
//!    graph's inputs (what it reads and did not write first) and the ranks
//!    meet, carrying which rounds their graph holds: graphs that hold
//!    different rounds are refused on every rank; an input that carries a
//!    failure on any rank makes every rank's replay skip, and everything
//!    each graph writes carries the failure, naming that rank. Only when
//!    every rank is clean does any rank replay. [`Client::replay`] refuses
//!    such a graph, claiming nothing.
//! 3. **What happens after is what happens after a call.** A replay that
//!    fails to start on one rank leaves its peers' collectives waiting on
//!    the device: the communicators are aborted and the group breaks, as
//!    for a failed call (rule 47); across processes a replay is waited for
//!    within the deadline (rule 49).
//!
//!
//! NCCL states the same contract from its side: whether a call is captured
//! is a collective property that must be uniform over its ranks, and the
//! launch of a graph holding a captured call is collective over the ranks
//! of the capture, each launching the graph derived from it. Here the
//! ranks check that before any launch, rather than hang when it is broken.
//! NCCL also warns that several GPUs of one process launching such graphs
//! from one thread may deadlock; a group's ranks replay from a thread each
//! ([`Group::run`](super::Group::run)).
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
