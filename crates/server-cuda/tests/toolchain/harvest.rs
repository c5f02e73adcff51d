//! The CUDA C++ cubecl-cpp writes for scope's CUDA server, collected with
//! no device: cubecl programs run on `ScopeRuntime<Cuda>` over the mock
//! driver and NVRTC (`tests/mock`), in child processes, with
//! `SCOPE_MOCK_NVRTC_DUMP` set, so the mock NVRTC writes every source it is
//! given into a folder.
//!
//! A child finds the mocks by name: copies named by their sonames
//! (`libcuda.so`, `libnvrtc.so`) sit in a folder put first on its
//! `LD_LIBRARY_PATH`, and cudarc's first candidates are those names. Two
//! children run:
//!
//! - cubecl-core's runtime tests: the `runtime_cuda` test binary of
//!   scope-cubecl, built by the same `cargo test --workspace
//!   --all-features` build as this one and found beside it (or named by
//!   `SCOPE_CUBECL_RUNTIME_CUDA`).
//! - cubek's matmul and reductions, as `tests/cubek.rs` of scope-cubecl
//!   launches them: this binary again, running only
//!   [`cubek_on_the_mock`] (the `cubek_kernels_for_the_toolchain_test`
//!   test).
//!
//! The mock cannot run cubecl's kernels: it refuses to compile them (after
//! writing them out), so the launch fails and a test that compiles several
//! kernels one after another stops at its first. The runtime tests' other
//! kernels are not collected — about half: the same tests on lavapipe
//! compile 469 WGSL kernels where the mock collects 273 CUDA sources, the
//! rest being the later vectorisations and steps of tests that compile
//! several. The cubek launches are each tried on their own, so all of
//! theirs are.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness;

/// The test that runs [`cubek_on_the_mock`] when this binary is the child.
pub const CUBEK_TEST: &str = "cubek_kernels_for_the_toolchain_test";

/// The variable that makes [`CUBEK_TEST`] run.
pub const CHILD: &str = "SCOPE_TOOLCHAIN_HARVEST";

/// What a child may take before it is stopped.
const CHILD_LIMIT: Duration = Duration::from_secs(600);

/// Sources collected from one child.
pub struct Collected {
    /// Which child ("cubecl-core's runtime tests").
    pub what: &'static str,
    /// Each distinct source.
    pub sources: Vec<String>,
    /// What the child's own summary said.
    pub summary: String,
}

/// The mock driver and NVRTC, as files named by their sonames, in a
/// folder of `scratch`.
pub fn mock_folder(scratch: &Path) -> Result<PathBuf, String> {
    let folder = scratch.join("mock-lib");
    std::fs::create_dir_all(&folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    for (source, soname) in [
        ("mock_cuda.c", "libcuda.so"),
        ("mock_nvrtc.c", "libnvrtc.so"),
    ] {
        let built = harness::build(source, soname, &[]);
        std::fs::rename(&built, folder.join(soname))
            .map_err(|e| format!("moving {}: {e}", built.display()))?;
    }
    Ok(folder)
}

/// Run `binary args` on the mocks in `mock`, the mock NVRTC writing into a
/// new folder of `scratch` named `name`; the sources it wrote. The child's
/// own exit status is not judged — its tests fail on the mock by design —
/// but a child that wrote nothing is an error.
pub fn collect(
    what: &'static str,
    name: &str,
    binary: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    mock: &Path,
    scratch: &Path,
) -> Result<Collected, String> {
    let dump = scratch.join(name);
    std::fs::create_dir_all(&dump).map_err(|e| format!("{}: {e}", dump.display()))?;
    let log = scratch.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let library_path = match std::env::var_os("LD_LIBRARY_PATH") {
        Some(old) if !old.is_empty() => {
            let mut path = mock.as_os_str().to_owned();
            path.push(":");
            path.push(old);
            path
        }
        _ => mock.as_os_str().to_owned(),
    };
    let mut child = Command::new(binary)
        .args(args)
        .envs(env.iter().copied())
        .env("LD_LIBRARY_PATH", library_path)
        .env("SCOPE_MOCK_NVRTC_DUMP", &dump)
        // A child that required a device would fail for the wrong reason.
        .env_remove("SCOPE_REQUIRE")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", binary.display()))?;
    let started = Instant::now();
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
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display())))
        .collect::<Result<_, _>>()?;
    sources.sort();
    if sources.is_empty() {
        return Err(format!(
            "{} compiled no CUDA C++ on the mock ({summary}); its output is in {}",
            binary.display(),
            log.display()
        ));
    }
    Ok(Collected {
        what,
        sources,
        summary,
    })
}

/// The `runtime_cuda` test binary of the same build: named by
/// `SCOPE_CUBECL_RUNTIME_CUDA`, or the newest `runtime_cuda-<hash>` beside
/// this binary that lists cubecl's tests on CUDA (another feature set's
/// build leaves binaries of the same name without them).
pub fn runtime_cuda() -> Result<PathBuf, String> {
    if let Some(named) = std::env::var_os("SCOPE_CUBECL_RUNTIME_CUDA") {
        return Ok(PathBuf::from(named));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let deps = me.parent().ok_or("this binary has no folder")?;
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(deps)
        .map_err(|e| format!("{}: {e}", deps.display()))?
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix("runtime_cuda-").is_some_and(|hash| {
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
                .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("cuda::"))
        })
        .ok_or_else(|| {
            format!(
                "no runtime_cuda test binary with cubecl's CUDA tests in {} (build every test \
                 binary first: cargo test --workspace --all-features --no-run), or name one \
                 with SCOPE_CUBECL_RUNTIME_CUDA",
                deps.display()
            )
        })
}

/// In the child: cubek's unit matmul and unit reductions on
/// `ScopeRuntime<Cuda>` over the mock, with the shapes, axes and
/// operations `tests/cubek.rs` of scope-cubecl uses, each launch tried on
/// its own (the mock refuses to compile every one of them, after writing
/// it out). How many launches were tried.
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

    let mock = server_cuda::client().expect("the mock driver is first on LD_LIBRARY_PATH");
    let described = mock.describe();
    assert!(
        described.starts_with("Mock"),
        "the child must run on the mock driver, not {described}"
    );
    let client = ScopeRuntime::<server_cuda::Cuda>::client(&ScopeDevice::default());
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
