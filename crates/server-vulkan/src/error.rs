//! Classifying a `VkResult` into the core's typed [`Error`].
//!
//! The same `VkResult` means different things at different call sites, so classification
//! takes the site. Out-of-memory at an allocation is [`Error::OutOfMemory`], not sticky
//! (rule 37). From `vkQueueSubmit` it means the batch never ran: a non-sticky
//! [`Error::Fault`] of the work in flight (rule 23). `VK_ERROR_DEVICE_LOST` is sticky
//! everywhere (rule 36), since Vulkan declares every later call undefined.

use std::sync::Arc;

use ash::vk;
use scope_core::{BackendKind, DeviceFault, Error, FaultClass};

/// The table's row for this server; its name is in every error.
pub(crate) const KIND: BackendKind = BackendKind::Vulkan;
pub(crate) const NAME: &str = KIND.name();

/// Where a Vulkan call failed: decides what its `VkResult` means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Site {
    Allocate,
    Record,
    Submit,
    Wait,
    Create,
}

/// Whether Vulkan calls this code out-of-memory.
pub(crate) fn is_oom(code: vk::Result) -> bool {
    matches!(
        code,
        vk::Result::ERROR_OUT_OF_HOST_MEMORY
            | vk::Result::ERROR_OUT_OF_DEVICE_MEMORY
            | vk::Result::ERROR_OUT_OF_POOL_MEMORY
            | vk::Result::ERROR_FRAGMENTATION
            | vk::Result::ERROR_FRAGMENTED_POOL
            | vk::Result::ERROR_TOO_MANY_OBJECTS
    )
}

/// A device fault with `code`; sticky for device loss.
pub(crate) fn fault(code: vk::Result, detail: impl Into<String>) -> Error {
    Error::Fault(DeviceFault {
        backend: NAME,
        code: format!("VK_{code:?}"),
        class: if code == vk::Result::ERROR_DEVICE_LOST {
            FaultClass::Sticky
        } else {
            FaultClass::Recoverable
        },
        stream: None,
        detail: detail.into(),
    })
}

/// The typed error for `code` from a call at `site`, described by `what`.
pub(crate) fn classify(code: vk::Result, site: Site, what: &str, requested: u64) -> Error {
    if code == vk::Result::ERROR_DEVICE_LOST {
        return fault(code, what);
    }
    match site {
        Site::Allocate | Site::Create if is_oom(code) => Error::OutOfMemory {
            backend: NAME,
            requested,
            detail: format!("{what}: VK_{code:?}"),
        },
        Site::Record => Error::Launch {
            kernel: Arc::from(what),
            stream: scope_core::StreamId(0),
            detail: format!("recording failed: VK_{code:?}"),
        },
        _ => fault(code, what),
    }
}

/// An error for a launch that could not be recorded.
pub(crate) fn launch_error(
    kernel: &str,
    stream: scope_core::StreamId,
    detail: impl Into<String>,
) -> Error {
    Error::Launch {
        kernel: Arc::from(kernel),
        stream,
        detail: detail.into(),
    }
}

/// The backend is not usable here: no loader, instance or device.
pub(crate) fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable {
        backend: NAME,
        reason: reason.into(),
    }
}

/// The answer while a failed recovery left the device closed: the client must recover again.
pub(crate) fn closed() -> Error {
    Error::refused(
        "the Vulkan device is closed: a recovery destroyed the lost device and could not open \
         another; recover again",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_loss_is_sticky_everywhere_and_oom_only_at_allocation() {
        for site in [
            Site::Allocate,
            Site::Record,
            Site::Submit,
            Site::Wait,
            Site::Create,
        ] {
            assert!(classify(vk::Result::ERROR_DEVICE_LOST, site, "x", 0).is_sticky());
        }
        assert!(
            classify(
                vk::Result::ERROR_OUT_OF_DEVICE_MEMORY,
                Site::Allocate,
                "x",
                8
            )
            .is_out_of_memory()
        );
        let submit = classify(vk::Result::ERROR_OUT_OF_HOST_MEMORY, Site::Submit, "x", 0);
        assert!(
            matches!(submit, Error::Fault(ref f) if !f.class.poisons()),
            "{submit}"
        );
        assert!(matches!(
            classify(vk::Result::ERROR_UNKNOWN, Site::Record, "k", 0),
            Error::Launch { .. }
        ));
    }
}
