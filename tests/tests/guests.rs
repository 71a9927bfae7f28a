//! One test per Rust guest component of `tests/guests.txt`, named after it
//! (`-` as `_`): the component `scripts/build-guests.sh` made exists, has
//! exactly the imports and exports it should, and idem's runtime loads it as
//! a handler of world `idem:handler/handler` (or, for `wrong-world`, refuses
//! it), with and without `wasi = true`. `foreach_guest!` (generated from the
//! list by `build.rs`) makes a guest without its test a compile error.
//!
//! Needs the guests built: `scripts/build-guests.sh` (`scripts/test.sh` runs it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::runtime::{LoadError, LoadOptions, Runtime};
use idem_tests::foreach_guest;
use idem_tests::guests::GUESTS;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// Every guest in the list has a test of its name in this module.
macro_rules! assert_test_exists {
    ($name:ident) => {
        #[expect(unused_imports, reason = "only proves that the test exists")]
        use self::$name as _;
    };
}
foreach_guest!(assert_test_exists);

static RUNTIME: LazyLock<Runtime> = LazyLock::new(|| Runtime::new().expect("runtime starts"));

const PLAIN: LoadOptions = LoadOptions { wasi: false };
const WASI: LoadOptions = LoadOptions { wasi: true };

/// What a component built with `idem-guest` imports: the world's interfaces
/// it uses (`outbox` only when it calls it).
const IDEM_IMPORTS: [&str; 3] = [
    "idem:handler/types@0.2.0",
    "idem:handler/transaction@0.2.0",
    "idem:handler/log@0.2.0",
];

/// What a component built for the 0.1.0 world imports.
const IDEM_V0_1_IMPORTS: [&str; 2] = ["idem:handler/types@0.1.0", "idem:handler/transaction@0.1.0"];

/// What Rust's standard library for wasm32-wasip2 imports (stdio, exit,
/// environment and the streams under them).
const WASIP2_STD_IMPORTS: [&str; 13] = [
    "wasi:io/poll@0.2.6",
    "wasi:io/error@0.2.6",
    "wasi:io/streams@0.2.6",
    "wasi:cli/environment@0.2.6",
    "wasi:cli/exit@0.2.6",
    "wasi:cli/stdin@0.2.6",
    "wasi:cli/stdout@0.2.6",
    "wasi:cli/stderr@0.2.6",
    "wasi:cli/terminal-input@0.2.6",
    "wasi:cli/terminal-output@0.2.6",
    "wasi:cli/terminal-stdin@0.2.6",
    "wasi:cli/terminal-stdout@0.2.6",
    "wasi:cli/terminal-stderr@0.2.6",
];

/// The built component of a listed guest, and its import and export names
/// as wasmtime reads them.
struct Built {
    path: PathBuf,
    imports: BTreeSet<String>,
    exports: BTreeSet<String>,
}

fn built(component: &str) -> Built {
    assert!(
        GUESTS.iter().any(|(c, ..)| *c == component),
        "`{component}` is not in tests/guests.txt"
    );
    let path = idem_tests::guest(component);
    let engine = wasmtime::Engine::default();
    let parsed = wasmtime::component::Component::from_file(&engine, &path)
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let ty = parsed.component_type();
    let imports = ty.imports(&engine).map(|(n, _)| n.to_string()).collect();
    let exports = ty.exports(&engine).map(|(n, _)| n.to_string()).collect();
    Built {
        path,
        imports,
        exports,
    }
}

fn set<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    names.into_iter().map(str::to_string).collect()
}

fn handle_only() -> BTreeSet<String> {
    set(["handle"])
}

fn sha256(path: &Path) -> String {
    hex(&Sha256::digest(std::fs::read(path).unwrap()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Loads with `options`: a handler module from `path`, with the file's
/// digest, WASI linked exactly when `wasi`.
fn assert_loads(path: &Path, options: LoadOptions, wasi: bool) {
    let module = RUNTIME
        .load(path, options)
        .unwrap_or_else(|e| panic!("{options:?}: {e}"));
    assert_eq!(module.wasi(), wasi, "{options:?}");
    assert_eq!(module.path(), path);
    assert_eq!(module.digest(), sha256(path));
}

/// A guest built with `idem-guest` for wasm32-unknown-unknown: the world's
/// three imports and `handle`, nothing else; loads without WASI, and gets
/// none when its handler allows it (it imports none).
fn assert_plain_handler(component: &str) {
    let b = built(component);
    assert_eq!(b.imports, set(IDEM_IMPORTS));
    assert_eq!(b.exports, handle_only());
    assert_loads(&b.path, PLAIN, false);
    assert_loads(&b.path, WASI, false);
}

#[test]
fn credit() {
    assert_plain_handler("credit");
}

#[test]
fn credit_log() {
    assert_plain_handler("credit-log");
}

#[test]
fn credit_bonus() {
    assert_plain_handler("credit-bonus");
}

#[test]
fn likes() {
    assert_plain_handler("likes");
}

#[test]
fn projection() {
    assert_plain_handler("projection");
}

#[test]
fn parcel() {
    assert_plain_handler("parcel");
}

#[test]
fn counter() {
    assert_plain_handler("counter");
}

/// A guest built with `idem-guest` that also calls the outbox: the world's
/// three imports, `outbox` and `handle`, nothing else; loads without WASI.
fn assert_outbox_handler(component: &str) {
    let b = built(component);
    let mut imports = set(IDEM_IMPORTS);
    imports.insert("idem:handler/outbox@0.2.0".into());
    assert_eq!(b.imports, imports);
    assert_eq!(b.exports, handle_only());
    assert_loads(&b.path, PLAIN, false);
}

/// Calls the outbox too: imports it.
#[test]
fn behave() {
    assert_outbox_handler("behave");
}

/// The orders example's first handler: publishes through the outbox.
#[test]
fn orders() {
    assert_outbox_handler("orders");
    assert_loads(&built("orders").path, WASI, false);
}

/// The orders example's second handler: calls an endpoint through the outbox.
#[test]
fn stock() {
    assert_outbox_handler("stock");
    assert_loads(&built("stock").path, WASI, false);
}

/// Built for `idem:handler@0.1.0`, the world before `outbox`: loads
/// unchanged (tests/tests/outbox.rs runs it beside a 0.2.0 component).
#[test]
fn credit_v0_1() {
    let b = built("credit-v0-1");
    assert_eq!(b.imports, set(IDEM_V0_1_IMPORTS));
    assert_eq!(b.exports, handle_only());
    assert_loads(&b.path, PLAIN, false);
    assert_loads(&b.path, WASI, false);
}

/// Exports `handle` of another type and imports nothing: refused as not
/// targeting the world, with or without WASI.
#[test]
fn wrong_world() {
    let b = built("wrong-world");
    assert_eq!(b.imports, BTreeSet::new());
    assert_eq!(b.exports, handle_only());
    for options in [PLAIN, WASI] {
        let err = RUNTIME
            .load(&b.path, options)
            .expect_err("a component of another world must be refused");
        let LoadError::BadExport { path, detail } = &err else {
            panic!("{options:?}: expected BadExport, got {err:?}");
        };
        assert_eq!(path, &b.path);
        assert_eq!(
            err.to_string(),
            format!(
                "{}: does not export `handle: func(msg: message) -> result<_, handler-error>` \
                 of world idem:handler/handler ({detail}); build it against this idem's \
                 wit/handler.wit",
                b.path.display()
            )
        );
        assert_eq!(detail, WRONG_WORLD_DETAIL, "{options:?}");
    }
}

/// What wasmtime says of `wrong-world`'s `handle`: its parameter is a
/// `string` where the world has the `message` record.
const WRONG_WORLD_DETAIL: &str =
    "type-checking export func `handle`: expected `record` found `string`";

/// The credit example built for wasm32-wasip2: the world's imports plus the
/// standard library's WASI; refused without `wasi = true`, naming the first
/// WASI import, and loaded with WASI linked with it.
#[test]
fn credit_wasip2() {
    let b = built("credit-wasip2");
    assert_eq!(
        b.imports,
        set(IDEM_IMPORTS.into_iter().chain(WASIP2_STD_IMPORTS))
    );
    assert_eq!(b.exports, handle_only());
    let err = RUNTIME
        .load(&b.path, PLAIN)
        .expect_err("WASI without the option");
    let LoadError::WasiNotEnabled { path, name, others } = &err else {
        panic!("expected WasiNotEnabled, got {err:?}");
    };
    assert_eq!(
        (path, name.as_str(), *others),
        (&b.path, "wasi:io/poll@0.2.6", 12)
    );
    assert_loads(&b.path, WASI, true);
}

/// The WASI probe: the idem world's imports and every WASI interface the
/// host links (`wasi:random` through its own bindings); refused without
/// `wasi = true`, loaded with it.
#[test]
fn wasi_probe() {
    let b = built("wasi-probe");
    let probe_wasi = [
        "wasi:clocks/monotonic-clock@0.2.6",
        "wasi:clocks/wall-clock@0.2.6",
        "wasi:filesystem/types@0.2.6",
        "wasi:filesystem/preopens@0.2.6",
        "wasi:sockets/network@0.2.6",
        "wasi:sockets/instance-network@0.2.6",
        "wasi:sockets/udp@0.2.6",
        "wasi:sockets/udp-create-socket@0.2.6",
        "wasi:sockets/tcp@0.2.6",
        "wasi:sockets/tcp-create-socket@0.2.6",
        "wasi:sockets/ip-name-lookup@0.2.6",
        "wasi:random/random@0.2.6",
        "wasi:random/insecure@0.2.6",
        "wasi:random/insecure-seed@0.2.6",
    ];
    assert_eq!(
        b.imports,
        set(IDEM_IMPORTS
            .into_iter()
            .chain(WASIP2_STD_IMPORTS)
            .chain(probe_wasi))
    );
    assert_eq!(b.exports, handle_only());
    let err = RUNTIME
        .load(&b.path, PLAIN)
        .expect_err("WASI without the option");
    let LoadError::WasiNotEnabled { path, name, others } = &err else {
        panic!("expected WasiNotEnabled, got {err:?}");
    };
    assert_eq!(
        (path, name.as_str(), *others),
        (&b.path, "wasi:random/random@0.2.6", 26)
    );
    assert_loads(&b.path, WASI, true);
}
