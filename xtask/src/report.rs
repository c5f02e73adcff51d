//! Reading what a test runner printed: which tests passed, failed or
//! skipped, and why; and the lines a person reads about it.
//!
//! A device test with nothing to run on passes after printing one line,
//! `skipped: <reason>`. The runner counts it as a pass. This module finds
//! those lines **in each test's own output** and counts the test once as
//! skipped, with its reason. A test that prints something of its own after
//! its skip lines ran something, such as one comparing every server present.
//! It stays a pass, with its skip reasons listed as parts skipped.
//!
//! A test that ran but did nothing on its device is counted apart, as **not
//! exercised**, never as passed. It prints `not exercised: <reason>` (cubecl's
//! runtime tests; see `crates/scope-cubecl/tests/common/mod.rs`), or
//! `not run: <reason>` when its binary marks it as not holding on this device.
//! The first is printed to stderr as the test's thread ends, after libtest
//! stopped capturing. So under plain libtest it stands outside the test's
//! block, and under nextest in its stderr; the name in brackets says whose.
//!
//! A kit behaviour whose suite lacks what it needs by design (a host-staged
//! suite and the device transport's behaviours) prints `not applicable:
//! <reason>`. It is counted apart again, so that "not exercised" lists only
//! what could have run here.
//!
//! Each test's output is found in the runner's own framing:
//!
//! - nextest, with `--success-output immediate --failure-output immediate`:
//!   a status line (`PASS [ 0.004s] (1/5) crate::binary test`), its
//!   `stdout ───` and `stderr ───` blocks, and a closing `Summary [ … ]`.
//!   Older nextest writes `──── STDOUT: crate::binary test`.
//! - a libtest binary with `--show-output`: `test name ... ok` lines, then
//!   one `---- name stdout ----` block per test that printed anything, in
//!   its `successes:` and `failures:` sections, and `test result: …`.
//!
//! Three parts: the lines a test prints about itself ([`lines`]), the
//! runners' framing around each test's output ([`runner`]), and the rows
//! and table of the summary ([`counts`]).

mod counts;
mod lines;
mod runner;

pub use counts::{Counts, summary};
pub use lines::strip_ansi;

#[cfg(test)]
mod checks {
    use super::counts::*;
    use super::lines::*;
    use super::runner::*;
    use crate::backends::BackendKind::{Cuda, Vulkan, Wgpu};

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn skip_lines_are_the_projects_convention_at_the_start_of_a_line() {
        assert_eq!(
            skip_reason("skipped: no vulkan device (no loader)").as_deref(),
            Some("no vulkan device (no loader)")
        );
        assert_eq!(
            skip_reason("    skipped: VK_LAYER_KHRONOS_validation is not installed").as_deref(),
            Some("VK_LAYER_KHRONOS_validation is not installed")
        );
        assert_eq!(
            skip_reason("Skipped: no cuda device").as_deref(),
            Some("no cuda device")
        );
        assert_eq!(
            skip_reason("\u{1b}[1mskipped: no hip device\u{1b}[0m").as_deref(),
            Some("no hip device")
        );
        // Not one: no reason, or `skipped:` inside another message.
        assert_eq!(skip_reason("skipped:").as_deref(), None);
        assert_eq!(skip_reason("skipped: ").as_deref(), None);
        assert_eq!(
            skip_reason("DEBUG scope: skipped: input carries fill failed").as_deref(),
            None
        );
        assert_eq!(
            skip_reason("assertion failed: skipped: 3: copy out of range").as_deref(),
            None
        );
        assert_eq!(skip_reason("vulkan: skipped (no adapter)").as_deref(), None);
        assert_eq!(skip_reason("skip").as_deref(), None);
    }

    #[test]
    fn a_skip_is_a_test_that_printed_its_reason_and_returned() {
        assert_eq!(classify(&lines("hello\nworld")), Skip::None);
        assert_eq!(
            classify(&lines(
                "\nrunning 1 test\nskipped: no vulkan device (x)\ntest a ... ok\n\n\
                 test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 5 filtered out\n"
            )),
            Skip::Whole("no vulkan device (x)".to_owned())
        );
        // Two servers absent, one test: one skip, both reasons.
        assert_eq!(
            classify(&lines("skipped: no cuda device\nskipped: no hip device")),
            Skip::Whole("no cuda device; no hip device".to_owned())
        );
        // It went on to compare what was there: a pass with parts skipped.
        assert_eq!(
            classify(&lines(
                "skipped: no cuda device (x)\nskipped: no hip device (y)\nservers compared: [\"wgpu gl\"]"
            )),
            Skip::Partly(vec![
                "no cuda device (x)".to_owned(),
                "no hip device (y)".to_owned()
            ])
        );
    }

    /// nextest 0.9.143's output, cut down from a real run: a plain pass, a
    /// skip with a reason that names no device, a partial skip, and a
    /// failure with its stdout and stderr.
    const NEXTEST: &str = "\
────────────
 Nextest run ID 6d8cab41 with nextest profile: default
    Starting 5 tests across 1 binary (1 test skipped)
        PASS [   0.004s] (1/5) server-vulkan::vulkan plain
  stdout ───

    running 1 test
    test plain ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 0.00s

        PASS [   0.006s] (2/5) server-vulkan::vulkan a_validation_message_is_collected_and_fails_the_test
  stdout ───

    running 1 test
    skipped: VK_LAYER_KHRONOS_validation is not installed
    test a_validation_message_is_collected_and_fails_the_test ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 0.00s

  stderr ───
    WARNING: lavapipe is not a conformant vulkan implementation, testing use only.

        PASS [   0.005s] (3/5) server-vulkan::vulkan probe_lists_the_devices
  stdout ───

    running 1 test
    skipped: no vulkan device (Some(\"no loader\"))
    test probe_lists_the_devices ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 0.00s

        SLOW [> 60.000s] scope-cube::servers every_server_computes_the_same
        PASS [  61.005s] (4/5) scope-cube::servers every_server_computes_the_same
  stdout ───

    running 1 test
    skipped: no cuda device (libcuda.so.1 not found)
    servers compared: [\"vulkan spir-v\"]
    test every_server_computes_the_same ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 61.00s

        FAIL [   0.094s] (5/5) server-vulkan::vulkan fails
  stdout ───

    running 1 test
    before
    test fails ... FAILED

  stderr ───

    thread 'fails' panicked at tests/vulkan.rs:7:46:
    boom

────────────
     Summary [  61.102s] 5 tests run: 4 passed (1 slow), 1 failed, 1 skipped
        FAIL [   0.094s] (5/5) server-vulkan::vulkan fails
error: test run failed";

    #[test]
    fn nextest_output_is_read_test_by_test() {
        let parsed = parse_nextest(&lines(NEXTEST));
        assert!(parsed.summary_found);
        assert_eq!((parsed.passed, parsed.failed), (4, 1));
        let names: Vec<&str> = parsed.tests.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "server-vulkan::vulkan plain",
                "server-vulkan::vulkan a_validation_message_is_collected_and_fails_the_test",
                "server-vulkan::vulkan probe_lists_the_devices",
                "scope-cube::servers every_server_computes_the_same",
                "server-vulkan::vulkan fails",
            ]
        );
        let validation = &parsed.tests[1];
        assert!(validation.passed);
        assert!(validation.stdout.iter().all(|l| !l.contains("lavapipe")));
        let failure = &parsed.tests[4];
        assert!(!failure.passed);
        assert!(failure.raw[0].contains("FAIL"));
        assert!(failure.raw.iter().any(|l| l.contains("boom")));
        assert!(failure.raw.iter().any(|l| l.contains("before")));

        let mut row = Counts::new(Vulkan.name());
        row.add("cargo nextest run", false, &lines(NEXTEST), true);
        assert_eq!((row.passed, row.failed, row.skipped), (2, 1, 2));
        assert_eq!(
            row.skips,
            [
                ("VK_LAYER_KHRONOS_validation is not installed".to_owned(), 1),
                ("no vulkan device (Some(\"no loader\"))".to_owned(), 1),
            ]
        );
        assert_eq!(
            row.partly,
            [("no cuda device (libcuda.so.1 not found)".to_owned(), 1)]
        );
        assert_eq!(row.failures.len(), 1);
        assert_eq!(row.failures[0].name, "server-vulkan::vulkan fails");
        assert!(row.note.is_empty(), "{}", row.note);
    }

    #[test]
    fn older_nextest_blocks_and_colour_are_read_too() {
        let old = "\
        \u{1b}[32;1mPASS\u{1b}[0m [   0.004s] nxt t::skips
──── STDOUT:             nxt t::skips
skipped: no wgpu device (no adapter)
──── STDERR:             nxt t::skips
skipped: this is stderr and does not count
        PASS [   0.004s] nxt t::plain
────────────
     \u{1b}[1mSummary\u{1b}[0m [   0.102s] 2 tests run: 2 passed, 0 skipped";
        let mut row = Counts::new(Wgpu.name());
        row.add("cargo nextest run", true, &lines(old), true);
        assert_eq!((row.passed, row.failed, row.skipped), (1, 0, 1));
        assert_eq!(row.skips, [("no wgpu device (no adapter)".to_owned(), 1)]);
    }

    /// A test binary run with `--show-output`, as libtest prints it.
    const LIBTEST: &str = "\
running 6 tests
test t::ign ... ignored
test t::noisy ... ok
test t::partial ... ok
test t::plain ... ok
test t::skips ... ok
test t::fails ... FAILED

successes:

---- t::noisy stdout ----
hello
warn

---- t::partial stdout ----
skipped: no cuda device (x)
servers compared: [a]

---- t::skips stdout ----
skipped: no vulkan device (no loader)


successes:
    t::noisy
    t::partial
    t::plain
    t::skips

failures:

---- t::fails stdout ----
before

thread 't::fails' (12286) panicked at src/lib.rs:7:46:
boom
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    t::fails

test result: FAILED. 4 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.10s
";

    #[test]
    fn libtest_output_is_read_test_by_test() {
        let parsed = parse_libtest(&lines(LIBTEST));
        assert_eq!((parsed.passed, parsed.failed), (4, 1));
        assert_eq!(parsed.tests.len(), 5, "{:?}", parsed.tests);
        let skips = parsed.tests.iter().find(|t| t.name == "t::skips").unwrap();
        assert_eq!(
            classify(&skips.stdout),
            Skip::Whole("no vulkan device (no loader)".into())
        );
        let mut row = Counts::new("core");
        row.add("target/debug/deps/core-1", false, &lines(LIBTEST), false);
        assert_eq!((row.passed, row.failed, row.skipped), (3, 1, 1));
        assert_eq!(row.partly, [("no cuda device (x)".to_owned(), 1)]);
        assert_eq!(row.failures.len(), 1);
        let failure = &row.failures[0];
        assert_eq!(failure.name, "t::fails");
        assert_eq!(failure.lines[0], "test t::fails ... FAILED");
        assert!(failure.lines.iter().any(|l| l == "boom"));
    }

    #[test]
    fn a_run_that_died_is_one_failure_shown_whole() {
        let crashed = lines(
            "running 3 tests\ntest a ... ok\nerror: process didn't exit successfully (signal: 11, SIGSEGV)",
        );
        let mut row = Counts::new(Wgpu.name());
        row.add("target/debug/deps/wgpu-1", false, &crashed, false);
        assert_eq!((row.passed, row.failed), (0, 1));
        assert_eq!(row.failures.len(), 1);
        assert_eq!(row.failures[0].name, "target/debug/deps/wgpu-1");
        assert_eq!(row.failures[0].lines.len(), 3);
        assert_eq!(row.note, "the run failed before its summary");
    }

    #[test]
    fn unrecognised_framing_falls_back_to_counting_skip_lines() {
        let odd = lines("skipped: no cuda device (x)\n  Summary [ 1.0s] 3 tests run: 3 passed");
        let mut row = Counts::new(Cuda.name());
        row.add("cargo nextest run", true, &odd, true);
        assert_eq!((row.passed, row.failed, row.skipped), (2, 0, 1));
        assert!(row.note.contains("counted by line"));
    }

    #[test]
    fn long_reasons_are_clipped_for_the_terminal() {
        assert_eq!(clip("no cuda device", 20), "no cuda device");
        assert_eq!(
            clip("no cuda device (searched a, b, c)", 17),
            "no cuda device (…"
        );
        let mut row = Counts::new(Cuda.name());
        row.skips = vec![(
            format!("no cuda device ({})", "libcuda.so, ".repeat(20)),
            53,
        )];
        let details = row.details();
        assert!(details[0].starts_with("skipped  53 × no cuda device (libcuda.so, "));
        assert!(details[0].ends_with('…') && details[0].chars().count() < 130);
    }

    #[test]
    fn the_summary_has_each_rows_time_and_the_totals() {
        let mut core = Counts::new("core");
        core.passed = 412;
        core.secs = 58.25;
        let mut vulkan = Counts::new(Vulkan.name());
        vulkan.passed = 37;
        vulkan.skipped = 3;
        vulkan.secs = 48.0;
        vulkan.skips = vec![("VK_LAYER_KHRONOS_validation is not installed".into(), 3)];
        let (text, ok) = summary(
            &[core, vulkan],
            &[("build", 812.0, "cargo test --no-run")],
            Some("target/xtask/test.log"),
        );
        assert!(ok);
        assert!(
            text.contains(
                "core               412       0        0              0      0    58.2 s"
            ),
            "{text}"
        );
        assert!(text.contains("skipped: VK_LAYER_KHRONOS_validation is not installed"));
        assert!(
            text.contains(
                "build                                                          13.5 min  cargo test --no-run"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "total              449       0        3              0      0  15.3 min"
            ),
            "{text}"
        );
        assert!(text.contains("449 passed, 0 failed, 3 skipped, 0 not exercised"));
        assert!(text.contains("target/xtask/test.log"));
    }

    #[test]
    fn a_not_exercised_line_gives_its_reason_and_may_name_its_test() {
        assert_eq!(
            not_exercised("not exercised: nothing reached the device [wgpu::f32_ty::test_x]"),
            Some((
                "nothing reached the device".to_owned(),
                Some("wgpu::f32_ty::test_x".to_owned())
            ))
        );
        assert_eq!(
            not_exercised("    not exercised: nothing reached the device"),
            Some(("nothing reached the device".to_owned(), None))
        );
        assert_eq!(
            not_exercised("\u{1b}[1mNot exercised: no plane ops [t]\u{1b}[0m"),
            Some(("no plane ops".to_owned(), Some("t".to_owned())))
        );
        // Not one: no reason, or the words inside another message.
        assert_eq!(not_exercised("not exercised:"), None);
        assert_eq!(not_exercised("not exercised: [t]"), None);
        assert_eq!(not_exercised("INFO x: not exercised: y"), None);
        assert_eq!(
            not_run_reason("not run: GLSL's % of a negative operand").as_deref(),
            Some("GLSL's % of a negative operand")
        );
        assert_eq!(not_run_reason("not run:").as_deref(), None);
        assert_eq!(not_run_reason("test a ... not run: x").as_deref(), None);
    }

    /// nextest runs each test in its own process, so the verdict a runtime test
    /// prints as its thread ends is in its own stderr. One printed by a thread the
    /// test spawned is in its stdout.
    const NEXTEST_UNEXERCISED: &str = "\
        PASS [   0.041s] (1/5) scope-cubecl::runtime_wgpu wgpu::f32_ty::test_plane_sum_vec1
  stdout ───

    running 1 test
    test wgpu::f32_ty::test_plane_sum_vec1 ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.02s

  stderr ───
    not exercised: nothing reached the device [wgpu::f32_ty::test_plane_sum_vec1]

        PASS [   0.043s] (2/5) scope-cubecl::runtime_wgpu wgpu::f32_ty::test_plane_max_vec1
  stdout ───

    running 1 test
    test wgpu::f32_ty::test_plane_max_vec1 ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.02s

  stderr ───
    not exercised: nothing reached the device [wgpu::f32_ty::test_plane_max_vec1]

        PASS [   0.052s] (3/5) scope-cubecl::runtime_wgpu wgpu::binary_untyped::test_signed_remainder
  stdout ───

    running 1 test
    not run: GLSL leaves % of a negative operand undefined
    test wgpu::binary_untyped::test_signed_remainder ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.03s

        PASS [   0.061s] (4/5) scope-cubecl::runtime_wgpu wgpu::test_a_group_all_reduce_sums_and_averages
  stdout ───

    running 1 test
    not exercised: nothing reached the device
    test wgpu::test_a_group_all_reduce_sums_and_averages ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.03s

        PASS [   0.210s] (5/5) scope-cubecl::runtime_wgpu wgpu::f32_ty::test_unary_abs
  stdout ───

    running 1 test
    test wgpu::f32_ty::test_unary_abs ... ok

    test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 388 filtered out; finished in 0.19s

────────────
     Summary [   0.450s] 5 tests run: 5 passed, 0 skipped";

    #[test]
    fn tests_that_did_nothing_on_the_device_are_not_exercised_not_passed() {
        let mut row = Counts::new("cubecl on wgpu (gl)");
        row.add("cargo nextest run", true, &lines(NEXTEST_UNEXERCISED), true);
        assert_eq!(
            (row.passed, row.failed, row.skipped, row.not_exercised),
            (1, 0, 0, 4)
        );
        assert_eq!(
            row.unexercised,
            [("nothing reached the device".to_owned(), 3)]
        );
        assert_eq!(
            row.not_run,
            ["not run: wgpu::binary_untyped::test_signed_remainder \
              (GLSL leaves % of a negative operand undefined)"]
        );
        let details = row.details();
        assert!(
            details.contains(&"not exercised   3 × nothing reached the device".to_owned()),
            "{details:?}"
        );
        assert!(
            row.outcome().contains("4 not exercised"),
            "{}",
            row.outcome()
        );
    }

    /// Plain libtest: the verdict comes as the test's thread ends, after capture,
    /// so it stands named outside the test's block. One printed by a thread the
    /// test spawned is in its block.
    const LIBTEST_UNEXERCISED: &str = "\
running 5 tests
not exercised: nothing reached the device [wgpu::test_cmma_simple_1]
test wgpu::test_cmma_simple_1 ... ok
test wgpu::test_all_gather_concatenates_in_member_order ... ok
test wgpu::f32_ty::test_unary_abs ... ok
not exercised: nothing reached the device [wgpu::test_fails_early]
test wgpu::test_fails_early ... FAILED
test wgpu::binary_untyped::test_ieee_constant_folds ... ok

successes:

---- wgpu::test_all_gather_concatenates_in_member_order stdout ----
not exercised: nothing reached the device

---- wgpu::binary_untyped::test_ieee_constant_folds stdout ----
not run: WGSL may fold NaN


successes:
    wgpu::binary_untyped::test_ieee_constant_folds
    wgpu::f32_ty::test_unary_abs
    wgpu::test_all_gather_concatenates_in_member_order
    wgpu::test_cmma_simple_1

failures:

---- wgpu::test_fails_early stdout ----

thread 'wgpu::test_fails_early' panicked at src/x.rs:1:1:
boom


failures:
    wgpu::test_fails_early

test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.10s
";

    #[test]
    fn under_libtest_a_verdict_outside_the_block_is_its_named_tests() {
        let mut row = Counts::new("cubecl on vulkan");
        row.add(
            "target/debug/deps/runtime_vulkan-1",
            false,
            &lines(LIBTEST_UNEXERCISED),
            false,
        );
        // The failure stays a failure whatever it printed.
        assert_eq!(
            (row.passed, row.failed, row.skipped, row.not_exercised),
            (1, 1, 0, 3)
        );
        assert_eq!(
            row.unexercised,
            [("nothing reached the device".to_owned(), 2)]
        );
        assert_eq!(
            row.not_run,
            ["not run: wgpu::binary_untyped::test_ieee_constant_folds (WGSL may fold NaN)"]
        );
    }

    #[test]
    fn the_summary_counts_not_exercised_in_a_column_of_its_own() {
        let mut gl = Counts::new("cubecl on wgpu (gl)");
        gl.passed = 250;
        gl.not_exercised = 134;
        gl.not_applicable = 7;
        gl.secs = 40.0;
        let mut cuda = Counts::new("cubecl on cuda");
        cuda.skipped = 1;
        cuda.note = "skipped: no cuda device".to_owned();
        let (text, ok) = summary(&[gl, cuda], &[], None);
        assert!(ok);
        assert!(
            text.contains(
                "cubecl on wgpu (gl)     250       0        0            134      7    40.0 s"
            ),
            "{text}"
        );
        assert!(
            text.contains("250 passed, 0 failed, 1 skipped, 134 not exercised, 7 not applicable")
        );
    }

    /// A kit behaviour whose suite lacks what it needs says so, and counts
    /// as not applicable: neither passed nor not exercised.
    #[test]
    fn a_behaviour_its_suite_cannot_have_is_not_applicable() {
        assert_eq!(
            not_applicable("not applicable: the suite's groups are not over a device transport")
                .as_deref(),
            Some("the suite's groups are not over a device transport")
        );
        assert_eq!(not_applicable("not applicable:"), None);
        assert_eq!(not_applicable("note: not applicable: x"), None);
        let output = "\nrunning 3 tests\ntest a ... ok\ntest b ... ok\ntest c ... ok\n\n\
            successes:\n\n---- a stdout ----\nnot applicable: the suite makes no backend\n\n\
            ---- b stdout ----\nnot exercised: nothing reached the device\n\n\
            successes:\n    a\n    b\n    c\n\n\
            test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n";
        let mut row = Counts::new("host");
        row.add("conformance", true, &lines(output), false);
        assert_eq!(
            (
                row.passed,
                row.skipped,
                row.not_exercised,
                row.not_applicable
            ),
            (1, 0, 1, 1)
        );
        assert_eq!(
            row.inapplicable,
            [("the suite makes no backend".to_owned(), 1)]
        );
        assert!(
            row.outcome().contains("1 not exercised    1 n/a"),
            "{}",
            row.outcome()
        );
    }
}
