//! The scope-core conformance suite with `#[cube]` kernels — the very
//! `scope_cube::kernels` fill, copy and add a runtime would use — on the
//! Vulkan server (cubecl's SPIR-V, by device address, validation layer on)
//! and on the wgpu server (cubecl's WGSL) over both of its adapters here.
//!
//! The suite hands each launch its scalars as `u32` values and asks
//! [`Suite::scalar_blob`] for the bytes. cubecl's argument model is not the
//! convention's default (little-endian words): the scalars live in an info
//! struct, grouped by type and padded to eight bytes, followed — the
//! kernels are bounds-checked — by each buffer's length. So this suite
//! answers with [`scope_cube::CubeKernel::pack`] over the suite's own
//! bindings: the blob is cubecl's `InfoBuilder` output for exactly the
//! buffers the suite binds, and the packing also checks that the suite's
//! declared access covers what the compiler says each kernel does.
//!
//! The one kernel that is not a cubecl kernel is `broken` (an entry point
//! its module lacks): the server must refuse it before it reads a blob, so
//! it gets the convention's plain words.

use std::sync::OnceLock;

use scope_core::{Binding, Client, Kernel, Result};
use scope_cube::kernels::{add_kernel, copy_kernel, fill_kernel};
use scope_cube::{Args, CubeKernel, Target};
use scope_test::Suite;

/// The three kernels for one target, translated once per test binary.
struct Kernels {
    fill: CubeKernel,
    copy: CubeKernel,
    add: CubeKernel,
}

impl Kernels {
    fn new(target: Target) -> Self {
        Self {
            fill: fill_kernel(target).expect("fill translates"),
            copy: copy_kernel(target).expect("copy translates"),
            add: add_kernel(target).expect("add translates"),
        }
    }

    /// The cube kernel `kernel` was taken from, by its id (source, entry
    /// point and block).
    fn find(&self, kernel: &Kernel) -> Option<&CubeKernel> {
        [&self.fill, &self.copy, &self.add]
            .into_iter()
            .find(|cube| cube.id() == kernel.id())
    }

    /// The scalar blob for a launch the suite makes: cubecl's info struct
    /// for these bindings and values, or plain words for a kernel that is
    /// not one of ours (`broken`).
    fn blob(&self, kernel: &Kernel, bindings: &[Binding<'_>], values: &[u32]) -> Vec<u8> {
        let Some(cube) = self.find(kernel) else {
            return values.iter().flat_map(|v| v.to_le_bytes()).collect();
        };
        let args = bindings
            .iter()
            .fold(Args::new(), |args, binding| args.buffer::<u32>(*binding));
        let args = values.iter().fold(args, |args, &value| args.scalar(value));
        let (packed, blob) = cube.pack(&args).unwrap_or_else(|error| {
            panic!(
                "the suite's launch of `{}` does not fit the cube kernel: {error}",
                kernel.name()
            )
        });
        assert_eq!(packed.len(), bindings.len(), "packing keeps the bindings");
        blob
    }
}

fn spirv() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| Kernels::new(Target::SpirV))
}

fn wgsl() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| Kernels::new(Target::Wgsl))
}

/// A cube kernel that does not compile on the server: `fill`, asked for an
/// entry point its module does not have. (cubecl refuses a kernel that does
/// not type-check while it expands, before there is any source for the
/// server to refuse.)
fn broken(kernels: &Kernels) -> Kernel {
    // SAFETY: it names no entry point the module has, so it never runs.
    unsafe { kernels.fill.kernel() }
        .clone()
        .entry("no_such_entry_point")
}

struct VulkanCube;

impl Suite for VulkanCube {
    type Backend = server_vulkan::Vulkan;

    fn capabilities() -> &'static [scope_test::Capability] {
        &[scope_test::Capability::Reopen]
    }

    fn client() -> Result<Client<server_vulkan::Vulkan>> {
        let _ = std::fs::create_dir_all("/tmp/xdg");
        server_vulkan::client_with(server_vulkan::Config {
            validation: true,
            fail_on_validation: true,
            force_staging: false,
            ..Default::default()
        })
    }

    fn fill() -> Kernel {
        // SAFETY: the suite launches it only with blobs `Kernels::blob`
        // packs for the launch's own bindings, or with bindings the core
        // refuses before anything runs.
        unsafe { spirv().fill.kernel() }.clone()
    }

    fn copy() -> Kernel {
        // SAFETY: the suite launches it only with blobs `Kernels::blob`
        // packs for the launch's own bindings, or with bindings the core
        // refuses before anything runs.
        unsafe { spirv().copy.kernel() }.clone()
    }

    fn add() -> Kernel {
        // SAFETY: the suite launches it only with blobs `Kernels::blob`
        // packs for the launch's own bindings, or with bindings the core
        // refuses before anything runs.
        unsafe { spirv().add.kernel() }.clone()
    }

    fn broken() -> Kernel {
        broken(spirv())
    }

    fn scalar_blob(kernel: &Kernel, bindings: &[Binding<'_>], values: &[u32]) -> Vec<u8> {
        spirv().blob(kernel, bindings, values)
    }
}

mod vulkan {
    scope_test::conformance_tests!(super::VulkanCube);
}

trait OnApi: 'static {
    const API: server_wgpu::Api;
}

struct WgpuVulkan;
impl OnApi for WgpuVulkan {
    const API: server_wgpu::Api = server_wgpu::Api::Vulkan;
}

struct WgpuGl;
impl OnApi for WgpuGl {
    const API: server_wgpu::Api = server_wgpu::Api::Gl;
}

struct WgpuCube<A>(std::marker::PhantomData<A>);

impl<A: OnApi> Suite for WgpuCube<A> {
    type Backend = server_wgpu::Wgpu;

    fn capabilities() -> &'static [scope_test::Capability] {
        &[scope_test::Capability::Reopen]
    }

    fn client() -> Result<Client<server_wgpu::Wgpu>> {
        server_wgpu::client_with(&server_wgpu::Options::api(A::API))
    }

    fn fill() -> Kernel {
        // SAFETY: the suite launches it only with blobs `Kernels::blob`
        // packs for the launch's own bindings, or with bindings the core
        // refuses before anything runs.
        unsafe { wgsl().fill.kernel() }.clone()
    }

    fn copy() -> Kernel {
        // SAFETY: the suite launches it only with blobs `Kernels::blob`
        // packs for the launch's own bindings, or with bindings the core
        // refuses before anything runs.
        unsafe { wgsl().copy.kernel() }.clone()
    }

    fn add() -> Kernel {
        // SAFETY: the suite launches it only with blobs `Kernels::blob`
        // packs for the launch's own bindings, or with bindings the core
        // refuses before anything runs.
        unsafe { wgsl().add.kernel() }.clone()
    }

    fn broken() -> Kernel {
        broken(wgsl())
    }

    fn scalar_blob(kernel: &Kernel, bindings: &[Binding<'_>], values: &[u32]) -> Vec<u8> {
        wgsl().blob(kernel, bindings, values)
    }
}

mod wgpu_vulkan {
    type Suite = super::WgpuCube<super::WgpuVulkan>;
    scope_test::conformance_tests!(Suite);
}

mod wgpu_gl {
    type Suite = super::WgpuCube<super::WgpuGl>;
    scope_test::conformance_tests!(Suite);
}

/// The packing the suite relies on, checked without a device: the blob is
/// cubecl's (scalars padded to eight bytes, then one length per binding,
/// the binding's and not the buffer's), not the convention's words; a
/// foreign kernel gets the words.
#[test]
fn the_suite_blob_is_cubecls_info_struct() {
    let buffer = scope_core::Client::new(scope_test::host::Host::new())
        .expect("host server")
        .allocate(256)
        .expect("allocate");
    for kernels in [spirv(), wgsl()] {
        // SAFETY: used to pack a blob, never launched.
        let fill = unsafe { kernels.fill.kernel() };
        let blob = kernels.blob(fill, &[Binding::write(&buffer)], &[64, 9]);
        let words: Vec<u32> = blob
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // [n, value] (one u32 group, padded to eight bytes), then the
        // bound buffer's length in elements, then padding.
        assert_eq!(words, [64, 9, 64, 0], "cubecl's info struct");
        let half = kernels.blob(fill, &[buffer.slice(0..128).write()], &[32, 9]);
        assert_eq!(
            half[8..12],
            32u32.to_le_bytes(),
            "the length is the binding's"
        );
        let foreign = broken(kernels);
        assert_eq!(
            kernels.blob(&foreign, &[Binding::write(&buffer)], &[64, 9]),
            [64u32, 9]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>()
        );
    }
}
