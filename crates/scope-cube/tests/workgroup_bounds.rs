//! Out-of-bounds indexes in checked `#[cube]` kernels, on every server that
//! runs here.
//!
//! A kernel translated by [`scope_cube::translate`] is safe to launch: the
//! failure model believes that a launch touches only the bytes of its
//! bindings, and no `unsafe` promised anything about the kernel's indexes.
//! So a kernel that indexes past its workgroup (shared) array, or past a
//! buffer (of words, or of vectors), must not reach anything else — however far past it reaches, and
//! with the index read from a buffer so that no compiler folds it away.
//! Each case runs on the Vulkan server (cubecl's SPIR-V and WGSL) and on
//! the wgpu server (both adapters), with buffers allocated on either side
//! of the kernel's, and checks that
//!
//! - the launch is an outcome, never a crash (a typed error is allowed);
//! - every neighbouring buffer keeps its bytes;
//! - the device keeps working: a later `fill → copy → add` gives the right
//!   answer.
//!
//! The translation itself is checked without a device: a checked kernel is
//! never vouched in bounds (`Kernel::vouch_in_bounds`), because cubecl's
//! checked mode does not check every index (see `translate_definition`).

use cubecl_core as cubecl;
use cubecl_core::prelude::*;

use scope_core::{Backend, Binding, Buffer, Client, Dispatch, KernelSource};
use scope_cube::kernels::{self, CUBE};
use scope_cube::{Args, CubeKernel, Target, translate};
use scope_test::client_or_skip;

/// Words of the workgroup array the shared-memory kernel declares.
const SHARED_WORDS: usize = 4;

/// Words of the buffer the kernels write (one cube's worth).
const OUT_WORDS: u32 = CUBE;

/// What the kernels write where they should not.
const POISON: u32 = 0xdead_beef;

/// Each unit writes `shared[at[0] + UNIT_POS]` of a four-word workgroup
/// array, then copies an element that is in bounds out.
#[cube(launch)]
fn writes_past_shared(at: &[u32], out: &mut [u32], #[comptime] words: usize) {
    let mut shared = Shared::new_slice(words);
    let i = UNIT_POS as usize;
    shared[at[0] as usize + i] = POISON;
    out[i] = shared[i % words];
}

/// Each unit writes `out[at[0] + ABSOLUTE_POS]`.
#[cube(launch)]
fn writes_past_global(at: &[u32], out: &mut [u32]) {
    out[at[0] as usize + ABSOLUTE_POS] = POISON;
}

/// Each unit writes `out[at[0] + ABSOLUTE_POS]`, a buffer of four-word
/// vectors: its length, and so its clamp, counts vectors.
#[cube(launch)]
fn writes_past_vectors<N: Size>(at: &[u32], out: &mut [Vector<u32, N>]) {
    out[at[0] as usize + ABSOLUTE_POS] = Vector::new(POISON);
}

fn writes_past_shared_kernel(target: Target) -> CubeKernel {
    let kernel = writes_past_shared::WritesPastShared::new(
        target.settings([CUBE, 1, 1]),
        target.device_properties(),
        target.target_properties(),
        BufferCompilationArg { inplace: None },
        BufferCompilationArg { inplace: None },
        SHARED_WORDS,
    );
    translate(&kernel, target).unwrap_or_else(|e| panic!("{target:?}: {e}"))
}

fn writes_past_global_kernel(target: Target) -> CubeKernel {
    let kernel = writes_past_global::WritesPastGlobal::new(
        target.settings([CUBE, 1, 1]),
        target.device_properties(),
        target.target_properties(),
        BufferCompilationArg { inplace: None },
        BufferCompilationArg { inplace: None },
    );
    translate(&kernel, target).unwrap_or_else(|e| panic!("{target:?}: {e}"))
}

fn writes_past_vectors_kernel(target: Target) -> CubeKernel {
    let kernel = writes_past_vectors::WritesPastVectors::new(
        target.settings([CUBE, 1, 1]),
        target.device_properties(),
        target.target_properties(),
        BufferCompilationArg { inplace: None },
        BufferCompilationArg { inplace: None },
        4,
    );
    translate(&kernel, target).unwrap_or_else(|e| panic!("{target:?}: {e}"))
}

/// The translation of a checked kernel carries no vouch that it stays in
/// bounds: the servers keep their own checks (naga's and wgpu's, for
/// WGSL). cubecl's checked mode leaves a workgroup array's indexes
/// unchecked, so a vouch for a kernel with one would be false.
#[test]
fn a_checked_kernel_with_workgroup_memory_is_not_vouched_in_bounds() {
    for target in Target::ALL {
        let kernel = writes_past_shared_kernel(target);
        assert!(kernel.shared_memory() >= SHARED_WORDS * 4, "{target:?}");
        // SAFETY: inspected, never launched.
        let k = unsafe { kernel.kernel() };
        assert!(
            !k.vouched_in_bounds(),
            "{target:?}: a kernel with workgroup memory is vouched in bounds"
        );
    }
}

/// A CUDA or HIP kernel's shared arrays live in one `extern __shared__`
/// buffer the launch sizes: the kernel carries that size to the server. A
/// launch with none writes outside its block's memory (an H200 faults).
#[test]
fn a_cuda_family_kernel_carries_its_dynamic_shared_memory() {
    for target in Target::ALL {
        let kernel = writes_past_shared_kernel(target);
        // SAFETY: inspected, never launched.
        let k = unsafe { kernel.kernel() };
        let bytes = k.dynamic_shared_memory_bytes() as usize;
        if matches!(target, Target::Cuda | Target::Hip) {
            assert_eq!(bytes, kernel.shared_memory(), "{target:?}");
            assert!(bytes >= SHARED_WORDS * 4, "{target:?}: {bytes}");
        } else {
            assert_eq!(bytes, 0, "{target:?} declares its workgroup memory itself");
        }
    }
    let without = writes_past_global_kernel(Target::Cuda);
    // SAFETY: inspected, never launched.
    assert_eq!(unsafe { without.kernel() }.dynamic_shared_memory_bytes(), 0);
}

/// Nor is a checked kernel without workgroup memory: in cubecl 0.12's
/// checked mode, a buffer index is not checked either.
#[test]
fn a_checked_kernel_is_not_vouched_in_bounds() {
    for target in Target::ALL {
        let kernel = writes_past_global_kernel(target);
        assert_eq!(kernel.shared_memory(), 0, "{target:?}");
        // SAFETY: inspected, never launched.
        let k = unsafe { kernel.kernel() };
        assert!(!k.vouched_in_bounds(), "{target:?}: vouched in bounds");
    }
}

/// Every target's source clamps the indexes cubecl's checked mode leaves
/// alone (`checks.rs` in the crate): each kernel here has a `min` for
/// every index it computes, where cubecl's own output has none. The
/// device cases below show the clamps holding on WGSL and SPIR-V; CUDA
/// and HIP have no device here, so their source is what is checked.
#[test]
fn every_target_clamps_what_cubecl_leaves_unchecked() {
    for target in Target::ALL {
        for kernel in [
            writes_past_shared_kernel(target),
            writes_past_global_kernel(target),
            writes_past_vectors_kernel(target),
        ] {
            // SAFETY: inspected, never launched.
            let k = unsafe { kernel.kernel() };
            match k.source().text() {
                Some(text) => assert!(
                    text.contains("min("),
                    "{target:?}: `{}` clamps no index:\n{text}",
                    k.name()
                ),
                // SPIR-V: `UMin` is GLSL.std.450 instruction 38, an
                // `OpExtInst` (opcode 12) naming it as its fourth operand.
                None => {
                    let KernelSource::SpirV(words) = k.source() else {
                        panic!("{target:?}: neither text nor SPIR-V");
                    };
                    let umin = words.windows(5).any(|w| w[0] & 0xffff == 12 && w[4] == 38);
                    assert!(umin, "{target:?}: `{}` clamps no index", k.name());
                }
            }
        }
    }
}

/// The length a kernel's clamp reads counts the kernel's own elements: a
/// buffer of four-word vectors bound as `u32` words holds a quarter as many
/// (counted in words, an index could run three quarters of the buffer past
/// its end), and a binding that is not whole vectors is refused.
#[test]
fn a_vector_buffers_length_counts_vectors() {
    let c = scope_test::host::client().expect("the host server always starts");
    let at = c.allocate(4).unwrap();
    let out = c.allocate(u64::from(OUT_WORDS) * 4).unwrap();
    for target in Target::ALL {
        let kernel = writes_past_vectors_kernel(target);
        let (_, blob) = kernel
            .pack(&Args::new().slice::<u32>(&at).slice::<u32>(&out))
            .unwrap();
        assert_eq!(words(&blob), vec![1, OUT_WORDS / 4], "{target:?}");
        let refused = kernel
            .pack(&Args::new().slice::<u32>(&at).slice::<u32>(out.slice(0..20)))
            .unwrap_err();
        assert!(
            refused.to_string().contains("16-byte elements"),
            "{target:?}: {refused}"
        );
    }
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn bytes(words: impl IntoIterator<Item = u32>) -> Vec<u8> {
    words.into_iter().flat_map(u32::to_le_bytes).collect()
}

/// A neighbour's contents: distinct per buffer, never [`POISON`].
fn pattern(k: u32) -> Vec<u32> {
    (0..OUT_WORDS).map(|i| (k << 16) | i).collect()
}

/// Buffers on either side of the kernel's own, with their contents.
struct Neighbours {
    buffers: Vec<(Buffer, Vec<u32>)>,
}

impl Neighbours {
    fn around<B: Backend>(client: &Client<B>, first: u32) -> Self {
        let buffers = (first..first + 8)
            .map(|k| {
                let words = pattern(k);
                (client.upload(&bytes(words.iter().copied())).unwrap(), words)
            })
            .collect();
        Self { buffers }
    }

    fn assert_intact<B: Backend>(&self, client: &Client<B>, case: &str) {
        for (n, (buffer, expected)) in self.buffers.iter().enumerate() {
            let got = words(&client.read(buffer).unwrap());
            if let Some(i) = (0..got.len()).find(|&i| got[i] != expected[i]) {
                panic!(
                    "{case}: neighbour {n} changed at word {i}: {:#010x}, expected {:#010x}",
                    got[i], expected[i]
                );
            }
        }
    }
}

/// `fill → copy → add` on fresh buffers: the device still computes.
fn still_computes<B: Backend>(client: &Client<B>, target: Target, case: &str) {
    let n = 1000u32;
    let input: Vec<u32> = (0..n).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let words_in = client.upload(&bytes(input.iter().copied())).unwrap();
    let sevens = client.allocate(u64::from(n) * 4).unwrap();
    let copied = client.allocate(u64::from(n) * 4).unwrap();
    let sum = client.allocate(u64::from(n) * 4).unwrap();
    let groups = Dispatch::linear(n.div_ceil(CUBE));
    kernels::fill_kernel(target)
        .unwrap()
        .launch(
            client,
            &Args::new()
                .buffer::<u32>(Binding::write(&sevens))
                .scalar(n)
                .scalar(7u32),
            groups,
        )
        .unwrap();
    kernels::copy_kernel(target)
        .unwrap()
        .launch(
            client,
            &Args::new()
                .slice::<u32>(&sevens)
                .slice::<u32>(&copied)
                .scalar(n),
            groups,
        )
        .unwrap();
    kernels::add_kernel(target)
        .unwrap()
        .launch(
            client,
            &Args::new()
                .slice::<u32>(&words_in)
                .slice::<u32>(&copied)
                .slice::<u32>(&sum)
                .scalar(n),
            groups,
        )
        .unwrap();
    let got = words(&client.read(&sum).unwrap());
    let expected: Vec<u32> = input.iter().map(|w| w.wrapping_add(7)).collect();
    assert_eq!(
        got, expected,
        "{case}: the device computes wrongly afterwards"
    );
}

/// How far past the array or buffer the first unit writes, in words: just
/// past it, a little further, and far enough to leave any page it shares.
const PAST: [u32; 3] = [OUT_WORDS, 1000, 1 << 20];

/// Launch `kernel` (one of the two above) once for each of [`PAST`] on
/// `client`, with neighbours around its buffers, and check what the module
/// docs list.
fn survives<B: Backend>(
    client: &Client<B>,
    name: &str,
    kernel: &CubeKernel,
    target: Target,
    groups: u32,
) {
    for past in PAST {
        let case = format!("{name}, `{}` at +{past}", kernel.name());
        let before = Neighbours::around(client, 0);
        let at = client.upload(&bytes([past])).unwrap();
        let out = client.upload(&bytes(vec![0; OUT_WORDS as usize])).unwrap();
        let after = Neighbours::around(client, 8);
        let launched = kernel.launch(
            client,
            &Args::new().slice::<u32>(&at).slice::<u32>(&out),
            Dispatch::linear(groups),
        );
        // Either outcome is the kernel's own: what it wrote is its output's.
        let read = client.read(&out).map(|b| words(&b));
        println!("{case}: launch {launched:?}, output read {}", read.is_ok());
        before.assert_intact(client, &case);
        after.assert_intact(client, &case);
        assert_eq!(
            words(&client.read(&at).unwrap()),
            vec![past],
            "{case}: the index buffer changed"
        );
        still_computes(client, target, &case);
    }
}

fn vulkan() -> Option<Client<server_vulkan::Vulkan>> {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    client_or_skip(server_vulkan::client)
}

fn wgpu_clients() -> Vec<(&'static str, Client<server_wgpu::Wgpu>)> {
    let _ = std::fs::create_dir_all("/tmp/xdg");
    [
        ("wgpu vulkan", server_wgpu::Api::Vulkan),
        ("wgpu gl", server_wgpu::Api::Gl),
    ]
    .into_iter()
    .filter_map(|(name, api)| {
        client_or_skip(|| server_wgpu::client_with(&server_wgpu::Options::api(api)))
            .map(|c| (name, c))
    })
    .collect()
}

/// WGSL only: cubecl's SPIR-V for a kernel with workgroup memory makes
/// lavapipe (Mesa 22.3) crash inside `vkCreateComputePipelines`, in bounds
/// or not (docs/CUBECL.md, risk 9). Its clamps are the same IR as the
/// WGSL's, checked in [`every_target_clamps_what_cubecl_leaves_unchecked`].
#[test]
fn a_workgroup_array_indexed_out_of_bounds_reaches_nothing_on_vulkan() {
    let Some(c) = vulkan() else {
        return;
    };
    let kernel = writes_past_shared_kernel(Target::Wgsl);
    survives(&c, "vulkan Wgsl", &kernel, Target::Wgsl, 1);
}

#[test]
fn a_workgroup_array_indexed_out_of_bounds_reaches_nothing_on_wgpu() {
    for (name, c) in wgpu_clients() {
        let kernel = writes_past_shared_kernel(Target::Wgsl);
        survives(&c, name, &kernel, Target::Wgsl, 1);
    }
}

#[test]
fn a_buffer_indexed_out_of_bounds_reaches_nothing_on_vulkan() {
    let Some(c) = vulkan() else {
        return;
    };
    for target in [Target::SpirV, Target::Wgsl] {
        let kernel = writes_past_global_kernel(target);
        survives(&c, &format!("vulkan {target:?}"), &kernel, target, 4);
    }
}

#[test]
fn a_buffer_indexed_out_of_bounds_reaches_nothing_on_wgpu() {
    for (name, c) in wgpu_clients() {
        let kernel = writes_past_global_kernel(Target::Wgsl);
        survives(&c, name, &kernel, Target::Wgsl, 4);
    }
}

#[test]
fn a_vector_buffer_indexed_out_of_bounds_reaches_nothing_on_vulkan() {
    let Some(c) = vulkan() else {
        return;
    };
    for target in [Target::SpirV, Target::Wgsl] {
        let kernel = writes_past_vectors_kernel(target);
        survives(&c, &format!("vulkan {target:?}"), &kernel, target, 1);
    }
}

#[test]
fn a_vector_buffer_indexed_out_of_bounds_reaches_nothing_on_wgpu() {
    for (name, c) in wgpu_clients() {
        let kernel = writes_past_vectors_kernel(Target::Wgsl);
        survives(&c, name, &kernel, Target::Wgsl, 1);
    }
}
