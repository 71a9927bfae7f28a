//! `idem check MODULE [--config C --handler H]`: a component described
//! (world, WIT version, imports, size, digest) on stdout, exit 0; a
//! handler whose settings do not allow it, or a file that is no usable
//! component, one line per problem on stderr, exit 1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem_tests::*;
use sha2::{Digest, Sha256};
use std::path::Path;

/// A config with one handler `h` on `module`, with `extra` lines.
fn config(dir: &Path, module: &Path, extra: &str) -> String {
    let cfg = dir.join("idem.toml");
    std::fs::write(
        &cfg,
        format!(
            "[broker]\nurl = \"nats://127.0.0.1:1\"\n[[handler]]\nname = \"h\"\nmodule = \"{}\"\nstream = \"S\"\nsubjects = [\"s\"]\ntables = [\"accounts\"]\n{extra}",
            module.display()
        ),
    )
    .unwrap();
    cfg.to_str().unwrap().to_string()
}

/// `idem check MODULE --config CFG --handler HANDLER`: (exit code, stdout,
/// stderr).
fn check_against(module: &Path, cfg: &str, handler: &str) -> (i32, String, String) {
    idem_cli(
        &[
            "check",
            module.to_str().unwrap(),
            "--config",
            cfg,
            "--handler",
            handler,
        ],
        &[],
    )
}

/// The value of the stdout line that starts with `label`.
fn field<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(label))
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{out}"))
        .trim()
}

#[test]
fn a_component_is_described() {
    let module = guest("behave");
    let bytes = std::fs::read(&module).unwrap();
    let (code, out, err) = idem_cli(&["check", module.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "stderr: {err}");
    assert_eq!(err, "");
    assert_eq!(
        field(&out, "world"),
        "idem:handler/handler (idem:handler@0.2.0)"
    );
    assert_eq!(field(&out, "size"), format!("{} bytes", bytes.len()));
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(field(&out, "digest"), digest);
    assert_eq!(field(&out, "wasi"), "no");
    assert_eq!(field(&out, "imports"), "4");
    let imports: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("  ")).collect();
    assert_eq!(
        imports,
        [
            "idem:handler/types@0.2.0",
            "idem:handler/transaction@0.2.0",
            "idem:handler/log@0.2.0",
            "idem:handler/outbox@0.2.0"
        ]
    );
    let ms: u64 = field(&out, "compile")
        .trim_end_matches(" ms")
        .parse()
        .unwrap();
    assert!(ms < 60_000, "{out}");
    // The 0.1.0 world is named as such.
    let old = guest("credit-v0-1");
    let (code, out, err) = idem_cli(&["check", old.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "stderr: {err}");
    assert_eq!(
        field(&out, "world"),
        "idem:handler/handler (idem:handler@0.1.0)"
    );
}

#[test]
fn a_handler_whose_settings_refuse_the_component_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // WASI imports, and the handler has `wasi = false` (the default).
    let wasi = guest("credit-wasip2");
    let cfg = config(dir.path(), &wasi, "");
    let (code, out, err) = check_against(&wasi, &cfg, "h");
    assert_eq!(code, 1, "stdout: {out}");
    assert_eq!(field(&out, "wasi"), "yes");
    assert_eq!(
        field(&out, "handler"),
        "`h`: its settings do not allow this component"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!("idem: {}: imports WASI (`wasi:", wasi.display())),
        "{err}"
    );
    assert!(err.contains("handler `h` has `wasi = false`"), "{err}");
    let cfg = config(dir.path(), &wasi, "wasi = true\n");
    let (code, out, err) = check_against(&wasi, &cfg, "h");
    assert_eq!((code, err.as_str()), (0, ""), "stdout: {out}");
    assert_eq!(
        field(&out, "handler"),
        "`h`: its settings allow this component"
    );
    // The outbox imported, nothing granted to send to.
    let behave = guest("behave");
    let cfg = config(dir.path(), &behave, "");
    let (code, _, err) = check_against(&behave, &cfg, "h");
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("imports idem:handler/outbox and handler `h` grants no `publish` subjects and no `endpoints`"),
        "{err}"
    );
    let cfg = config(dir.path(), &behave, "publish = [\"out.>\"]\n");
    let (code, _, err) = check_against(&behave, &cfg, "h");
    assert_eq!((code, err.as_str()), (0, ""));
    // A handler the config does not have.
    let (code, out, err) = check_against(&behave, &cfg, "g");
    assert_eq!((code, out.as_str()), (1, ""));
    assert_eq!(
        err.trim_end(),
        format!("idem: {cfg}: no handler `g` (it has: h); name one of them with --handler")
    );
}

#[test]
fn a_file_that_is_no_component_is_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("handler.wasm");
    std::fs::write(&text, "not wasm").unwrap();
    for (path, needle) in [
        (text.to_str().unwrap().to_string(), "not a WebAssembly file"),
        ("/nonexistent/h.wasm".to_string(), "no such file"),
        (
            guest("wrong-world").to_str().unwrap().to_string(),
            "wrong-world.wasm",
        ),
    ] {
        let (code, out, err) = idem_cli(&["check", &path], &[]);
        assert_eq!((code, out.as_str()), (1, ""), "{path}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("idem: ") && err.contains(needle), "{err}");
    }
}
