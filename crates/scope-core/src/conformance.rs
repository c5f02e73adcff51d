//! The conformance suite: one test per behaviour, for any server.
//!
//! A server's test module implements [`Suite`] — how to get a client, and
//! four kernels in its own language — and expands
//! [`conformance_tests!`](crate::conformance_tests) to get one `#[test]` per
//! behaviour below. Each test names the rules of `docs/ERROR_MODEL.md` it
//! checks.
//!
//! A server with no device here prints `skipped: no <backend> device` and
//! returns; with `SCOPE_REQUIRE=<backend>` (or `all`) a missing device fails
//! the test instead, which is how `cargo xtask test --backend X` makes a
//! missing device an error.

use crate::backend::Backend;
use crate::client::Client;
use crate::error::Result;
use crate::kernel::Kernel;

/// What a server supplies to run the suite against itself.
///
/// The kernels work on `u32` words with a workgroup (block) of 64
/// invocations, one word each, and are dispatched over
/// `ceil(n / 64)` groups. Scalars are little-endian `u32`s.
pub trait Suite: 'static {
    /// The backend under test.
    type Backend: Backend;

    /// A client of a fresh server; [`Error::BackendUnavailable`](crate::Error::BackendUnavailable)
    /// when there is no device here.
    fn client() -> Result<Client<Self::Backend>>;

    /// `out[i] = value` for `i < n`. Bindings `[out (write)]`; scalars
    /// `[n, value]`.
    fn fill() -> Kernel;

    /// `out[i] = in[i]` for `i < n`. Bindings `[in (read), out (write)]`;
    /// scalars `[n]`.
    fn copy() -> Kernel;

    /// `out[i] = a[i] + b[i]` (wrapping) for `i < n`. Bindings
    /// `[a (read), b (read), out (write)]`; scalars `[n]`.
    fn add() -> Kernel;

    /// A kernel in the backend's language that does not compile.
    fn broken() -> Kernel;

    /// A size no larger than the backend's largest allocation that the
    /// device cannot provide, to test a real out-of-memory; `None` to rely
    /// on injected ones only.
    fn oversized() -> Option<u64> {
        None
    }
}

/// Whether `SCOPE_REQUIRE` (a comma-separated list, or `all`) names
/// `backend`, so that a missing device is a failure rather than a skip.
pub fn required(backend: &str) -> bool {
    std::env::var("SCOPE_REQUIRE").is_ok_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|b| b.eq_ignore_ascii_case(backend) || b.eq_ignore_ascii_case("all"))
    })
}

/// A client from `make`, or `None` after printing `skipped: no <backend>
/// device (<why>)` when the backend is unavailable here.
///
/// # Panics
///
/// When the backend is unavailable and [`required`]; or when `make` fails
/// for any reason other than unavailability — a device that is present but
/// broken is a failure, never a skip.
pub fn client_or_skip<B: Backend>(make: impl FnOnce() -> Result<Client<B>>) -> Option<Client<B>> {
    match make() {
        Ok(client) => Some(client),
        Err(crate::Error::BackendUnavailable { reason, .. }) => {
            assert!(
                !required(B::NAME),
                "SCOPE_REQUIRE names {} but it is unavailable: {reason}",
                B::NAME
            );
            println!("skipped: no {} device ({reason})", B::NAME);
            None
        }
        Err(other) => panic!("{} is present but failed to start: {other}", B::NAME),
    }
}
