//! The Vulkan instance, and the validation layer it may load: the loader
//! is asked once per opening (and once per [`device_count`] or probe),
//! and the layer's messages land in the `Gpu` that asked for them.
//!
//! [`device_count`]: super::device_count

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;
use scope_core::Result;

use crate::error::{NAME, unavailable};

pub(super) const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// What is missing when the validation layer is, and where it comes from.
pub const VALIDATION_LAYER_MISSING: &str =
    "VK_LAYER_KHRONOS_validation is not installed (apt-get install vulkan-validationlayers)";

/// Whether `VK_LAYER_KHRONOS_validation` is installed, as the loader sees
/// it (`VK_LAYER_PATH` and the manifest folders); false without a loader.
pub fn validation_layer_installed() -> bool {
    load_entry().is_ok_and(|entry| layer_present(&entry, VALIDATION_LAYER))
}

/// Why a missing validation layer is an error here rather than a run
/// without it: `CI=true`, or `SCOPE_REQUIRE` naming vulkan (the one parser,
/// [`scope_core::required`]). `None` elsewhere.
pub fn validation_required_by() -> Option<&'static str> {
    if std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1") {
        Some("CI=true")
    } else if scope_core::required(NAME) {
        Some("SCOPE_REQUIRE names vulkan")
    } else {
        None
    }
}

/// Messages the validation layer sent, in order.
pub(crate) type Messages = Arc<Mutex<Vec<String>>>;

/// The validation callback: append the message to the `Messages` behind
/// `user`.
pub(super) unsafe extern "system" fn on_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    user: *mut c_void,
) -> vk::Bool32 {
    if data.is_null() || user.is_null() {
        return vk::FALSE;
    }
    // SAFETY: the layer passes a valid callback-data struct for the length
    // of the call; `p_message` is null or a NUL-terminated string.
    let text = unsafe {
        let data = &*data;
        if data.p_message.is_null() {
            String::new()
        } else {
            CStr::from_ptr(data.p_message)
                .to_string_lossy()
                .into_owned()
        }
    };
    // SAFETY: `user` is `Arc::as_ptr` of the `Gpu`'s `Messages`, which the
    // `Gpu` keeps alive until after it destroys the messenger.
    let sink = unsafe { &*(user as *const Mutex<Vec<String>>) };
    tracing::warn!(target: "server_vulkan::validation", "{severity:?}: {text}");
    sink.lock().push(format!("{severity:?}: {text}"));
    vk::FALSE
}

pub(super) fn load_entry() -> Result<ash::Entry> {
    // SAFETY: loading libvulkan runs its initialisers; the loader is a
    // well-behaved system library, and a missing one is an error, not UB.
    unsafe { ash::Entry::load() }
        .map_err(|e| unavailable(format!("the Vulkan loader could not be loaded: {e}")))
}

pub(super) fn layer_present(entry: &ash::Entry, name: &CStr) -> bool {
    // SAFETY: a plain query on a loaded entry.
    let layers = unsafe { entry.enumerate_instance_layer_properties() }.unwrap_or_default();
    layers
        .iter()
        .any(|l| l.layer_name_as_c_str().is_ok_and(|n| n == name))
}

pub(super) fn make_instance(entry: &ash::Entry, validation: bool) -> Result<(ash::Instance, u32)> {
    // SAFETY: a plain query on a loaded entry.
    let version = unsafe { entry.try_enumerate_instance_version() }
        .ok()
        .flatten()
        .unwrap_or(vk::API_VERSION_1_0);
    if version < vk::API_VERSION_1_2 {
        return Err(unavailable(format!(
            "the Vulkan loader offers {}.{}; timeline semaphores need 1.2",
            vk::api_version_major(version),
            vk::api_version_minor(version)
        )));
    }
    let api = version.min(vk::API_VERSION_1_3);
    let app = vk::ApplicationInfo::default()
        .application_name(c"scope")
        .engine_name(c"scope")
        .api_version(api);
    let layers = [VALIDATION_LAYER.as_ptr()];
    let extensions = [ash::ext::debug_utils::NAME.as_ptr()];
    let mut info = vk::InstanceCreateInfo::default().application_info(&app);
    if validation {
        info = info
            .enabled_layer_names(&layers)
            .enabled_extension_names(&extensions);
    }
    // SAFETY: `info` and everything it points at outlive the call.
    let instance = unsafe { entry.create_instance(&info, None) }
        .map_err(|e| unavailable(format!("vkCreateInstance failed: {e}")))?;
    Ok((instance, api))
}
