//! What a device runs: no launch within these limits is refused as invalid (rule 38).

/// Optional capabilities the server enabled.
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
    /// Buffers one launch may bind, counting a scalar blob as one more.
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
    /// The subgroup size range, where the server enabled subgroups.
    pub subgroup_size: Option<(u32, u32)>,
    /// The width the device runs in lockstep: a sizing hint only.
    pub native_width: Option<(u32, u32)>,
    /// What the server enabled.
    pub features: DeviceFeatures,
}

impl Default for LaunchLimits {
    /// WebGPU's defaults, the least every API guarantees.
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
    /// Whether a workgroup of `size` fits, per axis and in all.
    ///
    /// # Errors
    ///
    /// The reason it does not fit, naming the axis or the count.
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
    /// The largest buffer the device could ever give.
    pub max_allocation: u64,
    /// The alignment a binding's offset must have.
    pub binding_alignment: u64,
    /// What one launch may ask for.
    pub launch: LaunchLimits,
}
