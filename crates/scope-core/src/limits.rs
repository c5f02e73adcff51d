//! What the device behind a server can run, as the server opened it.
//!
//! A runtime over [`Client<B>`](crate::Client) sizes its grids, picks a
//! kernel variant and decides which types its kernels may use from these
//! numbers, without naming the backend. They are the server's own: the
//! limits its [`Backend::check_launch`](crate::Backend::check_launch)
//! enforces and the features it enabled — not what the hardware could do
//! with another server, and not a guess. A launch inside every limit
//! reported here is never refused as an invalid argument, and the grid is
//! exact: one workgroup past an axis is refused before it runs, claiming
//! nothing (rule 38). A few limits also depend on the kernel (a `uniform`
//! blob, registers per thread); each server's `launch_limits` says which.

/// Optional capabilities a server enabled on its device. A kernel that uses
/// one the server did not enable may fail to compile, however capable the
/// hardware.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceFeatures {
    /// 16-bit floats in kernels.
    pub f16: bool,
    /// 64-bit floats in kernels.
    pub f64: bool,
    /// 64-bit integers in kernels.
    pub i64: bool,
    /// Atomic add on 32-bit floats in device memory.
    pub f32_atomic_add: bool,
    /// Subgroup (warp, wave, plane) operations.
    pub subgroups: bool,
}

/// The limits a launch must keep to, as the backend checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchLimits {
    /// Buffers one launch may bind, counting its scalar blob, when it has
    /// one, as one more (most APIs pass the blob as one more binding or
    /// parameter).
    pub max_bindings: u32,
    /// Bytes one binding may cover.
    pub max_binding_size: u64,
    /// Bytes of the scalar blob one launch may pass.
    pub max_scalar_bytes: u32,
    /// Workgroups one launch may run, per axis.
    pub max_workgroups: [u32; 3],
    /// The largest workgroup a kernel may declare, per axis.
    pub max_workgroup_size: [u32; 3],
    /// The most invocations one workgroup may have in all.
    pub max_invocations: u32,
    /// Bytes of workgroup (shared) memory one workgroup may use.
    pub max_workgroup_memory: u32,
    /// The subgroup size range, `Some` only where the server enabled
    /// subgroup operations.
    pub subgroup_size: Option<(u32, u32)>,
    /// The width the device runs invocations in lockstep (its subgroup,
    /// warp or wavefront size range), where it says, whether or not
    /// subgroup operations are enabled: a hint for sizing workgroups, never
    /// a promise of subgroup operations (that is
    /// [`subgroup_size`](Self::subgroup_size)). A kernel library that sizes
    /// its workgroups for 32 lanes on an 8-lane device runs a quarter as
    /// many of them.
    pub native_width: Option<(u32, u32)>,
    /// What the server enabled.
    pub features: DeviceFeatures,
}

impl Default for LaunchLimits {
    /// The least every GPU API scope runs on guarantees (WebGPU's default
    /// limits; no scalar blob, no optional feature). `LaunchLimits` is
    /// `#[non_exhaustive]`, so a backend starts from this and sets every
    /// field it knows; a field added later starts at a value no device
    /// falls short of.
    fn default() -> Self {
        Self {
            max_bindings: 8,
            max_binding_size: 128 << 20,
            max_scalar_bytes: 0,
            max_workgroups: [65_535; 3],
            max_workgroup_size: [256, 256, 64],
            max_invocations: 256,
            max_workgroup_memory: 16 << 10,
            subgroup_size: None,
            native_width: None,
            features: DeviceFeatures::default(),
        }
    }
}

impl LaunchLimits {
    /// Whether a workgroup of `size` fits: each axis within
    /// `max_workgroup_size` and all of it within `max_invocations`. The
    /// reason, if not, names the axis or the count. One check for every
    /// server that learns a kernel's workgroup size (CUDA's and HIP's
    /// block, Vulkan's WGSL `@workgroup_size`): a workgroup past the device
    /// is a launch that fails inside its scope, or undefined behaviour.
    ///
    /// # Errors
    ///
    /// The reason it does not fit.
    pub fn workgroup_fits(&self, size: [u32; 3]) -> Result<(), String> {
        if let Some((axis, (declared, max))) = size
            .iter()
            .zip(self.max_workgroup_size)
            .enumerate()
            .find(|(_, (declared, max))| **declared > *max)
        {
            return Err(format!(
                "a workgroup of {declared} along axis {axis} is past the device's {max}"
            ));
        }
        let invocations = size.iter().map(|&n| u64::from(n)).product::<u64>();
        if invocations > u64::from(self.max_invocations) {
            return Err(format!(
                "a workgroup of {invocations} invocations ({size:?}) is past the device's {}",
                self.max_invocations
            ));
        }
        Ok(())
    }
}

/// Everything [`Client::limits`](crate::Client::limits) reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceLimits {
    /// The largest buffer the device could ever give
    /// ([`Backend::max_allocation`](crate::Backend::max_allocation)): a
    /// larger request is an invalid argument, a smaller one that does not
    /// fit now is out of memory.
    pub max_allocation: u64,
    /// The alignment a binding's offset must have.
    pub binding_alignment: u64,
    /// What one launch may ask for.
    pub launch: LaunchLimits,
}
