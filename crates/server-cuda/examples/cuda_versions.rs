//! Which CUDA driver and NVRTC this machine has, and whether the driver can
//! JIT the PTX that NVRTC writes: what the CUDA bundle's `run.sh` prints
//! before any test, and how it decides between the machine's NVRTC and the
//! one it carries.
//!
//! ```text
//! cargo run -p server-cuda --example cuda_versions
//! ```
//!
//! It loads the driver and NVRTC the way the server does (by name, on the
//! loader's path), asks each its version (`cuDriverGetVersion`,
//! `nvrtcVersion`), compiles a trivial kernel through the server's NVRTC
//! call for `compute_80` and reads the PTX ISA version it wrote
//! (`.version`). Needs no GPU: without a driver it says so and still
//! reports NVRTC.
//!
//! Exit status: 0 when the driver JITs this NVRTC's PTX; 1 when it cannot
//! (the PTX is newer than the driver); 2 when there is no driver here; 3
//! when there is no NVRTC here (or it cannot compile); 4 when the driver's
//! version is newer than every one the server knows and it cannot tell.

use std::process::ExitCode;

use scope_core::Kernel;
use server_cuda::{CudaVersion, PtxIsa, driver_jits};

fn main() -> ExitCode {
    let driver = server_cuda::cuda_driver_version();
    match &driver {
        Ok(version) => println!(
            "driver: CUDA {version} (cuDriverGetVersion){}",
            version.ptx_isa().map_or_else(
                || " — newer than every release scope knows".to_owned(),
                |isa| format!(", JITs PTX ISA {isa} and older")
            )
        ),
        Err(e) => println!("driver: none ({e})"),
    }
    let nvrtc = match nvrtc() {
        Ok(found) => found,
        Err(why) => {
            println!("NVRTC: none ({why})");
            return ExitCode::from(3);
        }
    };
    let (version, isa, path) = nvrtc;
    println!("NVRTC: {version} ({path}), writes PTX ISA {isa}");
    let Ok(driver) = driver else {
        return ExitCode::from(2);
    };
    match driver_jits(driver, isa) {
        Some(true) => {
            println!("PTX ISA {isa}: the driver (CUDA {driver}) JITs it");
            ExitCode::SUCCESS
        }
        Some(false) => {
            let needed = CudaVersion::oldest_for(isa).map_or_else(
                || "a newer one".to_owned(),
                |v| format!("CUDA {v} or newer"),
            );
            println!(
                "PTX ISA {isa}: the driver (CUDA {driver}) cannot JIT it; it needs {needed}, \
                 or an NVRTC no newer than CUDA {driver}"
            );
            ExitCode::from(1)
        }
        None => {
            println!("PTX ISA {isa}: unknown whether the driver (CUDA {driver}) JITs it");
            ExitCode::from(4)
        }
    }
}

/// NVRTC's version, the PTX ISA version it writes, and the file it was
/// loaded from.
fn nvrtc() -> Result<(CudaVersion, PtxIsa, String), String> {
    let version = server_cuda::nvrtc_version().map_err(|e| e.to_string())?;
    // SAFETY: only compiled, never launched.
    let probe = unsafe {
        Kernel::cuda(
            "probe",
            r#"extern "C" __global__ void probe(unsigned int* out) { out[threadIdx.x] = 1; }"#,
        )
    };
    let ptx = server_cuda::nvrtc_ptx(&probe, "compute_80").map_err(|e| e.to_string())?;
    let isa = PtxIsa::of(&ptx).ok_or("its PTX declares no .version")?;
    Ok((
        version,
        isa,
        loaded_from().unwrap_or_else(|| "path unknown".to_owned()),
    ))
}

/// The file NVRTC was loaded from, as the process's memory map names it.
fn loaded_from() -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            std::path::Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc.so"))
        })
        .map(str::to_owned)
}
