//! The oracle's side of the world. Per word of every live buffer, whether it is stale and, where
//! known, its value. What each operation does to them, and which uses a capture on another stream
//! refuses. Kept apart from the steps, so that what the server is expected to do is read in one
//! place. It is not spread between the calls that exercise it.

use super::*;

impl<S: Suite> World<S> {
    pub(super) fn index_of(&self, id: BufferId) -> Option<usize> {
        self.bufs.iter().position(|b| b.handle.id() == id)
    }

    /// Set `ranges` (of allocated, live buffers) to `word`.
    pub(super) fn mark(&mut self, ranges: &[Range], word: Word) {
        for r in ranges {
            if let Some(i) = self.index_of(r.0)
                && self.bufs[i].allocated
            {
                self.bufs[i].words[words(r)].fill(word);
            }
        }
    }

    pub(super) fn any_stale(&self, ranges: &[Range]) -> bool {
        ranges.iter().any(|r| {
            self.index_of(r.0)
                .is_some_and(|i| self.bufs[i].words[words(r)].iter().any(|w| w.stale))
        })
    }

    pub(super) fn values(&self, r: &Range) -> Vec<Option<u32>> {
        match self.index_of(r.0) {
            Some(i) => self.bufs[i].words[words(r)]
                .iter()
                .map(|w| w.value)
                .collect(),
            None => vec![None; (len(r) / 4) as usize],
        }
    }

    pub(super) fn set_values(&mut self, r: &Range, values: &[Option<u32>]) {
        if let Some(i) = self.index_of(r.0) {
            for (w, v) in self.bufs[i].words[words(r)].iter_mut().zip(values) {
                w.value = *v;
            }
        }
    }

    /// What `op` does to the values it writes, on the values there now.
    /// Staleness is the caller's business.
    pub(super) fn apply(&mut self, op: &Op) {
        match op {
            Op::Write(dst, data) => {
                let v: Vec<_> = data.iter().map(|&d| Some(d)).collect();
                self.set_values(dst, &v);
            }
            Op::Copy(src, dst) => {
                let v = self.values(src);
                self.set_values(dst, &v);
            }
            Op::Fill(dst, value) => {
                self.set_values(dst, &vec![Some(*value); (len(dst) / 4) as usize]);
            }
            Op::Add(a, b, dst) => {
                let (a, b) = (self.values(a), self.values(b));
                let v: Vec<_> = a
                    .iter()
                    .zip(&b)
                    .map(|(a, b)| Some(a.as_ref()?.wrapping_add(*b.as_ref()?)))
                    .collect();
                self.set_values(dst, &v);
            }
        }
    }

    /// Whether a use of `ids` on this step's stream is refused, as
    /// `Server::refuse_recorded_elsewhere` decides. That is a buffer whose last user is another
    /// stream that is recording. Either that window's recorded work used it, or this stream records
    /// too.
    pub(super) fn refused(&self, ids: &[BufferId]) -> bool {
        let to = self.stream();
        ids.iter().any(|&id| {
            let Some(i) = self.index_of(id) else {
                return false;
            };
            let from = self.bufs[i].last_user;
            if from == to || !self.stream_records(from) {
                return false;
            }
            let touched = self
                .window
                .as_ref()
                .is_some_and(|(_, w)| w.touched.contains(&id));
            touched || self.stream_records(to)
        })
    }

    /// Work on this step's stream reached `Server::order` with `ids`. They are its now, and its
    /// window's if it records.
    pub(super) fn ordered(&mut self, ids: &[BufferId]) {
        let to = self.stream();
        if self.records()
            && let Some((_, window)) = &mut self.window
        {
            for id in ids {
                if !window.touched.contains(id) {
                    window.touched.push(*id);
                }
            }
        }
        for &id in ids {
            if let Some(i) = self.index_of(id) {
                self.bufs[i].last_user = to;
            }
        }
    }

    /// A failure on this step's stream dooms its window, if it records.
    pub(super) fn doom(&mut self) {
        if self.records()
            && let Some((_, window)) = &mut self.window
        {
            window.doomed = true;
        }
    }

    /// Clean work on this step's stream: recorded if it records, applied to the values now if not.
    pub(super) fn done(&mut self, reads: &[Range], writes: &[Range], op: Op) {
        if self.records()
            && let Some((_, window)) = &mut self.window
        {
            window.record(reads, writes, op);
        } else {
            self.apply(&op);
        }
    }
}
