//! `Runtime::load`: every way a module can be wrong gives one clear line that
//! names the file, what is wrong and what to do; a real handler loads.
//!
//! Needs the guests built: `scripts/build-guests.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_test_support::built;

use idem::runtime::{LoadError, LoadOptions, Runtime};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

static RUNTIME: LazyLock<Runtime> = LazyLock::new(|| Runtime::new().expect("runtime starts"));

const PLAIN: LoadOptions = LoadOptions { wasi: false };
const WASI: LoadOptions = LoadOptions { wasi: true };

fn load_err(path: &Path) -> (LoadError, String) {
    load_err_with(path, PLAIN)
}

fn load_err_with(path: &Path, options: LoadOptions) -> (LoadError, String) {
    let err = RUNTIME.load(path, options).expect_err("load must fail");
    let line = err.to_string();
    assert!(!line.contains('\n'), "one line, got: {line}");
    assert!(
        line.starts_with(&path.display().to_string()),
        "names the file: {line}"
    );
    (err, line)
}

fn write_temp(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("handler.wasm");
    std::fs::write(&p, bytes).unwrap();
    (dir, p)
}

#[test]
fn missing_file() {
    let p = Path::new("/nonexistent/idem/handler.wasm");
    let (err, line) = load_err(p);
    assert!(matches!(err, LoadError::Missing { .. }), "{err:?}");
    assert!(line.contains("no such file"), "{line}");
    assert!(line.contains("`module`"), "says what to fix: {line}");
}

#[test]
fn garbage_bytes() {
    let (_dir, p) = write_temp(b"{\"this is\": \"json, not wasm\"}");
    let (err, line) = load_err(&p);
    assert!(matches!(err, LoadError::NotWasm { .. }), "{err:?}");
    assert!(line.contains("not a WebAssembly file"), "{line}");
}

#[test]
fn empty_file() {
    let (_dir, p) = write_temp(b"");
    let (err, _) = load_err(&p);
    assert!(matches!(err, LoadError::NotWasm { .. }), "{err:?}");
}

#[test]
fn core_module_is_not_a_component() {
    // The smallest core module: magic and version 1.
    let (_dir, p) = write_temp(b"\0asm\x01\0\0\0");
    let (err, line) = load_err(&p);
    assert!(matches!(err, LoadError::CoreModule { .. }), "{err:?}");
    assert!(
        line.contains("wasm-tools component new"),
        "says what to do: {line}"
    );
}

#[test]
fn cargo_output_before_component_new_is_a_core_module() {
    // The common mistake: pointing at cargo's output instead of the component.
    let p = built("wasm32-unknown-unknown/guest/credit.wasm");
    let (err, _) = load_err(&p);
    assert!(matches!(err, LoadError::CoreModule { .. }), "{err:?}");
}

#[test]
fn broken_component() {
    let (_dir, p) = write_temp(b"\0asm\x0d\0\x01\0\xff\xff\xff\xff");
    let (err, line) = load_err(&p);
    assert!(matches!(err, LoadError::Invalid { .. }), "{err:?}");
    assert!(line.contains("not a valid WebAssembly component"), "{line}");
}

#[test]
fn wasi_imports_are_refused_without_the_option() {
    // The credit example built for wasm32-wasip2 imports 13 WASI interfaces
    // (I/O and CLI), the first `wasi:io/poll`.
    let p = built("guests/credit-wasip2.wasm");
    let (err, line) = load_err(&p);
    match &err {
        LoadError::WasiNotEnabled { name, others, .. } => {
            assert_eq!(name, "wasi:io/poll@0.2.6");
            assert_eq!(*others, 12);
        }
        other => panic!("expected WasiNotEnabled, got {other:?}"),
    }
    assert_eq!(
        line,
        format!(
            "{}: imports WASI: `wasi:io/poll@0.2.6` (and 12 more), which idem links only for \
             handlers with `wasi = true`; build for wasm32-unknown-unknown (Rust: then \
             `wasm-tools component new`), or set `wasi = true` for this handler if its language \
             cannot avoid WASI",
            p.display()
        )
    );
}

#[test]
fn wasi_imports_load_with_the_option() {
    let p = built("guests/credit-wasip2.wasm");
    let module = RUNTIME.load(&p, WASI).unwrap_or_else(|e| panic!("{e}"));
    assert!(module.wasi());
    assert_eq!(
        module.digest(),
        hex::encode(Sha256::digest(std::fs::read(&p).unwrap()))
    );
    // Sockets, files, clocks: every interface the probe imports is linked.
    let probe = built("guests/wasi-probe.wasm");
    assert!(RUNTIME.load(&probe, WASI).unwrap().wasi());
    let (err, _) = load_err_with(&probe, PLAIN);
    assert!(
        matches!(err, LoadError::WasiNotEnabled { others: 26, .. }),
        "{err:?}"
    );
}

#[test]
fn a_guest_without_wasi_imports_gets_no_wasi_even_with_the_option() {
    let module = RUNTIME
        .load(&built("guests/credit.wasm"), WASI)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!module.wasi());
}

#[test]
fn wrong_handle_signature() {
    let p = built("guests/wrong-world.wasm");
    let (err, line) = load_err(&p);
    assert!(matches!(err, LoadError::BadExport { .. }), "{err:?}");
    assert!(line.contains("`handle"), "names the export: {line}");
    assert!(line.contains("wit/handler.wit"), "says what to do: {line}");
}

#[test]
fn credit_loads_with_the_file_digest() {
    let p = built("guests/credit.wasm");
    let module = RUNTIME.load(&p, PLAIN).unwrap_or_else(|e| panic!("{e}"));
    let expected = hex::encode(Sha256::digest(std::fs::read(&p).unwrap()));
    assert_eq!(module.digest(), expected);
    assert_eq!(module.path(), p);
}

#[test]
fn behave_loads() {
    let p = built("guests/behave.wasm");
    RUNTIME.load(&p, PLAIN).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn example_config_points_at_a_loadable_module() {
    built("guests/credit.wasm");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/credit/idem.toml");
    let config = idem::config::Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let handler = &config.handlers[0];
    RUNTIME
        .load(&handler.module, LoadOptions { wasi: handler.wasi })
        .unwrap_or_else(|e| panic!("{e}"));
    let migrations = handler
        .migrations
        .as_ref()
        .expect("the example ships migrations");
    assert!(migrations.join("0001_accounts.sql").exists());
}
