//! A rank that joins alone (`Rank::join`) borrows two streams of its
//! server, one for its rounds and one for its ballots: joining over and
//! over must give them back, or a runtime that re-forms its group every
//! few minutes runs out of streams.

use std::time::{Duration, Instant};

use scope_core::collective::device::DeviceCollectives;
use scope_core::collective::{Element, Rank, Reduce, background_drops_done};
use scope_test::host::{self, Host};

/// A rank that joins alone and goes, more times than a server has
/// streams, spends none: its two streams are lent and given back, a failed
/// join's too, so no more than three joins' worth are ever made.
#[test]
fn joining_again_and_again_spends_no_stream() {
    let client = host::client().unwrap();
    for attempt in 0..scope_core::MAX_STREAMS + 8 {
        // The last rank's group may drop on another thread, where the
        // watchdog's poll held it last: its streams come back once that
        // thread ran. Seconds cover any delay a busy machine puts on a
        // thread; a leak never comes back.
        assert!(
            background_drops_done(Instant::now() + Duration::from_secs(10)),
            "join {attempt}: a group's drop did not end"
        );
        let identity = Host::identity().unwrap();
        let rank = Rank::join(client.clone(), &identity, 0, 1, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("join {attempt}: {e}"));
        let input = client.upload(&[1, 0, 0, 0]).unwrap();
        let output = client.allocate(4).unwrap();
        rank.all_reduce(input.all(), output.all(), Element::U32, Reduce::Sum)
            .unwrap_or_else(|e| panic!("all-reduce {attempt}: {e}"));
        if attempt % 64 == 0 {
            // A join short of its peer fails, and gives its stream back.
            let short = Host::identity().unwrap();
            let failed = Rank::join(client.clone(), &short, 0, 2, Duration::from_millis(1));
            assert!(failed.is_err());
        }
    }
    // At most three joins held streams at once on `client`, two each: a
    // rank and a short one beside it, which this thread holds, and the
    // rank before them, whose drop may still be under way on another
    // thread. So a new stream is at most the seventh made after the
    // client's own, not the thousandth.
    let identity = Host::identity().unwrap();
    let other = host::client().unwrap();
    let pair = std::thread::scope(|scope| {
        let a = scope
            .spawn(|| Rank::join(client.clone(), &identity, 0, 2, Duration::from_secs(5)).unwrap());
        let b = Rank::join(other.clone(), &identity, 1, 2, Duration::from_secs(5)).unwrap();
        (a.join().unwrap(), b)
    });
    drop(pair);
    let fresh = client.new_stream().unwrap();
    assert!(
        fresh.stream().0 <= 7,
        "streams made on this server: {}",
        fresh.stream().0
    );
}
