//! Which devices the server may open, and in what order: the one `SCOPE_VULKAN_DEVICE`
//! names first, then the rest that qualify, hardware before software.

use ash::vk;
use scope_core::{DeviceKind, Error, Probe, ProbedDevice, Result};

use super::instance::{load_entry, make_instance};
use super::lifecycle::{calling, destroy_instance};
use crate::error::{NAME, unavailable};

fn device_name(props: &vk::PhysicalDeviceProperties) -> String {
    props
        .device_name_as_c_str()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unnamed device".to_owned())
}

fn kind_rank(kind: vk::PhysicalDeviceType) -> u32 {
    match kind {
        vk::PhysicalDeviceType::DISCRETE_GPU => 0,
        vk::PhysicalDeviceType::INTEGRATED_GPU => 1,
        vk::PhysicalDeviceType::VIRTUAL_GPU => 2,
        vk::PhysicalDeviceType::CPU => 3,
        _ => 4,
    }
}

pub(super) fn kind_name(kind: vk::PhysicalDeviceType) -> &'static str {
    match kind {
        vk::PhysicalDeviceType::DISCRETE_GPU => "discrete GPU",
        vk::PhysicalDeviceType::INTEGRATED_GPU => "integrated GPU",
        vk::PhysicalDeviceType::VIRTUAL_GPU => "virtual GPU",
        vk::PhysicalDeviceType::CPU => "CPU",
        _ => "other",
    }
}

pub(super) struct Candidate {
    pub(super) physical: vk::PhysicalDevice,
    pub(super) props: vk::PhysicalDeviceProperties,
    pub(super) name: String,
}

/// Why `physical` cannot host a server, or its compute queue family.
fn qualify(instance: &ash::Instance, candidate: &Candidate) -> std::result::Result<u32, String> {
    if candidate.props.api_version < vk::API_VERSION_1_2 {
        return Err("it offers Vulkan below 1.2".to_owned());
    }
    let physical = candidate.physical;
    let _calling = calling();
    // SAFETY: plain queries on a physical device of a live instance.
    let (families, extensions) = unsafe {
        (
            instance.get_physical_device_queue_family_properties(physical),
            instance
                .enumerate_device_extension_properties(physical)
                .unwrap_or_default(),
        )
    };
    let has_push = extensions.iter().any(|e| {
        e.extension_name_as_c_str()
            .is_ok_and(|n| n == ash::khr::push_descriptor::NAME)
    });
    if !has_push {
        return Err("it lacks VK_KHR_push_descriptor".to_owned());
    }
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
    let mut features = vk::PhysicalDeviceFeatures2::default().push_next(&mut v12);
    // SAFETY: `features` chains a struct that lives across the call.
    unsafe { instance.get_physical_device_features2(physical, &mut features) };
    if v12.timeline_semaphore == vk::FALSE {
        return Err("it lacks timeline semaphores".to_owned());
    }
    // A compute-only family runs beside graphics work on real GPUs.
    let compute = |f: &vk::QueueFamilyProperties| {
        f.queue_flags.contains(vk::QueueFlags::COMPUTE) && f.queue_count > 0
    };
    let family = families
        .iter()
        .position(|f| compute(f) && !f.queue_flags.contains(vk::QueueFlags::GRAPHICS))
        .or_else(|| families.iter().position(compute))
        .ok_or_else(|| "it has no compute queue".to_owned())?;
    Ok(family as u32)
}

pub(super) fn candidates(instance: &ash::Instance) -> Vec<Candidate> {
    let _calling = calling();
    // SAFETY: plain queries on a live instance.
    let physicals = unsafe { instance.enumerate_physical_devices() }.unwrap_or_default();
    physicals
        .into_iter()
        .map(|physical| {
            // SAFETY: as above.
            let props = unsafe { instance.get_physical_device_properties(physical) };
            let name = device_name(&props);
            Candidate {
                physical,
                props,
                name,
            }
        })
        .collect()
}

/// The usable candidates in device order, each with its compute queue family. Device 0 is
/// what [`Config::device`](super::config::Config::device) `None` opens, so it never changes unasked.
fn usable_in_order(instance: &ash::Instance, all: &[Candidate]) -> Result<Vec<(usize, u32)>> {
    if all.is_empty() {
        return Err(unavailable("the loader found no Vulkan device"));
    }
    let mut chosen = Vec::new();
    if let Ok(wanted) = std::env::var("SCOPE_VULKAN_DEVICE") {
        let index = match wanted.trim().parse::<usize>() {
            Ok(i) if i < all.len() => Some(i),
            Ok(_) => None,
            Err(_) => {
                let needle = wanted.to_lowercase();
                all.iter()
                    .position(|c| c.name.to_lowercase().contains(&needle))
            }
        };
        let Some(index) = index else {
            let names: Vec<_> = all.iter().map(|c| c.name.as_str()).collect();
            return Err(unavailable(format!(
                "SCOPE_VULKAN_DEVICE={wanted} names none of {names:?}"
            )));
        };
        let family = qualify(instance, &all[index]).map_err(|why| {
            unavailable(format!(
                "SCOPE_VULKAN_DEVICE picks {}, but {why}",
                all[index].name
            ))
        })?;
        chosen.push((index, family));
    }
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by_key(|&i| kind_rank(all[i].props.device_type));
    let mut refusals = Vec::new();
    for i in order {
        if chosen.iter().any(|&(c, _)| c == i) {
            continue;
        }
        match qualify(instance, &all[i]) {
            Ok(family) => chosen.push((i, family)),
            Err(why) => refusals.push(format!("{}: {why}", all[i].name)),
        }
    }
    if chosen.is_empty() {
        return Err(unavailable(format!(
            "no usable device ({})",
            refusals.join("; ")
        )));
    }
    Ok(chosen)
}

/// The candidate [`Config::device`](super::config::Config::device) names (device 0 when it names none).
pub(super) fn choose(
    instance: &ash::Instance,
    all: &[Candidate],
    device: Option<usize>,
) -> Result<(usize, u32)> {
    let order = usable_in_order(instance, all)?;
    let wanted = device.unwrap_or(0);
    order.get(wanted).copied().ok_or_else(|| {
        unavailable(format!(
            "device {wanted} does not exist: {} usable Vulkan device(s) here",
            order.len()
        ))
    })
}

/// How many devices the server can open here; 0 without a loader or a usable device.
pub fn device_count() -> usize {
    let Ok(entry) = load_entry() else {
        return 0;
    };
    let Ok((instance, _)) = make_instance(&entry, false) else {
        return 0;
    };
    let count = usable_in_order(&instance, &candidates(&instance)).map_or(0, |o| o.len());
    // SAFETY: nothing else was created from the instance.
    destroy_instance(false, || unsafe { instance.destroy_instance(None) });
    count
}

/// List the physical devices, never panicking: a missing loader is an answer.
pub(crate) fn probe() -> Probe {
    let entry = match load_entry() {
        Ok(entry) => entry,
        Err(Error::BackendUnavailable { reason, .. }) => return Probe::none(NAME, reason),
        Err(other) => return Probe::none(NAME, other.to_string()),
    };
    let (instance, _) = match make_instance(&entry, false) {
        Ok(made) => made,
        Err(e) => return Probe::none(NAME, e.to_string()),
    };
    let all = candidates(&instance);
    let devices = all
        .iter()
        .map(|c| ProbedDevice {
            name: c.name.clone(),
            kind: if c.props.device_type == vk::PhysicalDeviceType::CPU {
                DeviceKind::Software
            } else {
                DeviceKind::Hardware
            },
            detail: format!(
                "{}, Vulkan {}.{}{}",
                kind_name(c.props.device_type),
                vk::api_version_major(c.props.api_version),
                vk::api_version_minor(c.props.api_version),
                match qualify(&instance, c) {
                    Ok(_) => String::new(),
                    Err(why) => format!(", unusable: {why}"),
                }
            ),
        })
        .collect();
    // SAFETY: nothing else was created from the instance.
    destroy_instance(false, || unsafe { instance.destroy_instance(None) });
    Probe::found(NAME, devices)
}
