//! The bounds checks cubecl's checked mode promises, made before a checked
//! definition reaches a compiler.
//!
//! A `#[cube]` kernel's `list[i]` becomes an `IndexOp` marked *checked*,
//! and in [`ExecutionMode::Checked`](cubecl_core::prelude::ExecutionMode)
//! each compiler runs cubecl's `CheckedIo` pass to clamp it. In
//! cubecl 0.12.0-pre.1 that pass clamps nothing:
//!
//! - it matches an index only when the *type of its base* is a
//!   `RuntimeArrayType` (`cubecl-core/src/post_processing/checked_io.rs:22`,
//!   `is_runtime_array` at `:49-52`), but the base of an `IndexOp` is always
//!   a pointer (`OperandNOfType<0, PointerType>`,
//!   `cubecl-ir/src/dialect/memory.rs:269-282`; a buffer argument is a
//!   `PointerType` to the runtime array, `cubecl-ir/src/scope.rs:930-931`),
//!   so a buffer index is never matched — the WGSL, SPIR-V and C++ it
//!   produces index buffers with no check at all;
//! - and had it looked through the pointer, it was still written for
//!   buffers only: a workgroup (`Shared::new_slice`) or local
//!   (`Array::new`) array is a fixed-size `ArrayType`
//!   (`cubecl-core/src/frontend/container/shared_memory.rs:55-66`,
//!   `array/base.rs:51-53`), which it leaves alone, and its clamp reads a
//!   length only a buffer binding has (`cubecl-core/src/io.rs:74-78`).
//!
//! So [`clamp_indices`] does what the pass means to do, for every array:
//! each checked index into a buffer becomes `min(index, len - 1)`, with
//! `len` the binding's length from the info struct (the expansion cubecl's
//! pass would have used, `cubecl_core::io::expand_checked_index`), scaled
//! when the kernel reinterprets the buffer at another vector width; each
//! checked index into a workgroup or local array is clamped to the array's
//! own length. The length a buffer's clamp reads must count the kernel's
//! own elements, a vector being one: [`buffer_element_bytes`] tells
//! `CubeKernel::pack` what that is. What is left unchecked is what the
//! kernel's author wrote under `unsafe` (`get_unchecked`), a vector lane
//! chosen at run time (`insert_dynamic`; naga restricts it in WGSL), a
//! binding shorter than one element of the width the kernel reinterprets
//! it at (no index is inside it, so none can be clamped into it), and the
//! instructions that move whole tiles (cmma, tensor maps, asynchronous
//! copies), which no scope WGSL or SPIR-V device offers.

use cubecl_core as cubecl;
use cubecl_core::frontend::buffer_len::expand_buffer_length_native;
use cubecl_core::ir::attributes::{ATTR_BUFFER_BINDING, BufferBindingAttr, FuncInterface};
use cubecl_core::ir::dialect::OperationPtrExt;
use cubecl_core::ir::dialect::memory::IndexOp;
use cubecl_core::ir::interfaces::aliasing::PointerExt;
use cubecl_core::ir::interfaces::{SizedType, TypedExt};
use cubecl_core::ir::pliron::builtin::ops::FuncOp;
use cubecl_core::ir::pliron::value::DefiningEntity;
use cubecl_core::ir::prelude::*;
use cubecl_core::ir::types::{ArrayType, PointerType, RuntimeArrayType};
use cubecl_core::ir::{NamedRewrite, Scope};
use cubecl_core::prelude::*;

/// `min(index, len · times / per − 1)`: the last element of an array of
/// `len` elements seen `per` at a time as `times` (a buffer reinterpreted
/// at another vector width), when `index` is past it.
#[cube]
#[allow(clippy::all)]
fn clamp(index: usize, len: usize, #[comptime] times: usize, #[comptime] per: usize) -> usize {
    index.min(len * times / per - 1)
}

/// What a checked index reaches.
enum Indexed {
    /// A buffer binding: its length, in elements of the binding's own
    /// vector width `root`, is in the info struct; the index counts
    /// elements of width `seen`.
    Buffer { root: usize, seen: usize },
    /// A workgroup or local array of this many elements.
    Array(usize),
    /// A runtime-sized array that is not a binding: nothing says how long
    /// it is.
    Unknown,
}

/// Whether `value`, a pointer, is rooted at an argument of the kernel's
/// entry point that is a buffer binding.
fn is_binding(ctx: &Context, value: Value) -> bool {
    let block = match value.defining_entity() {
        DefiningEntity::Block(block) => Some(block),
        DefiningEntity::Op(_) => value.get_root_defining_block(ctx),
    };
    let Some(block) = block else {
        return false;
    };
    let index = value.find_root_index(ctx);
    let Some(func) = block.deref(ctx).get_parent_op(ctx) else {
        return false;
    };
    func.as_op::<FuncOp>(ctx)
        .is_some_and(|func| func.has_arg_attr(ctx, index, &ATTR_BUFFER_BINDING))
}

/// What the pointer `base` of an index reaches, or `None` for what is not
/// an array (nothing cubecl indexes with a checked `IndexOp`).
fn indexed(ctx: &Context, base: Value) -> Option<Indexed> {
    let inner = {
        let ty = base.get_type(ctx).deref(ctx);
        ty.downcast_ref::<PointerType>()?.inner
    };
    let pointee = inner.deref(ctx);
    if let Some(array) = pointee.downcast_ref::<ArrayType>() {
        return Some(Indexed::Array(array.length));
    }
    pointee.downcast_ref::<RuntimeArrayType>()?;
    drop(pointee);
    if !is_binding(ctx, base) {
        return Some(Indexed::Unknown);
    }
    Some(Indexed::Buffer {
        root: base.get_root_value(ctx).vector_size(ctx),
        seen: base.vector_size(ctx),
    })
}

/// The rewrite: every checked index that reaches an array is clamped to
/// it. An index that cannot be clamped (an empty array, a runtime array
/// of unknown length) is left alone and counted, and the caller refuses
/// the kernel.
#[derive(Default)]
struct ClampIndices {
    unclamped: Vec<String>,
}

impl NamedRewrite for ClampIndices {
    fn name(&self) -> &str {
        "scope-clamp-indices"
    }
}

impl MatchRewrite for ClampIndices {
    fn r#match(&mut self, ctx: &Context, op: Ptr<Operation>) -> bool {
        let Some(index) = Operation::get_op::<IndexOp>(op, ctx) else {
            return false;
        };
        if !index.checked(ctx) {
            return false;
        }
        match indexed(ctx, index.base(ctx)) {
            None => false,
            Some(Indexed::Array(0)) => {
                self.unclamped
                    .push("an index into an empty array".to_owned());
                false
            }
            Some(Indexed::Unknown) => {
                self.unclamped
                    .push("an index into a runtime-sized array that is not a binding".to_owned());
                false
            }
            Some(_) => true,
        }
    }

    fn rewrite(
        &mut self,
        ctx: &mut Context,
        rewriter: &mut MatchRewriter,
        op: Ptr<Operation>,
    ) -> Result<()> {
        let index = Operation::get_op::<IndexOp>(op, ctx).expect("matched an IndexOp");
        let (base, at) = (index.base(ctx), index.index(ctx));
        let reaches = indexed(ctx, base).expect("matched an array");
        let scope = Scope::from_context_and_inserter(ctx, rewriter);
        let clamped = match reaches {
            Indexed::Buffer { root, seen } => {
                let len = expand_buffer_length_native(&scope, base);
                // `len` counts elements `root` wide; the index, `seen` wide.
                let (times, per) = if seen >= root {
                    (1, seen / root)
                } else {
                    (root / seen, 1)
                };
                clamp::expand(&scope, at.into(), len.into(), times, per)
            }
            Indexed::Array(len) => {
                let len = scope.const_usize(len);
                clamp::expand(&scope, at.into(), len.into(), 1, 1)
            }
            Indexed::Unknown => unreachable!("never matched"),
        };
        let clamped = clamped.value(&scope);
        let unchecked = IndexOp::maybe_checked(scope.ctx_mut(), base, clamped, false);
        let value = scope.register_with_result(&unchecked);
        rewriter.replace_operation_with_values(ctx, op, vec![value]);
        Ok(())
    }
}

/// Clamp every checked index of `definition` (a definition in checked mode)
/// to the array it reaches, in place.
///
/// # Errors
///
/// What would stay unchecked — an index into an empty array, or into a
/// runtime-sized array that is not a buffer binding — or a failure of the
/// rewrite itself, as text.
pub(crate) fn clamp_indices(definition: &KernelDefinition) -> std::result::Result<(), String> {
    let module = definition.body.state().module.get_operation();
    let ctx = definition.body.ctx_mut();
    let mut pass = MatchRewritePass(ClampIndices::default());
    pass.run(module, ctx, &mut AnalysisManager::default())
        .map_err(|e| format!("clamping the kernel's indexes failed: {e}"))?;
    match pass.0.unclamped.first() {
        None => Ok(()),
        Some(what) => Err(format!(
            "the kernel has {what}, which no check can keep inside its array"
        )),
    }
}

/// The bytes of one element of each buffer the kernel declares, by buffer
/// position (`None` for a binding that is not a buffer of sized elements).
///
/// A clamp reads a buffer's length from the info struct, in the kernel's
/// own elements, so that is what a launch must put there: a buffer of
/// `Vector<u32, 4>` holds a quarter as many elements as a buffer of `u32`
/// of the same bytes, and a length counted in `u32`s would let an index
/// run three quarters of the buffer past its end.
pub(crate) fn buffer_element_bytes(definition: &KernelDefinition) -> Vec<Option<u64>> {
    let entry = definition.body.state().entry_func;
    let ctx = definition.body.ctx();
    let block = entry.get_entry_block(ctx);
    let arguments = block.deref(ctx).get_num_arguments();
    let mut sizes: Vec<Option<u64>> = Vec::new();
    for i in 0..arguments {
        let Some(position) = entry
            .get_arg_attr::<BufferBindingAttr>(ctx, i, &ATTR_BUFFER_BINDING)
            .map(|binding| binding.buffer_pos)
        else {
            continue;
        };
        let argument = block.deref(ctx).get_argument(i);
        let element = {
            let ty = argument.get_type(ctx).deref(ctx);
            ty.downcast_ref::<PointerType>().and_then(|pointer| {
                pointer
                    .inner
                    .deref(ctx)
                    .downcast_ref::<RuntimeArrayType>()
                    .map(|array| array.inner)
            })
        };
        if sizes.len() <= position {
            sizes.resize(position + 1, None);
        }
        // A type with no size (an opaque one) leaves the caller's count.
        sizes[position] = element.and_then(|element| {
            let ty = element.deref(ctx);
            type_cast::<dyn SizedType>(&*ty).map(|sized| sized.size(ctx) as u64)
        });
    }
    sizes
}
