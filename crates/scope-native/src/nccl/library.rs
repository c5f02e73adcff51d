//! Finding the library: the first of a server's names that opens, kept open for the process.
//!
//! One loop for every server, because how a library is found is where servers drift:
//! NCCL as `libnccl.so.2` or `libnccl.so`, RCCL under `ROCM_PATH` first. A name that opens
//! but lacks an entry point is an answer (a library too old), not a reason to look further.

use std::ffi::c_void;

use libloading::Library;

use super::NcclTable;
use scope_core::{Error, Result};

/// An NCCL API library a server opened, and the table that points into it. A server keeps
/// it in a `static`, so the table stays valid for the process.
pub struct NcclLibrary {
    table: NcclTable,
    _library: Library,
}

impl NcclLibrary {
    /// The first of `names` that opens, as `library` (`"nccl"`, `"rccl"`); else every name
    /// tried and the last refusal, or the entry point the first that opened lacks.
    ///
    /// # Safety
    /// Every name is an NCCL API library's (NCCL 2.19 or later, or RCCL),
    /// whose initialisers only set up its own state.
    pub unsafe fn open_first(
        library: &'static str,
        names: &[String],
    ) -> std::result::Result<Self, String> {
        let mut why = String::from("no candidates");
        for name in names {
            // SAFETY: an NCCL API library (the caller's promise) runs only its own initialisers.
            let opened = match unsafe { Library::new(name.as_str()) } {
                Ok(opened) => opened,
                Err(e) => {
                    why = e.to_string();
                    continue;
                }
            };
            // SAFETY: each address is looked up by name in the library just opened, kept with it.
            let table = unsafe {
                NcclTable::resolve(library, |symbol| {
                    opened
                        .get::<*const c_void>(symbol.as_bytes())
                        .ok()
                        .map(|s| *s)
                })
            }
            .map_err(|missing| format!("{name} has no `{missing}`"))?;
            return Ok(Self {
                table,
                _library: opened,
            });
        }
        Err(format!(
            "{library} not found (tried {}): {why}",
            names.join(", ")
        ))
    }

    /// The table in a server's `static` for `library`, or why not. `loaded` lives for the
    /// program, so no safe call jumps into the code of a library since dropped.
    pub fn table_of(
        library: &'static str,
        loaded: &'static std::result::Result<Self, String>,
    ) -> Result<NcclTable> {
        match loaded {
            Ok(opened) => Ok(opened.table),
            Err(reason) => Err(Error::BackendUnavailable {
                backend: library,
                reason: reason.clone(),
            }),
        }
    }
}
