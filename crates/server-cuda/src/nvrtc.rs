//! CUDA C++ to PTX with NVRTC: no driver, context or device.
//!
//! NVRTC loads apart from the driver, so it stands below it: [`nvrtc_ptx`] checks kernels ahead
//! of a GPU run. NVRTC targets the device's `compute_XY`, clamped to the newest it knows
//! ([`pick_arch`]), so a newer device still gets PTX it can JIT.

use std::ffi::CString;
use std::sync::OnceLock;

use cudarc::nvrtc;
use scope_core::{Error, Kernel, KernelSource, Result};
use scope_native::c_chars;

use crate::error::BACKEND;
use crate::ptx::CudaVersion;

/// Whether NVRTC can be loaded here; asked once per process.
pub(crate) fn nvrtc_present() -> bool {
    static NVRTC: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only opens and drops candidate libraries.
    *NVRTC.get_or_init(|| unsafe { nvrtc::sys::is_culib_present() })
}

/// A kernel the compiler or the JIT refused, with its log.
pub(crate) fn compile_error(kernel: &Kernel, log: impl Into<String>) -> Error {
    Error::Compile {
        backend: BACKEND,
        kernel: kernel.name().clone(),
        log: log.into(),
    }
}

/// The `compute_XY` NVRTC should target for a device of `capability`.
pub(crate) fn nvrtc_arch(capability: (i32, i32)) -> Result<String> {
    let fail = |e: nvrtc::result::NvrtcError| Error::BackendUnavailable {
        backend: BACKEND,
        reason: format!("NVRTC could not list its architectures: {e}"),
    };
    let mut count = 0;
    // SAFETY: NVRTC is loaded (callers check presence); `count` is one int.
    unsafe { nvrtc::sys::nvrtcGetNumSupportedArchs(&mut count) }
        .result()
        .map_err(fail)?;
    let mut archs = vec![0i32; usize::try_from(count).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: `archs` holds the `count` ints NVRTC writes.
        unsafe { nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
            .result()
            .map_err(fail)?;
    }
    Ok(format!("compute_{}", pick_arch(capability, &archs)))
}

/// The newest of `supported` not newer than the device; else the oldest, for the JIT to refuse.
pub(crate) fn pick_arch(capability: (i32, i32), supported: &[i32]) -> i32 {
    let device = capability.0 * 10 + capability.1;
    supported
        .iter()
        .copied()
        .filter(|&a| a <= device)
        .max()
        .or_else(|| supported.iter().copied().min())
        .unwrap_or(device)
}

/// The NVRTC version the server compiles with (`nvrtcVersion`). Its PTX needs a driver that new
/// ([`CudaVersion::ptx_isa`]).
///
/// # Errors
///
/// [`Error::BackendUnavailable`] when NVRTC is missing or silent.
pub fn nvrtc_version() -> Result<CudaVersion> {
    if !nvrtc_present() {
        return Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: "NVRTC (libnvrtc) was not found here".to_owned(),
        });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); two ints for it to write.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::BackendUnavailable {
            backend: BACKEND,
            reason: format!("nvrtcVersion: {e}"),
        })?;
    match (u32::try_from(major), u32::try_from(minor)) {
        (Ok(major), Ok(minor)) => Ok(CudaVersion::new(major, minor)),
        _ => Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: format!("nvrtcVersion answered {major}.{minor}"),
        }),
    }
}

struct Program(nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created once by `create_program`, destroyed once here.
        let _ = unsafe { nvrtc::result::destroy_program(self.0) };
    }
}

/// The options the server gives NVRTC for `arch` (`compute_90`): the architecture alone.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}")]
}

/// The PTX NVRTC makes of CUDA C++ `kernel` for `arch`, exactly as the server would, with no driver
/// or device: for checking kernels ahead of a GPU run.
///
/// # Errors
///
/// [`Error::BackendUnavailable`] without NVRTC; [`Error::Compile`] with NVRTC's log, or when
/// `kernel` is not CUDA C++.
pub fn nvrtc_ptx(kernel: &Kernel, arch: &str) -> Result<String> {
    let KernelSource::Cuda(source) = kernel.source() else {
        return Err(compile_error(
            kernel,
            format!(
                "NVRTC compiles CUDA C++, not {}",
                kernel.source().language()
            ),
        ));
    };
    if !nvrtc_present() {
        return Err(Error::BackendUnavailable {
            backend: BACKEND,
            reason: "NVRTC (libnvrtc) was not found here".to_owned(),
        });
    }
    let mut ptx = nvrtc_compile(kernel, source, arch)?;
    ptx.pop(); // the NUL the driver needs
    String::from_utf8(ptx).map_err(|_| compile_error(kernel, "NVRTC's PTX is not UTF-8"))
}

/// CUDA C++ to NUL-terminated PTX.
pub(crate) fn nvrtc_compile(kernel: &Kernel, source: &str, arch: &str) -> Result<Vec<u8>> {
    let src = CString::new(source)
        .map_err(|_| compile_error(kernel, "the source contains a NUL byte"))?;
    let program = nvrtc::result::create_program(&src, Some(c"scope_kernel.cu"))
        .map(Program)
        .map_err(|e| compile_error(kernel, format!("nvrtcCreateProgram: {e}")))?;
    let options = nvrtc_options(arch);
    // SAFETY: `program` is live until the end of this function.
    let compiled = unsafe { nvrtc::result::compile_program(program.0, &options) };
    // SAFETY: as above.
    let log = unsafe { nvrtc::result::get_program_log(program.0) }
        .map(|chars| c_chars(&chars))
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(compile_error(
            kernel,
            format!("{}\n(nvrtc: {e}, {})", log.trim_end(), options.join(" ")),
        ));
    }
    if !log.trim().is_empty() {
        tracing::debug!(kernel = %kernel.name(), "nvrtc: {log}");
    }
    // SAFETY: as above; the program compiled.
    let ptx = unsafe { nvrtc::result::get_ptx(program.0) }
        .map_err(|e| compile_error(kernel, format!("nvrtcGetPTX: {e}")))?;
    let mut bytes: Vec<u8> = ptx
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    bytes.push(0);
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::pick_arch;

    #[test]
    fn the_arch_is_the_newest_the_compiler_knows_not_newer_than_the_device() {
        // NVRTC 12.2 knows nothing past sm_90: a newer device gets compute_90.
        let nvrtc_12_2 = [50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
        assert_eq!(pick_arch((8, 0), &nvrtc_12_2), 80);
        assert_eq!(pick_arch((9, 0), &nvrtc_12_2), 90);
        assert_eq!(pick_arch((10, 0), &nvrtc_12_2), 90);
        let nvrtc_13 = [75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121];
        assert_eq!(pick_arch((9, 0), &nvrtc_13), 90);
        assert_eq!(pick_arch((8, 9), &nvrtc_13), 89);
        assert_eq!(pick_arch((13, 0), &nvrtc_13), 121);
        // A device older than every arch gets the oldest, for the JIT to refuse.
        assert_eq!(pick_arch((6, 1), &nvrtc_13), 75);
        assert_eq!(pick_arch((9, 0), &[]), 90);
    }
}
