//! The HIP C++ cubecl-cpp writes for scope's HIP server, collected with no
//! device: cubecl programs run on `ScopeRuntime<Hip>` over the mock runtime
//! (`tests/mock/mock_hip.c`, which carries a mock hiprtc), in child
//! processes, with `SCOPE_MOCK_HIPRTC_DUMP` set, so the mock hiprtc writes
//! every source it is given into a folder.
//!
//! A child finds the mock where the server's loader looks first: the mock
//! as `lib/libamdhip64.so` (and `lib/libhiprtc.so`, a link to the same
//! file, so that hiprtc is the mock's too) of a folder named by
//! `ROCM_PATH`. A ROCm installed on the machine (`/opt/rocm`, Debian's
//! ROCm 5.2 that the toolchain row compiles with) comes later in the
//! loader's list and is never reached. Two children run:
//!
//! - cubecl-core's runtime tests: the `runtime_hip` test binary of
//!   scope-cubecl, built by the same `cargo test --workspace
//!   --all-features` build as this one and found beside it (or named by
//!   `SCOPE_CUBECL_RUNTIME_HIP`).
//! - cubek's matmul and reductions, as `tests/cubek.rs` of scope-cubecl
//!   launches them: this binary again, running only
//!   [`cubek_on_the_mock`] (the `cubek_kernels_for_the_toolchain_test`
//!   test).
//!
//! The mock cannot run cubecl's kernels: it compiles them (after writing
//! them out) and then finds no function of their name in the module, so
//! the launch fails and a test that compiles several kernels one after
//! another stops at its first. The runtime tests' later kernels are not
//! collected, as on the CUDA mock (server-cuda's `tests/toolchain/
//! harvest.rs` counts what that misses). The cubek launches are each tried
//! on their own, so all of theirs are.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The test that runs [`cubek_on_the_mock`] when this binary is the child.
pub const CUBEK_TEST: &str = "cubek_kernels_for_the_toolchain_test";

/// The variable that makes [`CUBEK_TEST`] run.
pub const CHILD: &str = "SCOPE_TOOLCHAIN_HARVEST";

/// What a child may take before it is stopped.
const CHILD_LIMIT: Duration = Duration::from_secs(600);

/// Sources collected from one child.
pub struct Collected {
    /// Which child ("cubecl-core runtime tests").
    pub what: &'static str,
    /// Each distinct source.
    pub sources: Vec<String>,
    /// What the child's own summary said.
    pub summary: String,
    /// How long the child ran.
    pub took: Duration,
}

/// A folder of `scratch` laid out as a ROCm install whose runtime and
/// hiprtc are the mock, built here: what a child's `ROCM_PATH` names.
pub fn mock_rocm(scratch: &Path) -> Result<PathBuf, String> {
    let rocm = scratch.join("mock-rocm");
    let lib = rocm.join("lib");
    std::fs::create_dir_all(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mock/mock_hip.c");
    let runtime = lib.join("libamdhip64.so");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
        .arg(&runtime)
        .arg(&source)
        .status()
        .map_err(|e| format!("running the C compiler `{compiler}` for the mock: {e}"))?;
    if !status.success() {
        return Err(format!("{} did not compile", source.display()));
    }
    let rtc = lib.join("libhiprtc.so");
    let _ = std::fs::remove_file(&rtc);
    std::os::unix::fs::symlink("libamdhip64.so", &rtc)
        .map_err(|e| format!("linking {}: {e}", rtc.display()))?;
    Ok(rocm)
}

/// Run `binary args` on the mock ROCm `rocm`, the mock hiprtc writing into
/// a new folder of `scratch` named `name`; the sources it wrote. The
/// child's own exit status is not judged — its tests fail on the mock by
/// design — but a child that wrote nothing is an error.
pub fn collect(
    what: &'static str,
    name: &str,
    binary: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    rocm: &Path,
    scratch: &Path,
) -> Result<Collected, String> {
    let dump = scratch.join(name);
    let _ = std::fs::remove_dir_all(&dump);
    std::fs::create_dir_all(&dump).map_err(|e| format!("{}: {e}", dump.display()))?;
    let log = scratch.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut child = Command::new(binary)
        .args(args)
        .envs(env.iter().copied())
        .env("ROCM_PATH", rocm)
        .env_remove("HIP_PATH")
        .env("SCOPE_MOCK_HIPRTC_DUMP", &dump)
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
        .filter(|p| p.extension().is_some_and(|x| x == "hip"))
        .map(|p| std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display())))
        .collect::<Result<_, _>>()?;
    sources.sort();
    if sources.is_empty() {
        return Err(format!(
            "{} compiled no HIP C++ on the mock ({summary}); its output is in {}",
            binary.display(),
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

/// The `runtime_hip` test binary of the same build: named by
/// `SCOPE_CUBECL_RUNTIME_HIP`, or the newest `runtime_hip-<hash>` beside
/// this binary that lists cubecl's tests on HIP (another feature set's
/// build leaves binaries of the same name without them).
pub fn runtime_hip() -> Result<PathBuf, String> {
    if let Some(named) = std::env::var_os("SCOPE_CUBECL_RUNTIME_HIP") {
        return Ok(PathBuf::from(named));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let deps = me.parent().ok_or("this binary has no folder")?;
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(deps)
        .map_err(|e| format!("{}: {e}", deps.display()))?
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix("runtime_hip-").is_some_and(|hash| {
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
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("hip::"))
        })
        .ok_or_else(|| {
            format!(
                "no runtime_hip test binary with cubecl's HIP tests in {} (build every test \
                 binary first: cargo test --workspace --all-features --no-run), or name one \
                 with SCOPE_CUBECL_RUNTIME_HIP",
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

/// In the child: cubek's unit matmul and unit reductions on
/// `ScopeRuntime<Hip>` over the mock, with the shapes, axes and operations
/// `tests/cubek.rs` of scope-cubecl uses, each launch tried on its own (the
/// mock finds no function in the module of any of them, after writing its
/// source out). How many launches were tried.
pub fn cubek_on_the_mock() -> usize {
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

    let mock = server_hip::client().expect("the mock runtime is the first the loader finds");
    let described = mock.describe();
    assert!(
        described.contains("Mock"),
        "the child must run on the mock runtime, not {described}"
    );
    let client = ScopeRuntime::<server_hip::Hip>::client(&ScopeDevice::default());
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
