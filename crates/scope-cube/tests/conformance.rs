//! The scope-core conformance suite with `#[cube]` kernels, on the Vulkan
//! server (cubecl's SPIR-V, by device address, validation layer on) and on
//! the wgpu server (cubecl's WGSL) over both of its adapters here.
//!
//! The suite's helpers pass their scalars raw, as the binding convention
//! says: little-endian `u32`s, `[n]` for copy and add. cubecl's info struct
//! pads each scalar group to eight bytes (and would append buffer lengths
//! in checked mode), so a kernel with cubecl scalars wants a 16-byte blob
//! where the suite gives 4 — wgpu rightly refuses a binding smaller than
//! the shader's struct. So these kernels take the blob the way the
//! convention hands it over: as their last buffer, `params: &[u32]`. cubecl
//! still declares a table of buffer lengths for every kernel, read only by
//! bounds checks and `len()`; these kernels are compiled unchecked and call
//! no `len()`, and [`WithoutLengths`] drops the table from their definition,
//! so no info struct is left and the bindings are exactly the convention's.
//! (Were a length read after all, the compiler would find no table and the
//! kernel would not compile — loud, never silently wrong.) The kernels in
//! `scope_cube::kernels`, launched through `Args`, use real cubecl scalars;
//! `tests/servers.rs` runs those.

use std::sync::OnceLock;

use cubecl_core as cubecl;
use cubecl_core::prelude::*;

use scope_core::conformance::Suite;
use scope_core::{Client, Kernel, Result};
use scope_cube::{Target, translate};

#[cube(launch)]
fn conformance_fill(out: &mut [u32], params: &[u32]) {
    let n = params[0];
    if (ABSOLUTE_POS as u32) < n {
        out[ABSOLUTE_POS] = params[1];
    }
}

#[cube(launch)]
fn conformance_copy(input: &[u32], out: &mut [u32], params: &[u32]) {
    if (ABSOLUTE_POS as u32) < params[0] {
        out[ABSOLUTE_POS] = input[ABSOLUTE_POS];
    }
}

#[cube(launch)]
fn conformance_add(a: &[u32], b: &[u32], out: &mut [u32], params: &[u32]) {
    if (ABSOLUTE_POS as u32) < params[0] {
        out[ABSOLUTE_POS] = a[ABSOLUTE_POS] + b[ABSOLUTE_POS];
    }
}

/// A definition without cubecl's table of buffer lengths (see the module
/// docs).
struct WithoutLengths<K>(K);

impl<K: KernelMetadata> KernelMetadata for WithoutLengths<K> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn id(&self) -> KernelId {
        self.0.id()
    }

    fn address_type(&self) -> ElemType {
        self.0.address_type()
    }
}

impl<K: CubeKernel> CubeKernel for WithoutLengths<K> {
    fn define(&self) -> KernelDefinition {
        let mut definition = self.0.define();
        definition.info.sized_meta = None;
        definition
    }
}

fn unbound() -> BufferCompilationArg {
    BufferCompilationArg { inplace: None }
}

fn settings(target: Target) -> KernelSettings {
    let mut settings = target.settings([64, 1, 1]);
    settings.execution_mode = ExecutionMode::Unchecked;
    settings
}

/// The three kernels for one target, translated once per test binary.
struct Kernels {
    fill: scope_cube::CubeKernel,
    copy: scope_cube::CubeKernel,
    add: scope_cube::CubeKernel,
}

fn kernels(target: Target) -> Kernels {
    let device = target.device_properties();
    let props = target.target_properties();
    let fill = conformance_fill::ConformanceFill::new(
        settings(target),
        device.clone(),
        props.clone(),
        unbound(),
        unbound(),
    );
    let copy = conformance_copy::ConformanceCopy::new(
        settings(target),
        device.clone(),
        props.clone(),
        unbound(),
        unbound(),
        unbound(),
    );
    let add = conformance_add::ConformanceAdd::new(
        settings(target),
        device,
        props,
        unbound(),
        unbound(),
        unbound(),
        unbound(),
    );
    let kernels = Kernels {
        fill: translate(&WithoutLengths(fill), target).expect("fill translates"),
        copy: translate(&WithoutLengths(copy), target).expect("copy translates"),
        add: translate(&WithoutLengths(add), target).expect("add translates"),
    };
    for k in [&kernels.fill, &kernels.copy, &kernels.add] {
        assert!(
            !k.has_info(),
            "{}: the blob is a buffer, so cubecl must add no info struct",
            k.kernel().name()
        );
    }
    kernels
}

fn spirv() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| kernels(Target::SpirV))
}

fn wgsl() -> &'static Kernels {
    static KERNELS: OnceLock<Kernels> = OnceLock::new();
    KERNELS.get_or_init(|| kernels(Target::Wgsl))
}

/// A cube kernel that does not compile on the server: `fill`, asked for an
/// entry point its module does not have. (cubecl refuses a kernel that does
/// not type-check while it expands, before there is any source for the
/// server to refuse.)
fn broken(kernels: &Kernels) -> Kernel {
    kernels.fill.kernel().clone().entry("no_such_entry_point")
}

struct VulkanCube;

impl Suite for VulkanCube {
    type Backend = server_vulkan::Vulkan;

    fn client() -> Result<Client<server_vulkan::Vulkan>> {
        let _ = std::fs::create_dir_all("/tmp/xdg");
        server_vulkan::client_with(server_vulkan::Config {
            validation: true,
            fail_on_validation: true,
            force_staging: false,
        })
    }

    fn fill() -> Kernel {
        spirv().fill.kernel().clone()
    }

    fn copy() -> Kernel {
        spirv().copy.kernel().clone()
    }

    fn add() -> Kernel {
        spirv().add.kernel().clone()
    }

    fn broken() -> Kernel {
        broken(spirv())
    }

    fn oversized() -> Option<u64> {
        Some(64 << 30)
    }
}

mod vulkan {
    scope_core::conformance_tests!(super::VulkanCube);
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

    fn client() -> Result<Client<server_wgpu::Wgpu>> {
        server_wgpu::client_with(&server_wgpu::Options::api(A::API))
    }

    fn fill() -> Kernel {
        wgsl().fill.kernel().clone()
    }

    fn copy() -> Kernel {
        wgsl().copy.kernel().clone()
    }

    fn add() -> Kernel {
        wgsl().add.kernel().clone()
    }

    fn broken() -> Kernel {
        broken(wgsl())
    }
}

mod wgpu_vulkan {
    type Suite = super::WgpuCube<super::WgpuVulkan>;
    scope_core::conformance_tests!(Suite);
}

mod wgpu_gl {
    type Suite = super::WgpuCube<super::WgpuGl>;
    scope_core::conformance_tests!(Suite);
}
