//! The Vulkan instance, and the validation layer it may load. The instance outlives every
//! device opened on it, so across a recovery the layer's messages carry over.

use std::ffi::{CStr, c_void};
use std::sync::Arc;

use ash::vk;
use parking_lot::Mutex;
use scope_core::{Error, Result};

use super::config::Config;
use super::lifecycle::{Guarded, calling, create_instance, destroy_instance};
use crate::error::{NAME, unavailable};

pub(super) const VALIDATION_LAYER: &CStr = c"VK_LAYER_KHRONOS_validation";

/// What is missing when the validation layer is, and where it comes from.
pub const VALIDATION_LAYER_MISSING: &str =
    "VK_LAYER_KHRONOS_validation is not installed (apt-get install vulkan-validationlayers)";

/// Whether the loader sees `VK_LAYER_KHRONOS_validation` installed; false without a loader.
pub fn validation_layer_installed() -> bool {
    load_entry().is_ok_and(|entry| layer_present(&entry, VALIDATION_LAYER))
}

/// Why a missing validation layer is an error here: `CI=true`, or `SCOPE_REQUIRE` naming
/// vulkan ([`scope_core::required`]). `None` elsewhere.
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

/// The validation callback: append the message to the `Messages` behind `user`.
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
    // SAFETY: `user` is `Arc::as_ptr` of the `Instance`'s `Messages`, which
    // the `Instance` keeps alive until after it destroys the messenger.
    let sink = unsafe { &*(user as *const Mutex<Vec<String>>) };
    tracing::warn!(target: "server_vulkan::validation", "{severity:?}: {text}");
    sink.lock().push(format!("{severity:?}: {text}"));
    vk::FALSE
}

type Messenger = (ash::ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT);

/// The instance devices are opened on, with the layer's messenger when it listens.
pub(crate) struct Instance {
    _entry: ash::Entry,
    pub raw: ash::Instance,
    pub api: u32,
    pub validation: bool,
    /// Whether made with the layer (`lifecycle.rs` counts those).
    layered: bool,
    debug: Option<Messenger>,
    pub messages: Messages,
}

impl Instance {
    /// An instance as `config` and the environment ask, with the layer when wanted and
    /// installed.
    pub(super) fn open(config: &Config) -> Result<Instance> {
        let entry = load_entry()?;
        let validation = config.validation && layer_present(&entry, VALIDATION_LAYER);
        if config.validation && !validation {
            if let Some(why) = validation_required_by() {
                return Err(Error::Refused {
                    reason: format!(
                        "{VALIDATION_LAYER_MISSING}; validation was asked for and is required \
                         here ({why})"
                    ),
                });
            }
            tracing::info!("{VALIDATION_LAYER_MISSING}; running without it");
        }
        let (raw, api) = make_instance(&entry, validation)?;
        let messages: Messages = Arc::default();
        let debug = if validation {
            listen(&entry, &raw, &messages)
        } else {
            None
        };
        Ok(Instance {
            validation: debug.is_some(),
            layered: validation,
            _entry: entry,
            raw,
            api,
            debug,
            messages,
        })
    }
}

/// A messenger collecting the layer's warnings and errors; `None` if it cannot be made.
fn listen(entry: &ash::Entry, instance: &ash::Instance, messages: &Messages) -> Option<Messenger> {
    let _calling = calling();
    let utils = ash::ext::debug_utils::Instance::new(entry, instance);
    let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
        .message_severity(
            vk::DebugUtilsMessageSeverityFlagsEXT::WARNING
                | vk::DebugUtilsMessageSeverityFlagsEXT::ERROR,
        )
        .message_type(
            vk::DebugUtilsMessageTypeFlagsEXT::GENERAL
                | vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                | vk::DebugUtilsMessageTypeFlagsEXT::PERFORMANCE,
        )
        .pfn_user_callback(Some(on_message))
        .user_data(Arc::as_ptr(messages) as *mut c_void);
    // SAFETY: the `Instance` owns both, and destroys the messenger before its `Messages` go.
    match unsafe { utils.create_debug_utils_messenger(&info, None) } {
        Ok(messenger) => Some((utils, messenger)),
        Err(e) => {
            tracing::warn!("no validation messenger: {e}");
            None
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some((utils, messenger)) = self.debug.take() {
            // SAFETY: the messenger was made on this instance, which is still alive.
            unsafe { Guarded::new(&utils).destroy_debug_utils_messenger(messenger, None) };
        }
        // SAFETY: every device made on it is gone or leaked with a reference keeping this from
        // running, and the messenger is gone.
        destroy_instance(self.layered, || unsafe { self.raw.destroy_instance(None) });
    }
}

pub(super) fn load_entry() -> Result<ash::Entry> {
    // SAFETY: loading libvulkan runs its initialisers; a missing one is an error, not UB.
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
    let instance = create_instance(validation, || unsafe { entry.create_instance(&info, None) })
        .map_err(|e| unavailable(format!("vkCreateInstance failed: {e}")))?;
    Ok((instance, api))
}
