//! `cargo xtask matrix`: which backends have a device here.
//!
//! xtask links no server, which lets it build in seconds and speak before the
//! long build. So each server's `probe()` is asked through the demo binary,
//! `tiny-runtime --probe <backend>`, built like the tests ([`crate::artifacts`]).
//! One process a backend runs, side by side. A probe promises never to panic
//! or abort, and the binary answers a panic as that backend's "why not". A
//! probe that still takes its process down, aborting in a driver, is that
//! backend's "why not" too. A matrix that dies on one backend tells the user
//! nothing about the other three.
//!
//! A backend the binary does not answer for has a row saying why, rather
//! than no row: the table always has the same four backends.

use std::path::Path;
use std::process::Stdio;

use crate::backends::{BackendKind, Drivers};
use crate::run;

/// Whether a device is real hardware or a software implementation (the
/// probe's `DeviceKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A GPU.
    Hardware,
    /// A CPU implementation (lavapipe, llvmpipe).
    Software,
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct Row {
    /// The backend.
    pub backend: BackendKind,
    /// The device's name, or empty.
    pub device: String,
    /// Hardware, software, or none.
    pub kind: Option<Kind>,
    /// What else the probe said (API, compute capability, driver).
    pub detail: String,
    /// Why there is no device, when there is none.
    pub why_not: String,
    /// Whether a probe answered for this backend (even "no device").
    pub probed: bool,
}

impl Row {
    fn none(backend: BackendKind, why_not: String, probed: bool) -> Self {
        Self {
            backend,
            device: String::new(),
            kind: None,
            detail: String::new(),
            why_not,
            probed,
        }
    }
}

/// Probe one backend in its own process.
fn probe(binary: &Path, backend: BackendKind) -> Vec<Row> {
    let output = run::program(binary)
        .args(["--probe", backend.name()])
        .stdin(Stdio::null())
        .output();
    let output = match output {
        Ok(output) => output,
        Err(e) => {
            return vec![Row::none(
                backend,
                format!("could not start {}: {e}", binary.display()),
                false,
            )];
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    match rows_from(backend, &stdout) {
        // An answer counts even if the process then failed on its way out.
        Some(rows) => rows,
        None => {
            // The process died before it could answer.
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no message");
            vec![Row::none(
                backend,
                format!(
                    "the probe process died ({}; a bug in server-{backend} or its driver): {}",
                    output.status,
                    last.trim()
                ),
                true,
            )]
        }
    }
}

/// The rows in `tiny-runtime --probe`'s answer for `backend`.
fn rows_from(backend: BackendKind, json: &str) -> Option<Vec<Row>> {
    let answer: serde_json::Value = serde_json::from_str(json).ok()?;
    let object = answer
        .as_array()?
        .iter()
        .find(|o| o["backend"] == backend.name())?;
    let why_not = object["why_not"].as_str().unwrap_or("no device found");
    let linked = object["linked"].as_bool() == Some(true);
    let devices = object["devices"].as_array()?;
    if devices.is_empty() {
        return Some(vec![Row::none(backend, why_not.to_owned(), linked)]);
    }
    Some(
        devices
            .iter()
            .map(|d| Row {
                backend,
                device: d["name"].as_str().unwrap_or_default().to_owned(),
                kind: Some(if d["kind"] == "software" {
                    Kind::Software
                } else {
                    Kind::Hardware
                }),
                detail: d["detail"].as_str().unwrap_or_default().to_owned(),
                why_not: String::new(),
                probed: true,
            })
            .collect(),
    )
}

/// Probe every backend, side by side, with the demo binary; without one (it
/// did not build), rows that say so.
pub fn probe_all(binary: Option<&Path>) -> Vec<Row> {
    let Some(binary) = binary else {
        return BackendKind::ALL
            .iter()
            .map(|&b| {
                Row::none(
                    b,
                    "not probed: tiny-runtime did not build (see the build output above)"
                        .to_owned(),
                    false,
                )
            })
            .collect();
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = BackendKind::ALL
            .iter()
            .map(|&b| scope.spawn(move || probe(binary, b)))
            .collect();
        handles
            .into_iter()
            .zip(BackendKind::ALL.iter().copied())
            .flat_map(|(h, b)| {
                h.join().unwrap_or_else(|_| {
                    vec![Row::none(b, "probing failed in xtask".to_owned(), false)]
                })
            })
            .collect()
    })
}

/// Whether any backend found any device, hardware or software. When no
/// backend that can run on Vulkan answered (the demo binary did not
/// build), an installed Vulkan driver manifest (an ICD file) stands in for
/// their answer.
pub fn any_adapter(rows: &[Row]) -> bool {
    if rows.iter().any(|r| r.kind.is_some()) {
        return true;
    }
    let vulkan_probed = rows
        .iter()
        .any(|r| r.backend.drivers() != Drivers::Vendor && r.probed);
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

/// Whether `row` is a device reached through Vulkan: every row of a
/// Vulkan server, and a row whose API (wgpu's detail) is Vulkan.
fn on_vulkan(row: &Row) -> bool {
    row.backend.drivers() == Drivers::Vulkan
        || row.detail.to_ascii_lowercase().starts_with("vulkan")
}

/// The backend the demo should use: a vendor's (CUDA, HIP), then a hardware
/// device, in the table's order. Then a software adapter: Vulkan (lavapipe,
/// through wgpu or the Vulkan server) before GL (wgpu on llvmpipe).
pub fn best(rows: &[Row]) -> Option<BackendKind> {
    let rank = |r: &Row| {
        let kind = r.kind?;
        let drivers = r.backend.drivers();
        let tier = match (drivers, kind) {
            (Drivers::Vendor, _) | (_, Kind::Hardware) => 0,
            (Drivers::Portable, Kind::Software) if on_vulkan(r) => 1,
            (Drivers::Vulkan, Kind::Software) => 2,
            (Drivers::Portable, Kind::Software) => 3,
        };
        let order = BackendKind::ALL.iter().position(|&b| b == r.backend);
        Some((tier, order))
    };
    rows.iter()
        .filter_map(|r| Some((rank(r)?, r.backend)))
        .min()
        .map(|(_, backend)| backend)
}

/// The device `backend` will most likely open, for the line that says
/// where the demo runs: hardware first, then Vulkan before GL, as the
/// servers rank their adapters.
pub fn device_of(rows: &[Row], backend: BackendKind) -> Option<&Row> {
    rows.iter()
        .filter(|r| r.backend == backend && r.kind.is_some())
        .min_by_key(|r| (r.kind != Some(Kind::Hardware), !on_vulkan(r)))
}

fn kind_text(kind: Option<Kind>) -> &'static str {
    match kind {
        Some(Kind::Hardware) => "hardware",
        Some(Kind::Software) => "software",
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
                r.backend.name().to_owned(),
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
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The rows as a JSON array, one object a row.
pub fn json(rows: &[Row]) -> String {
    let objects: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "  {{\"backend\": {}, \"device\": {}, \"kind\": {}, \"detail\": {}, \"why_not\": {}}}",
                json_string(r.backend.name()),
                if r.device.is_empty() { "null".to_owned() } else { json_string(&r.device) },
                json_string(kind_text(r.kind)),
                json_string(&r.detail),
                if r.why_not.is_empty() { "null".to_owned() } else { json_string(&r.why_not) },
            )
        })
        .collect();
    format!("[\n{}\n]", objects.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use BackendKind::{Cuda, Hip, Vulkan, Wgpu};

    #[test]
    fn a_probe_answer_becomes_rows() {
        let json = r#"[{"backend": "wgpu", "linked": true, "devices": [
            {"name": "llvmpipe", "kind": "software", "detail": "Vulkan, Cpu"},
            {"name": "llvmpipe", "kind": "software", "detail": "Gl, Cpu"}], "why_not": null}]"#;
        let rows = rows_from(Wgpu, json).expect("rows");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].kind, Some(Kind::Software));
        assert_eq!(best(&rows), Some(Wgpu));
        let none = r#"[{"backend": "cuda", "linked": true, "devices": [], "why_not": "libcuda.so.1 not found"}]"#;
        let rows = rows_from(Cuda, none).expect("a row");
        assert_eq!(rows[0].why_not, "libcuda.so.1 not found");
        assert!(rows[0].probed && rows[0].kind.is_none());
        assert!(rows_from(Hip, none).is_none());
    }

    fn software(backend: BackendKind, detail: &str) -> Row {
        Row {
            backend,
            device: "llvmpipe (LLVM 15.0.6, 256 bits)".to_owned(),
            kind: Some(Kind::Software),
            detail: detail.to_owned(),
            why_not: String::new(),
            probed: true,
        }
    }

    #[test]
    fn the_demo_prefers_vulkan_to_gl_on_a_software_adapter() {
        // llvmpipe GL only (no lavapipe): wgpu on GL.
        let gl = [software(Wgpu, "Gl, Cpu")];
        assert_eq!(best(&gl), Some(Wgpu));
        assert_eq!(device_of(&gl, Wgpu).unwrap().detail, "Gl, Cpu");
        // lavapipe installed: wgpu on its Vulkan adapter.
        let both = [
            software(Vulkan, "Vulkan 1.3, lavapipe"),
            software(Wgpu, "Gl, Cpu"),
            software(Wgpu, "Vulkan, Cpu"),
        ];
        assert_eq!(best(&both), Some(Wgpu));
        assert_eq!(device_of(&both, Wgpu).unwrap().detail, "Vulkan, Cpu");
        // wgpu without its Vulkan adapter: the Vulkan server, not GL.
        let split = [software(Vulkan, "lavapipe"), software(Wgpu, "Gl, Cpu")];
        assert_eq!(best(&split), Some(Vulkan));
        let mut gpu = software(Wgpu, "Vulkan, DiscreteGpu");
        gpu.kind = Some(Kind::Hardware);
        assert_eq!(best(&[software(Vulkan, "lavapipe"), gpu]), Some(Wgpu));
    }
}
