//! Loading a handler component: compile once, check it against the world,
//! and say in one line what is wrong and what to do when it does not fit.

use super::bindings::{HandlerPre, PROVIDED_IMPORTS};
use super::host_impl::HostState;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

/// A compiled handler component, checked against the world
/// `idem:handler/handler` and ready to instantiate once per message.
pub struct HandlerModule {
    pub(crate) pre: HandlerPre<HostState>,
    digest: String,
    path: PathBuf,
}

impl HandlerModule {
    /// Hex SHA-256 of the component file's bytes: recorded with every receipt.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The file the component was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::fmt::Debug for HandlerModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerModule")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .finish_non_exhaustive()
    }
}

/// Why a handler component cannot be used. Each message is one line that names
/// the file, what is wrong with it, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file does not exist.
    #[error("{}: no such file; build the handler (for the examples: scripts/build-guests.sh) or fix `module` in the config", path.display())]
    Missing { path: PathBuf },
    /// The file exists but cannot be read.
    #[error("{}: cannot read the file: {detail}", path.display())]
    Unreadable { path: PathBuf, detail: String },
    /// The file is not WebAssembly at all.
    #[error("{}: not a WebAssembly file (no `\\0asm` header); point `module` at a .wasm component", path.display())]
    NotWasm { path: PathBuf },
    /// A core module, not a component.
    #[error("{}: a core WebAssembly module, not a component; make one with `wasm-tools component new {} -o handler.wasm` and point `module` at that", path.display(), path.display())]
    CoreModule { path: PathBuf },
    /// A component that does not validate or compile.
    #[error("{}: not a valid WebAssembly component: {detail}", path.display())]
    Invalid { path: PathBuf, detail: String },
    /// A component that imports something the host does not provide (WASI, say).
    #[error("{}: imports `{name}`{more}, which idem does not provide (it provides only idem:handler/transaction and idem:handler/log); build Rust guests for wasm32-unknown-unknown and run `wasm-tools component new`, or drop the dependency that needs it", path.display(), more = more_imports(*others))]
    UnknownImport {
        path: PathBuf,
        /// The first import the host does not provide.
        name: String,
        /// How many more there are.
        others: usize,
    },
    /// The idem:handler imports do not match the host's (another WIT version, say).
    #[error("{}: its idem:handler imports do not match this host's ({detail}); rebuild it against this idem's wit/handler.wit", path.display())]
    ImportMismatch { path: PathBuf, detail: String },
    /// No `handle` export, or one of another type.
    #[error("{}: does not export `handle: func(msg: message) -> result<_, handler-error>` of world idem:handler/handler ({detail}); build it against this idem's wit/handler.wit", path.display())]
    BadExport { path: PathBuf, detail: String },
}

fn more_imports(others: usize) -> String {
    match others {
        0 => String::new(),
        1 => " (and 1 more)".to_string(),
        n => format!(" (and {n} more)"),
    }
}

/// A wasmtime error as one line: its causes joined by `: `, no newlines.
pub(crate) fn one_line(e: &wasmtime::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads, compiles and checks one component. See [`super::Runtime::load`].
pub(crate) fn load(
    engine: &Engine,
    linker: &Linker<HostState>,
    path: &Path,
) -> Result<HandlerModule, LoadError> {
    let p = || path.to_path_buf();
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LoadError::Missing { path: p() },
        _ => LoadError::Unreadable {
            path: p(),
            detail: e.to_string(),
        },
    })?;
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => return Err(LoadError::CoreModule { path: p() }),
        Some([0, b'a', b's', b'm', ..]) => {}
        _ => return Err(LoadError::NotWasm { path: p() }),
    }
    let component = Component::from_binary(engine, &bytes).map_err(|e| LoadError::Invalid {
        path: p(),
        detail: one_line(&e),
    })?;

    let foreign: Vec<String> = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name)
        .filter(|name| !name.starts_with("idem:handler/") && !PROVIDED_IMPORTS.contains(name))
        .map(str::to_string)
        .collect();
    if let Some(name) = foreign.first() {
        return Err(LoadError::UnknownImport {
            path: p(),
            name: name.clone(),
            others: foreign.len() - 1,
        });
    }

    let instance_pre =
        linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::ImportMismatch {
                path: p(),
                detail: one_line(&e),
            })?;
    let pre = HandlerPre::new(instance_pre).map_err(|e| LoadError::BadExport {
        path: p(),
        detail: one_line(&e),
    })?;
    Ok(HandlerModule {
        pre,
        digest: hex::encode(Sha256::digest(&bytes)),
        path: p(),
    })
}
