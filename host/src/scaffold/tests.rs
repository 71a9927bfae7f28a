//! The renderer: every language renders every strategy, the file list, and
//! `write` refusing a non-empty folder.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn paths(files: &[File]) -> Vec<&str> {
    files.iter().map(|f| f.path.as_str()).collect()
}

fn text_of<'a>(files: &'a [File], path: &str) -> &'a str {
    let f = files
        .iter()
        .find(|f| f.path == path)
        .unwrap_or_else(|| panic!("no {path} in {:?}", paths(files)));
    std::str::from_utf8(&f.contents).unwrap()
}

#[test]
fn every_language_renders_every_strategy() {
    for lang in Lang::ALL {
        for strategy in Strategy::ALL {
            let files = render("my-handler", lang, strategy)
                .unwrap_or_else(|e| panic!("{lang:?} {strategy:?}: {e:#}"));
            for f in &files {
                let text = String::from_utf8_lossy(&f.contents);
                assert!(
                    !text.contains("{{") && !text.contains("{%"),
                    "{lang:?} {strategy:?} {}: a template tag left:\n{text}",
                    f.path
                );
            }
            let toml: toml::Value = toml::from_str(text_of(&files, "idem.toml")).unwrap();
            let h = &toml["handler"][0];
            assert_eq!(h["name"].as_str(), Some("my-handler"));
            assert_eq!(h["module"].as_str(), Some("build/my-handler.wasm"));
            assert_eq!(h["migrations"].as_str(), Some("migrations"));
            let fixtures: toml::Value = toml::from_str(text_of(&files, "fixtures.toml")).unwrap();
            let fixtures = fixtures["fixture"].as_array().unwrap();
            assert!(fixtures.len() >= 3, "{strategy:?}: {fixtures:?}");
            assert!(
                fixtures.iter().any(|f| f["message"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m.get("outcome").and_then(|o| o.as_str()) == Some("reject"))),
                "{strategy:?}: no fixture with a rejected message"
            );
            for p in paths(&files) {
                if let Some(m) = p.strip_prefix("messages/") {
                    let v: serde_json::Value = serde_json::from_str(text_of(&files, p)).unwrap();
                    assert!(v["event_id"].is_string(), "{strategy:?} {m}");
                }
            }
            let readme = text_of(&files, "README.md");
            assert!(readme.contains("idem test --config idem.toml my-handler fixtures.toml"));
            assert!(readme.contains("bash build.sh"));
        }
    }
}

#[test]
fn the_files_of_each_language() {
    let common = [
        ".gitignore",
        "README.md",
        "build.sh",
        "fixtures.toml",
        "idem.toml",
        "messages/credit-alice.json",
        "messages/credit-bob.json",
        "messages/malformed.json",
        "migrations/0001_accounts.sql",
        "wit/handler.wit",
    ];
    let own: [(Lang, &[&str]); 4] = [
        (
            Lang::Rust,
            &[
                "Cargo.toml",
                "idem-guest/Cargo.toml",
                "idem-guest/src/decode.rs",
                "idem-guest/src/lib.rs",
                "idem-guest/src/value.rs",
                "src/lib.rs",
            ],
        ),
        (
            Lang::C,
            &["bindings/handler.c", "bindings/handler.h", "main.c"],
        ),
        (Lang::Js, &["handler.js", "idem.js"]),
        (Lang::Python, &["app.py", "idem_json.py"]),
    ];
    for (lang, own) in own {
        let files = render("credit", lang, Strategy::Receipt).unwrap();
        let mut want: Vec<&str> = common.iter().chain(own).copied().collect();
        want.sort();
        assert_eq!(paths(&files), want, "{lang:?}");
        let build = files.iter().find(|f| f.path == "build.sh").unwrap();
        assert!(build.executable);
    }
}

#[test]
fn the_rust_source_has_the_strategy_s_statements() {
    let files = render("counter", Lang::Rust, Strategy::Aggregate).unwrap();
    let src = text_of(&files, "src/lib.rs");
    assert!(src.contains("const RECORD: &str = concat!("), "{src}");
    assert!(src.contains("\"ON CONFLICT (op_id) DO NOTHING\","), "{src}");
    assert!(
        src.contains("params![event.op_id.as_str(), event.key.as_str(), event.amount]"),
        "{src}"
    );
    // One type name whatever the handler's name, so none clashes with
    // the payload's type or an import.
    assert!(src.contains("struct Component;"), "{src}");
    for name in ["9lives", "event", "handler", "message", "deserialize"] {
        let files = render(name, Lang::Rust, Strategy::Receipt).unwrap();
        assert!(text_of(&files, "src/lib.rs").contains("struct Component;"));
    }
    let files = render("9lives", Lang::Rust, Strategy::Receipt).unwrap();
    assert!(text_of(&files, "Cargo.toml").contains("name = \"handler-9lives\""));
}

#[test]
fn a_rust_handler_is_not_named_after_a_crate_or_keyword() {
    for name in ["serde", "serde-json", "idem-guest", "self", "fn"] {
        let e = render(name, Lang::Rust, Strategy::Receipt).unwrap_err();
        assert!(e.to_string().contains("choose another"), "{e}");
        render(name, Lang::Js, Strategy::Receipt).unwrap();
    }
}

#[test]
fn a_bad_name_is_refused() {
    let long = "a".repeat(65);
    for name in ["", "a b", "a.b", "a/b", "é", "../x", &long] {
        let e = render(name, Lang::Rust, Strategy::Receipt).unwrap_err();
        assert!(
            e.to_string().contains("may use only letters"),
            "{name}: {e}"
        );
    }
}

#[test]
fn a_non_empty_folder_is_refused_and_nothing_written() {
    let tmp = tempfile::tempdir().unwrap();
    let files = render("h", Lang::Js, Strategy::Upsert).unwrap();
    std::fs::write(tmp.path().join("keep.txt"), "mine").unwrap();
    let e = write(tmp.path(), &files).unwrap_err();
    assert!(e.to_string().contains("exists and is not empty"), "{e}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(left.len(), 1);

    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    write(&empty, &files).unwrap();
    let fresh = tmp.path().join("a/b");
    write(&fresh, &files).unwrap();
    for f in &files {
        assert_eq!(std::fs::read(fresh.join(&f.path)).unwrap(), f.contents);
    }
}
