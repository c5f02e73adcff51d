//! Tensors and the four operations, issued through the server contract.
//!
//! The runtime is generic over `B: Backend` and touches nothing but
//! [`Client`]: it never matches on a backend, never syncs between kernels,
//! and never checks a launch's result for a failure the bytes will carry.
//! That last point is the one a runtime author is most tempted to get wrong.
//! A launch's error is one of two kinds:
//!
//! - **The request was wrong** (a bad binding, a refusal, a poisoned
//!   device): nothing was claimed, nothing will report it later, so it is
//!   returned at once.
//! - **The work failed or was skipped** (a device fault, a compile error, a
//!   skipped launch): the outputs now carry it, every later kernel that
//!   reads them is skipped, and the host read at the end names the root
//!   cause and the chain. Stopping the pass here would throw that chain
//!   away and leave a half-issued pass, so the runtime logs it and carries
//!   on; [`Runtime::read`] is where the caller learns of it.

use scope_core::{Backend, Binding, Buffer, Client, Dispatch, Error, Kernel, Result};
use scope_cube::{Args, CubeKernel, Target};

use crate::cube::CubeKernels;
use crate::kernels::{Dialect, GROUP, Kernels, ROWS};

/// A row-major `f32` matrix on the device.
#[derive(Clone, Debug)]
pub struct Tensor {
    buffer: Buffer,
    rows: usize,
    cols: usize,
}

impl Tensor {
    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether it holds no elements (never, for a tensor the runtime made).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device buffer, for reports and for work outside the runtime.
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }
}

/// Whether a launch's error is carried by its outputs (so the pass goes on
/// and the read reports it) rather than a rejected request (returned now).
pub fn carried_by_outputs(error: &Error) -> bool {
    matches!(
        error,
        Error::Skipped { .. }
            | Error::Fault(_)
            | Error::Launch { .. }
            | Error::Compile { .. }
            | Error::NeverFinished { .. }
            | Error::OutOfMemory { .. }
            | Error::Unwritten(_)
            | Error::SeveralUnwritten(_)
    ) && !error.is_device_poisoned()
}

fn scalars(values: &[u32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn u32_of(value: usize, what: &str) -> Result<u32> {
    u32::try_from(value)
        .map_err(|_| Error::invalid(what, format!("{value} does not fit the kernels' u32 index")))
}

fn groups(items: usize, per_group: u32) -> Result<u32> {
    u32_of(items.div_ceil(per_group as usize), "workgroup count")
}

/// Which kernels a runtime launches.
///
/// Both paths issue the same launches — same buffers, same dispatch — and
/// differ only in the kernel and how its scalars become the blob: the
/// native kernels take their scalars as plain little-endian `u32`s (the
/// convention's words), the cube kernels as cubecl's info struct, packed
/// by [`Args`] with the bound lengths.
#[derive(Clone, Debug)]
pub enum Path {
    /// Hand-written kernels ([`crate::kernels`]), or any set of the same
    /// shape (the host server's closures in this crate's tests).
    Native(Box<Kernels>),
    /// `#[cube]` kernels ([`crate::cube`]) translated for one target.
    Cube(Box<CubeKernels>),
}

impl Path {
    /// `"native"` or `"cube <target>"`, for reports.
    pub fn describe(&self) -> String {
        match self {
            Path::Native(_) => "native".to_owned(),
            Path::Cube(k) => format!("cube ({:?})", k.matmul.target()),
        }
    }
}

/// One operation, as each path names its kernel.
#[derive(Clone, Copy)]
enum Op {
    Matmul,
    BiasAdd,
    Gelu,
    Softmax,
}

/// A client and the kernels its server compiles.
#[derive(Clone, Debug)]
pub struct Runtime<B: Backend> {
    client: Client<B>,
    path: Path,
}

impl<B: Backend> Runtime<B> {
    /// A runtime over `client` with the `#[cube]` kernels, translated for
    /// the language [`Target::of`] gives its server: SPIR-V for Vulkan,
    /// WGSL for wgpu, CUDA or HIP C++.
    ///
    /// On Vulkan that is SPIR-V reaching buffers by device address, not the
    /// WGSL the server could also take through naga: it is cubecl's own
    /// Vulkan output with no second compiler in between (so what cubecl's
    /// access analysis proved is what runs), scope-cube's tests run it under
    /// the validation layer, and on lavapipe its forward pass was the faster
    /// (0.95–1.03 s against 1.19 s for the WGSL). [`Runtime::cube`] picks the
    /// WGSL instead.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a server cubecl has no target for
    /// (the host server); [`Error::Compile`] when cubecl cannot translate a
    /// kernel.
    pub fn new(client: Client<B>) -> Result<Self> {
        let target = Target::of::<B>().ok_or_else(|| {
            Error::invalid(
                "backend",
                format!("cubecl has no target for the {} server", B::NAME),
            )
        })?;
        Self::cube(client, target)
    }

    /// A runtime over `client` with the `#[cube]` kernels translated for
    /// `target`, which the server must accept (WGSL on the Vulkan server,
    /// say, through naga).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the server does not take `target`'s
    /// language; [`Error::Compile`] when cubecl cannot translate a kernel.
    pub fn cube(client: Client<B>, target: Target) -> Result<Self> {
        let language = target.language();
        if !client.with_backend(|backend| backend.accepts(language)) {
            return Err(Error::invalid(
                "kernel target",
                format!("the {} server does not take {language}", B::NAME),
            ));
        }
        let kernels = CubeKernels::for_target(target)?;
        Ok(Self {
            client,
            path: Path::Cube(Box::new(kernels)),
        })
    }

    /// A runtime over `client` with the hand-written kernels in the first
    /// language its server accepts: the native path.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the server takes neither WGSL, CUDA
    /// C++ nor HIP C++.
    pub fn native(client: Client<B>) -> Result<Self> {
        let dialect = client
            .with_backend(|backend| Dialect::choose(|language| backend.accepts(language)))
            .ok_or_else(|| {
                Error::invalid(
                    "backend",
                    format!("{} accepts none of WGSL, CUDA C++, HIP C++", B::NAME),
                )
            })?;
        // SAFETY: `issue` launches each of these kernels with scalars
        // computed from the shapes of the tensors whose buffers it binds,
        // which is what `for_language` asks.
        let kernels = unsafe { Kernels::for_language(dialect) };
        Ok(Self::with_kernels(client, kernels))
    }

    /// A runtime over `client` with native-path `kernels` of its own
    /// (scalars as plain `u32` words).
    pub fn with_kernels(client: Client<B>, kernels: Kernels) -> Self {
        Self {
            client,
            path: Path::Native(Box::new(kernels)),
        }
    }

    /// The client, for what the runtime does not wrap (capture, faults).
    pub fn client(&self) -> &Client<B> {
        &self.client
    }

    /// The kernels it launches.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Compile every kernel now, so the first pass does not time compiles.
    ///
    /// # Errors
    ///
    /// The first compile error, with the compiler's log.
    pub fn compile(&self) -> Result<()> {
        for op in [Op::Matmul, Op::BiasAdd, Op::Gelu, Op::Softmax] {
            let kernel = match &self.path {
                Path::Native(k) => Self::native_kernel(k, op),
                // SAFETY: compiled here, not launched; `issue` launches it
                // with the blob `pack` makes.
                Path::Cube(k) => unsafe { Self::cube_kernel(k, op).kernel() },
            };
            self.client.compile(kernel)?;
        }
        Ok(())
    }

    fn native_kernel(kernels: &Kernels, op: Op) -> &Kernel {
        match op {
            Op::Matmul => &kernels.matmul,
            Op::BiasAdd => &kernels.bias_add,
            Op::Gelu => &kernels.gelu,
            Op::Softmax => &kernels.softmax,
        }
    }

    fn cube_kernel(kernels: &CubeKernels, op: Op) -> &CubeKernel {
        match op {
            Op::Matmul => &kernels.matmul,
            Op::BiasAdd => &kernels.bias_add,
            Op::Gelu => &kernels.gelu,
            Op::Softmax => &kernels.softmax,
        }
    }

    /// An uninitialised `rows × cols` tensor.
    ///
    /// # Errors
    ///
    /// A zero or oversized shape; a poisoned device. A device out of memory
    /// returns the error here rather than a buffer carrying it.
    pub fn empty(&self, rows: usize, cols: usize) -> Result<Tensor> {
        let bytes = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| Error::invalid("tensor shape", format!("{rows}×{cols} overflows")))?;
        let buffer = self.client.try_allocate(bytes as u64)?;
        Ok(Tensor { buffer, rows, cols })
    }

    /// A `rows × cols` tensor holding `data`.
    ///
    /// # Errors
    ///
    /// As [`empty`](Self::empty) and [`write`](Self::write).
    pub fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Tensor> {
        let tensor = self.empty(rows, cols)?;
        self.write(&tensor, data)?;
        Ok(tensor)
    }

    /// Overwrite all of `tensor` with `data`. The bytes written heal
    /// whatever failure they carried.
    ///
    /// # Errors
    ///
    /// A length other than the tensor's; the device's failure.
    pub fn write(&self, tensor: &Tensor, data: &[f32]) -> Result<()> {
        if data.len() != tensor.len() {
            return Err(Error::invalid(
                "tensor data",
                format!(
                    "{} values for a {}×{} tensor",
                    data.len(),
                    tensor.rows,
                    tensor.cols
                ),
            ));
        }
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.client.write(&tensor.buffer, &bytes)
    }

    /// The values of `tensor`, after the work that writes them.
    ///
    /// # Errors
    ///
    /// [`Error::Unwritten`] when a failure claims them: the root error and
    /// the chain of kernels that were skipped on the way here.
    pub fn read(&self, tensor: &Tensor) -> Result<Vec<f32>> {
        let bytes = self.client.read(&tensor.buffer)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Wait for the stream's work.
    ///
    /// # Errors
    ///
    /// As [`Client::sync`].
    pub fn sync(&self) -> Result<()> {
        self.client.sync()
    }

    /// Launch `op` under `name` over `bindings` (all `f32` buffers): the
    /// native kernel with `native` as its scalar words, or the cube kernel
    /// with `cube` as its `u32` scalars packed into cubecl's info struct.
    fn issue(
        &self,
        op: Op,
        name: &str,
        bindings: &[Binding<'_>],
        native: &[u32],
        cube: &[u32],
        dispatch: Dispatch<'_>,
    ) -> Result<()> {
        let (kernel, bindings, blob) = match &self.path {
            Path::Native(kernels) => (
                crate::kernels::named(Self::native_kernel(kernels, op), name),
                bindings.to_vec(),
                scalars(native),
            ),
            Path::Cube(kernels) => {
                let cube_kernel = Self::cube_kernel(kernels, op);
                let args = bindings
                    .iter()
                    .fold(Args::new(), |args, binding| args.buffer::<f32>(*binding));
                let args = cube.iter().fold(args, |args, &value| args.scalar(value));
                let (bindings, blob) = cube_kernel.pack(&args)?;
                (
                    // SAFETY: launched below with the blob `pack` just made
                    // for these arguments.
                    crate::kernels::named(unsafe { cube_kernel.kernel() }, name),
                    bindings,
                    blob,
                )
            }
        };
        match self.client.launch(&kernel, &bindings, &blob, dispatch) {
            Ok(()) => Ok(()),
            Err(error) if carried_by_outputs(&error) => {
                tracing::debug!(kernel = %kernel.name(), %error, "launch failed; its outputs carry it");
                Ok(())
            }
            Err(error) => Err(error),
        }
    }

    /// A tensor's length, rows and columns as the kernels' `u32`s.
    fn dims(x: &Tensor) -> Result<(u32, u32, u32)> {
        Ok((
            u32_of(x.len(), "length")?,
            u32_of(x.rows, "rows")?,
            u32_of(x.cols, "cols")?,
        ))
    }

    fn expect_shape(what: &str, tensor: &Tensor, rows: usize, cols: usize) -> Result<()> {
        if tensor.rows == rows && tensor.cols == cols {
            Ok(())
        } else {
            Err(Error::invalid(
                what,
                format!("{}×{}, expected {rows}×{cols}", tensor.rows, tensor.cols),
            ))
        }
    }

    /// `out = a · b`, under the kernel name `name`.
    ///
    /// # Errors
    ///
    /// Shapes that do not chain; a rejected launch. A failed or skipped
    /// launch is carried by `out` (see the module documentation).
    pub fn matmul(&self, name: &str, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("matmul rhs", b, a.cols, b.cols)?;
        Self::expect_shape("matmul output", out, a.rows, b.cols)?;
        let dims = [
            u32_of(a.rows, "rows")?,
            u32_of(b.cols, "cols")?,
            u32_of(a.cols, "inner")?,
        ];
        let dispatch = Dispatch::Groups([groups(b.cols, GROUP)?, groups(a.rows, ROWS)?, 1]);
        self.issue(
            Op::Matmul,
            name,
            &[
                Binding::read(&a.buffer),
                Binding::read(&b.buffer),
                Binding::write(&out.buffer),
            ],
            &dims,
            &dims,
            dispatch,
        )
    }

    /// `out = x + bias`, `bias` a `1 × cols` row broadcast down the rows.
    ///
    /// # Errors
    ///
    /// As [`matmul`](Self::matmul).
    pub fn bias_add(&self, name: &str, x: &Tensor, bias: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("bias", bias, 1, x.cols)?;
        Self::expect_shape("bias_add output", out, x.rows, x.cols)?;
        let (len, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::BiasAdd,
            name,
            &[
                Binding::read(&x.buffer),
                Binding::read(&bias.buffer),
                Binding::write(&out.buffer),
            ],
            &[len, cols],
            &[rows, cols],
            Dispatch::linear(groups(x.len(), GROUP)?),
        )
    }

    /// `out = gelu(x)`, elementwise.
    ///
    /// # Errors
    ///
    /// As [`matmul`](Self::matmul).
    pub fn gelu(&self, name: &str, x: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("gelu output", out, x.rows, x.cols)?;
        let (len, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::Gelu,
            name,
            &[Binding::read(&x.buffer), Binding::write(&out.buffer)],
            &[len],
            &[rows, cols],
            Dispatch::linear(groups(x.len(), GROUP)?),
        )
    }

    /// `out = softmax(x)` along each row.
    ///
    /// # Errors
    ///
    /// As [`matmul`](Self::matmul).
    pub fn softmax(&self, name: &str, x: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("softmax output", out, x.rows, x.cols)?;
        let (_, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::Softmax,
            name,
            &[Binding::read(&x.buffer), Binding::write(&out.buffer)],
            &[rows, cols],
            &[rows, cols],
            Dispatch::linear(groups(x.rows, GROUP)?),
        )
    }
}
