//! Which PTX a driver can JIT, and [`UnsupportedPtx`] for PTX newer than the driver.
//!
//! A driver JITs PTX of its own release's ISA version and older, never newer
//! (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, 222). NVRTC writes its own release's ISA. So NVRTC 13.0's
//! ISA 9.0 fails on every 12.x driver, and NVRTC 12.2's ISA 8.2 runs from CUDA 12.2 (Linux 535) on.
//! The tables come from the PTX ISA release notes
//! (<https://docs.nvidia.com/cuda/parallel-thread-execution/#release-notes>) and the toolkit's
//! driver table (<https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/>).

use std::fmt;
use std::sync::Arc;

/// A CUDA version as the driver and NVRTC report it: `12.2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    /// `12` of 12.2.
    pub major: u32,
    /// `2` of 12.2.
    pub minor: u32,
}

impl CudaVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The version `cuDriverGetVersion` encodes as `1000 * major + 10 * minor`; `None` if negative.
    pub fn from_driver(encoded: i32) -> Option<Self> {
        let encoded = u32::try_from(encoded).ok()?;
        Some(Self::new(encoded / 1000, (encoded % 1000) / 10))
    }

    /// The newest PTX ISA this version's driver JITs and its NVRTC writes: the ISA the release
    /// introduced, or the one before (12.6 introduced none). `None` before 11.0 and past
    /// [`NEWEST_KNOWN`](Self::NEWEST_KNOWN).
    pub fn ptx_isa(self) -> Option<PtxIsa> {
        PTX_ISA_OF_CUDA
            .iter()
            .rev()
            .find(|(cuda, _)| *cuda <= self)
            .filter(|_| self <= Self::NEWEST_KNOWN && self >= PTX_ISA_OF_CUDA[0].0)
            .map(|(_, isa)| *isa)
    }

    /// The newest CUDA release in this crate's table.
    pub const NEWEST_KNOWN: CudaVersion = CudaVersion::new(13, 1);

    /// The oldest CUDA release whose driver JITs `isa`; `None` past every known release.
    pub fn oldest_for(isa: PtxIsa) -> Option<CudaVersion> {
        PTX_ISA_OF_CUDA
            .iter()
            .find(|(_, newest)| *newest >= isa)
            .map(|(cuda, _)| *cuda)
    }

    /// The Linux driver branch that first shipped this version (535 for 12.2), if known.
    pub fn linux_driver_branch(self) -> Option<u32> {
        LINUX_BRANCH_OF_CUDA
            .iter()
            .find(|(cuda, _)| *cuda == self)
            .map(|(_, branch)| *branch)
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// A PTX ISA version, as a `.version` directive declares it: `8.2`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PtxIsa {
    /// `8` of 8.2.
    pub major: u32,
    /// `2` of 8.2.
    pub minor: u32,
}

impl PtxIsa {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The version the first `.version X.Y` directive of `ptx` declares; `None` without one.
    pub fn of(ptx: &str) -> Option<Self> {
        ptx.lines().find_map(|line| {
            let rest = line.trim_start().strip_prefix(".version")?;
            if !rest.starts_with([' ', '\t']) {
                return None;
            }
            let (major, minor) = rest.trim().split_once('.')?;
            let minor: String = minor.chars().take_while(char::is_ascii_digit).collect();
            Some(Self::new(major.parse().ok()?, minor.parse().ok()?))
        })
    }
}

impl fmt::Display for PtxIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Each CUDA release and the newest PTX ISA its driver JITs, oldest first.
const PTX_ISA_OF_CUDA: [(CudaVersion, PtxIsa); 20] = {
    const fn e(cuda: (u32, u32), isa: (u32, u32)) -> (CudaVersion, PtxIsa) {
        (CudaVersion::new(cuda.0, cuda.1), PtxIsa::new(isa.0, isa.1))
    }
    [
        e((11, 0), (7, 0)),
        e((11, 1), (7, 1)),
        e((11, 2), (7, 2)),
        e((11, 3), (7, 3)),
        e((11, 4), (7, 4)),
        e((11, 5), (7, 5)),
        e((11, 6), (7, 6)),
        e((11, 7), (7, 7)),
        e((11, 8), (7, 8)),
        e((12, 0), (8, 0)),
        e((12, 1), (8, 1)),
        e((12, 2), (8, 2)),
        e((12, 3), (8, 3)),
        e((12, 4), (8, 4)),
        e((12, 5), (8, 5)),
        e((12, 7), (8, 6)),
        e((12, 8), (8, 7)),
        e((12, 9), (8, 8)),
        e((13, 0), (9, 0)),
        e((13, 1), (9, 1)),
    ]
};

/// The Linux driver branch each CUDA release first shipped with.
const LINUX_BRANCH_OF_CUDA: [(CudaVersion, u32); 11] = [
    (CudaVersion::new(12, 0), 525),
    (CudaVersion::new(12, 1), 530),
    (CudaVersion::new(12, 2), 535),
    (CudaVersion::new(12, 3), 545),
    (CudaVersion::new(12, 4), 550),
    (CudaVersion::new(12, 5), 555),
    (CudaVersion::new(12, 6), 560),
    (CudaVersion::new(12, 8), 570),
    (CudaVersion::new(12, 9), 575),
    (CudaVersion::new(13, 0), 580),
    (CudaVersion::new(13, 1), 590),
];

/// The NVRTC the CUDA bundle carries: the oldest that compiles every kernel the project emits. Its
/// PTX (ISA 8.2) runs on every driver from CUDA 12.2 (Linux 535).
pub const BUNDLED_NVRTC: CudaVersion = CudaVersion::new(12, 2);

/// Whether a driver of CUDA `driver` JITs PTX ISA `isa`; `None` where the tables cannot tell (a
/// driver newer than every known release, and an ISA newer still).
pub fn driver_jits(driver: CudaVersion, isa: PtxIsa) -> Option<bool> {
    match driver.ptx_isa() {
        Some(newest) => Some(isa <= newest),
        None if driver > CudaVersion::NEWEST_KNOWN => {
            CudaVersion::oldest_for(isa).is_some().then_some(true)
        }
        None => None,
    }
}

/// A module the driver refused because its PTX ISA is newer than it JITs
/// (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`), with the versions and the fix. It comes back as
/// [`scope_core::Error::External`], so it stays typed: match it with
/// `error.external_root::<UnsupportedPtx>()`.
#[derive(Clone, Debug)]
pub struct UnsupportedPtx {
    /// The kernel whose module was refused.
    pub kernel: Arc<str>,
    /// The ISA version the PTX declares (`.version`), if any.
    pub ptx_isa: Option<PtxIsa>,
    /// The driver's CUDA version (`cuDriverGetVersion`), where it answered.
    pub driver: Option<CudaVersion>,
    /// The NVRTC that wrote the PTX; `None` for PTX the caller gave.
    pub nvrtc: Option<CudaVersion>,
    /// The driver JIT's log.
    pub log: String,
}

impl UnsupportedPtx {
    /// The newest PTX ISA the driver JITs, where the tables know it.
    pub fn driver_isa(&self) -> Option<PtxIsa> {
        self.driver.and_then(CudaVersion::ptx_isa)
    }

    /// The oldest CUDA release whose driver JITs this PTX.
    pub fn driver_needed(&self) -> Option<CudaVersion> {
        self.ptx_isa.and_then(CudaVersion::oldest_for)
    }
}

impl fmt::Display for UnsupportedPtx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let isa = self.ptx_isa.map_or_else(
            || "of an unknown ISA version".to_owned(),
            |v| format!("ISA {v}"),
        );
        let driver = self
            .driver
            .map_or_else(|| "of unknown version".to_owned(), |v| format!("CUDA {v}"));
        write!(
            f,
            "kernel `{}`: the CUDA driver ({driver}) cannot JIT its PTX ({isa}",
            self.kernel
        )?;
        match self.nvrtc {
            Some(nvrtc) => write!(f, ", written by NVRTC {nvrtc})")?,
            None => f.write_str(", given as PTX)")?,
        }
        if let Some(newest) = self.driver_isa() {
            write!(f, "; it JITs PTX ISA {newest} and older")?;
        }
        f.write_str(" (CUDA_ERROR_UNSUPPORTED_PTX_VERSION).\nFix: ")?;
        match self.driver_needed() {
            Some(needed) => {
                write!(f, "a driver for CUDA {needed} or newer")?;
                if let Some(branch) = needed.linux_driver_branch() {
                    write!(f, " (Linux {branch} or newer)")?;
                }
            }
            None => f.write_str("a newer driver")?,
        }
        match (self.nvrtc, self.driver) {
            (Some(_), Some(driver)) => {
                write!(f, ", or an NVRTC no newer than the driver (CUDA {driver})")?;
                if driver >= BUNDLED_NVRTC {
                    write!(
                        f,
                        ", such as the NVRTC {BUNDLED_NVRTC} `cargo xtask bundle --backend cuda` carries"
                    )?;
                }
            }
            (Some(_), None) => f.write_str(", or an older NVRTC")?,
            (None, Some(driver)) => {
                write!(f, ", or PTX no newer than the driver's (CUDA {driver})")?;
                if let Some(newest) = self.driver_isa() {
                    write!(f, ", `.version {newest}` or older")?;
                }
            }
            (None, None) => f.write_str(", or older PTX")?,
        }
        let log = self.log.trim_end();
        if !log.is_empty() {
            write!(f, ".\nThe JIT's log:\n{log}")?;
        } else {
            f.write_str(".")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnsupportedPtx {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_directive_is_read_past_comments() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n//\n\n.version 8.2\n.target sm_80\n";
        assert_eq!(PtxIsa::of(ptx), Some(PtxIsa::new(8, 2)));
        assert_eq!(PtxIsa::of(".version\t9.0 // x\n"), Some(PtxIsa::new(9, 0)));
        assert_eq!(PtxIsa::of(".target sm_80\n"), None);
        assert_eq!(PtxIsa::of(".versionx 8.2\n"), None);
        assert_eq!(PtxIsa::of(".version 8\n"), None);
    }

    #[test]
    fn each_driver_jits_the_isa_of_its_release_and_older() {
        let v = CudaVersion::new;
        let isa = PtxIsa::new;
        assert_eq!(v(12, 2).ptx_isa(), Some(isa(8, 2)));
        assert_eq!(v(12, 6).ptx_isa(), Some(isa(8, 5)));
        assert_eq!(v(12, 8).ptx_isa(), Some(isa(8, 7)));
        assert_eq!(v(13, 0).ptx_isa(), Some(isa(9, 0)));
        assert_eq!(v(10, 2).ptx_isa(), None);
        assert_eq!(v(14, 0).ptx_isa(), None);
        assert_eq!(driver_jits(v(12, 2), isa(8, 2)), Some(true));
        assert_eq!(driver_jits(v(12, 2), isa(9, 0)), Some(false));
        assert_eq!(driver_jits(v(12, 1), isa(8, 2)), Some(false));
        assert_eq!(driver_jits(v(13, 0), isa(8, 2)), Some(true));
        assert_eq!(driver_jits(v(14, 0), isa(9, 0)), Some(true));
        assert_eq!(driver_jits(v(14, 0), isa(9, 9)), None);
        assert_eq!(driver_jits(v(10, 2), isa(6, 5)), None);
        assert_eq!(CudaVersion::oldest_for(isa(9, 0)), Some(v(13, 0)));
        assert_eq!(CudaVersion::oldest_for(isa(8, 2)), Some(v(12, 2)));
        assert_eq!(CudaVersion::oldest_for(isa(8, 6)), Some(v(12, 7)));
        assert_eq!(CudaVersion::from_driver(12020), Some(v(12, 2)));
        assert_eq!(CudaVersion::from_driver(13000), Some(v(13, 0)));
        assert_eq!(CudaVersion::from_driver(-1), None);
        assert_eq!(v(12, 2).linux_driver_branch(), Some(535));
        assert_eq!(v(13, 0).linux_driver_branch(), Some(580));
    }

    #[test]
    fn the_error_names_the_versions_and_the_fix() {
        let error = UnsupportedPtx {
            kernel: "fill".into(),
            ptx_isa: Some(PtxIsa::new(9, 0)),
            driver: Some(CudaVersion::new(12, 2)),
            nvrtc: Some(CudaVersion::new(13, 0)),
            log: "ptxas fatal : Unsupported .version 9.0; current version is '8.2'".to_owned(),
        };
        let text = error.to_string();
        for part in [
            "kernel `fill`",
            "CUDA 12.2",
            "ISA 9.0",
            "NVRTC 13.0",
            "PTX ISA 8.2 and older",
            "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
            "a driver for CUDA 13.0 or newer (Linux 580 or newer)",
            "an NVRTC no newer than the driver (CUDA 12.2), such as the NVRTC 12.2",
            "current version is '8.2'",
        ] {
            assert!(text.contains(part), "{part:?} missing from:\n{text}");
        }
        let given = UnsupportedPtx {
            nvrtc: None,
            ..error
        };
        let text = given.to_string();
        assert!(text.contains("given as PTX"), "{text}");
        assert!(!text.contains("NVRTC"), "{text}");
        assert!(text.contains("`.version 8.2` or older"), "{text}");
    }
}
