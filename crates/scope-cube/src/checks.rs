//! The bounds checks cubecl's checked mode promises, made before a definition is compiled.
//!
//! In [`ExecutionMode::Checked`](cubecl_core::prelude::ExecutionMode) each compiler runs
//! cubecl's `CheckedIo` pass on a checked `IndexOp`. In cubecl 0.12.0-pre.1 it clamps nothing:
//! - It matches a base typed `RuntimeArrayType`, but an `IndexOp`'s base is always a pointer
//!   (`checked_io.rs:22`, `memory.rs:269-282`). No buffer index is checked.
//! - It skips workgroup and local arrays, which are fixed-size `ArrayType`s.
//!
//! So [`clamp_indices`] clamps every checked index itself. A buffer index becomes
//! `min(index, len - 1)`, `len` read from the info struct and scaled for a reinterpreted
//! vector width. An array index is clamped to the array's length. [`buffer_element_bytes`]
//! tells `CubeKernel::pack` to count `len` in the kernel's own elements.
//!
//! Left unchecked: `get_unchecked`, a run-time vector lane, a binding shorter than one
//! reinterpreted element, and tile moves, which no scope WGSL or SPIR-V device offers.

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

/// `min(index, len · times / per − 1)`, for a buffer reinterpreted at another vector width.
#[cube]
#[allow(clippy::all)]
fn clamp(index: usize, len: usize, #[comptime] times: usize, #[comptime] per: usize) -> usize {
    index.min(len * times / per - 1)
}

/// What a checked index reaches.
enum Indexed {
    /// A buffer binding: its length counts `root`-wide elements, the index `seen`-wide ones.
    Buffer { root: usize, seen: usize },
    /// A workgroup or local array of this many elements.
    Array(usize),
    /// A runtime-sized array that is not a binding, of no known length.
    Unknown,
}

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

/// What the pointer `base` of an index reaches, or `None` for what is not an array.
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

/// Clamps each checked index to its array, and counts those it cannot clamp.
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

/// Clamp every checked index of `definition` in place; `Err` names an index left unbounded.
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

/// Each buffer's element bytes (`None` if unsized): the unit of the lengths a clamp reads.
/// A `Vector<u32, 4>` buffer's length counted in `u32`s would let an index run past its end.
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
        sizes[position] = element.and_then(|element| {
            let ty = element.deref(ctx);
            type_cast::<dyn SizedType>(&*ty).map(|sized| sized.size(ctx) as u64)
        });
    }
    sizes
}
