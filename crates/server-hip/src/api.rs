//! Safe(r) wrappers over the loaded entry points, and owned handles.
//!
//! Every `unsafe` call into HIP lives here. HIP objects are owned values ([`Stream`],
//! [`Event`], [`DeviceAlloc`], [`Pinned`], [`Module`], [`Graph`], [`GraphExec`]) that destroy
//! themselves on drop and hold an `Arc<Api>`, so none outlives its library. Ownership cannot
//! express an asynchronous copy touching host memory *later*: that is an `unsafe fn`.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use crate::error::{HipError, HipResult};
use crate::ffi::*;
use crate::loader::{Api, LoadError};

impl Api {
    fn check(&self, call: &'static str, result: HipErrorCode) -> HipResult<()> {
        if result == code::SUCCESS {
            Ok(())
        } else {
            let message = match (code_name(result), self.error_name(result)) {
                // A code newer than our header: the runtime names it.
                (None, Some(name)) => Some(format!(
                    "{name}: {}",
                    self.error_string(result).unwrap_or_default()
                )),
                _ => self.error_string(result),
            };
            Err(HipError {
                call,
                code: result,
                message,
            })
        }
    }

    /// The runtime's name for `code`.
    pub fn error_name(&self, value: HipErrorCode) -> Option<String> {
        // SAFETY: any value gives a static NUL-terminated string or null.
        unsafe { static_text((self.rt.get_error_name)(value)) }
    }

    /// The runtime's description of `code`.
    pub fn error_string(&self, value: HipErrorCode) -> Option<String> {
        // SAFETY: any value gives a static NUL-terminated string or null.
        unsafe { static_text((self.rt.get_error_string)(value)) }
    }

    /// `hipInit(0)`.
    pub fn init(&self) -> HipResult<()> {
        // SAFETY: plain value argument.
        self.check("hipInit", unsafe { (self.rt.init)(0) })
    }

    /// `hipRuntimeGetVersion`.
    pub fn runtime_version(&self) -> HipResult<i32> {
        let mut version: c_int = 0;
        // SAFETY: the out-pointer is a live local.
        self.check("hipRuntimeGetVersion", unsafe {
            (self.rt.runtime_get_version)(&mut version)
        })?;
        Ok(version)
    }

    /// `hipGetDeviceCount`.
    pub fn device_count(&self) -> HipResult<i32> {
        let mut count: c_int = 0;
        // SAFETY: the out-pointer is a live local.
        self.check("hipGetDeviceCount", unsafe {
            (self.rt.get_device_count)(&mut count)
        })?;
        Ok(count)
    }

    /// `hipSetDevice`: HIP keeps the current device per thread, so set it before allocating.
    pub fn set_device(&self, ordinal: i32) -> HipResult<()> {
        // SAFETY: plain value argument; HIP validates the ordinal.
        self.check("hipSetDevice", unsafe { (self.rt.set_device)(ordinal) })
    }

    /// `hipDeviceReset`: destroy every resource on the current device, **process-wide**.
    /// # Safety
    /// No handle made on the current device is used after this call.
    pub unsafe fn device_reset(&self) -> HipResult<()> {
        // SAFETY: no arguments; the caller vouches nothing made on the device is used after.
        self.check("hipDeviceReset", unsafe { (self.rt.device_reset)() })
    }

    /// `hipGetDevicePropertiesR0600`.
    pub fn device_properties(&self, ordinal: i32) -> HipResult<Box<DevicePropBuffer>> {
        let mut buffer = DevicePropBuffer::zeroed();
        // SAFETY: `buffer` owns a zeroed R0600 struct plus 4 KiB spare, for the whole call.
        let result = unsafe { (self.rt.get_device_properties)(&mut buffer.props, ordinal) };
        self.check("hipGetDevicePropertiesR0600", result)?;
        Ok(buffer)
    }

    /// `hipDeviceTotalMem`.
    pub fn device_total_mem(&self, ordinal: i32) -> HipResult<usize> {
        let mut bytes = 0usize;
        // SAFETY: the out-pointer is a live local.
        self.check("hipDeviceTotalMem", unsafe {
            (self.rt.device_total_mem)(&mut bytes, ordinal)
        })?;
        Ok(bytes)
    }

    /// A non-blocking stream on the current device.
    pub fn stream(self: &Arc<Self>) -> HipResult<Stream> {
        let mut raw: RawStream = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local; the flag is a header value.
        let result = unsafe { (self.rt.stream_create_with_flags)(&mut raw, STREAM_NON_BLOCKING) };
        self.check("hipStreamCreateWithFlags", result)?;
        // A null stream is the default one, which orders against every stream.
        non_null("hipStreamCreateWithFlags", raw)?;
        Ok(Stream {
            raw,
            api: self.clone(),
        })
    }

    /// An event without timing, for ordering and fences.
    pub fn event(self: &Arc<Self>) -> HipResult<Event> {
        let mut raw: RawEvent = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local; the flag is a header value.
        let result = unsafe { (self.rt.event_create_with_flags)(&mut raw, EVENT_DISABLE_TIMING) };
        self.check("hipEventCreateWithFlags", result)?;
        non_null("hipEventCreateWithFlags", raw)?;
        Ok(Event {
            raw,
            api: self.clone(),
        })
    }

    /// `bytes` of device memory on the current device.
    pub fn device_alloc(self: &Arc<Self>, bytes: usize) -> HipResult<DeviceAlloc> {
        let mut ptr: DevicePtr = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local.
        self.check("hipMalloc", unsafe { (self.rt.malloc)(&mut ptr, bytes) })?;
        Ok(DeviceAlloc {
            ptr,
            bytes,
            api: self.clone(),
        })
    }

    /// `bytes` of page-locked host memory, for DMA.
    pub fn pinned(self: &Arc<Self>, bytes: usize) -> HipResult<Pinned> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: the out-pointer is a live local; the flag is a header value.
        let result = unsafe { (self.rt.host_malloc)(&mut ptr, bytes.max(1), HOST_MALLOC_DEFAULT) };
        self.check("hipHostMalloc", result)?;
        // SAFETY: `bytes.max(1)` writable bytes came back; zeroed, every later `&[u8]` is sound.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        Ok(Pinned {
            ptr: ptr.cast(),
            len: bytes,
            api: self.clone(),
        })
    }

    /// Load a code object (the bytes hiprtc produced) on the current device.
    pub fn load_module(self: &Arc<Self>, image: &[u8]) -> HipResult<Module> {
        let mut raw: RawModule = std::ptr::null_mut();
        // SAFETY: `image` is a whole code object alive for the call; HIP copies what it keeps.
        let result = unsafe { (self.rt.module_load_data)(&mut raw, image.as_ptr().cast()) };
        self.check("hipModuleLoadData", result)?;
        non_null("hipModuleLoadData", raw)?;
        Ok(Module {
            raw,
            api: self.clone(),
        })
    }

    /// Compile HIP C++ with hiprtc: the code object, or the failure and its log.
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RtcFailure> {
        let rtc = self.rtc.as_ref().map_err(|e| RtcFailure {
            result: -1,
            log: e.to_string(),
        })?;
        rtc.compile(source, name, options)
    }
}

/// One hiprtc program at a time in the process: ROCm 5.2's hiprtc aborts (`LLVM ERROR:
/// inconsistency in registered CommandLine options`) or crashes when two threads compile.
static ONE_PROGRAM_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

impl crate::loader::Rtc {
    /// Compile `<name>.hip` with `options`, one at a time ([`ONE_PROGRAM_AT_A_TIME`]).
    pub fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
    ) -> Result<Vec<u8>, RtcFailure> {
        // Taken first, so released after the program is destroyed.
        let _one = ONE_PROGRAM_AT_A_TIME.lock();
        let rtc = self;
        let c_source = CString::new(source)
            .map_err(|_| RtcFailure::input("the source contains a NUL byte"))?;
        let c_name = CString::new(format!("{name}.hip"))
            .map_err(|_| RtcFailure::input("the name contains a NUL byte"))?;
        let c_options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| RtcFailure::input("an option contains a NUL byte"))?;
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        let mut program: RawProgram = std::ptr::null_mut();
        // SAFETY: source and name are NUL-terminated and outlive the call; no headers.
        let result = unsafe {
            (rtc.create_program)(
                &mut program,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if result != rtc::SUCCESS {
            return Err(RtcFailure::from_call(
                rtc,
                "hiprtcCreateProgram",
                result,
                String::new(),
            ));
        }
        let program = Program { raw: program, rtc };
        let count = c_int::try_from(option_ptrs.len()).unwrap_or(c_int::MAX);
        // SAFETY: `program` is live; `c_options` owns the NUL-terminated options.
        let result = unsafe { (rtc.compile_program)(program.raw, count, option_ptrs.as_ptr()) };
        let log = program.log();
        if result != rtc::SUCCESS {
            return Err(RtcFailure::from_call(
                rtc,
                "hiprtcCompileProgram",
                result,
                log,
            ));
        }
        let mut size = 0usize;
        // SAFETY: `program` is live and compiled; the out-pointer is a local.
        let result = unsafe { (rtc.get_code_size)(program.raw, &mut size) };
        if result != rtc::SUCCESS {
            return Err(RtcFailure::from_call(rtc, "hiprtcGetCodeSize", result, log));
        }
        let mut code = vec![0u8; size];
        // SAFETY: `code` holds exactly the `size` bytes hiprtc said it writes.
        let result = unsafe { (rtc.get_code)(program.raw, code.as_mut_ptr().cast()) };
        if result != rtc::SUCCESS {
            return Err(RtcFailure::from_call(rtc, "hiprtcGetCode", result, log));
        }
        if !log.trim().is_empty() {
            tracing::debug!(kernel = name, "hiprtc: {log}");
        }
        Ok(code)
    }
}

/// A hiprtc program, destroyed on drop.
struct Program<'a> {
    raw: RawProgram,
    rtc: &'a crate::loader::Rtc,
}

impl Program<'_> {
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: the program is live; the out-pointer is a local.
        if unsafe { (self.rtc.get_program_log_size)(self.raw, &mut size) } != rtc::SUCCESS
            || size == 0
        {
            return String::new();
        }
        let mut log = vec![0u8; size];
        // SAFETY: `log` holds exactly the `size` bytes hiprtc said it writes.
        if unsafe { (self.rtc.get_program_log)(self.raw, log.as_mut_ptr().cast()) } != rtc::SUCCESS
        {
            return String::new();
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        String::from_utf8_lossy(&log[..end]).into_owned()
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: the program is live and destroyed exactly once, here.
        let _ = unsafe { (self.rtc.destroy_program)(&mut self.raw) };
    }
}

/// A hiprtc call that failed, with the compiler's log.
#[derive(Debug, Clone)]
pub struct RtcFailure {
    /// Its `hiprtcResult`, or -1 when hiprtc is not loaded.
    pub result: RtcResult,
    /// The compiler's log, or the reason.
    pub log: String,
}

impl RtcFailure {
    fn input(why: &str) -> Self {
        Self {
            result: 3,
            log: why.to_owned(),
        }
    }

    fn from_call(
        rtc: &crate::loader::Rtc,
        call: &'static str,
        result: RtcResult,
        log: String,
    ) -> Self {
        // SAFETY: hiprtcGetErrorString takes any value; it returns a static string or null.
        let text = unsafe { (rtc.get_error_string)(result) };
        let name = if text.is_null() {
            format!("hiprtcResult({result})")
        } else {
            // SAFETY: non-null, NUL-terminated and static.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        };
        let log = if log.trim().is_empty() {
            format!("{call} returned {name}")
        } else {
            format!("{call} returned {name}\n{log}")
        };
        Self { result, log }
    }

    /// Whether hiprtc ran out of memory rather than rejecting the source.
    pub fn out_of_memory(&self) -> bool {
        self.result == rtc::OUT_OF_MEMORY
    }
}

/// Refuse a null "created" handle: a null stream is the default one; others name nothing.
fn non_null<T>(call: &'static str, raw: *mut T) -> HipResult<()> {
    if raw.is_null() {
        return Err(HipError {
            call,
            code: code::INVALID_HANDLE,
            message: Some(format!("{call} returned success and a null handle")),
        });
    }
    Ok(())
}

/// Whether hiprtc could be loaded, or why not.
pub fn rtc_status(api: &Api) -> Result<(), LoadError> {
    api.rtc.as_ref().map(|_| ()).map_err(Clone::clone)
}

/// An owned handle type, usable from any thread, destroyed by `$destroy` on drop.
macro_rules! owned {
    ($(#[$meta:meta])* $name:ident($raw:ty), $destroy:ident) => {
        $(#[$meta])*
        pub struct $name {
            raw: $raw,
            api: Arc<Api>,
        }

        // SAFETY: HIP handles are process-wide; the runtime serialises access to them.
        unsafe impl Send for $name {}
        // SAFETY: as for `Send`: every method is a HIP call, which the runtime makes safe.
        unsafe impl Sync for $name {}

        impl $name {
            /// Destroy the handle now, while its device can take it back (a reset may
            /// reuse the value). A later drop does nothing; make no HIP call with it.
            #[allow(dead_code)]
            pub(crate) fn destroy_now(&mut self) {
                if self.raw.is_null() {
                    return;
                }
                // SAFETY: made by this API, owned only here; nulled below, so destroyed once.
                let result = unsafe { (self.api.rt.$destroy)(self.raw) };
                if result != code::SUCCESS {
                    tracing::debug!(code = result, concat!(stringify!($destroy), " failed"));
                }
                self.raw = std::ptr::null_mut();
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                self.destroy_now();
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, concat!(stringify!($name), "({:p})"), self.raw)
            }
        }
    };
}

owned!(
    /// A HIP stream.
    Stream(RawStream),
    stream_destroy
);
owned!(
    /// A HIP event.
    Event(RawEvent),
    event_destroy
);
owned!(
    /// A loaded code object.
    Module(RawModule),
    module_unload
);
owned!(
    /// A captured graph, before or after instantiation.
    Graph(RawGraph),
    graph_destroy
);
owned!(
    /// An instantiated, launchable graph.
    GraphExec(RawGraphExec),
    graph_exec_destroy
);

impl Stream {
    /// The raw handle, valid while `self` lives, for RCCL to issue work on.
    pub(crate) fn raw(&self) -> RawStream {
        self.raw
    }

    /// Wait on the host for all of the stream's work.
    pub fn synchronize(&self) -> HipResult<()> {
        // SAFETY: the stream is live (owned by `self`).
        self.api.check("hipStreamSynchronize", unsafe {
            (self.api.rt.stream_synchronize)(self.raw)
        })
    }

    /// Make the stream's later work wait for `event`'s last record.
    pub fn wait(&self, event: &Event) -> HipResult<()> {
        // SAFETY: stream and event are live.
        self.api.check("hipStreamWaitEvent", unsafe {
            (self.api.rt.stream_wait_event)(self.raw, event.raw, 0)
        })
    }

    /// Start recording the stream's work into a graph.
    pub fn begin_capture(&self) -> HipResult<()> {
        // SAFETY: the stream is live; the mode is a header value.
        let result = unsafe { (self.api.rt.stream_begin_capture)(self.raw, CAPTURE_MODE_RELAXED) };
        self.api.check("hipStreamBeginCapture", result)
    }

    /// Stop recording: the graph, or the runtime's refusal, which still ends capture mode.
    pub fn end_capture(&self) -> HipResult<Graph> {
        let mut raw: RawGraph = std::ptr::null_mut();
        // SAFETY: the stream is live; the out-pointer is a local.
        let result = unsafe { (self.api.rt.stream_end_capture)(self.raw, &mut raw) };
        let graph = (!raw.is_null()).then(|| Graph {
            raw,
            api: self.api.clone(),
        });
        self.api.check("hipStreamEndCapture", result)?;
        graph.ok_or_else(|| HipError::new("hipStreamEndCapture", code::STREAM_CAPTURE_INVALIDATED))
    }

    /// Launch an instantiated graph on the stream.
    /// # Safety
    /// What the graph's work touches (memory, host bytes, launched modules) outlives the replay.
    pub unsafe fn launch_graph(&self, exec: &GraphExec) -> HipResult<()> {
        // SAFETY: stream and graph are owned; the caller keeps what the work touches.
        self.api.check("hipGraphLaunch", unsafe {
            (self.api.rt.graph_launch)(exec.raw, self.raw)
        })
    }

    /// Copy `len` bytes from host `src` to device `dst` on the stream (or record it).
    /// # Safety
    /// `src` is valid for `len` bytes until the stream passes the copy (or the graph's last
    /// replay ends); `dst` addresses `len` bytes of a live device allocation.
    pub unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
    ) -> HipResult<()> {
        // SAFETY: the caller upholds the pointers' contract; the stream is live.
        let result = unsafe {
            (self.api.rt.memcpy_async)(dst, src.cast(), len, MEMCPY_HOST_TO_DEVICE, self.raw)
        };
        self.api.check("hipMemcpyAsync", result)
    }

    /// Copy `len` bytes from device `src` to host `dst`, ordered on the stream.
    /// # Safety
    /// `dst` is writable for `len` bytes, unread and unfreed, until the stream passes the
    /// copy; `src` addresses `len` bytes of a live device allocation.
    pub unsafe fn copy_to_host(&self, dst: *mut u8, src: DevicePtr, len: usize) -> HipResult<()> {
        // SAFETY: the caller upholds the pointers' contract; the stream is live.
        let result = unsafe {
            (self.api.rt.memcpy_async)(dst.cast(), src, len, MEMCPY_DEVICE_TO_HOST, self.raw)
        };
        self.api.check("hipMemcpyAsync", result)
    }

    /// Copy `len` bytes between device allocations, ordered on the stream.
    /// # Safety
    /// Both pointers must address `len` bytes of live device allocations.
    pub unsafe fn copy_on_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
    ) -> HipResult<()> {
        // SAFETY: the caller upholds the pointers' contract; the stream is live.
        let result =
            unsafe { (self.api.rt.memcpy_async)(dst, src, len, MEMCPY_DEVICE_TO_DEVICE, self.raw) };
        self.api.check("hipMemcpyAsync", result)
    }

    /// Launch `function` with `params` (pointers to each argument's value).
    /// # Safety
    /// `function`'s module stays loaded while the launch (or its graph) may run; `params` match
    /// the kernel's, each at a live value of its size; device pointers address memory the
    /// kernel may touch; `shared` covers its dynamic shared memory.
    pub unsafe fn launch(
        &self,
        function: RawFunction,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        params: &mut [*mut c_void],
    ) -> HipResult<()> {
        let params_ptr = if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_mut_ptr()
        };
        // SAFETY: the caller upholds the launch contract, `shared` included; the stream is live.
        let result = unsafe {
            (self.api.rt.module_launch_kernel)(
                function,
                grid[0] as c_uint,
                grid[1] as c_uint,
                grid[2] as c_uint,
                block[0] as c_uint,
                block[1] as c_uint,
                block[2] as c_uint,
                shared as c_uint,
                self.raw,
                params_ptr,
                std::ptr::null_mut(),
            )
        };
        self.api.check("hipModuleLaunchKernel", result)
    }
}

impl Event {
    /// Record the event at the stream's current end.
    pub fn record(&self, stream: &Stream) -> HipResult<()> {
        // SAFETY: event and stream are live.
        self.api.check("hipEventRecord", unsafe {
            (self.api.rt.event_record)(self.raw, stream.raw)
        })
    }

    /// Whether the work before the last record has finished (a never recorded event has).
    pub fn is_done(&self) -> HipResult<bool> {
        // SAFETY: the event is live.
        match unsafe { (self.api.rt.event_query)(self.raw) } {
            code::SUCCESS => Ok(true),
            code::NOT_READY => Ok(false),
            other => self.api.check("hipEventQuery", other).map(|()| false),
        }
    }

    /// Wait on the host for the work before the last record.
    pub fn synchronize(&self) -> HipResult<()> {
        // SAFETY: the event is live.
        self.api.check("hipEventSynchronize", unsafe {
            (self.api.rt.event_synchronize)(self.raw)
        })
    }
}

impl Module {
    /// The kernel named `entry`, valid while the module is loaded.
    pub fn function(&self, entry: &str) -> HipResult<RawFunction> {
        let name = CString::new(entry)
            .map_err(|_| HipError::new("hipModuleGetFunction", code::INVALID_VALUE))?;
        let mut function: RawFunction = std::ptr::null_mut();
        // SAFETY: the module is live; the name is NUL-terminated; the out-pointer is a local.
        let result =
            unsafe { (self.api.rt.module_get_function)(&mut function, self.raw, name.as_ptr()) };
        self.api.check("hipModuleGetFunction", result)?;
        non_null("hipModuleGetFunction", function)?;
        Ok(function)
    }
}

impl Graph {
    /// Instantiate the graph for launching.
    pub fn instantiate(&self) -> HipResult<GraphExec> {
        let mut raw: RawGraphExec = std::ptr::null_mut();
        // SAFETY: the graph is live; the out-pointer is a local; no error node or log.
        let result = unsafe {
            (self.api.rt.graph_instantiate)(
                &mut raw,
                self.raw,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        self.api.check("hipGraphInstantiate", result)?;
        Ok(GraphExec {
            raw,
            api: self.api.clone(),
        })
    }
}

/// Device memory from `hipMalloc`, freed on drop.
pub struct DeviceAlloc {
    ptr: DevicePtr,
    bytes: usize,
    api: Arc<Api>,
}

// SAFETY: a device address is usable from any thread.
unsafe impl Send for DeviceAlloc {}

impl DeviceAlloc {
    /// The device address of byte `offset`.
    /// # Safety
    /// `offset` is at most [`bytes`](Self::bytes): the address stays in (or one past) the block.
    pub unsafe fn at(&self, offset: u64) -> DevicePtr {
        // A device address: wrapping arithmetic, never dereferenced here.
        self.ptr.cast::<u8>().wrapping_add(offset as usize).cast()
    }

    /// Its size.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        // SAFETY: from hipMalloc, owned only here, freed once; hipFree waits for the device.
        let result = unsafe { (self.api.rt.free)(self.ptr) };
        if result != code::SUCCESS {
            tracing::debug!(code = result, "hipFree failed on drop");
        }
    }
}

impl std::fmt::Debug for DeviceAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceAlloc({:p}, {} bytes)", self.ptr, self.bytes)
    }
}

/// Page-locked host memory from `hipHostMalloc`, freed on drop.
pub struct Pinned {
    ptr: *mut u8,
    len: usize,
    api: Arc<Api>,
}

// SAFETY: the memory is plain host memory owned uniquely by this value.
unsafe impl Send for Pinned {}

impl Pinned {
    /// Its bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes (never null: one byte at least);
        // the borrow keeps Rust writers out, and the owner reads only after the device's fence.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Its bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; the unique borrow excludes every other Rust access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Its address, for an asynchronous copy.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    /// Its address, for an asynchronous copy into it.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// Its size.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: from hipHostMalloc, owned only here, freed once, after the copies using it.
        let result = unsafe { (self.api.rt.host_free)(self.ptr.cast()) };
        if result != code::SUCCESS {
            tracing::debug!(code = result, "hipHostFree failed on drop");
        }
    }
}

/// The text of a string the runtime owns for the process's life, or `None` for null.
/// # Safety
/// `text` is null, or a NUL-terminated string valid while this runs (as hipGetErrorName gives).
unsafe fn static_text(text: *const std::ffi::c_char) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // SAFETY: non-null, so NUL-terminated and valid (this function's contract).
    Some(
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned(),
    )
}
