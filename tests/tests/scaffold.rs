//! `idem new`: for each language and each strategy, a handler folder made
//! outside the repository builds with the
//! command its README gives, into the component its `idem.toml` names; then
//! its fixtures pass `idem test` on SQLite and PostgreSQL
//! ([`idem_test_fixtures`]).
//!
//! Building needs the toolchains `scripts/toolchains.sh` installs (C, JS,
//! Python) and, for Rust, crates.io (the folder's own crate fetches
//! `wit-bindgen`, `serde`, `serde_json`). The Rust builds share one target
//! directory (`<target>/scaffold`), so the dependencies compile once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use std::path::Path;
use std::process::Command;

/// `idem new NAME --lang LANG --strategy STRATEGY --dir DIR`, which must
/// succeed.
fn idem_new(name: &str, lang: &str, strategy: &str, dir: &Path) {
    let (code, out, err) = idem_cli(
        &[
            "new",
            name,
            "--lang",
            lang,
            "--strategy",
            strategy,
            "--dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "idem new {name} --lang {lang}: {out}{err}");
    assert!(out.contains("created"), "{out}");
}

/// Runs the build command the folder's README gives (the line of its
/// "Build, test, run" block ending in the `# -> MODULE` comment), with the
/// toolchains `scripts/toolchains.sh` exports for `lang`; returns the module
/// path it names.
fn build_as_readme_says(dir: &Path, lang: &str) -> std::path::PathBuf {
    let readme = std::fs::read_to_string(dir.join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.contains("# -> "))
        .unwrap_or_else(|| panic!("no build line in README.md:\n{readme}"));
    let (command, module) = line.split_once("# -> ").unwrap();
    let (command, module) = (command.trim(), module.trim());
    assert_eq!(command, "bash build.sh");
    let toolchains = match lang {
        "rust" => format!(". {}/scripts/setup.sh", root().display()),
        other => format!(". {}/scripts/toolchains.sh {other}", root().display()),
    };
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("{toolchains} >&2 && {command}"))
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir().join("scaffold"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command} in {}:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(module);
    assert!(path.is_file(), "{} was not built", path.display());
    // The component the config names.
    let toml = std::fs::read_to_string(dir.join("idem.toml")).unwrap();
    assert!(toml.contains(&format!("module = \"{module}\"")), "{toml}");
    path
}

/// `idem test --config idem.toml NAME fixtures.toml` in `dir`, on SQLite and
/// on a throwaway PostgreSQL database (`[database] url` overridden by
/// `IDEM_DATABASE__URL`): every fixture passes on both.
fn idem_test_fixtures(dir: &Path, name: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let db = rt.block_on(TestDb::new(backend));
        let cfg = dir.join("idem.toml");
        let fixtures = dir.join("fixtures.toml");
        let (code, out, err) = idem_cli(
            &[
                "test",
                "--config",
                cfg.to_str().unwrap(),
                name,
                fixtures.to_str().unwrap(),
            ],
            &[("IDEM_DATABASE__URL", &db.url)],
        );
        assert_eq!(code, 0, "idem test {name} on {backend:?}:\n{out}{err}");
    }
}

/// Makes, builds and tests one handler.
fn scaffold(lang: &str, strategy: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let name = format!("{lang}-{strategy}");
    let dir = tmp.path().join(&name);
    idem_new(&name, lang, strategy, &dir);
    let module = build_as_readme_says(&dir, lang);
    // A component of the handler world, as `idem check` sees it; its
    // handler's settings allow it, except that the JavaScript helpers and
    // componentize-py import the outbox, which the handler grants nothing
    // (`idem check` says so; `idem run` runs it, as examples/credit-js).
    let cfg = dir.join("idem.toml");
    let mut args = vec![module.to_str().unwrap()];
    if lang == "rust" || lang == "c" {
        args.extend(["--config", cfg.to_str().unwrap(), "--handler", &name]);
    }
    let (code, out, err) = idem_cli(&[&["check"][..], &args].concat(), &[]);
    assert_eq!(code, 0, "idem check: {out}{err}");
    assert!(out.contains("world    idem:handler/handler"), "{out}");
    assert!(out.contains("wasi     no"), "{out}");
    idem_test_fixtures(&dir, &name);
}

/// One `#[test]` per language and strategy: `NAME` runs
/// `scaffold(LANG, STRATEGY)`.
macro_rules! pairs {
    ($($name:ident: $lang:literal $strategy:literal;)*) => {
        $(
            #[test]
            fn $name() {
                scaffold($lang, $strategy);
            }
        )*
    };
}

pairs! {
    rust_receipt: "rust" "receipt";
    rust_natural_key: "rust" "natural-key";
    rust_version: "rust" "version";
    rust_upsert: "rust" "upsert";
    rust_aggregate: "rust" "aggregate";
    c_receipt: "c" "receipt";
    c_natural_key: "c" "natural-key";
    c_version: "c" "version";
    c_upsert: "c" "upsert";
    c_aggregate: "c" "aggregate";
    js_receipt: "js" "receipt";
    js_natural_key: "js" "natural-key";
    js_version: "js" "version";
    js_upsert: "js" "upsert";
    js_aggregate: "js" "aggregate";
    python_receipt: "python" "receipt";
    python_natural_key: "python" "natural-key";
    python_version: "python" "version";
    python_upsert: "python" "upsert";
    python_aggregate: "python" "aggregate";
}

#[test]
fn a_non_empty_folder_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("keep.txt"), "mine").unwrap();
    let (code, _, err) = idem_cli(
        &[
            "new",
            "h",
            "--lang",
            "rust",
            "--dir",
            tmp.path().to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("exists and is not empty"), "{err}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
    let (code, _, err) = idem_cli(&["new", "a.b", "--lang", "rust"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("may use only letters"), "{err}");
    let (code, _, err) = idem_cli(&["new", "h", "--lang", "cobol"], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cobol"), "{err}");
}
