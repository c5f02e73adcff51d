//! Translation and argument packing, checked without a device: what each
//! target's source looks like at the seams scope relies on, the blob's
//! layout, and every refusal. Buffers come from the reference host server;
//! nothing here launches on it except the one refusal that must happen
//! before a launch.

use cubecl_core as cubecl;
use cubecl_core::prelude::*;

use scope_core::{Access, Binding, Dispatch, Error, KernelSource, Language};
use scope_cube::kernels::{self, CUBE};
use scope_cube::{Args, Target, translate};

fn host() -> scope_core::Client<scope_test::host::Host> {
    scope_test::host::client().expect("the host server always starts")
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn every_kernel_translates_for_every_target() {
    for target in Target::ALL {
        for kernel in [
            kernels::fill_kernel(target),
            kernels::copy_kernel(target),
            kernels::add_kernel(target),
            kernels::mix_kernel(target),
            kernels::blend_kernel(target),
        ] {
            let kernel = kernel.unwrap_or_else(|e| panic!("{target:?}: {e}"));
            // SAFETY: inspected, never launched.
            let k = unsafe { kernel.kernel() };
            assert_eq!(k.source().language(), target.language());
            // The entry point is cubecl's, with its build hash; the name is
            // the function's.
            assert!(
                k.entry_point().starts_with(&format!("{}_", k.name())),
                "{target:?}: entry {} for {}",
                k.entry_point(),
                k.name()
            );
            match k.source() {
                KernelSource::Cuda(text) | KernelSource::Hip(text) => {
                    assert_eq!(k.block_size(), [CUBE, 1, 1]);
                    // The info struct is the last parameter, by value: the
                    // convention's scalar blob.
                    let signature = text
                        .lines()
                        .find(|l| l.contains(k.entry_point()))
                        .expect("the entry point is defined");
                    assert!(signature.contains("extern \"C\" __global__"), "{signature}");
                    assert!(signature.contains("info_st const info"), "{signature}");
                    assert!(!signature.contains("info_st const*"), "{signature}");
                    if target == Target::Cuda {
                        assert!(signature.contains("__grid_constant__"), "{signature}");
                    }
                }
                KernelSource::Wgsl(text) => {
                    // One storage buffer per argument, the info at the next
                    // binding, read-only.
                    let n = kernel.buffers();
                    assert!(
                        text.contains(&format!(
                            "@group(0) @binding({n}) var<storage, read> info_var"
                        )),
                        "{text}"
                    );
                    assert!(text.contains(&format!("fn {}(", k.entry_point())));
                }
                KernelSource::SpirV(words) => assert_eq!(words[0], 0x0723_0203),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

#[test]
fn the_compiler_answers_each_buffers_access() {
    let fill = kernels::fill_kernel(Target::Wgsl).unwrap();
    assert_eq!(fill.access(0), Some(Access::Write));
    assert_eq!(fill.access(1), None);
    let add = kernels::add_kernel(Target::SpirV).unwrap();
    assert_eq!(
        (0..3).map(|i| add.access(i).unwrap()).collect::<Vec<_>>(),
        vec![Access::Read, Access::Read, Access::Write]
    );
}

/// The blob is cubecl's info struct: scalars by type, each group padded to
/// eight bytes, then one length per buffer (in elements), padded likewise.
#[test]
fn the_blob_is_cubecls_info_struct() {
    let c = host();
    let out = c.allocate(64 * 4).unwrap();
    let fill = kernels::fill_kernel(Target::Wgsl).unwrap();
    let (bindings, blob) = fill
        .pack(&Args::new().slice::<u32>(&out).scalar(5u32).scalar(9u32))
        .unwrap();
    assert_eq!(bindings.len(), 1);
    assert_eq!(bindings[0].access, Access::Write);
    assert_eq!(words(&blob), vec![5, 9, 64, 0]);

    // Two scalar types: grouped, in the order the kernel's struct declares.
    let blend = kernels::blend_kernel(Target::Cuda).unwrap();
    let order = blend.scalars();
    assert_eq!(
        order,
        vec![("f32".to_owned(), 1), ("u32".to_owned(), 1)],
        "floats sort before unsigned integers, whatever the argument order"
    );
    let x = c.allocate(10 * 4).unwrap();
    let (_, blob) = blend
        .pack(
            &Args::new()
                .slice::<f32>(&x)
                .slice::<f32>(x.slice(0..20))
                .slice::<f32>(&x)
                .scalar(1.5f32)
                .scalar(7u32),
        )
        .unwrap();
    let alpha = 1.5f32.to_bits();
    assert_eq!(words(&blob), vec![alpha, 0, 7, 0, 10, 5, 10, 0]);
}

#[test]
fn declared_access_must_cover_the_kernels() {
    let c = host();
    let a = c.allocate(256).unwrap();
    let b = c.allocate(256).unwrap();
    let copy = kernels::copy_kernel(Target::SpirV).unwrap();
    // The output declared read-only would never carry a failure.
    let error = copy
        .pack(
            &Args::new()
                .buffer::<u32>(Binding::read(&a))
                .buffer::<u32>(Binding::read(&b))
                .scalar(64u32),
        )
        .unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument { why, .. } if why.contains("buffer 1 is declared Read")),
        "{error}"
    );
    // The input declared write-only would be run on even when tainted.
    let error = copy
        .pack(
            &Args::new()
                .buffer::<u32>(Binding::write(&a))
                .buffer::<u32>(Binding::write(&b))
                .scalar(64u32),
        )
        .unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument { why, .. } if why.contains("buffer 0")),
        "{error}"
    );
    // Wider than needed is fine: it only makes the sets larger.
    let (bindings, _) = copy
        .pack(
            &Args::new()
                .buffer::<u32>(Binding::read_write(&a))
                .buffer::<u32>(Binding::read_write(&b))
                .scalar(64u32),
        )
        .unwrap();
    assert!(bindings.iter().all(|b| b.access == Access::ReadWrite));
}

#[test]
fn wrong_arguments_are_refused() {
    let c = host();
    let a = c.allocate(256).unwrap();
    let fill = kernels::fill_kernel(Target::Wgsl).unwrap();
    let refused = |args: Args<'_>, needle: &str| {
        let error = fill.pack(&args).unwrap_err();
        assert!(
            matches!(&error, Error::InvalidArgument { why, .. } if why.contains(needle)),
            "{error}"
        );
    };
    refused(
        Args::new().scalar(1u32).scalar(2u32),
        "takes 1 buffers, 0 given",
    );
    refused(
        Args::new()
            .slice::<u32>(&a)
            .slice::<u32>(&a)
            .scalar(1u32)
            .scalar(2u32),
        "takes 1 buffers, 2 given",
    );
    refused(Args::new().slice::<u32>(&a).scalar(1u32), "given [1 × u32]");
    refused(
        Args::new().slice::<u32>(&a).scalar(1u32).scalar(2.0f32),
        "takes scalars [2 × u32]",
    );
    refused(
        Args::new()
            .slice::<u32>(a.slice(0..6))
            .scalar(1u32)
            .scalar(2u32),
        "not a whole number of 4-byte elements",
    );
}

#[test]
fn a_language_the_server_does_not_take_is_refused_before_launching() {
    let c = host();
    let a = c.allocate(256).unwrap();
    let fill = kernels::fill_kernel(Target::Wgsl).unwrap();
    let error = fill
        .launch(
            &c,
            &Args::new().slice::<u32>(&a).scalar(64u32).scalar(1u32),
            Dispatch::linear(1),
        )
        .unwrap_err();
    assert!(
        matches!(&error, Error::InvalidArgument { why, .. } if why.contains("WGSL")),
        "{error}"
    );
    assert!(c.read(&a).is_ok(), "nothing was claimed");
    assert_eq!(Target::of::<server_vulkan::Vulkan>(), Some(Target::SpirV));
    assert_eq!(Target::of::<server_wgpu::Wgpu>(), Some(Target::Wgsl));
    assert_eq!(Target::of::<server_cuda::Cuda>(), Some(Target::Cuda));
    assert_eq!(Target::of::<server_hip::Hip>(), Some(Target::Hip));
    assert_eq!(Target::of::<scope_test::host::Host>(), None);
    assert_eq!(Target::Hip.language(), Language::Hip);
}

/// Every backend of the table has a target, and each target names the
/// backend its errors are reported under.
#[test]
fn every_backend_has_a_target_and_back() {
    for &kind in scope_core::BackendKind::ALL {
        assert_eq!(Target::for_kind(kind).kind(), kind);
    }
    for target in Target::ALL {
        assert_eq!(Target::for_kind(target.kind()), target);
    }
}

fn expansion_refuses() -> u32 {
    panic!("this kernel refuses to expand")
}

#[cube(launch)]
fn panics_while_expanding(out: &mut [u32]) {
    let value = comptime![expansion_refuses()];
    out[ABSOLUTE_POS] = value;
}

#[test]
fn a_kernel_that_panics_while_expanding_is_a_compile_error() {
    let target = Target::Wgsl;
    let panicking = panics_while_expanding::PanicsWhileExpanding::new(
        target.settings([CUBE, 1, 1]),
        target.device_properties(),
        target.target_properties(),
        BufferCompilationArg { inplace: None },
    );
    let error = translate(&panicking, target).unwrap_err();
    assert!(
        matches!(&error, Error::Compile { log, .. } if log.contains("refuses to expand")),
        "{error}"
    );
}

/// `translate` is safe because a checked definition gets bounds checks
/// (`translate_definition` clamps every index), so a kernel defined
/// without them (cubecl's unchecked mode, which a caller chooses with
/// `launch_unchecked`) is refused for every target rather than launched
/// with no checks at all.
#[test]
fn a_kernel_defined_without_checks_is_refused_for_every_target() {
    for target in [Target::Cuda, Target::Hip, Target::SpirV, Target::Wgsl] {
        let settings = KernelSettings::new(
            *CubeDim::new_1d(CUBE),
            ExecutionMode::Unchecked,
            AddressType::U32,
        );
        let fill = kernels::fill::Fill::new(
            settings,
            target.device_properties(),
            target.target_properties(),
            BufferCompilationArg { inplace: None },
            (),
            (),
        );
        let error = translate(&fill, target).unwrap_err();
        assert!(
            matches!(&error, Error::Compile { log, .. } if log.contains("Unchecked mode")),
            "{target:?}: {error}"
        );
    }
}

#[cube(launch)]
fn reads_a_shape(input: &Tensor<u32>, out: &mut [u32]) {
    out[ABSOLUTE_POS] = input.shape(0) as u32 + input.stride(0) as u32;
}

/// `reads_a_shape`, compiled for `target`.
fn reads_a_shape_kernel(target: Target) -> reads_a_shape::ReadsAShape {
    reads_a_shape::ReadsAShape::new(
        target.settings([CUBE, 1, 1]),
        target.device_properties(),
        target.target_properties(),
        TensorCompilationArg {
            meta: TensorMetaCompilationArg { len: (), rank: () },
            buffer: BufferCompilationArg { inplace: None },
        },
        BufferCompilationArg { inplace: None },
    )
}

/// A kernel that reads a tensor's shape or strides needs metadata the scope
/// convention has no place for (buffers and one scalar blob): every target
/// refuses it at translation, naming why, rather than producing a kernel
/// that would read garbage for its shape.
#[test]
fn a_kernel_with_tensor_metadata_is_refused_for_every_target() {
    for target in [Target::Cuda, Target::Hip, Target::SpirV, Target::Wgsl] {
        let error = translate(&reads_a_shape_kernel(target), target).unwrap_err();
        assert!(
            matches!(&error, Error::Compile { log, .. } if log.contains("tensor metadata")),
            "{target:?}: {error}"
        );
    }
}

fn reads_a_shape_definition(target: Target) -> cubecl_core::prelude::KernelDefinition {
    cubecl_core::define_kernel(&reads_a_shape_kernel(target)).expect("the kernel expands")
}

/// The parameter list of `entry` in C++ `text`, one entry per parameter.
fn cpp_parameters(text: &str, entry: &str) -> Vec<String> {
    let at = text
        .find(&format!("{entry}("))
        .unwrap_or_else(|| panic!("no `{entry}(` in {text}"));
    let open = at + entry.len() + 1;
    let close = open + text[open..].find(')').expect("the parameter list closes");
    text[open..close]
        .split(',')
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// What `translate_definition` gives a runtime that packs cubecl's whole
/// info struct: on CUDA and HIP the kernel's parameters are its buffers,
/// the metadata pointer, then the info struct by value — the layout
/// `binds_tensor_metadata` promises (a scope launch whose last binding is
/// the metadata and whose blob is the info up to the dynamic offset); on
/// WGSL and SPIR-V the metadata stays inside the blob.
#[test]
fn tensor_metadata_is_the_last_binding_on_the_cuda_family_only() {
    for target in Target::ALL {
        // SAFETY: a checked definition; inspected, never launched.
        let kernel = unsafe {
            scope_cube::translate_definition(
                reads_a_shape_definition(target),
                target,
                &scope_cube::Translation::default(),
            )
        }
        .unwrap_or_else(|e| panic!("{target:?}: {e}"));
        let words = [1, 2, 3, 4, 5];
        let (blob, metadata) = kernel.split_info(&words, 3);
        match target {
            Target::Cuda | Target::Hip => {
                assert!(kernel.binds_tensor_metadata(), "{target:?}");
                assert_eq!((blob, metadata), (&words[..3], Some(&words[3..])));
                // An offset past the end is no dynamic part, never a panic.
                assert_eq!(kernel.split_info(&words, 9), (&words[..], Some(&[][..])));
                // SAFETY: inspected, never launched.
                let k = unsafe { kernel.kernel() };
                let (KernelSource::Cuda(text) | KernelSource::Hip(text)) = k.source() else {
                    panic!("{target:?}: C++ expected");
                };
                let parameters = cpp_parameters(text, k.entry_point());
                assert_eq!(parameters.len(), kernel.buffers() + 2, "{parameters:?}");
                // The name is the last word; cubecl numbers it (`dynamic_meta_v25`).
                let name = |p: &str| p.rsplit(' ').next().unwrap_or_default().to_owned();
                let metadata = &parameters[kernel.buffers()];
                assert!(
                    metadata.contains('*') && name(metadata).starts_with("dynamic_meta"),
                    "{target:?}: the parameter after the buffers is the metadata pointer: \
                     {parameters:?}"
                );
                let info = parameters.last().expect("two at least");
                assert!(
                    name(info).starts_with("info") && !info.contains('*'),
                    "{target:?}: the last parameter is the info struct by value: {parameters:?}"
                );
            }
            Target::Wgsl | Target::SpirV => {
                assert!(!kernel.binds_tensor_metadata(), "{target:?}");
                assert_eq!((blob, metadata), (&words[..], None));
            }
        }
    }
}

#[cube(launch)]
fn reverses_through_shared(out: &mut [u32], #[comptime] words: usize) {
    let mut shared = Shared::new_slice(words);
    let i = UNIT_POS as usize;
    if i < words {
        shared[words - i - 1] = out[i];
    }
    sync_cube();
    if i < words {
        out[i] = shared[i];
    }
}

fn reverses_through_shared_kernel(target: Target, words: usize) -> scope_cube::CubeKernel {
    let kernel = reverses_through_shared::ReversesThroughShared::new(
        target.settings([CUBE, 1, 1]),
        target.device_properties(),
        target.target_properties(),
        BufferCompilationArg { inplace: None },
        words,
    );
    // Through a trait object, as a runtime's launcher holds its kernels.
    let as_dyn: &dyn cubecl::CubeKernel = &kernel;
    translate(as_dyn, target).unwrap_or_else(|e| panic!("{target:?}: {e}"))
}

/// Every target reports the workgroup memory its compiled kernel declares,
/// and a launch on a server whose workgroups hold less is refused before it
/// runs, as an invalid argument that claims nothing.
#[test]
fn workgroup_memory_is_reported_and_held_to_the_device() {
    for target in Target::ALL {
        let kernel = reverses_through_shared_kernel(target, 64);
        assert!(
            kernel.shared_memory() >= 64 * 4,
            "{target:?}: {} bytes",
            kernel.shared_memory()
        );
    }
    let _ = std::fs::create_dir_all("/tmp/xdg");
    let Some(c) = scope_test::client_or_skip(|| {
        server_vulkan::client_with(server_vulkan::Config {
            validation: true,
            fail_on_validation: true,
            force_staging: false,
            ..Default::default()
        })
    }) else {
        return;
    };
    let room = c.limits().launch.max_workgroup_memory as usize;
    let out = c.upload(&[0u8; 256]).unwrap();
    let too_big = reverses_through_shared_kernel(Target::SpirV, room / 4 + 1024);
    let refused = too_big
        .launch(&c, &Args::new().slice::<u32>(&out), Dispatch::linear(1))
        .unwrap_err();
    assert!(
        matches!(&refused, Error::InvalidArgument { why, .. } if why.contains("workgroup memory")),
        "{refused}"
    );
    assert_eq!(c.failures_held(), 0);
    // WGSL: cubecl's SPIR-V for this kernel makes lavapipe (Mesa 22.3)
    // crash while it creates the pipeline; see docs/CUBECL.md (9).
    let fits = reverses_through_shared_kernel(Target::Wgsl, 64);
    c.write(
        &out,
        &(0..64u32).flat_map(u32::to_le_bytes).collect::<Vec<_>>(),
    )
    .unwrap();
    fits.launch(&c, &Args::new().slice::<u32>(&out), Dispatch::linear(1))
        .unwrap();
    assert_eq!(
        words(&c.read(&out).unwrap()),
        (0..64u32).rev().collect::<Vec<_>>()
    );
}
