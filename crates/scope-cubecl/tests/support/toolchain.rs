//! Shared by the toolchain tests of server-cuda and server-hip (their
//! `tests/toolchain.rs`, which include this file by path): both collect
//! the C++ cubecl-cpp writes for their server in the same way, and written
//! once per server the two ways would drift apart, each row then checking
//! a different set of kernels. The way: child processes run cubecl
//! programs on `ScopeRuntime<B>` over the server's mock, which writes every
//! source it is asked to compile into a folder, and the parent reads the
//! folder back. The file lives with scope-cubecl's tests because what it
//! drives is scope-cubecl's runtime, and the cubek launches it tries are
//! those of `tests/cubek.rs` here; no test of scope-cubecl includes it, and
//! it adds no dependency to either server.
//!
//! What differs by server stays in that server's tests: in
//! `tests/toolchain/harvest.rs` the mock libraries and how a child's
//! loader is pointed at them ([`Mock`]), the name of scope-cubecl's
//! runtime-test binary for the server ([`runtime_tests`]) and the check
//! that a child really runs on the mock; in `tests/toolchain.rs` how the
//! sources are then compiled (NVRTC and ptxas, or hiprtc).
//!
//! Two children run ([`harvest`]):
//!
//! - cubecl-core's runtime tests: scope-cubecl's test binary for the server
//!   (`runtime_cuda`, `runtime_hip`), built by the same `cargo test
//!   --workspace --all-features` build as the toolchain test and found
//!   beside it.
//! - cubek's matmul and reductions, as `tests/cubek.rs` of scope-cubecl
//!   launches them: the toolchain test's binary again, running only its
//!   [`CUBEK_TEST`], which calls [`cubek_child`].
//!
//! The mock cannot run cubecl's kernels, so each launch fails after its
//! source is written out, and a runtime test that compiles several kernels
//! one after another stops at its first: only the runtime tests' first
//! kernels are collected. The cubek launches are each tried on their own,
//! so all of theirs are.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use scope_cubecl::CubeBackend;

/// The test that calls [`cubek_child`] in each toolchain test binary.
pub const CUBEK_TEST: &str = "cubek_kernels_for_the_toolchain_test";

/// The variable that makes [`CUBEK_TEST`] run.
const CHILD: &str = "SCOPE_TOOLCHAIN_HARVEST";

/// What a child may take before it is stopped.
const CHILD_LIMIT: Duration = Duration::from_secs(600);

/// A server's mock, as a child process is put on it.
pub struct Mock {
    /// What points the child's loader at the mock rather than at a real
    /// library of the machine: each variable set to a value, or removed
    /// (`None`).
    pub env: Vec<(&'static str, Option<OsString>)>,
    /// The variable naming the folder the mock compiler writes each source
    /// it is given into.
    pub dump: &'static str,
    /// The extension of the files it writes there.
    pub extension: &'static str,
    /// What the sources are, for messages ("CUDA C++").
    pub language: &'static str,
}

/// Sources collected from one child.
struct Collected {
    /// Which child ("cubecl-core runtime tests").
    what: &'static str,
    /// Each distinct source.
    sources: Vec<String>,
    /// What the child's own summary said.
    summary: String,
    /// How long the child ran.
    took: Duration,
}

/// Both children on `mock`, the runtime tests being the binary `runtime`,
/// their sources written into folders of `scratch`; each source with the
/// child it came from. Prints a line per child.
pub fn harvest(
    mock: &Mock,
    runtime: &Path,
    scratch: &Path,
) -> Result<Vec<(&'static str, String)>, String> {
    let me = std::env::current_exe().map_err(|e| format!("this test binary's path: {e}"))?;
    let children = [
        collect(
            "cubecl-core runtime tests",
            "runtime-tests",
            runtime,
            &["--test-threads=2"],
            &[],
            mock,
            scratch,
        )?,
        collect(
            "cubek",
            "cubek",
            &me,
            &["--exact", CUBEK_TEST, "--ignored", "--nocapture"],
            &[(CHILD, "cubek")],
            mock,
            scratch,
        )?,
    ];
    let mut sources = Vec::new();
    for child in children {
        println!(
            "{}: {} distinct sources in {:.1} s (the child's tests on the mock: {})",
            child.what,
            child.sources.len(),
            child.took.as_secs_f64(),
            child.summary
        );
        sources.extend(child.sources.into_iter().map(|s| (child.what, s)));
    }
    Ok(sources)
}

/// Run `binary args` on `mock`, the mock compiler writing into a new
/// folder of `scratch` named `name`; the sources it wrote. The child's own
/// exit status is not judged — its tests fail on the mock by design — but
/// a child that wrote nothing is an error.
fn collect(
    what: &'static str,
    name: &str,
    binary: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    mock: &Mock,
    scratch: &Path,
) -> Result<Collected, String> {
    let dump = scratch.join(name);
    let _ = std::fs::remove_dir_all(&dump);
    std::fs::create_dir_all(&dump).map_err(|e| format!("{}: {e}", dump.display()))?;
    let log = scratch.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut command = Command::new(binary);
    command.args(args).envs(env.iter().copied());
    for (variable, value) in &mock.env {
        match value {
            Some(value) => command.env(variable, value),
            None => command.env_remove(variable),
        };
    }
    let started = Instant::now();
    let mut child = command
        .env(mock.dump, &dump)
        // A child that required a device would fail for the wrong reason.
        .env_remove("SCOPE_REQUIRE")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < CHILD_LIMIT => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} ran past {CHILD_LIMIT:?} on the mock; its output is in {}",
                    binary.display(),
                    log.display()
                ));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", binary.display())),
        }
    }
    let took = started.elapsed();
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let summary = output
        .lines()
        .rfind(|l| l.starts_with("test result:"))
        .unwrap_or("no summary")
        .to_owned();
    let mut sources: Vec<String> = std::fs::read_dir(&dump)
        .map_err(|e| format!("{}: {e}", dump.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == mock.extension))
        .map(|p| std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display())))
        .collect::<Result<_, _>>()?;
    sources.sort();
    if sources.is_empty() {
        return Err(format!(
            "{} compiled no {} on the mock ({summary}); its output is in {}",
            binary.display(),
            mock.language,
            log.display()
        ));
    }
    Ok(Collected {
        what,
        sources,
        summary,
        took,
    })
}

/// scope-cubecl's test binary `stem` of the same build: named by the
/// variable `named_by`, or the newest `<stem>-<hash>` beside this binary
/// that lists cubecl's tests of the server's module `module` (`cuda`):
/// another feature set's build leaves binaries of the same name without
/// them.
pub fn runtime_tests(stem: &str, named_by: &str, module: &str) -> Result<PathBuf, String> {
    if let Some(named) = std::env::var_os(named_by) {
        return Ok(PathBuf::from(named));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let deps = me.parent().ok_or("this binary has no folder")?;
    let prefix = format!("{stem}-");
    let listed = format!("{module}::");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(deps)
        .map_err(|e| format!("{}: {e}", deps.display()))?
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix(&prefix).is_some_and(|hash| {
                    hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())
                })
            })
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    found.sort();
    found
        .into_iter()
        .rev()
        .map(|(_, path)| path)
        .find(|path| {
            Command::new(path)
                .arg("--list")
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(&listed))
        })
        .ok_or_else(|| {
            format!(
                "no {stem} test binary with cubecl's `{listed}` tests in {} (build every test \
                 binary first: cargo test --workspace --all-features --no-run), or name one \
                 with {named_by}",
                deps.display()
            )
        })
}

/// The name of the first `__global__` function of `source`.
pub fn entry_point(source: &str) -> Option<String> {
    let after = &source[source.find("__global__")? + "__global__".len()..];
    let open = after.find('(')?;
    let mut head = &after[..open];
    // `void __launch_bounds__(N) name(`: the parenthesis found was the
    // bounds'.
    if head.contains("__launch_bounds__") {
        let rest = &after[after[open..].find(')')? + open + 1..];
        head = &rest[..rest.find('(')?];
    }
    head.split_whitespace().last().map(str::to_owned)
}

/// The body of [`CUBEK_TEST`]: in the child [`harvest`] starts, after
/// `on_the_mock` has checked that the server `B` opens on its mock, every
/// cubek launch of [`cubek_on_the_mock`]; anywhere else, nothing.
pub fn cubek_child<B: CubeBackend>(on_the_mock: impl FnOnce()) {
    if std::env::var(CHILD).as_deref() != Ok("cubek") {
        return;
    }
    on_the_mock();
    let tried = cubek_on_the_mock::<B>();
    println!("cubek: {tried} launches tried on the mock");
}

/// cubek's unit matmul and unit reductions on `ScopeRuntime<B>`, with the
/// shapes, axes and operations `tests/cubek.rs` of scope-cubecl uses, each
/// launch tried on its own (on the mock every one fails, after its source
/// is written out). How many launches were tried.
fn cubek_on_the_mock<B: CubeBackend>() -> usize {
    use cubecl_runtime::runtime::Runtime;
    use cubek_matmul::definition::MatmulElems;
    use cubek_matmul::launch::launch_ref;
    use cubek_matmul::multi_level;
    use cubek_matmul::strategy::Strategy;
    use cubek_reduce::components::instructions::ReduceOperationConfig;
    use cubek_reduce::launch::{RoutineStrategy, VectorizationStrategy};
    use cubek_reduce::routines::BlueprintStrategy;
    use cubek_reduce::routines::unit::UnitStrategy;
    use cubek_reduce::{ReduceDtypes, ReduceStrategy};
    use cubek_std::InputBinding;
    use scope_cube::cubecl_core::prelude::*;
    use scope_cube::cubecl_core::zspace::{Shape, Strides, Tiling};
    use scope_cubecl::{ScopeDevice, ScopeRuntime};

    let client = ScopeRuntime::<B>::client(&ScopeDevice::default());
    let tensor = |handle: &scope_cube::cubecl_core::server::Handle, shape: &[usize]| {
        let mut strides = vec![1usize; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        TensorBinding {
            handle: handle.clone().binding(),
            shape: Shape::from(shape.to_vec()),
            strides: Strides::from(strides),
            tiling: Tiling::UNTILED,
        }
    };
    let f32_type = f32::elem_type_native();
    let mut tried = 0;
    let mut attempt = |launch: &dyn Fn()| {
        tried += 1;
        // The launch fails on the mock, by a panic or an error: either way
        // its kernel was compiled, which is all that is wanted here.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(launch));
    };
    for [m, k, n] in [[64, 64, 64], [128, 96, 80], [100, 37, 53], [32, 16, 8]] {
        attempt(&|| {
            let lhs = client.empty(m * k * 4);
            let rhs = client.empty(k * n * 4);
            let out = client.empty(m * n * 4);
            let mut elems = MatmulElems::from_single_dtype(f32_type);
            let launched = launch_ref(
                &Strategy::MultiLevel(multi_level::Strategy::SimpleUnit(Default::default())),
                &client,
                InputBinding::Normal(tensor(&lhs, &[m, k]), f32_type),
                InputBinding::Normal(tensor(&rhs, &[k, n]), f32_type),
                tensor(&out, &[m, n]),
                &mut elems,
            );
            if launched.is_ok() {
                let _ = client.read_one(out);
            }
        });
    }
    let shape = [6usize, 17, 33];
    for axis in 0..3 {
        for op in [
            ReduceOperationConfig::Sum,
            ReduceOperationConfig::Mean,
            ReduceOperationConfig::Max,
            ReduceOperationConfig::ArgMax,
        ] {
            attempt(&|| {
                let mut out_shape = shape;
                out_shape[axis] = 1;
                let input = client.empty(shape.iter().product::<usize>() * 4);
                let out = client.empty(out_shape.iter().product::<usize>() * 4);
                let output = match op {
                    ReduceOperationConfig::ArgMax | ReduceOperationConfig::ArgMin => {
                        u32::elem_type_native()
                    }
                    _ => f32_type,
                };
                let launched = cubek_reduce::reduce(
                    &client,
                    tensor(&input, &shape),
                    tensor(&out, &out_shape),
                    axis,
                    ReduceStrategy {
                        routine: RoutineStrategy::Unit(BlueprintStrategy::Inferred(UnitStrategy)),
                        vectorization: VectorizationStrategy {
                            parallel_output_vectorization: false,
                        },
                        autotune_level: Default::default(),
                    },
                    op,
                    ReduceDtypes {
                        input: f32_type,
                        output,
                        accumulation: f32_type,
                    },
                );
                if launched.is_ok() {
                    let _ = client.read_one(out);
                }
            });
        }
    }
    tried
}
