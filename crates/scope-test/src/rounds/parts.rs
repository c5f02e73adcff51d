//! One rank's buffers: each a part between two margins that no round may touch.
//!
//! A part starts a few words into its buffer, so a transport that drops an offset or writes past a
//! part is caught by the margins, which every read checks as uploaded.

use super::draw::{MARGIN, SLOTS};
use super::oracle::Oracle;
use crate::property::Rng;
use crate::{as_words, upload, words_of};
use scope_core::backend::Backend;
use scope_core::{Buffer, Client, Slice};

/// One rank's buffers, each a part between two margins.
pub(super) struct Parts {
    pub(super) buffers: Vec<Buffer>,
    /// Each buffer's margins, as uploaded.
    pub(super) margins: Vec<(Vec<u32>, Vec<u32>)>,
}

impl Parts {
    /// `oracle`'s parts of rank `rank`, between margins drawn from `rng`.
    pub(super) fn upload<B: Backend>(
        c: &Client<B>,
        oracle: &Oracle,
        rank: usize,
        rng: &mut Rng,
    ) -> Self {
        let (buffers, margins) = (0..=SLOTS)
            .map(|slot| {
                let (before, after) = (rng.words(MARGIN), rng.words(MARGIN));
                let words: Vec<u32> = [&before[..], oracle.words(rank, slot), &after[..]].concat();
                (upload(c, &words), (before, after))
            })
            .unzip();
        Self { buffers, margins }
    }

    /// The first `words` words of `slot`'s part.
    pub(super) fn words(&self, slot: usize, words: u32) -> Slice<'_> {
        let start = u64::from(MARGIN) * 4;
        self.buffers[slot].slice(start..start + u64::from(words) * 4)
    }

    /// `slot`'s part.
    pub(super) fn view(&self, slot: usize) -> Slice<'_> {
        let words = words_of(&self.buffers[slot]) - 2 * MARGIN;
        self.words(slot, words)
    }

    /// Whether every margin reads back clean, as uploaded.
    pub(super) fn check_margins<B: Backend>(&self, at: &str, c: &Client<B>) {
        for (slot, (buffer, (before, after))) in self.buffers.iter().zip(&self.margins).enumerate()
        {
            let end = buffer.size();
            let margin = u64::from(MARGIN) * 4;
            for (range, expected) in [(0..margin, before), (end - margin..end, after)] {
                let read = c.read(buffer.slice(range.clone())).map(|b| as_words(&b));
                assert!(
                    read.as_ref().is_ok_and(|words| words == expected),
                    "{at}: buffer {slot}'s margin {range:?} was touched: {read:?}"
                );
            }
        }
    }
}
