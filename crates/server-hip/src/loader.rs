//! Loading HIP at run time: a table of function pointers whose loader answers a `Result`.
//!
//! The table is all this crate asks of ROCm: a few dozen entry points of `libamdhip64` and
//! `libhiprtc`, resolved once through `libloading`. No ROCm is [`LoadError::LibraryNotFound`];
//! a missing entry point is [`LoadError::MissingSymbol`], named. Neither panics nor aborts: the
//! reason to own the table. Libraries stay loaded for the process, since the runtime cannot be
//! unloaded while its threads run and every handle points into it.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::{Arc, OnceLock};

use libloading::Library;

use crate::ffi::*;

/// Why HIP could not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No candidate file could be opened.
    #[error("{what} not found (tried {}): {detail}", tried.join(", "))]
    LibraryNotFound {
        /// Which library: "the HIP runtime (libamdhip64)".
        what: &'static str,
        /// The names and paths tried, in order.
        tried: Vec<String>,
        /// The loader's message for the last one.
        detail: String,
    },
    /// A library was opened but lacks an entry point the server needs.
    #[error("{library} has no symbol `{symbol}` (ROCm 6 or later is required)")]
    MissingSymbol {
        /// The library opened.
        library: String,
        /// The entry point it lacks.
        symbol: &'static str,
    },
}

/// Resolve `name` in `lib` as a value of type `T`.
/// # Safety
/// `T` is the function-pointer type the library's C header declares for `name`.
unsafe fn symbol<T: Copy>(
    lib: &Library,
    library: &str,
    name: &'static str,
) -> Result<T, LoadError> {
    // SAFETY: the caller vouches for `T`; the copied pointer is valid while the `Api` holds `lib`.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|_| LoadError::MissingSymbol {
            library: library.to_owned(),
            symbol: name,
        })
}

/// A table of entry points: a struct of function pointers, its resolver, and its names.
macro_rules! entry_points {
    ($(#[$meta:meta])* $name:ident { $( $field:ident = $sym:literal : fn($($arg:ty),* $(,)?) -> $ret:ty; )* }) => {
        $(#[$meta])*
        #[allow(missing_docs)]
        pub struct $name {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        impl $name {
            /// Every symbol the table needs, in declaration order.
            #[allow(dead_code)]
            pub const SYMBOLS: &'static [&'static str] = &[$($sym),*];

            fn resolve(lib: &Library, library: &str) -> Result<Self, LoadError> {
                Ok(Self {
                    // SAFETY: each field's type is transcribed from its symbol's header.
                    $( $field: unsafe { symbol(lib, library, $sym)? }, )*
                })
            }
        }
    };
}

entry_points! {
    /// The HIP runtime's entry points (`hip_runtime_api.h`).
    Runtime {
        init = "hipInit": fn(c_uint) -> HipErrorCode;
        runtime_get_version = "hipRuntimeGetVersion": fn(*mut c_int) -> HipErrorCode;
        get_device_count = "hipGetDeviceCount": fn(*mut c_int) -> HipErrorCode;
        get_device_properties = "hipGetDevicePropertiesR0600": fn(*mut DevicePropR0600, c_int) -> HipErrorCode;
        device_total_mem = "hipDeviceTotalMem": fn(*mut usize, c_int) -> HipErrorCode;
        set_device = "hipSetDevice": fn(c_int) -> HipErrorCode;
        device_reset = "hipDeviceReset": fn() -> HipErrorCode;
        get_error_name = "hipGetErrorName": fn(HipErrorCode) -> *const c_char;
        get_error_string = "hipGetErrorString": fn(HipErrorCode) -> *const c_char;
        stream_create_with_flags = "hipStreamCreateWithFlags": fn(*mut RawStream, c_uint) -> HipErrorCode;
        stream_destroy = "hipStreamDestroy": fn(RawStream) -> HipErrorCode;
        stream_synchronize = "hipStreamSynchronize": fn(RawStream) -> HipErrorCode;
        stream_wait_event = "hipStreamWaitEvent": fn(RawStream, RawEvent, c_uint) -> HipErrorCode;
        event_create_with_flags = "hipEventCreateWithFlags": fn(*mut RawEvent, c_uint) -> HipErrorCode;
        event_record = "hipEventRecord": fn(RawEvent, RawStream) -> HipErrorCode;
        event_query = "hipEventQuery": fn(RawEvent) -> HipErrorCode;
        event_synchronize = "hipEventSynchronize": fn(RawEvent) -> HipErrorCode;
        event_destroy = "hipEventDestroy": fn(RawEvent) -> HipErrorCode;
        malloc = "hipMalloc": fn(*mut DevicePtr, usize) -> HipErrorCode;
        free = "hipFree": fn(DevicePtr) -> HipErrorCode;
        host_malloc = "hipHostMalloc": fn(*mut *mut c_void, usize, c_uint) -> HipErrorCode;
        host_free = "hipHostFree": fn(*mut c_void) -> HipErrorCode;
        memcpy_async = "hipMemcpyAsync": fn(*mut c_void, *const c_void, usize, c_int, RawStream) -> HipErrorCode;
        module_load_data = "hipModuleLoadData": fn(*mut RawModule, *const c_void) -> HipErrorCode;
        module_get_function = "hipModuleGetFunction": fn(*mut RawFunction, RawModule, *const c_char) -> HipErrorCode;
        module_unload = "hipModuleUnload": fn(RawModule) -> HipErrorCode;
        module_launch_kernel = "hipModuleLaunchKernel": fn(
            RawFunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, RawStream,
            *mut *mut c_void, *mut *mut c_void,
        ) -> HipErrorCode;
        stream_begin_capture = "hipStreamBeginCapture": fn(RawStream, c_int) -> HipErrorCode;
        stream_end_capture = "hipStreamEndCapture": fn(RawStream, *mut RawGraph) -> HipErrorCode;
        graph_instantiate = "hipGraphInstantiate": fn(*mut RawGraphExec, RawGraph, *mut RawGraphNode, *mut c_char, usize) -> HipErrorCode;
        graph_launch = "hipGraphLaunch": fn(RawGraphExec, RawStream) -> HipErrorCode;
        graph_exec_destroy = "hipGraphExecDestroy": fn(RawGraphExec) -> HipErrorCode;
        graph_destroy = "hipGraphDestroy": fn(RawGraph) -> HipErrorCode;
    }
}

entry_points! {
    /// hiprtc's entry points (`hiprtc.h`).
    Rtc {
        create_program = "hiprtcCreateProgram": fn(
            *mut RawProgram, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char,
        ) -> RtcResult;
        compile_program = "hiprtcCompileProgram": fn(RawProgram, c_int, *const *const c_char) -> RtcResult;
        get_code_size = "hiprtcGetCodeSize": fn(RawProgram, *mut usize) -> RtcResult;
        get_code = "hiprtcGetCode": fn(RawProgram, *mut c_char) -> RtcResult;
        get_program_log_size = "hiprtcGetProgramLogSize": fn(RawProgram, *mut usize) -> RtcResult;
        get_program_log = "hiprtcGetProgramLog": fn(RawProgram, *mut c_char) -> RtcResult;
        destroy_program = "hiprtcDestroyProgram": fn(*mut RawProgram) -> RtcResult;
        get_error_string = "hiprtcGetErrorString": fn(RtcResult) -> *const c_char;
    }
}

/// The loaded HIP runtime and, when found, hiprtc.
pub struct Api {
    /// The runtime's entry points.
    pub rt: Runtime,
    /// hiprtc's entry points, or why not: copies and graphs work without, compiling does not.
    pub rtc: Result<Rtc, LoadError>,
    /// Where the runtime was found, for descriptions.
    pub runtime_path: String,
    // Declared last so the function pointers above never outlive it.
    _libraries: Vec<Library>,
}

/// The runtime's file names, most specific first (`ROCM_PATH`, `HIP_PATH`: off-path installs).
fn runtime_candidates() -> Vec<String> {
    candidates("libamdhip64.so", &["libamdhip64.so.7", "libamdhip64.so.6"])
}

fn rtc_candidates() -> Vec<String> {
    candidates("libhiprtc.so", &["libhiprtc.so.7", "libhiprtc.so.6"])
}

fn candidates(base: &str, versioned: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Ok(root) = std::env::var(var)
            && !root.is_empty()
        {
            out.push(format!("{root}/lib/{base}"));
        }
    }
    out.push(base.to_owned());
    out.extend(versioned.iter().map(|s| (*s).to_owned()));
    out.push(format!("/opt/rocm/lib/{base}"));
    out
}

/// An error and its sources: libloading says only "dlopen failed"; the reason is a source.
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn open_first(what: &'static str, names: &[String]) -> Result<(Library, String), LoadError> {
    let mut detail = String::from("no candidates");
    for name in names {
        // SAFETY: opening runs the library's initialisers; these are HIP's and hiprtc's (or
        // a test's system library), which only set up their own state.
        match unsafe { Library::new(name.as_str()) } {
            Ok(lib) => return Ok((lib, name.clone())),
            Err(e) => detail = with_sources(&e),
        }
    }
    Err(LoadError::LibraryNotFound {
        what,
        tried: names.to_vec(),
        detail,
    })
}

impl Api {
    /// Load the runtime from the first of `runtime` that opens, and hiprtc from the first of
    /// `rtc`, or from the runtime itself (where ROCm 5 shipped it).
    pub fn load_from(runtime: &[String], rtc: &[String]) -> Result<Self, LoadError> {
        let (rt_lib, runtime_path) = open_first("the HIP runtime (libamdhip64)", runtime)?;
        let rt = Runtime::resolve(&rt_lib, &runtime_path)?;
        let mut libraries = vec![rt_lib];
        let rtc = match open_first("hiprtc (libhiprtc)", rtc) {
            Ok((lib, path)) => {
                let table = Rtc::resolve(&lib, &path);
                libraries.push(lib);
                table
            }
            Err(not_found) => Rtc::resolve(&libraries[0], &runtime_path).map_err(|_| not_found),
        };
        Ok(Self {
            rt,
            rtc,
            runtime_path,
            _libraries: libraries,
        })
    }

    /// hiprtc alone, from the first of `names` that opens (its own library, or a runtime
    /// carrying it), without driving a runtime; loaded once per list and kept for the process.
    pub fn rtc_from(names: &[String]) -> Result<&'static Rtc, LoadError> {
        type Loaded = Vec<(Vec<String>, &'static Rtc)>;
        static LOADED: parking_lot::Mutex<Loaded> = parking_lot::Mutex::new(Vec::new());
        let mut loaded = LOADED.lock();
        if let Some((_, rtc)) = loaded.iter().find(|(n, _)| n == names) {
            return Ok(rtc);
        }
        let (lib, path) = open_first("hiprtc (libhiprtc)", names)?;
        let rtc: &'static Rtc = Box::leak(Box::new(Rtc::resolve(&lib, &path)?));
        // Never unloaded: the table's pointers point into it.
        std::mem::forget(lib);
        loaded.push((names.to_vec(), rtc));
        Ok(rtc)
    }

    /// The process's HIP, loaded on first use.
    pub fn get() -> Result<Arc<Api>, LoadError> {
        static API: OnceLock<Result<Arc<Api>, LoadError>> = OnceLock::new();
        API.get_or_init(|| Api::load_from(&runtime_candidates(), &rtc_candidates()).map(Arc::new))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_a_typed_error_listing_what_was_tried() {
        let names = vec![
            "libscope-no-such-hip.so".to_owned(),
            "/nonexistent/libamdhip64.so".to_owned(),
        ];
        let Err(error) = Api::load_from(&names, &names) else {
            panic!("a library that does not exist loaded");
        };
        match &error {
            LoadError::LibraryNotFound { tried, detail, .. } => {
                assert_eq!(tried, &names);
                assert!(!detail.is_empty());
            }
            other => panic!("expected LibraryNotFound, got {other:?}"),
        }
        assert!(
            error.to_string().contains("libscope-no-such-hip.so"),
            "{error}"
        );
    }

    #[test]
    fn a_library_without_hip_symbols_names_the_first_missing_one() {
        // A real library that is not HIP, through the server's own loader.
        let names: Vec<String> = ["libm.so.6", "libc.so.6"].map(String::from).to_vec();
        let Err(error) = Api::load_from(&names, &names) else {
            panic!("libm resolved as the HIP runtime");
        };
        assert_eq!(
            error,
            LoadError::MissingSymbol {
                library: "libm.so.6".to_owned(),
                symbol: "hipInit",
            }
        );
        assert!(error.to_string().contains("`hipInit`"), "{error}");
    }

    #[test]
    fn hiprtc_missing_from_a_found_library_names_its_symbol() {
        let lib = {
            // SAFETY: libm's initialisers only set up libm.
            unsafe { Library::new("libm.so.6") }.expect("libm.so.6 is on every glibc system")
        };
        let Err(error) = Rtc::resolve(&lib, "libm.so.6") else {
            panic!("libm resolved as hiprtc");
        };
        assert!(
            matches!(
                error,
                LoadError::MissingSymbol {
                    symbol: "hiprtcCreateProgram",
                    ..
                }
            ),
            "{error:?}"
        );
    }

    #[test]
    fn the_tables_name_each_symbol_once() {
        for table in [Runtime::SYMBOLS, Rtc::SYMBOLS] {
            let mut names = table.to_vec();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), table.len());
        }
        assert_eq!(Runtime::SYMBOLS.len() + Rtc::SYMBOLS.len(), 41);
    }

    #[test]
    fn candidates_honour_rocm_path_first() {
        let c = candidates("libamdhip64.so", &["libamdhip64.so.6"]);
        assert!(c.contains(&"libamdhip64.so".to_owned()));
        assert_eq!(
            c.last().map(String::as_str),
            Some("/opt/rocm/lib/libamdhip64.so")
        );
    }
}
