//! The C side of HIP and hiprtc that this crate uses, written out by hand.
//!
//! No binding crate is used (see the crate docs), so the few types, values and flags the
//! server needs are here, checked against ROCm 6/7's `hip/hip_runtime_api.h` and
//! `hip/hiprtc.h`. Handles are opaque pointers; enums are `c_int`, so an unnamed value fits.

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `hipError_t`.
pub type HipErrorCode = c_int;
/// `hiprtcResult`.
pub type RtcResult = c_int;

/// `hipStream_t`.
pub type RawStream = *mut c_void;
/// `hipEvent_t`.
pub type RawEvent = *mut c_void;
/// `hipModule_t`.
pub type RawModule = *mut c_void;
/// `hipFunction_t`.
pub type RawFunction = *mut c_void;
/// `hipGraph_t`.
pub type RawGraph = *mut c_void;
/// `hipGraphExec_t`.
pub type RawGraphExec = *mut c_void;
/// `hipGraphNode_t`.
pub type RawGraphNode = *mut c_void;
/// `hiprtcProgram`.
pub type RawProgram = *mut c_void;
/// `hipDeviceptr_t` (and any device address).
pub type DevicePtr = *mut c_void;

/// `hipError_t` values (`hip_runtime_api.h`, ROCm 6.x/7.x).
#[allow(missing_docs)]
pub mod code {
    use super::HipErrorCode;
    pub const SUCCESS: HipErrorCode = 0;
    pub const INVALID_VALUE: HipErrorCode = 1;
    pub const OUT_OF_MEMORY: HipErrorCode = 2;
    pub const NOT_INITIALIZED: HipErrorCode = 3;
    pub const DEINITIALIZED: HipErrorCode = 4;
    pub const INVALID_CONFIGURATION: HipErrorCode = 9;
    pub const INVALID_SYMBOL: HipErrorCode = 13;
    pub const INVALID_DEVICE_POINTER: HipErrorCode = 17;
    pub const INVALID_MEMCPY_DIRECTION: HipErrorCode = 21;
    pub const INSUFFICIENT_DRIVER: HipErrorCode = 35;
    pub const MISSING_CONFIGURATION: HipErrorCode = 52;
    pub const PRIOR_LAUNCH_FAILURE: HipErrorCode = 53;
    pub const INVALID_DEVICE_FUNCTION: HipErrorCode = 98;
    pub const NO_DEVICE: HipErrorCode = 100;
    pub const INVALID_DEVICE: HipErrorCode = 101;
    pub const INVALID_IMAGE: HipErrorCode = 200;
    pub const INVALID_CONTEXT: HipErrorCode = 201;
    pub const NO_BINARY_FOR_GPU: HipErrorCode = 209;
    pub const ECC_NOT_CORRECTABLE: HipErrorCode = 214;
    pub const INVALID_KERNEL_FILE: HipErrorCode = 218;
    pub const INVALID_SOURCE: HipErrorCode = 300;
    pub const FILE_NOT_FOUND: HipErrorCode = 301;
    pub const SHARED_OBJECT_SYMBOL_NOT_FOUND: HipErrorCode = 302;
    pub const SHARED_OBJECT_INIT_FAILED: HipErrorCode = 303;
    pub const INVALID_HANDLE: HipErrorCode = 400;
    pub const ILLEGAL_STATE: HipErrorCode = 401;
    pub const NOT_FOUND: HipErrorCode = 500;
    pub const NOT_READY: HipErrorCode = 600;
    pub const ILLEGAL_ADDRESS: HipErrorCode = 700;
    pub const LAUNCH_OUT_OF_RESOURCES: HipErrorCode = 701;
    pub const LAUNCH_TIME_OUT: HipErrorCode = 702;
    pub const CONTEXT_IS_DESTROYED: HipErrorCode = 709;
    pub const ASSERT: HipErrorCode = 710;
    pub const LAUNCH_FAILURE: HipErrorCode = 719;
    pub const COOPERATIVE_LAUNCH_TOO_LARGE: HipErrorCode = 720;
    pub const NOT_SUPPORTED: HipErrorCode = 801;
    pub const STREAM_CAPTURE_UNSUPPORTED: HipErrorCode = 900;
    pub const STREAM_CAPTURE_INVALIDATED: HipErrorCode = 901;
    pub const STREAM_CAPTURE_MERGE: HipErrorCode = 902;
    pub const STREAM_CAPTURE_UNMATCHED: HipErrorCode = 903;
    pub const STREAM_CAPTURE_UNJOINED: HipErrorCode = 904;
    pub const STREAM_CAPTURE_ISOLATION: HipErrorCode = 905;
    pub const STREAM_CAPTURE_IMPLICIT: HipErrorCode = 906;
    pub const CAPTURED_EVENT: HipErrorCode = 907;
    pub const STREAM_CAPTURE_WRONG_THREAD: HipErrorCode = 908;
    pub const GRAPH_EXEC_UPDATE_FAILURE: HipErrorCode = 910;
    pub const UNKNOWN: HipErrorCode = 999;
    pub const RUNTIME_MEMORY: HipErrorCode = 1052;
    pub const RUNTIME_OTHER: HipErrorCode = 1053;
}

/// The header's name for `value`, so messages name it without asking the runtime.
pub fn code_name(value: HipErrorCode) -> Option<&'static str> {
    use code::*;
    Some(match value {
        SUCCESS => "hipSuccess",
        INVALID_VALUE => "hipErrorInvalidValue",
        OUT_OF_MEMORY => "hipErrorOutOfMemory",
        NOT_INITIALIZED => "hipErrorNotInitialized",
        DEINITIALIZED => "hipErrorDeinitialized",
        INVALID_CONFIGURATION => "hipErrorInvalidConfiguration",
        INVALID_SYMBOL => "hipErrorInvalidSymbol",
        INVALID_DEVICE_POINTER => "hipErrorInvalidDevicePointer",
        INVALID_MEMCPY_DIRECTION => "hipErrorInvalidMemcpyDirection",
        INSUFFICIENT_DRIVER => "hipErrorInsufficientDriver",
        MISSING_CONFIGURATION => "hipErrorMissingConfiguration",
        PRIOR_LAUNCH_FAILURE => "hipErrorPriorLaunchFailure",
        INVALID_DEVICE_FUNCTION => "hipErrorInvalidDeviceFunction",
        NO_DEVICE => "hipErrorNoDevice",
        INVALID_DEVICE => "hipErrorInvalidDevice",
        INVALID_IMAGE => "hipErrorInvalidImage",
        INVALID_CONTEXT => "hipErrorInvalidContext",
        NO_BINARY_FOR_GPU => "hipErrorNoBinaryForGpu",
        ECC_NOT_CORRECTABLE => "hipErrorECCNotCorrectable",
        INVALID_KERNEL_FILE => "hipErrorInvalidKernelFile",
        INVALID_SOURCE => "hipErrorInvalidSource",
        FILE_NOT_FOUND => "hipErrorFileNotFound",
        SHARED_OBJECT_SYMBOL_NOT_FOUND => "hipErrorSharedObjectSymbolNotFound",
        SHARED_OBJECT_INIT_FAILED => "hipErrorSharedObjectInitFailed",
        INVALID_HANDLE => "hipErrorInvalidHandle",
        ILLEGAL_STATE => "hipErrorIllegalState",
        NOT_FOUND => "hipErrorNotFound",
        NOT_READY => "hipErrorNotReady",
        ILLEGAL_ADDRESS => "hipErrorIllegalAddress",
        LAUNCH_OUT_OF_RESOURCES => "hipErrorLaunchOutOfResources",
        LAUNCH_TIME_OUT => "hipErrorLaunchTimeOut",
        CONTEXT_IS_DESTROYED => "hipErrorContextIsDestroyed",
        ASSERT => "hipErrorAssert",
        LAUNCH_FAILURE => "hipErrorLaunchFailure",
        COOPERATIVE_LAUNCH_TOO_LARGE => "hipErrorCooperativeLaunchTooLarge",
        NOT_SUPPORTED => "hipErrorNotSupported",
        STREAM_CAPTURE_UNSUPPORTED => "hipErrorStreamCaptureUnsupported",
        STREAM_CAPTURE_INVALIDATED => "hipErrorStreamCaptureInvalidated",
        STREAM_CAPTURE_MERGE => "hipErrorStreamCaptureMerge",
        STREAM_CAPTURE_UNMATCHED => "hipErrorStreamCaptureUnmatched",
        STREAM_CAPTURE_UNJOINED => "hipErrorStreamCaptureUnjoined",
        STREAM_CAPTURE_ISOLATION => "hipErrorStreamCaptureIsolation",
        STREAM_CAPTURE_IMPLICIT => "hipErrorStreamCaptureImplicit",
        CAPTURED_EVENT => "hipErrorCapturedEvent",
        STREAM_CAPTURE_WRONG_THREAD => "hipErrorStreamCaptureWrongThread",
        GRAPH_EXEC_UPDATE_FAILURE => "hipErrorGraphExecUpdateFailure",
        UNKNOWN => "hipErrorUnknown",
        RUNTIME_MEMORY => "hipErrorRuntimeMemory",
        RUNTIME_OTHER => "hipErrorRuntimeOther",
        _ => return None,
    })
}

/// `hiprtcResult` values (`hiprtc.h`).
#[allow(missing_docs)]
pub mod rtc {
    use super::RtcResult;
    pub const SUCCESS: RtcResult = 0;
    pub const OUT_OF_MEMORY: RtcResult = 1;
}

/// `hipStreamNonBlocking`: no implicit sync with the null stream, which capture forbids.
pub const STREAM_NON_BLOCKING: c_uint = 0x01;
/// `hipEventDisableTiming`: the cheapest event, for ordering only.
pub const EVENT_DISABLE_TIMING: c_uint = 0x02;
/// `hipHostMallocDefault`.
pub const HOST_MALLOC_DEFAULT: c_uint = 0x00;
/// `hipMemcpyHostToDevice`.
pub const MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `hipMemcpyDeviceToHost`.
pub const MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `hipMemcpyDeviceToDevice`.
pub const MEMCPY_DEVICE_TO_DEVICE: c_int = 3;
/// `hipStreamCaptureModeRelaxed`: others may host-sync or pin memory while a stream records.
pub const CAPTURE_MODE_RELAXED: c_int = 2;

/// `hipUUID`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HipUuid {
    /// The bytes.
    pub bytes: [c_char; 16],
}

/// `hipDeviceProp_tR0600`, the frozen layout `hipGetDevicePropertiesR0600` fills (ROCm 6+),
/// transcribed in full to place the few fields read; a unit test pins the offsets.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_snake_case, missing_docs)]
pub struct DevicePropR0600 {
    pub name: [c_char; 256],
    pub uuid: HipUuid,
    pub luid: [c_char; 8],
    pub luidDeviceNodeMask: c_uint,
    pub totalGlobalMem: usize,
    pub sharedMemPerBlock: usize,
    pub regsPerBlock: c_int,
    pub warpSize: c_int,
    pub memPitch: usize,
    pub maxThreadsPerBlock: c_int,
    pub maxThreadsDim: [c_int; 3],
    pub maxGridSize: [c_int; 3],
    pub clockRate: c_int,
    pub totalConstMem: usize,
    pub major: c_int,
    pub minor: c_int,
    pub textureAlignment: usize,
    pub texturePitchAlignment: usize,
    pub deviceOverlap: c_int,
    pub multiProcessorCount: c_int,
    pub kernelExecTimeoutEnabled: c_int,
    pub integrated: c_int,
    pub canMapHostMemory: c_int,
    pub computeMode: c_int,
    pub maxTexture1D: c_int,
    pub maxTexture1DMipmap: c_int,
    pub maxTexture1DLinear: c_int,
    pub maxTexture2D: [c_int; 2],
    pub maxTexture2DMipmap: [c_int; 2],
    pub maxTexture2DLinear: [c_int; 3],
    pub maxTexture2DGather: [c_int; 2],
    pub maxTexture3D: [c_int; 3],
    pub maxTexture3DAlt: [c_int; 3],
    pub maxTextureCubemap: c_int,
    pub maxTexture1DLayered: [c_int; 2],
    pub maxTexture2DLayered: [c_int; 3],
    pub maxTextureCubemapLayered: [c_int; 2],
    pub maxSurface1D: c_int,
    pub maxSurface2D: [c_int; 2],
    pub maxSurface3D: [c_int; 3],
    pub maxSurface1DLayered: [c_int; 2],
    pub maxSurface2DLayered: [c_int; 3],
    pub maxSurfaceCubemap: c_int,
    pub maxSurfaceCubemapLayered: [c_int; 2],
    pub surfaceAlignment: usize,
    pub concurrentKernels: c_int,
    pub ECCEnabled: c_int,
    pub pciBusID: c_int,
    pub pciDeviceID: c_int,
    pub pciDomainID: c_int,
    pub tccDriver: c_int,
    pub asyncEngineCount: c_int,
    pub unifiedAddressing: c_int,
    pub memoryClockRate: c_int,
    pub memoryBusWidth: c_int,
    pub l2CacheSize: c_int,
    pub persistingL2CacheMaxSize: c_int,
    pub maxThreadsPerMultiProcessor: c_int,
    pub streamPrioritiesSupported: c_int,
    pub globalL1CacheSupported: c_int,
    pub localL1CacheSupported: c_int,
    pub sharedMemPerMultiprocessor: usize,
    pub regsPerMultiprocessor: c_int,
    pub managedMemory: c_int,
    pub isMultiGpuBoard: c_int,
    pub multiGpuBoardGroupID: c_int,
    pub hostNativeAtomicSupported: c_int,
    pub singleToDoublePrecisionPerfRatio: c_int,
    pub pageableMemoryAccess: c_int,
    pub concurrentManagedAccess: c_int,
    pub computePreemptionSupported: c_int,
    pub canUseHostPointerForRegisteredMem: c_int,
    pub cooperativeLaunch: c_int,
    pub cooperativeMultiDeviceLaunch: c_int,
    pub sharedMemPerBlockOptin: usize,
    pub pageableMemoryAccessUsesHostPageTables: c_int,
    pub directManagedMemAccessFromHost: c_int,
    pub maxBlocksPerMultiProcessor: c_int,
    pub accessPolicyMaxWindowSize: c_int,
    pub reservedSharedMemPerBlock: usize,
    pub hostRegisterSupported: c_int,
    pub sparseHipArraySupported: c_int,
    pub hostRegisterReadOnlySupported: c_int,
    pub timelineSemaphoreInteropSupported: c_int,
    pub memoryPoolsSupported: c_int,
    pub gpuDirectRDMASupported: c_int,
    pub gpuDirectRDMAFlushWritesOptions: c_uint,
    pub gpuDirectRDMAWritesOrdering: c_int,
    pub memoryPoolSupportedHandleTypes: c_uint,
    pub deferredMappingHipArraySupported: c_int,
    pub ipcEventSupported: c_int,
    pub clusterLaunch: c_int,
    pub unifiedFunctionPointers: c_int,
    pub reserved: [c_int; 63],
    pub hipReserved: [c_int; 32],
    pub gcnArchName: [c_char; 256],
    pub maxSharedMemoryPerMultiProcessor: usize,
    pub clockInstructionRate: c_int,
    /// `hipDeviceArch_t`: seventeen one-bit fields in one `unsigned`.
    pub arch: c_uint,
    pub hdpMemFlushCntl: *mut c_uint,
    pub hdpRegFlushCntl: *mut c_uint,
    pub cooperativeMultiDeviceUnmatchedFunc: c_int,
    pub cooperativeMultiDeviceUnmatchedGridDim: c_int,
    pub cooperativeMultiDeviceUnmatchedBlockDim: c_int,
    pub cooperativeMultiDeviceUnmatchedSharedMem: c_int,
    pub isLargeBar: c_int,
    pub asicRevision: c_int,
}

/// The properties plus spare room, so a newer runtime's longer struct stays in our memory.
#[repr(C)]
pub struct DevicePropBuffer {
    /// The properties.
    pub props: DevicePropR0600,
    /// Room for fields a later runtime appends.
    pub spare: [u8; 4096],
}

impl DevicePropBuffer {
    /// All zeroes, on the heap (it is several kilobytes).
    pub fn zeroed() -> Box<Self> {
        // SAFETY: every field is an integer, integer array or raw pointer: all-zero is valid.
        Box::new(unsafe { std::mem::zeroed() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Offsets from an independent count of the R0600 header (LP64); the mock writes these.
    #[test]
    fn device_props_match_the_r0600_layout() {
        assert_eq!(offset_of!(DevicePropR0600, uuid), 256);
        assert_eq!(offset_of!(DevicePropR0600, totalGlobalMem), 288);
        assert_eq!(offset_of!(DevicePropR0600, sharedMemPerBlock), 296);
        assert_eq!(offset_of!(DevicePropR0600, warpSize), 308);
        assert_eq!(offset_of!(DevicePropR0600, maxThreadsPerBlock), 320);
        assert_eq!(offset_of!(DevicePropR0600, maxThreadsDim), 324);
        assert_eq!(offset_of!(DevicePropR0600, maxGridSize), 336);
        assert_eq!(offset_of!(DevicePropR0600, gcnArchName), 1160);
        assert_eq!(size_of::<DevicePropR0600>(), 1472);
    }

    #[test]
    fn names_cover_the_codes_that_classification_cares_about() {
        for c in [
            code::ILLEGAL_ADDRESS,
            code::LAUNCH_FAILURE,
            code::ASSERT,
            code::LAUNCH_TIME_OUT,
            code::ECC_NOT_CORRECTABLE,
            code::CONTEXT_IS_DESTROYED,
            code::PRIOR_LAUNCH_FAILURE,
            code::OUT_OF_MEMORY,
        ] {
            assert!(code_name(c).is_some(), "{c}");
        }
        assert_eq!(code_name(12345), None);
    }
}
