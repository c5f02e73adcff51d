//! The launch rules of the APIs that launch a C++ kernel with an array of
//! parameter pointers: CUDA and HIP.
//!
//! `cuLaunchKernel` and `hipModuleLaunchKernel` take a kernel, a grid, a
//! block and `void** kernelParams`: one entry per parameter the kernel
//! declares, each pointing at that parameter's value, from which the API
//! copies as many bytes as the kernel says the parameter is long. Under the
//! binding convention of [`kernel`](scope_core::kernel) the parameters are the
//! bindings' device pointers, in order, then the scalar blob by value when
//! it is non-empty. The two APIs differ in numbers (how many parameters,
//! how many bytes of them, how far a grid may reach), not in these rules,
//! so the rules live here once and each server passes its numbers in:
//!
//! - [`LaunchGeometry`] → [`LaunchLimits`] ([`launch_limits`]): what one
//!   launch may ask for, from what the device reports and the API's own
//!   [`ApiRules`];
//! - [`check_launch`]: exactly those limits, and the kernel's own
//!   parameter list where the API can report it, checked before a launch's
//!   scope opens;
//! - [`ParamTable`]: the parameter array handed to the API, padded with
//!   zeros to the most any kernel can declare, so that a kernel declaring
//!   more than a launch passes reads zeros, never past the caller's bytes;
//! - [`indirect_counts`] and [`runs_anything`]: neither API launches
//!   indirectly, so the counts come back to the host and are read here;
//! - [`c_chars`]: the names and logs these APIs write into `char` arrays;
//! - [`nccl`]: the collective library both ship under one API (NCCL,
//!   RCCL), for their device transports;
//! - [`Holding`]: which devices this process's servers hold, so that a
//!   reset of one (which both APIs do for the whole process) is refused
//!   under another client;
//! - [`reopen`]: a lost device opened again, the vendor calls supplied
//!   by each server ([`Reopen`]).

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

/// The bytes of one device pointer parameter (`T*` on a 64-bit host): what
/// every binding passes.
pub const POINTER_BYTES: usize = size_of::<u64>();

// A device address is a `u64`, as every `T*` parameter on the hosts these
// APIs run on.
const _: () = assert!(size_of::<*mut c_void>() == POINTER_BYTES);

/// What the device lets one launch ask for, in the API's own words (CUDA's
/// `cuDeviceGetAttribute`, HIP's `hipDeviceProp_t`), read once when the
/// server opens: the numbers [`launch_limits`] turns into what the server
/// reports and [`check_launch`] enforces.
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

/// What the API itself allows one launch, beside the device's
/// [`LaunchGeometry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiRules {
    /// Parameters one launch may pass: its bindings, and its blob as one
    /// more. The length of the [`ParamTable`] too.
    pub max_params: usize,
    /// Bytes of scalar blob one launch may pass.
    pub max_scalar_bytes: usize,
    /// The most bytes of parameters any kernel can declare: the zeros every
    /// spare entry of the padded [`ParamTable`] points at, so that no
    /// declared parameter reads past them.
    pub max_param_bytes: usize,
    /// Whether the API refuses a launch whose blocks times threads along an
    /// axis pass `u32::MAX` (HIP's `hipErrorInvalidConfiguration`): the
    /// grid reported is then bounded by the largest block the device
    /// allows, so no launch inside the limits is refused on the device.
    pub grid_threads_within_u32: bool,
    /// Whether kernels have 16-bit float arithmetic on this device.
    pub f16: bool,
}

/// What one launch may ask for on a device of `geometry` whose largest
/// allocation is `max_allocation`, under the API's `rules`: the one set of
/// numbers a server's [`Backend::launch_limits`](scope_core::Backend::launch_limits)
/// reports and its [`check_launch`] enforces, so the two cannot drift apart
/// (a launch the report allows but the check refuses, or the reverse, is
/// what rule 38 forbids).
///
/// - Bindings: [`ApiRules::max_params`], the blob counted as one.
/// - Scalars: [`ApiRules::max_scalar_bytes`].
/// - Grid: the device's, bounded as [`ApiRules::grid_threads_within_u32`]
///   says (on a `1024`-thread axis that is `4,194,303` blocks).
/// - Block, threads, shared memory, subgroup: the device's.
/// - Features: what CUDA C++ (NVRTC), PTX and HIP C++ (hiprtc) give every
///   kernel: 64-bit floats and integers, `atomicAdd` on `float` in global
///   memory, subgroup intrinsics (`__shfl_sync`, `__shfl`, `__ballot`)
///   wherever the device reports the subgroup's width, and 16-bit floats
///   where [`ApiRules::f16`] says.
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

/// How far a vendor's error `code` reaches: process-fatal where its
/// documentation says restart, sticky where a reset clears it, else
/// recoverable. Each server passes its own lists, so the rule is one.
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

/// The dynamic shared memory `kernel` declares, refused when one block
/// cannot hold it: at compile, typed, rather than a launch the driver
/// fails inside its scope.
///
/// # Errors
///
/// [`Error::InvalidArgument`] naming the kernel and both sizes.
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

/// What a server's [`Backend::check_launch`](scope_core::Backend::check_launch)
/// holds a launch of a kernel with `block` to before its scope opens —
/// exactly `limits`, the server's [`launch_limits`]: the kernel's block
/// inside the device's, no more parameters and no more scalar bytes than
/// the limits allow, and — where the API reports the kernel's parameters
/// (`declared`, each one's size in bytes) — bindings that are pointers and
/// a blob as long as the parameter it fills. Each refusal is an invalid
/// argument that claims nothing; the device would otherwise fail the launch
/// inside its scope, claiming outputs of work that never could have run.
///
/// # Errors
///
/// [`Error::InvalidArgument`] naming what was wrong.
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

/// The three workgroup counts of an indirect dispatch, read back to the
/// host: little-endian `u32`s, x then y then z.
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

/// Whether a launch of `groups` runs anything: a zero along an axis runs
/// nothing, and so does an indirect count past the grid of `limits` (a
/// host-given one was refused before the scope), as on every server.
pub fn runs_anything(groups: [u32; 3], limits: &LaunchLimits) -> bool {
    !groups.contains(&0)
        && groups
            .iter()
            .zip(limits.max_workgroups)
            .all(|(count, max)| *count <= max)
}

/// The `kernelParams` array a server hands the API, padded with zeros.
///
/// The API reads one entry per parameter the kernel *declares*, and copies
/// as many bytes from it as that parameter's declared size — not the
/// launch's. A kernel that declares more parameters than the launch passes
/// would make it read past the caller's array, and a parameter larger than
/// the value passed for it (a scalar struct larger than the blob, a struct
/// where the launch passes a pointer) past that value: host memory read by
/// the driver, undefined behaviour from a safe call. So the padded array is
/// always [`ApiRules::max_params`] long, and every entry points into one
/// zeroed block: the launch's pointers, then its blob, then
/// [`ApiRules::max_param_bytes`] zeros, which the entries past the launch's
/// point at. Whatever a kernel declares, the API reads inside the block —
/// wrong values on the device for a mismatched kernel, never the host's
/// bytes.
///
/// Where the API reports the kernel's own parameter list and
/// [`check_launch`] held the launch to it, the exact array is passed
/// instead, and the padded one is never made.
///
/// The padded array is made on the first launch that needs it and put back
/// to zeros after each launch, so that a launch costs what it writes, not
/// the array's length.
pub struct ParamTable {
    slots: usize,
    /// Room for the blob.
    blob: usize,
    /// Zeros behind everything a launch writes.
    zeros: usize,
    padded: Option<Padded>,
}

struct Padded {
    /// `[pointers | blob | zeros]`: room for `slots` pointers, then for the
    /// blob, then the zeros, in words so that a pointer entry is aligned as
    /// the API reads it. Cells, because `table` keeps pointers into it
    /// across the writes of later launches; boxed, so those stay valid when
    /// the server moves.
    words: Box<[Cell<u64>]>,
    /// `slots` pointers into `words`; all at the zeros between launches.
    table: Box<[*mut c_void]>,
    /// Where the zeros start.
    zeros: *mut c_void,
}

// SAFETY: every pointer in `table` and `zeros` addresses `words`, a heap
// block this value owns and which moves with it; no other value holds
// them, and the cells are only reached through `&mut ParamTable`.
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

    /// The address of word `index`.
    fn at(words: &[Cell<u64>], index: usize) -> *mut c_void {
        words[index].as_ptr().cast::<c_void>()
    }
}

impl ParamTable {
    /// A table for `rules`: [`ApiRules::max_params`] entries, room for
    /// [`ApiRules::max_scalar_bytes`] of blob, and
    /// [`ApiRules::max_param_bytes`] zeros behind everything.
    pub fn new(rules: &ApiRules) -> Self {
        Self {
            slots: rules.max_params,
            blob: rules.max_scalar_bytes,
            zeros: rules.max_param_bytes.max(POINTER_BYTES),
            padded: None,
        }
    }

    /// Call `fire` with the parameters of a launch whose bindings are at
    /// device addresses `pointers` and whose blob is `scalars`: the exact
    /// array when `exact` (the kernel's declared parameters are known to be
    /// `pointers.len()` pointers and, with a blob, one parameter of
    /// `scalars.len()` bytes), otherwise the padded one. Every entry `fire`
    /// sees points at bytes alive and unchanged until it returns: with
    /// `exact`, the value passed for it; padded, a place in one block with
    /// at least [`ApiRules::max_param_bytes`] bytes behind it.
    ///
    /// # Errors
    ///
    /// [`Error::Internal`] when the launch passes more than the table
    /// holds, which [`check_launch`] refuses first; `fire` is not called.
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
        // Back to all zeros for the next launch.
        padded.table[..used].fill(padded.zeros);
        let written = at + scalars.len().div_ceil(POINTER_BYTES);
        padded.words[..written].iter().for_each(|w| w.set(0));
        Ok(fired)
    }
}

/// A NUL-terminated C character array as a `String`, stopping at the end of
/// the array if there is no NUL: a device's name, a compiler's or JIT's
/// log.
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
                // SAFETY: `launch` promises entries that point into one
                // block alive for this call, each with `max_param_bytes` (32)
                // bytes behind it: the pointers, the blob, the zeros.
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
                // SAFETY: as above: the first entry points at the first
                // word of the block, with 32 bytes and more behind it.
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
