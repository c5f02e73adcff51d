//! The launch rules of CUDA and HIP, which take a C++ kernel's parameters as pointers.
//!
//! `cuLaunchKernel` and `hipModuleLaunchKernel` take `void** kernelParams`: one entry per
//! declared parameter, read for as many bytes as declared. Under the binding convention of
//! [`kernel`](scope_core::kernel) those are the bindings' device pointers, then the scalar
//! blob. The two APIs differ in numbers, not in rules, so the rules live here once and
//! each server passes its numbers in. [`nccl`] is the collective library both ship.

mod holding;
pub mod nccl;
mod reopen;

pub use holding::Holding;
pub use reopen::{Reopen, reopen};

use std::cell::Cell;
use std::ffi::{c_char, c_void};

use smallvec::SmallVec;

use scope_core::LaunchLimits;
use scope_core::backend::Launch;
use scope_core::{Error, Result};

/// The bytes of one device pointer parameter (`T*` on a 64-bit host).
pub const POINTER_BYTES: usize = size_of::<u64>();

const _: () = assert!(size_of::<*mut c_void>() == POINTER_BYTES);

/// What the device lets one launch ask for, read once when the server opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// Blocks per launch, per axis.
    pub grid: [u32; 3],
    /// Threads per block, per axis.
    pub block: [u32; 3],
    /// Threads per block in all.
    pub threads: u32,
    /// The static shared memory (LDS) one block may declare.
    pub shared_memory: u32,
    /// The warp or wavefront width, where the device gives a usable one.
    pub subgroup: Option<u32>,
}

/// What the API itself allows one launch, beside the device's [`LaunchGeometry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiRules {
    /// Parameters one launch may pass, its blob as one; the length of the [`ParamTable`].
    pub max_params: usize,
    /// Bytes of scalar blob one launch may pass.
    pub max_scalar_bytes: usize,
    /// The most parameter bytes any kernel can declare: the zeros behind the padded table.
    pub max_param_bytes: usize,
    /// Whether blocks times threads past `u32::MAX` per axis are refused (HIP), bounding the grid.
    pub grid_threads_within_u32: bool,
    /// Whether kernels have 16-bit float arithmetic on this device.
    pub f16: bool,
}

/// What one launch may ask for on a device of `geometry`, under `rules`: what a server's
/// [`Backend::launch_limits`](scope_core::Backend::launch_limits) reports and its
/// [`check_launch`] enforces, so the two cannot drift apart (rule 38).
pub fn launch_limits(
    geometry: &LaunchGeometry,
    max_allocation: u64,
    rules: &ApiRules,
) -> LaunchLimits {
    let grid = if rules.grid_threads_within_u32 {
        [0, 1, 2].map(|i| geometry.grid[i].min(u32::MAX / geometry.block[i].max(1)))
    } else {
        geometry.grid
    };
    let mut limits = LaunchLimits::default();
    limits.max_bindings = u32::try_from(rules.max_params).unwrap_or(u32::MAX);
    limits.max_binding_size = max_allocation;
    limits.max_scalar_bytes = u32::try_from(rules.max_scalar_bytes).unwrap_or(u32::MAX);
    limits.max_workgroups = grid;
    limits.max_workgroup_size = geometry.block;
    limits.max_invocations = geometry.threads;
    limits.max_workgroup_memory = geometry.shared_memory;
    limits.subgroup_size = geometry.subgroup.map(|w| (w, w));
    limits.features.f16 = rules.f16;
    limits.features.f64 = true;
    limits.features.i64 = true;
    limits.features.f32_atomic_add = true;
    limits.features.subgroups = geometry.subgroup.is_some();
    limits
}

/// How far a vendor's error `code` reaches: process-fatal where its documentation says
/// restart, sticky where a reset clears it, else recoverable.
pub fn class_of<C: PartialEq>(
    code: C,
    process_fatal: &[C],
    resettable: &[C],
) -> scope_core::FaultClass {
    if process_fatal.contains(&code) {
        scope_core::FaultClass::ProcessFatal
    } else if resettable.contains(&code) {
        scope_core::FaultClass::Sticky
    } else {
        scope_core::FaultClass::Recoverable
    }
}

/// The dynamic shared memory `kernel` declares, refused at compile if a block cannot hold it.
pub fn dynamic_shared_memory(kernel: &scope_core::Kernel, limits: &LaunchLimits) -> Result<u32> {
    let shared = kernel.dynamic_shared_memory_bytes();
    if shared > limits.max_workgroup_memory {
        return Err(Error::invalid(
            "dynamic shared memory",
            format!(
                "`{}` asks for {shared} bytes; a block of this device holds {}",
                kernel.name(),
                limits.max_workgroup_memory
            ),
        ));
    }
    Ok(shared)
}

/// Hold a launch of a kernel with `block` to `limits` before its scope opens, as
/// [`Backend::check_launch`](scope_core::Backend::check_launch) must. Where `declared` gives
/// the kernel's parameter sizes, bindings must be pointers and the blob as long as its own.
pub fn check_launch<M>(
    limits: &LaunchLimits,
    block: [u32; 3],
    declared: Option<&[usize]>,
    launch: &Launch<'_, M>,
) -> Result<()> {
    let invalid = |why: String| Err(Error::invalid(format!("launch of `{}`", launch.name), why));
    limits
        .workgroup_fits(block)
        .or_else(|why| invalid(format!("the kernel's block: {why}")))?;
    let with_blob = !launch.scalars.is_empty();
    let passed = launch.bindings.len() + usize::from(with_blob);
    if passed > limits.max_bindings as usize {
        return invalid(format!(
            "{passed} parameters is past the {} a kernel can take",
            limits.max_bindings
        ));
    }
    if launch.scalars.len() > limits.max_scalar_bytes as usize {
        return invalid(format!(
            "a {}-byte scalar blob exceeds the {}-byte parameter space",
            launch.scalars.len(),
            limits.max_scalar_bytes
        ));
    }
    if let Some(params) = declared {
        if params.len() != passed {
            return invalid(format!(
                "the kernel takes {} parameters; the launch passes {} pointers{}",
                params.len(),
                launch.bindings.len(),
                if with_blob { " and a scalar blob" } else { "" }
            ));
        }
        if let Some((i, size)) = params
            .iter()
            .take(launch.bindings.len())
            .enumerate()
            .find(|(_, size)| **size != POINTER_BYTES)
        {
            return invalid(format!(
                "parameter {i} is {size} bytes, but binding {i} passes an {POINTER_BYTES}-byte device pointer"
            ));
        }
        if with_blob && params[passed - 1] != launch.scalars.len() {
            return invalid(format!(
                "the scalar parameter is {} bytes; the blob is {}",
                params[passed - 1],
                launch.scalars.len()
            ));
        }
    }
    Ok(())
}

/// The counts of an indirect dispatch, read back to the host: little-endian `u32`s.
pub fn indirect_counts(bytes: [u8; 12]) -> [u32; 3] {
    let word = |i: usize| {
        u32::from_le_bytes([
            bytes[i * 4],
            bytes[i * 4 + 1],
            bytes[i * 4 + 2],
            bytes[i * 4 + 3],
        ])
    };
    [word(0), word(1), word(2)]
}

/// Whether `groups` runs anything: no zero count, no indirect count past the grid of `limits`.
pub fn runs_anything(groups: [u32; 3], limits: &LaunchLimits) -> bool {
    !groups.contains(&0)
        && groups
            .iter()
            .zip(limits.max_workgroups)
            .all(|(count, max)| *count <= max)
}

/// The `kernelParams` array a server hands the API, padded with zeros.
///
/// The API reads each declared parameter for as many bytes as declared, so a kernel
/// declaring more than a launch passes would read host memory: undefined behaviour from a
/// safe call. The padded array points into one zeroed block instead. Where [`check_launch`]
/// held the launch to the kernel's own parameters, the exact array is passed.
pub struct ParamTable {
    slots: usize,
    blob: usize,
    zeros: usize,
    padded: Option<Padded>,
}

struct Padded {
    /// `[pointers | blob | zeros]` in words, so pointers are aligned. Cells, as `table` points
    /// into it across launches; boxed, so those stay valid when the server moves.
    words: Box<[Cell<u64>]>,
    /// `slots` pointers into `words`; all at the zeros between launches.
    table: Box<[*mut c_void]>,
    zeros: *mut c_void,
}

// SAFETY: every pointer in `table` and `zeros` addresses `words`, a heap block this value
// owns and moves with; the cells are only reached through `&mut ParamTable`.
unsafe impl Send for Padded {}

impl Padded {
    fn new(slots: usize, blob: usize, zeros: usize) -> Self {
        let front = slots + blob.div_ceil(POINTER_BYTES);
        let words: Box<[Cell<u64>]> = (0..front + zeros.div_ceil(POINTER_BYTES))
            .map(|_| Cell::new(0))
            .collect();
        let zeros = Self::at(&words, front);
        Self {
            table: vec![zeros; slots].into_boxed_slice(),
            words,
            zeros,
        }
    }

    fn at(words: &[Cell<u64>], index: usize) -> *mut c_void {
        words[index].as_ptr().cast::<c_void>()
    }
}

impl ParamTable {
    /// A table of [`ApiRules::max_params`] entries for `rules`.
    pub fn new(rules: &ApiRules) -> Self {
        Self {
            slots: rules.max_params,
            blob: rules.max_scalar_bytes,
            zeros: rules.max_param_bytes.max(POINTER_BYTES),
            padded: None,
        }
    }

    /// Call `fire` with the parameters of a launch of bindings at `pointers` and blob `scalars`:
    /// the exact array when `exact` (the kernel declares just these), else the padded one. Each
    /// entry points at bytes alive and unchanged until `fire` returns.
    pub fn launch<R>(
        &mut self,
        pointers: &[u64],
        scalars: &[u8],
        exact: bool,
        fire: impl FnOnce(&mut [*mut c_void]) -> R,
    ) -> Result<R> {
        let with_blob = !scalars.is_empty();
        let used = pointers.len() + usize::from(with_blob);
        if used > self.slots || scalars.len() > self.blob {
            return Err(Error::internal(format!(
                "a launch of {used} parameters and {} scalar bytes reached a table of {} and {}",
                scalars.len(),
                self.slots,
                self.blob
            )));
        }
        if exact {
            let mut args: SmallVec<[*mut c_void; 9]> = pointers
                .iter()
                .map(|p| (p as *const u64).cast_mut().cast::<c_void>())
                .collect();
            if with_blob {
                args.push(scalars.as_ptr().cast_mut().cast::<c_void>());
            }
            return Ok(fire(&mut args));
        }
        let (slots, blob, zeros) = (self.slots, self.blob, self.zeros);
        let padded = self
            .padded
            .get_or_insert_with(|| Padded::new(slots, blob, zeros));
        for (i, (slot, p)) in padded.table.iter_mut().zip(pointers).enumerate() {
            padded.words[i].set(*p);
            *slot = Padded::at(&padded.words, i);
        }
        let at = pointers.len();
        for (word, chunk) in padded.words[at..].iter().zip(scalars.chunks(POINTER_BYTES)) {
            let mut bytes = [0u8; POINTER_BYTES];
            bytes[..chunk.len()].copy_from_slice(chunk);
            word.set(u64::from_ne_bytes(bytes));
        }
        if with_blob {
            padded.table[at] = Padded::at(&padded.words, at);
        }
        let fired = fire(&mut padded.table[..]);
        padded.table[..used].fill(padded.zeros);
        let written = at + scalars.len().div_ceil(POINTER_BYTES);
        padded.words[..written].iter().for_each(|w| w.set(0));
        Ok(fired)
    }
}

/// A C `char` array as a `String`, up to its first NUL or its end: a name, a log.
pub fn c_chars(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use scope_core::backend::{Access, Bound, BoundDispatch};

    const RULES: ApiRules = ApiRules {
        max_params: 6,
        max_scalar_bytes: 16,
        max_param_bytes: 32,
        grid_threads_within_u32: false,
        f16: true,
    };

    fn geometry() -> LaunchGeometry {
        LaunchGeometry {
            grid: [i32::MAX as u32, 65_535, 65_535],
            block: [1024, 1024, 64],
            threads: 1024,
            shared_memory: 48 << 10,
            subgroup: Some(32),
        }
    }

    #[test]
    fn limits_are_the_geometry_and_the_rules() {
        let limits = launch_limits(&geometry(), 1 << 30, &RULES);
        assert_eq!(limits.max_bindings, 6);
        assert_eq!(limits.max_scalar_bytes, 16);
        assert_eq!(limits.max_workgroups, [i32::MAX as u32, 65_535, 65_535]);
        assert_eq!(limits.subgroup_size, Some((32, 32)));
        assert!(limits.features.subgroups && limits.features.f16);
        let bounded = ApiRules {
            grid_threads_within_u32: true,
            ..RULES
        };
        let no_wave = LaunchGeometry {
            subgroup: None,
            ..geometry()
        };
        let limits = launch_limits(&no_wave, 1 << 30, &bounded);
        assert_eq!(limits.max_workgroups, [4_194_303, 65_535, 65_535]);
        assert!(!limits.features.subgroups);
        assert_eq!(limits.subgroup_size, None);
    }

    #[test]
    fn a_launch_past_the_limits_or_the_declared_parameters_is_refused() {
        let limits = launch_limits(&geometry(), 1 << 30, &RULES);
        let memory = ();
        let bound = |n: usize| -> Vec<Bound<'_, ()>> {
            (0..n)
                .map(|_| Bound {
                    memory: &memory,
                    offset: 0,
                    len: 4,
                    access: Access::ReadWrite,
                })
                .collect()
        };
        let check = |bindings: usize, scalars: usize, declared: Option<&[usize]>| {
            let bindings = bound(bindings);
            let scalars = vec![0u8; scalars];
            check_launch(
                &limits,
                [64, 1, 1],
                declared,
                &Launch {
                    name: "k",
                    bindings: &bindings,
                    scalars: &scalars,
                    dispatch: BoundDispatch::Groups([1, 1, 1]),
                },
            )
        };
        assert!(check(5, 8, None).is_ok());
        assert!(check(6, 8, None).is_err(), "seven parameters");
        assert!(check(1, 17, None).is_err(), "past the parameter space");
        assert!(check(1, 8, Some(&[8, 8])).is_ok());
        assert!(check(1, 4, Some(&[8, 8])).is_err(), "a short blob");
        assert!(check(2, 0, Some(&[8, 4])).is_err(), "not a pointer");
        assert!(check(1, 0, Some(&[8, 8])).is_err(), "a missing blob");
        let block = check_launch(
            &limits,
            [1, 1, 65],
            None,
            &Launch::<()> {
                name: "k",
                bindings: &[],
                scalars: &[],
                dispatch: BoundDispatch::Groups([1, 1, 1]),
            },
        );
        assert!(block.is_err());
    }

    #[test]
    fn the_padded_table_points_past_the_launch_at_zeros_and_is_zeroed_after() {
        let mut table = ParamTable::new(&RULES);
        let pointers = [0x1000u64, 0x2000];
        let scalars = [1u8, 2, 3, 4];
        let seen = table
            .launch(&pointers, &scalars, false, |params| {
                assert_eq!(params.len(), RULES.max_params);
                // SAFETY: `launch` promises entries into one live block, 32 bytes behind each.
                unsafe {
                    let first = *params[0].cast::<u64>();
                    let second = *params[1].cast::<u64>();
                    let blob = *params[2].cast::<[u8; 4]>();
                    let spare = *params[5].cast::<[u8; 32]>();
                    (first, second, blob, spare)
                }
            })
            .unwrap();
        assert_eq!(seen, (0x1000, 0x2000, [1, 2, 3, 4], [0; 32]));
        let after = table
            .launch(&[7], &[], false, |params| {
                // SAFETY: as above; the first entry has 32 bytes and more behind it.
                unsafe { *params[0].cast::<[u64; 4]>() }
            })
            .unwrap();
        assert_eq!(after, [7, 0, 0, 0], "the last launch's words were zeroed");
        let exact = table
            .launch(&pointers, &scalars, true, |params| params.len())
            .unwrap();
        assert_eq!(exact, 3);
        assert!(table.launch(&[0; 6], &scalars, false, |_| ()).is_err());
        assert!(table.launch(&[], &[0; 17], false, |_| ()).is_err());
    }

    #[test]
    fn counts_and_c_chars() {
        let mut bytes = [0u8; 12];
        bytes[0] = 2;
        bytes[4] = 3;
        bytes[8] = 4;
        assert_eq!(indirect_counts(bytes), [2, 3, 4]);
        let limits = launch_limits(&geometry(), 1 << 30, &RULES);
        assert!(runs_anything([2, 3, 4], &limits));
        assert!(!runs_anything([2, 0, 4], &limits));
        assert!(!runs_anything([1, 65_536, 1], &limits));
        let mut a = [0 as c_char; 8];
        for (i, b) in b"gfx90a".iter().enumerate() {
            a[i] = *b as c_char;
        }
        assert_eq!(c_chars(&a), "gfx90a");
        assert_eq!(c_chars(&[b'x' as c_char; 4]), "xxxx");
    }
}
