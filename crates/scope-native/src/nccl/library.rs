//! Finding the library: the first of a server's names that opens, kept
//! open for the process.
//!
//! One loop for every server, because the way a library is found is where
//! servers drift: CUDA's NCCL under its soname `libnccl.so.2` (what NCCL's
//! packages and NVIDIA's wheel install) as well as `libnccl.so` (a
//! development install), HIP's RCCL under `ROCM_PATH` first. A name that
//! opens but lacks an entry point is an answer (a library too old), not a
//! reason to look further.

use std::ffi::c_void;

use libloading::Library;

use super::NcclTable;
use scope_core::{Error, Result};

/// An NCCL API library a server opened, and its table, whose addresses
/// point into it: a server keeps it in a `static` for the life of the
/// process, so the table it hands out stays valid.
pub struct NcclLibrary {
    table: NcclTable,
    _library: Library,
}

impl NcclLibrary {
    /// The first of `names` that opens, as `library` (`"nccl"`,
    /// `"rccl"`); why not — every name tried and the last refusal, or the
    /// entry point the first that opened lacks.
    ///
    /// # Safety
    ///
    /// Every name is an NCCL API library's (NCCL 2.19 or later, or RCCL),
    /// whose initialisers only set up its own state.
    pub unsafe fn open_first(
        library: &'static str,
        names: &[String],
    ) -> std::result::Result<Self, String> {
        let mut why = String::from("no candidates");
        for name in names {
            // SAFETY: an NCCL API library (the caller's promise): opening
            // it runs only its own initialisers.
            let opened = match unsafe { Library::new(name.as_str()) } {
                Ok(opened) => opened,
                Err(e) => {
                    why = e.to_string();
                    continue;
                }
            };
            // SAFETY: each address is looked up by its NCCL name in the
            // library just opened, which `Self` keeps open with the table.
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

    /// The table of what a server's `static` holds for `library`, or
    /// [`Error::BackendUnavailable`] naming `library` and why it is not
    /// there. `loaded` lives for the program, so the library the table
    /// points into is never closed while the table is in use: a table from
    /// a library that could be dropped would let safe calls jump into
    /// unmapped code.
    ///
    /// # Errors
    ///
    /// As above.
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
