//! `cargo xtask matrix`: which backends have a device here.
//!
//! Each server crate's `probe()` answers for its backend and promises never
//! to panic or abort — a missing driver library is an answer, not a crash —
//! so the matrix calls them in-process. A panic is still caught and shown as
//! that backend's "why not", because a matrix that dies on one backend tells
//! the user nothing about the other three.
//!
//! A server crate that is not in the tree yet has a row saying so, rather
//! than no row: the table always has the same four backends.

use std::panic::{AssertUnwindSafe, catch_unwind};

use scope_core::{DeviceKind, Probe};

/// The backends, in the order the demo prefers them.
pub const BACKENDS: [&str; 4] = ["cuda", "hip", "vulkan", "wgpu"];

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    /// The backend.
    pub backend: &'static str,
    /// The device's name, or empty.
    pub device: String,
    /// Hardware, software, or none.
    pub kind: Option<DeviceKind>,
    /// What else the probe said (API, compute capability, driver).
    pub detail: String,
    /// Why there is no device, when there is none.
    pub why_not: String,
}

fn probe_fn(backend: &str) -> Option<fn() -> Probe> {
    match backend {
        "cuda" => linked::cuda(),
        "hip" => linked::hip(),
        "vulkan" => linked::vulkan(),
        "wgpu" => linked::wgpu(),
        _ => None,
    }
}

/// The server crates xtask links. While a server crate was still being
/// written its function answered `None` and its row said "crate not built
/// yet"; the rows keep that shape for a backend added later.
mod linked {
    use scope_core::Probe;

    pub fn cuda() -> Option<fn() -> Probe> {
        Some(server_cuda::probe)
    }
    pub fn hip() -> Option<fn() -> Probe> {
        Some(server_hip::probe)
    }
    pub fn vulkan() -> Option<fn() -> Probe> {
        Some(server_vulkan::probe)
    }
    pub fn wgpu() -> Option<fn() -> Probe> {
        Some(server_wgpu::probe)
    }
}

/// Probe one backend.
pub fn probe(backend: &'static str) -> Vec<Row> {
    let Some(probe) = probe_fn(backend) else {
        return vec![Row {
            backend,
            device: String::new(),
            kind: None,
            detail: String::new(),
            why_not: format!("crate not built yet (crates/server-{backend})"),
        }];
    };
    let answer = catch_unwind(AssertUnwindSafe(probe));
    match answer {
        Ok(probe) if probe.has_device() => probe
            .devices
            .into_iter()
            .map(|d| Row {
                backend,
                device: d.name,
                kind: Some(d.kind),
                detail: d.detail,
                why_not: String::new(),
            })
            .collect(),
        Ok(probe) => vec![Row {
            backend,
            device: String::new(),
            kind: None,
            detail: String::new(),
            why_not: probe
                .why_not
                .unwrap_or_else(|| "no device found".to_owned()),
        }],
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".to_owned());
            vec![Row {
                backend,
                device: String::new(),
                kind: None,
                detail: String::new(),
                why_not: format!("the probe panicked (a bug in server-{backend}): {message}"),
            }]
        }
    }
}

/// Probe every backend.
pub fn probe_all() -> Vec<Row> {
    BACKENDS.iter().flat_map(|b| probe(b)).collect()
}

/// Whether any backend found any device, hardware or software. When the
/// Vulkan and wgpu crates are not built yet, an installed Vulkan driver
/// manifest (an ICD file) stands in for their answer.
pub fn any_adapter(rows: &[Row]) -> bool {
    if rows.iter().any(|r| r.kind.is_some()) {
        return true;
    }
    let vulkan_probed = probe_fn("vulkan").is_some() || probe_fn("wgpu").is_some();
    !vulkan_probed && vulkan_icd_installed()
}

fn vulkan_icd_installed() -> bool {
    [
        "/usr/share/vulkan/icd.d",
        "/etc/vulkan/icd.d",
        "/usr/local/share/vulkan/icd.d",
    ]
    .iter()
    .filter_map(|dir| std::fs::read_dir(dir).ok())
    .flatten()
    .flatten()
    .any(|entry| entry.path().extension().is_some_and(|e| e == "json"))
}

/// The backend the demo should use: CUDA, HIP, hardware Vulkan, hardware
/// wgpu, then a software adapter (wgpu, then Vulkan).
pub fn best(rows: &[Row]) -> Option<&'static str> {
    let has = |backend: &str, kind: Option<DeviceKind>| {
        rows.iter()
            .any(|r| r.backend == backend && r.kind.is_some() && (kind.is_none() || r.kind == kind))
    };
    let hw = Some(DeviceKind::Hardware);
    [
        ("cuda", None),
        ("hip", None),
        ("vulkan", hw),
        ("wgpu", hw),
        ("wgpu", None),
        ("vulkan", None),
    ]
    .into_iter()
    .find(|(b, k)| has(b, *k))
    .map(|(b, _)| b)
}

fn kind_text(kind: Option<DeviceKind>) -> &'static str {
    match kind {
        Some(DeviceKind::Hardware) => "hardware",
        Some(DeviceKind::Software) => "software",
        None => "none",
    }
}

/// The rows as a table for a person.
pub fn table(rows: &[Row]) -> String {
    let headers = ["backend", "device", "kind", "detail / why not"];
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|r| {
            [
                r.backend.to_owned(),
                if r.device.is_empty() {
                    "-".to_owned()
                } else {
                    r.device.clone()
                },
                kind_text(r.kind).to_owned(),
                if r.kind.is_some() {
                    r.detail.clone()
                } else {
                    r.why_not.clone()
                },
            ]
        })
        .collect();
    let mut widths = headers.map(str::len);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cols: [&str; 4]| {
        let mut out = String::new();
        for (i, (cell, w)) in cols.iter().zip(widths).enumerate() {
            if i == 3 {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(headers);
    out.push('\n');
    out.push_str(&line(
        widths
            .map(|w| "-".repeat(w.min(40)))
            .each_ref()
            .map(String::as_str),
    ));
    for row in &cells {
        out.push('\n');
        out.push_str(&line(row.each_ref().map(String::as_str)));
    }
    out
}

fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The rows as a JSON array, one object a row.
pub fn json(rows: &[Row]) -> String {
    let objects: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "  {{\"backend\": {}, \"device\": {}, \"kind\": {}, \"detail\": {}, \"why_not\": {}}}",
                json_string(r.backend),
                if r.device.is_empty() { "null".to_owned() } else { json_string(&r.device) },
                json_string(kind_text(r.kind)),
                json_string(&r.detail),
                if r.why_not.is_empty() { "null".to_owned() } else { json_string(&r.why_not) },
            )
        })
        .collect();
    format!("[\n{}\n]", objects.join(",\n"))
}
