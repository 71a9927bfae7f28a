//! Loading a handler component: compile once, check it against the world,
//! and say in one line what is wrong and what to do when it does not fit.

use super::bindings::{HandlerPre, PROVIDED_IMPORTS};
use super::code_size::{CompileLimits, OverLimit};
use super::host_impl::HostState;
use super::wasi;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use wasmtime::Engine;
use wasmtime::component::{Component, Linker};

/// How to load one handler's component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Link WASI preview 2 with an empty context (no files, network,
    /// environment or arguments; stdout/stderr to the guest log) for a
    /// language that cannot avoid WASI imports: the handler's `wasi = true`.
    /// Default `false`: a component that imports WASI is refused.
    pub wasi: bool,
}

/// A compiled handler component, checked against the world
/// `idem:handler/handler` and ready to instantiate once per message.
pub struct HandlerComponent {
    pub(crate) code: Code,
    digest: String,
    path: PathBuf,
    wasi: bool,
    /// The WIT package version it was built for.
    wit: &'static str,
    /// Its import names, as the component declares them.
    imports: Vec<String>,
}

/// What runs a message: a compiled component, or (cargo feature
/// `native-handler`, for the throughput benchmark) Rust compiled into the
/// host ([`super::native`]).
pub(crate) enum Code {
    /// Instantiated once per message.
    Wasm(HandlerPre<HostState>),
    /// Called once per message, behind the same host functions.
    #[cfg(feature = "native-handler")]
    Native(std::sync::Arc<dyn super::native::NativeHandler>),
}

impl HandlerComponent {
    /// A native handler in the place of a component (feature
    /// `native-handler`; not sandboxed, for the throughput benchmark): its
    /// digest, the receipts' `module_digest`, is `native-<name>`.
    #[cfg(feature = "native-handler")]
    pub fn native(
        name: &str,
        handler: std::sync::Arc<dyn super::native::NativeHandler>,
    ) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            code: Code::Native(handler),
            digest: format!("native-{name}"),
            path: PathBuf::from(format!("native:{name}")),
            wasi: false,
            wit: super::WIT_PACKAGE,
            imports: Vec::new(),
        })
    }

    /// The compiled component, ready to instantiate (`None`: a native
    /// handler).
    pub(crate) fn wasm(&self) -> Option<&HandlerPre<HostState>> {
        match &self.code {
            Code::Wasm(pre) => Some(pre),
            #[cfg(feature = "native-handler")]
            Code::Native(_) => None,
        }
    }

    /// Whether the component runs with the (empty) WASI context linked: it
    /// was loaded with [`LoadOptions::wasi`] and imports WASI.
    pub fn wasi(&self) -> bool {
        self.wasi
    }

    /// The WIT package the component was built for: `idem:handler@0.1.0`
    /// when it imports an interface of 0.1.0, else [`super::WIT_PACKAGE`].
    pub fn wit(&self) -> &'static str {
        self.wit
    }

    /// The component's import names (`idem:handler/transaction@0.2.0`,
    /// `wasi:io/streams@0.2.6`, …), in the order it declares them.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Hex SHA-256 of the component file's bytes: recorded with every receipt.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The file the component was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::fmt::Debug for HandlerComponent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerComponent")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .field("wasi", &self.wasi)
            .finish_non_exhaustive()
    }
}

/// Why a handler component cannot be used. Each message is one line that names
/// the file, what is wrong with it, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file does not exist.
    #[error("{}: no such file; build the handler (for the examples: scripts/build-guests.sh) or fix `module` in the config", path.display())]
    Missing {
        /// The component file.
        path: PathBuf,
    },
    /// The file exists but cannot be read.
    #[error("{}: cannot read the file: {detail}", path.display())]
    Unreadable {
        /// The component file.
        path: PathBuf,
        /// What is wrong, as wasmtime or the file system said it.
        detail: String,
    },
    /// The file is not WebAssembly at all.
    #[error("{}: not a WebAssembly file (no `\\0asm` header); point `module` at a .wasm component", path.display())]
    NotWasm {
        /// The component file.
        path: PathBuf,
    },
    /// A core module, not a component.
    #[error("{}: a core WebAssembly module, not a component; make one with `wasm-tools component new {} -o handler.wasm` and point `module` at that", path.display(), path.display())]
    CoreModule {
        /// The component file.
        path: PathBuf,
    },
    /// A component that does not validate or compile.
    #[error("{}: not a valid WebAssembly component: {detail}", path.display())]
    Invalid {
        /// The component file.
        path: PathBuf,
        /// What is wrong, as wasmtime or the file system said it.
        detail: String,
    },
    /// A component that imports something the host does not provide
    /// (`wasi:http`, say, or WASI 0.3).
    #[error("{}: imports `{name}`{more}, which idem does not provide (it provides only idem:handler/transaction and idem:handler/log{and_wasi}); build Rust guests for wasm32-unknown-unknown and run `wasm-tools component new`, or drop the dependency that needs it", path.display(), more = more_imports(*others), and_wasi = if *wasi { ", and WASI 0.2 with an empty context" } else { "" })]
    UnknownImport {
        /// The component file.
        path: PathBuf,
        /// The first import the host does not provide.
        name: String,
        /// How many more there are.
        others: usize,
        /// Whether the component was loaded with [`LoadOptions::wasi`].
        wasi: bool,
    },
    /// A component that imports WASI 0.2, loaded without [`LoadOptions::wasi`].
    #[error("{}: imports WASI: `{name}`{more}, which idem links only for handlers with `wasi = true`; build for wasm32-unknown-unknown (Rust: then `wasm-tools component new`), or set `wasi = true` for this handler if its language cannot avoid WASI", path.display(), more = more_imports(*others))]
    WasiNotEnabled {
        /// The component file.
        path: PathBuf,
        /// The first WASI import.
        name: String,
        /// How many more WASI imports there are.
        others: usize,
    },
    /// The imports do not match the host's (another WIT version, say).
    #[error("{}: its imports do not match this host's ({detail}); rebuild it against this idem's wit/handler.wit", path.display())]
    ImportMismatch {
        /// The component file.
        path: PathBuf,
        /// What is wrong, as wasmtime or the file system said it.
        detail: String,
    },
    /// More code than `[runtime]` lets one component bring: refused before
    /// compiling (ARCHITECTURE.md, "Compile limits").
    #[error("{}: refused before compiling: it {over}; a handler this large takes the host's memory to compile: make it smaller, or raise that setting", path.display())]
    TooLarge {
        /// The component file.
        path: PathBuf,
        /// Which limit it is over.
        over: OverLimit,
    },
    /// No `handle` export, or one of another type.
    #[error("{}: does not export `handle: func(msg: message) -> result<_, handler-error>` of world idem:handler/handler ({detail}); build it against this idem's wit/handler.wit", path.display())]
    BadExport {
        /// The component file.
        path: PathBuf,
        /// What is wrong, as wasmtime or the file system said it.
        detail: String,
    },
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

/// The two linkers of a runtime: the plain one (idem:handler only) and the
/// one with WASI added.
pub(crate) struct Linkers {
    pub(crate) plain: Linker<HostState>,
    pub(crate) wasi: Linker<HostState>,
}

/// Reads a component file. See [`super::Runtime::load`].
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LoadError::Missing {
            path: path.to_path_buf(),
        },
        _ => LoadError::Unreadable {
            path: path.to_path_buf(),
            detail: e.to_string(),
        },
    })
}

/// Checks what can be checked of `bytes`, read from `path`, without
/// compiling: the header, and the code it brings against `limits`.
pub(crate) fn precheck(bytes: &[u8], path: &Path, limits: &CompileLimits) -> Result<(), LoadError> {
    let p = || path.to_path_buf();
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => return Err(LoadError::CoreModule { path: p() }),
        Some([0, b'a', b's', b'm', ..]) => {}
        _ => return Err(LoadError::NotWasm { path: p() }),
    }
    let size = super::code_size::measure(bytes)
        .map_err(|detail| LoadError::Invalid { path: p(), detail })?;
    match limits.check(&size) {
        Some(over) => Err(LoadError::TooLarge { path: p(), over }),
        None => Ok(()),
    }
}

/// The SHA-256 of a component's bytes, hex: its digest (in receipts,
/// deploy records and the compiled-component cache's file names).
pub(crate) fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Compiles one component's `bytes`, read from `path` (already through
/// [`precheck`]). See [`super::Runtime::load_bytes`].
pub(crate) fn compile(engine: &Engine, bytes: &[u8], path: &Path) -> Result<Component, LoadError> {
    Component::from_binary(engine, bytes).map_err(|e| LoadError::Invalid {
        path: path.to_path_buf(),
        detail: one_line(&e),
    })
}

/// Checks a compiled component's imports and exports against the host's.
pub(crate) fn link(
    engine: &Engine,
    linkers: &Linkers,
    component: &Component,
    path: &Path,
    options: LoadOptions,
    digest: String,
) -> Result<HandlerComponent, LoadError> {
    let p = || path.to_path_buf();
    let wit = if component
        .component_type()
        .imports(engine)
        .any(|(name, _)| name.starts_with("idem:handler/") && name.ends_with("@0.1.0"))
    {
        super::WIT_PACKAGE_V0_1
    } else {
        super::WIT_PACKAGE
    };
    // Imports the host may provide: idem:handler (an unknown one is an
    // ImportMismatch below, with wasmtime's detail) and WASI 0.2.
    let (wasi_imports, foreign): (Vec<String>, Vec<String>) = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name)
        .filter(|name| !name.starts_with("idem:handler/") && !PROVIDED_IMPORTS.contains(name))
        .map(str::to_string)
        .partition(|name| wasi::is_linked(name));
    if let Some(name) = foreign.first() {
        return Err(LoadError::UnknownImport {
            path: p(),
            name: name.clone(),
            others: foreign.len() - 1,
            wasi: options.wasi,
        });
    }
    if let (false, Some(name)) = (options.wasi, wasi_imports.first()) {
        return Err(LoadError::WasiNotEnabled {
            path: p(),
            name: name.clone(),
            others: wasi_imports.len() - 1,
        });
    }
    // A component without WASI imports gets the plain linker even when WASI
    // is allowed: no WASI at all is the stronger sandbox.
    let wasi = !wasi_imports.is_empty();
    if options.wasi && !wasi {
        tracing::warn!(module = %path.display(), "the handler sets `wasi = true` but its component imports no WASI; the option can go");
    }
    let linker = if wasi { &linkers.wasi } else { &linkers.plain };

    let instance_pre =
        linker
            .instantiate_pre(component)
            .map_err(|e| LoadError::ImportMismatch {
                path: p(),
                detail: one_line(&e),
            })?;
    let pre = HandlerPre::new(instance_pre).map_err(|e| LoadError::BadExport {
        path: p(),
        detail: one_line(&e),
    })?;
    let imports = component
        .component_type()
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    Ok(HandlerComponent {
        code: Code::Wasm(pre),
        digest,
        path: p(),
        wasi,
        wit,
        imports,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::runtime::Runtime;

    fn link_wat(wat: &str, wasi: bool) -> Result<HandlerComponent, LoadError> {
        let rt = Runtime::with_capacity(1).map_err(|e| LoadError::Invalid {
            path: PathBuf::new(),
            detail: e.to_string(),
        })?;
        let component = Component::new(&rt.engine, wat).map_err(|e| LoadError::Invalid {
            path: PathBuf::new(),
            detail: one_line(&e),
        })?;
        let path = Path::new("h.wasm");
        link(
            &rt.engine,
            &rt.linkers,
            &component,
            path,
            LoadOptions { wasi },
            String::new(),
        )
    }

    #[test]
    fn an_import_beyond_wasi_0_2_is_unknown_even_with_wasi() {
        let wat = r#"(component
            (import "wasi:http/types@0.2.6" (instance))
            (import "wasi:cli/environment@0.2.6" (instance))
        )"#;
        let err = link_wat(wat, true).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "h.wasm: imports `wasi:http/types@0.2.6`, which idem does not provide (it provides \
                 only idem:handler/transaction and idem:handler/log, and WASI 0.2 with an empty \
                 context); build Rust guests for wasm32-unknown-unknown and run `wasm-tools \
                 component new`, or drop the dependency that needs it"
            )
        );
    }

    #[test]
    fn wasi_imports_without_the_option_name_the_fix() {
        let wat = r#"(component
            (import "wasi:cli/environment@0.2.6" (instance))
            (import "wasi:cli/stdout@0.2.6" (instance))
        )"#;
        let err = link_wat(wat, false).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some(
                "h.wasm: imports WASI: `wasi:cli/environment@0.2.6` (and 1 more), which idem \
                 links only for handlers with `wasi = true`; build for wasm32-unknown-unknown \
                 (Rust: then `wasm-tools component new`), or set `wasi = true` for this handler \
                 if its language cannot avoid WASI"
            )
        );
        // With the option the imports link; the missing `handle` export is what is left.
        assert!(matches!(
            link_wat(wat, true),
            Err(LoadError::BadExport { .. })
        ));
    }
}
