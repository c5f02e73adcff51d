//! What is asserted after each step. Every range's `check` agrees with the oracle's staleness. Rule
//! 7's bound and the store's books hold. A refusal the oracle predicts changes nothing.

use super::*;

impl<S: Suite> World<S> {
    /// Check `result` against the oracle's refusal: refused exactly when it says so, as
    /// `Error::Refused` itself. A failure read back may carry a refusal as its root, which is not
    /// this.
    pub(super) fn expect_refusal<T: std::fmt::Debug>(
        &mut self,
        refused: bool,
        result: &scope_core::Result<T>,
        what: &str,
    ) {
        let got = matches!(result, Err(Error::Refused { .. }));
        assert_eq!(
            got,
            refused,
            "{}: {what}",
            if refused {
                "the oracle expected a cross-capture refusal"
            } else {
                "the oracle expected no refusal"
            }
        );
        assert!(
            !refused || result.as_ref().is_err_and(Error::is_refusal),
            "{what}"
        );
        self.refused |= refused;
    }

    /// After every step: checks agree with the oracle, and rule 7 holds.
    pub(super) fn verify(&mut self) {
        for i in 0..self.bufs.len() {
            let r = self.range(i);
            let whole = (r.0, 0, self.bufs[i].handle.size());
            for range in [r, whole] {
                let got = self
                    .client
                    .check(&[self.bufs[i].handle.slice(range.1..range.2)]);
                assert_eq!(
                    got.is_err(),
                    self.any_stale(&[range]),
                    "check {range:?}: {got:?}"
                );
            }
        }
        let held = self.client.failures_held();
        let claims = self.client.failure_claims();
        assert!(
            held <= claims,
            "rule 7: {held} failures held by {claims} claims\n{}",
            self.client.dump_failures()
        );
        if let Err(books) = self.client.audit() {
            panic!(
                "the store's books: {books}\n{}",
                self.client.dump_failures()
            );
        }
    }
}
