//! Tensors and the operations, issued through the server contract.
//!
//! The runtime touches nothing but [`Client`]: it never matches on a backend,
//! never syncs between kernels, and never stops on a failure the bytes carry.
//! A launch's error is one of two kinds:
//!
//! - **The request was wrong** (a bad binding, a refusal, a poisoned device):
//!   nothing will report it later, so it is returned at once.
//! - **The work failed or was skipped**: the outputs carry it, and the host
//!   read names the root cause and the chain. Stopping here would lose that
//!   chain and leave a half-issued pass, so the runtime logs it and goes on.

use scope_core::{Backend, Binding, Buffer, Client, Dispatch, Error, Kernel, Result, Slice};
use scope_cube::{Args, CubeKernel, Target};

use crate::cube::CubeKernels;
use crate::kernels::{Dialect, GROUP, Kernels, ROWS};

/// A row-major `f32` matrix on the device: a buffer, or a part [`Runtime::packed`] laid out.
#[derive(Clone, Debug)]
pub struct Tensor {
    buffer: Buffer,
    offset: u64,
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

    /// The device buffer; a packed tensor is part of it (see [`slice`](Self::slice)).
    pub fn buffer(&self) -> &Buffer {
        &self.buffer
    }

    /// Where its bytes start in [`buffer`](Self::buffer).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Its bytes: what a launch binds, a read reads and a collective moves.
    pub fn slice(&self) -> Slice<'_> {
        self.buffer
            .slice(self.offset..self.offset + self.len() as u64 * 4)
    }
}

/// Whether a launch's error is carried by its outputs, not returned as a rejected request.
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
/// Both paths issue the same launches and differ only in the kernel and its blob:
/// plain `u32` words for native, cubecl's info struct packed by [`Args`] for cube.
#[derive(Clone, Debug)]
pub enum Path {
    /// Hand-written kernels ([`crate::kernels`]), or any set of the same shape.
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

#[derive(Clone, Copy)]
enum Op {
    Matmul,
    BiasAdd,
    Gelu,
    Softmax,
    Transpose,
    GeluGrad,
    LossGrad,
    Sgd,
    ToBf16,
    FromBf16,
}

impl Op {
    const FORWARD: [Op; 4] = [Op::Matmul, Op::BiasAdd, Op::Gelu, Op::Softmax];
    const TRAINING: [Op; 6] = [
        Op::Transpose,
        Op::GeluGrad,
        Op::LossGrad,
        Op::Sgd,
        Op::ToBf16,
        Op::FromBf16,
    ];
}

/// A client and the kernels its server compiles.
#[derive(Clone, Debug)]
pub struct Runtime<B: Backend> {
    client: Client<B>,
    path: Path,
}

impl<B: Backend> Runtime<B> {
    /// A runtime over `client` with the `#[cube]` kernels, translated for
    /// the language [`Target::of`] gives its server.
    ///
    /// On Vulkan that is SPIR-V by device address, not WGSL through naga. No
    /// second compiler stands between cubecl's analysis and what runs, and on
    /// lavapipe it was the faster (0.95–1.03 s against 1.19 s). Fails with
    /// [`Error::InvalidArgument`] for a server cubecl has no target for,
    /// or [`Error::Compile`] when cubecl cannot translate a kernel.
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
    /// `target`, which the server must accept. Fails with [`Error::InvalidArgument`]
    /// when it does not, or [`Error::Compile`] when cubecl cannot translate a kernel.
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

    /// A runtime over `client` with the hand-written kernels in the first language
    /// its server accepts. Fails with [`Error::InvalidArgument`] when it takes none.
    pub fn native(client: Client<B>) -> Result<Self> {
        let dialect = client
            .with_backend(|backend| Dialect::choose(|language| backend.accepts(language)))
            .ok_or_else(|| {
                Error::invalid(
                    "backend",
                    format!("{} accepts none of WGSL, CUDA C++, HIP C++", B::NAME),
                )
            })?;
        // SAFETY: `issue` passes scalars from the bound tensors' shapes, as `for_language` asks.
        let kernels = unsafe { Kernels::for_language(dialect) };
        Ok(Self::with_kernels(client, kernels))
    }

    /// A runtime over `client` with native-path `kernels` of its own.
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

    /// Compile the forward pass's kernels now, so the first pass times no compiles.
    /// Fails with the first compile error, with the compiler's log.
    pub fn compile(&self) -> Result<()> {
        self.compile_ops(&Op::FORWARD)
    }

    /// Compile every kernel a training step launches.
    /// Errors as [`compile`](Self::compile).
    pub fn compile_training(&self) -> Result<()> {
        self.compile_ops(&Op::FORWARD)?;
        self.compile_ops(&Op::TRAINING)
    }

    fn compile_ops(&self, ops: &[Op]) -> Result<()> {
        for &op in ops {
            let kernel = match &self.path {
                Path::Native(k) => Self::native_kernel(k, op),
                // SAFETY: compiled, not launched; `issue` launches it with `pack`'s blob.
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
            Op::Transpose => &kernels.transpose,
            Op::GeluGrad => &kernels.gelu_grad,
            Op::LossGrad => &kernels.loss_grad,
            Op::Sgd => &kernels.sgd,
            Op::ToBf16 => &kernels.to_bf16,
            Op::FromBf16 => &kernels.from_bf16,
        }
    }

    fn cube_kernel(kernels: &CubeKernels, op: Op) -> &CubeKernel {
        match op {
            Op::Matmul => &kernels.matmul,
            Op::BiasAdd => &kernels.bias_add,
            Op::Gelu => &kernels.gelu,
            Op::Softmax => &kernels.softmax,
            Op::Transpose => &kernels.transpose,
            Op::GeluGrad => &kernels.gelu_grad,
            Op::LossGrad => &kernels.loss_grad,
            Op::Sgd => &kernels.sgd,
            Op::ToBf16 => &kernels.to_bf16,
            Op::FromBf16 => &kernels.from_bf16,
        }
    }

    /// An uninitialised `rows × cols` tensor. Fails on a bad shape, a poisoned device,
    /// or no memory (returned here, not carried).
    pub fn empty(&self, rows: usize, cols: usize) -> Result<Tensor> {
        let bytes = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(4))
            .ok_or_else(|| Error::invalid("tensor shape", format!("{rows}×{cols} overflows")))?;
        let buffer = self.client.try_allocate(bytes as u64)?;
        Ok(Tensor {
            buffer,
            offset: 0,
            rows,
            cols,
        })
    }

    /// Tensors of `shapes` in one zeroed buffer at bindable offsets, plus the whole buffer
    /// as `1 × n`, so one collective or launch covers them all. Errors as
    /// [`empty`](Self::empty) and [`write`](Self::write), or no shapes.
    pub fn packed(&self, shapes: &[(usize, usize)]) -> Result<(Tensor, Vec<Tensor>)> {
        if shapes.is_empty() {
            return Err(Error::invalid("packed tensors", "no shapes"));
        }
        let align = self.client.limits().binding_alignment.max(4);
        let mut offsets = Vec::with_capacity(shapes.len());
        let mut end = 0u64;
        for &(rows, cols) in shapes {
            let start = end.div_ceil(align) * align;
            offsets.push(start);
            end = start + (rows * cols) as u64 * 4;
        }
        let words = usize::try_from(end / 4)
            .map_err(|_| Error::invalid("packed tensors", format!("{end} bytes")))?;
        let whole = self.upload(1, words, &vec![0.0; words])?;
        let parts = shapes
            .iter()
            .zip(offsets)
            .map(|(&(rows, cols), offset)| Tensor {
                buffer: whole.buffer.clone(),
                offset,
                rows,
                cols,
            })
            .collect();
        Ok((whole, parts))
    }

    /// A `rows × cols` tensor holding `data`.
    /// Errors as [`empty`](Self::empty) and [`write`](Self::write).
    pub fn upload(&self, rows: usize, cols: usize, data: &[f32]) -> Result<Tensor> {
        let tensor = self.empty(rows, cols)?;
        self.write(&tensor, data)?;
        Ok(tensor)
    }

    /// Overwrite all of `tensor` with `data`, healing any failure it carried.
    /// Fails on a length other than the tensor's, or the device's failure.
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
        self.client.write(tensor.slice(), &bytes)
    }

    /// The values of `tensor`, after the work that writes them. Fails with
    /// [`Error::Unwritten`] when a failure claims them: the root and the skipped chain.
    pub fn read(&self, tensor: &Tensor) -> Result<Vec<f32>> {
        let bytes = self.client.read(tensor.slice())?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Wait for the stream's work. Errors as [`Client::sync`].
    pub fn sync(&self) -> Result<()> {
        self.client.sync()
    }

    /// Launch `op` as `name`: `native` as plain words, or `cube` packed by cubecl.
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
                    // SAFETY: launched below with the blob `pack` just made.
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

    /// `out = a · b`, under the kernel name `name`. Fails on shapes that do not chain
    /// or a rejected launch; a failed launch is carried by `out`.
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
            &[a.slice().read(), b.slice().read(), out.slice().write()],
            &dims,
            &dims,
            dispatch,
        )
    }

    /// `out = x + bias`, `bias` a `1 × cols` row broadcast down the rows.
    /// Errors as [`matmul`](Self::matmul).
    pub fn bias_add(&self, name: &str, x: &Tensor, bias: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("bias", bias, 1, x.cols)?;
        Self::expect_shape("bias_add output", out, x.rows, x.cols)?;
        let (len, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::BiasAdd,
            name,
            &[x.slice().read(), bias.slice().read(), out.slice().write()],
            &[len, cols],
            &[rows, cols],
            Dispatch::linear(groups(x.len(), GROUP)?),
        )
    }

    /// `out = gelu(x)`, elementwise. Errors as [`matmul`](Self::matmul).
    pub fn gelu(&self, name: &str, x: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("gelu output", out, x.rows, x.cols)?;
        let (len, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::Gelu,
            name,
            &[x.slice().read(), out.slice().write()],
            &[len],
            &[rows, cols],
            Dispatch::linear(groups(x.len(), GROUP)?),
        )
    }

    /// `out = softmax(x)` along each row. Errors as [`matmul`](Self::matmul).
    pub fn softmax(&self, name: &str, x: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("softmax output", out, x.rows, x.cols)?;
        let (_, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::Softmax,
            name,
            &[x.slice().read(), out.slice().write()],
            &[rows, cols],
            &[rows, cols],
            Dispatch::linear(groups(x.rows, GROUP)?),
        )
    }
}

/// The operations a training step adds: the backward pass's and the update's.
impl<B: Backend> Runtime<B> {
    /// `out = xᵀ`. Errors as [`matmul`](Self::matmul).
    pub fn transpose(&self, name: &str, x: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("transpose output", out, x.cols, x.rows)?;
        let (_, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::Transpose,
            name,
            &[x.slice().read(), out.slice().write()],
            &[rows, cols],
            &[rows, cols],
            Dispatch::linear(groups(x.len(), GROUP)?),
        )
    }

    /// `out = dy · gelu'(x)`: the gradient through [`gelu`](Self::gelu) at `x`.
    /// Errors as [`matmul`](Self::matmul).
    pub fn gelu_grad(&self, name: &str, x: &Tensor, dy: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("gelu_grad dy", dy, x.rows, x.cols)?;
        Self::expect_shape("gelu_grad output", out, x.rows, x.cols)?;
        let (len, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::GeluGrad,
            name,
            &[x.slice().read(), dy.slice().read(), out.slice().write()],
            &[len],
            &[rows, cols],
            Dispatch::linear(groups(x.len(), GROUP)?),
        )
    }

    /// `out = (probs - targets) / rows`: the mean cross-entropy's gradient at
    /// the logits, `targets` one-hot. Errors as [`matmul`](Self::matmul).
    pub fn loss_grad(
        &self,
        name: &str,
        probs: &Tensor,
        targets: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        Self::expect_shape("loss_grad targets", targets, probs.rows, probs.cols)?;
        Self::expect_shape("loss_grad output", out, probs.rows, probs.cols)?;
        let (len, rows, cols) = Self::dims(probs)?;
        self.issue(
            Op::LossGrad,
            name,
            &[
                probs.slice().read(),
                targets.slice().read(),
                out.slice().write(),
            ],
            &[len, rows],
            &[rows, cols],
            Dispatch::linear(groups(probs.len(), GROUP)?),
        )
    }

    /// `x` in `bf16`, two values to each of `out`'s words: `out` is `1 × ⌈len / 2⌉`.
    /// Errors as [`matmul`](Self::matmul).
    pub fn to_bf16(&self, name: &str, x: &Tensor, out: &Tensor) -> Result<()> {
        let words = x.len().div_ceil(2);
        Self::expect_shape("bf16 output", out, 1, words)?;
        let (len, rows, cols) = Self::dims(x)?;
        self.issue(
            Op::ToBf16,
            name,
            &[x.slice().read(), out.slice().write()],
            &[len],
            &[rows, cols],
            Dispatch::linear(groups(words, GROUP)?),
        )
    }

    /// `packed`'s `bf16` values into `out`, exactly: `packed` is `1 × ⌈len / 2⌉` of
    /// `out`. Errors as [`matmul`](Self::matmul).
    pub fn from_bf16(&self, name: &str, packed: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("bf16 input", packed, 1, out.len().div_ceil(2))?;
        let (len, rows, cols) = Self::dims(out)?;
        self.issue(
            Op::FromBf16,
            name,
            &[packed.slice().read(), out.slice().write()],
            &[len],
            &[rows, cols],
            Dispatch::linear(groups(out.len(), GROUP)?),
        )
    }

    /// `out = w - lr · g`, `lr` a `1 × 1` tensor; `out` is not `w`, so a skipped update
    /// leaves `w` as it was. Errors as [`matmul`](Self::matmul).
    pub fn sgd(&self, name: &str, w: &Tensor, g: &Tensor, lr: &Tensor, out: &Tensor) -> Result<()> {
        Self::expect_shape("sgd gradient", g, w.rows, w.cols)?;
        Self::expect_shape("sgd learning rate", lr, 1, 1)?;
        Self::expect_shape("sgd output", out, w.rows, w.cols)?;
        let (len, rows, cols) = Self::dims(w)?;
        self.issue(
            Op::Sgd,
            name,
            &[
                w.slice().read(),
                g.slice().read(),
                lr.slice().read(),
                out.slice().write(),
            ],
            &[len],
            &[rows, cols],
            Dispatch::linear(groups(w.len(), GROUP)?),
        )
    }
}
