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

/// A client and the kernels its server compiles.
#[derive(Clone, Debug)]
pub struct Runtime<B: Backend> {
    client: Client<B>,
    kernels: Kernels,
}

impl<B: Backend> Runtime<B> {
    /// A runtime over `client`, with the shipped kernels in the first
    /// language its server accepts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the server takes neither WGSL, CUDA
    /// C++ nor HIP C++.
    pub fn new(client: Client<B>) -> Result<Self> {
        let dialect = client
            .with_backend(|backend| Dialect::choose(|language| backend.accepts(language)))
            .ok_or_else(|| {
                Error::invalid(
                    "backend",
                    format!("{} accepts none of WGSL, CUDA C++, HIP C++", B::NAME),
                )
            })?;
        Ok(Self::with_kernels(client, Kernels::for_language(dialect)))
    }

    /// A runtime over `client` with `kernels` of its own.
    pub fn with_kernels(client: Client<B>, kernels: Kernels) -> Self {
        Self { client, kernels }
    }

    /// The client, for what the runtime does not wrap (capture, faults).
    pub fn client(&self) -> &Client<B> {
        &self.client
    }

    /// The kernels.
    pub fn kernels(&self) -> &Kernels {
        &self.kernels
    }

    /// Compile every kernel now, so the first pass does not time compiles.
    ///
    /// # Errors
    ///
    /// The first compile error, with the compiler's log.
    pub fn compile(&self) -> Result<()> {
        let k = &self.kernels;
        for kernel in [&k.matmul, &k.bias_add, &k.gelu, &k.softmax] {
            self.client.compile(kernel)?;
        }
        Ok(())
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

    fn issue(
        &self,
        kernel: &Kernel,
        bindings: &[Binding<'_>],
        scalars: &[u8],
        dispatch: Dispatch<'_>,
    ) -> Result<()> {
        match self.client.launch(kernel, bindings, scalars, dispatch) {
            Ok(()) => Ok(()),
            Err(error) if carried_by_outputs(&error) => {
                tracing::debug!(kernel = %kernel.name(), %error, "launch failed; its outputs carry it");
                Ok(())
            }
            Err(error) => Err(error),
        }
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
        let kernel = crate::kernels::named(&self.kernels.matmul, name);
        let dims = scalars(&[
            u32_of(a.rows, "rows")?,
            u32_of(b.cols, "cols")?,
            u32_of(a.cols, "inner")?,
        ]);
        let dispatch = Dispatch::Groups([groups(b.cols, GROUP)?, groups(a.rows, ROWS)?, 1]);
        self.issue(
            &kernel,
            &[
                Binding::read(&a.buffer),
                Binding::read(&b.buffer),
                Binding::write(&out.buffer),
            ],
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
        let kernel = crate::kernels::named(&self.kernels.bias_add, name);
        let dims = scalars(&[u32_of(x.len(), "length")?, u32_of(x.cols, "cols")?]);
        self.issue(
            &kernel,
            &[
                Binding::read(&x.buffer),
                Binding::read(&bias.buffer),
                Binding::write(&out.buffer),
            ],
            &dims,
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
        let kernel = crate::kernels::named(&self.kernels.gelu, name);
        let dims = scalars(&[u32_of(x.len(), "length")?]);
        self.issue(
            &kernel,
            &[Binding::read(&x.buffer), Binding::write(&out.buffer)],
            &dims,
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
        let kernel = crate::kernels::named(&self.kernels.softmax, name);
        let dims = scalars(&[u32_of(x.rows, "rows")?, u32_of(x.cols, "cols")?]);
        self.issue(
            &kernel,
            &[Binding::read(&x.buffer), Binding::write(&out.buffer)],
            &dims,
            Dispatch::linear(groups(x.rows, GROUP)?),
        )
    }
}
