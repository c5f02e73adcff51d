//! A launch's arguments, packed as bindings in order and one scalar blob.
//!
//! The blob is built by cubecl's own [`InfoBuilder`], so its layout cannot drift. This module
//! adds the checks a raw launch cannot make, above all declared access that covers the
//! kernel's: a written buffer declared read-only would never carry a failure.

use cubecl_core::ir::ElemType;
use cubecl_core::{CubeElement, InfoBuilder, ScalarArgType};
use scope_core::{Access, Backend, Binding, Client, Dispatch, Error, Result, Slice};

use crate::translate::{CubeKernel, io_access};

#[derive(Clone, Copy, Debug)]
struct BufferArg<'a> {
    slice: Slice<'a>,
    /// `None`: bind with the kernel's own answer.
    access: Option<Access>,
    elem_size: u64,
}

/// The arguments of one launch of a [`CubeKernel`], in the kernel's order.
#[derive(Clone, Debug, Default)]
pub struct Args<'a> {
    buffers: Vec<BufferArg<'a>>,
    scalars: Vec<(ElemType, Vec<u8>)>,
}

impl<'a> Args<'a> {
    /// No arguments yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The next buffer, of elements `T`, with a declared access that covers the kernel's.
    pub fn buffer<T: CubeElement>(mut self, binding: Binding<'a>) -> Self {
        self.buffers.push(BufferArg {
            slice: binding.slice,
            access: Some(binding.access),
            elem_size: size_of::<T>() as u64,
        });
        self
    }

    /// The next buffer, of elements `T`, bound with [`CubeKernel::access`].
    pub fn slice<T: CubeElement>(mut self, slice: impl Into<Slice<'a>>) -> Self {
        self.buffers.push(BufferArg {
            slice: slice.into(),
            access: None,
            elem_size: size_of::<T>() as u64,
        });
        self
    }

    /// The next scalar.
    pub fn scalar<T: ScalarArgType>(mut self, value: T) -> Self {
        self.scalars
            .push((T::cube_type(), T::as_bytes(&[value]).to_vec()));
        self
    }
}

fn invalid(kernel: &CubeKernel, why: String) -> Error {
    Error::invalid(format!("arguments of `{}`", kernel.kernel.name()), why)
}

impl CubeKernel {
    /// The bindings and scalar blob for `args`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for wrong counts or types, a partial element, or short access.
    pub fn pack<'a>(&self, args: &Args<'a>) -> Result<(Vec<Binding<'a>>, Vec<u8>)> {
        if args.buffers.len() != self.io.len() {
            return Err(invalid(
                self,
                format!(
                    "the kernel takes {} buffers, {} given",
                    self.io.len(),
                    args.buffers.len()
                ),
            ));
        }
        let mut bindings = Vec::with_capacity(args.buffers.len());
        let mut lengths = Vec::with_capacity(args.buffers.len());
        for (i, (arg, io)) in args.buffers.iter().zip(&self.io).enumerate() {
            let needed = io_access(*io);
            let access = arg.access.unwrap_or(needed);
            if (needed.writes() && !access.writes()) || (needed.reads() && !access.reads()) {
                return Err(invalid(
                    self,
                    format!(
                        "buffer {i} is declared {access:?}, but the kernel's access to it is \
                         {needed:?}; the launch's read and write sets would be wrong"
                    ),
                ));
            }
            let bytes = arg.slice.range.end.saturating_sub(arg.slice.range.start);
            // Bounds checks count the kernel's own elements, whatever `T` the caller named.
            let element = self.element_bytes.get(i).copied().flatten();
            for (size, whose) in [
                (Some(arg.elem_size), "the type given"),
                (element, "the kernel's element"),
            ] {
                if let Some(size) = size.filter(|&size| bytes % size != 0) {
                    return Err(invalid(
                        self,
                        format!(
                            "buffer {i} binds {bytes} bytes, not a whole number of {size}-byte \
                             elements ({whose})"
                        ),
                    ));
                }
            }
            lengths.push(bytes / element.unwrap_or(arg.elem_size));
            bindings.push(Binding {
                slice: arg.slice,
                access,
            });
        }
        let blob = self.info_blob(args, &lengths)?;
        Ok((bindings, blob))
    }

    /// The info struct as bytes: empty when the kernel declares none.
    fn info_blob(&self, args: &Args<'_>, lengths: &[u64]) -> Result<Vec<u8>> {
        let mut given: Vec<(ElemType, usize)> = Vec::new();
        for (ty, _) in &args.scalars {
            match given.iter_mut().find(|(t, _)| t == ty) {
                Some((_, count)) => *count += 1,
                None => given.push((*ty, 1)),
            }
        }
        given.sort_by_key(|(ty, _)| *ty);
        let wanted: Vec<(ElemType, usize)> =
            self.info.scalars.iter().map(|s| (s.ty, s.count)).collect();
        if given != wanted {
            let show = |list: &[(ElemType, usize)]| {
                list.iter()
                    .map(|(ty, n)| format!("{n} × {ty}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(invalid(
                self,
                format!(
                    "the kernel takes scalars [{}], given [{}]",
                    show(&wanted),
                    show(&given)
                ),
            ));
        }
        if !self.info.has_info() {
            return Ok(Vec::new());
        }
        let mut info = InfoBuilder::default();
        for (ty, bytes) in &args.scalars {
            info.scalars.push_raw(bytes, *ty);
        }
        // A blob longer than the struct would not match a by-value parameter.
        if self.info.sized_meta.is_some() {
            for &len in lengths {
                info.metadata.register_buffer(len, self.address_type);
            }
        }
        let packed = info.finish(self.address_type);
        Ok(packed.data.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    /// Pack `args` and launch on `client`.
    ///
    /// # Errors
    ///
    /// What [`pack`](Self::pack) refuses, a foreign language, more workgroup memory than the
    /// device holds (no server checks it), or the launch's error.
    pub fn launch<B: Backend>(
        &self,
        client: &Client<B>,
        args: &Args<'_>,
        dispatch: Dispatch<'_>,
    ) -> Result<()> {
        let language = self.kernel.source().language();
        if !client.with_backend(|backend| backend.accepts(language)) {
            return Err(Error::invalid(
                format!("kernel `{}`", self.kernel.name()),
                format!(
                    "it was translated to {language}, which the {} server does not take",
                    B::NAME
                ),
            ));
        }
        let room = client.limits().launch.max_workgroup_memory;
        if self.shared_memory > room as usize {
            return Err(invalid(
                self,
                format!(
                    "it declares {} bytes of workgroup memory; the device gives a workgroup {room}",
                    self.shared_memory
                ),
            ));
        }
        let (bindings, blob) = self.pack(args)?;
        client.launch(&self.kernel, &bindings, &blob, dispatch)
    }
}
