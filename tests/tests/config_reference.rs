//! docs/configuration.md's "Reference" is the one list of every key
//! `idem.toml` accepts: each section's table names exactly the keys the
//! config loader accepts in that section. The keys come from the code, as
//! the loader itself reports them: a file with an unknown key `nope` in the
//! top level, in every section and in a `[[handler]]` makes
//! [`Config::load`] name, for each, every key it would have accepted
//! (serde's list of the section's fields, what `idem config check` prints).
//! So a key added to the config without a row in the reference, or a row
//! left for a key that is gone, fails here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use idem::config::{Config, ConfigError};
use idem_tests::root;
use std::collections::{BTreeMap, BTreeSet};

/// What the loader accepts: `""` for the top level (the sections), else
/// `[section]` or `[[handler]]` to its keys.
fn accepted() -> BTreeMap<String, BTreeSet<String>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.toml");
    std::fs::write(
        &path,
        "nope = 1\n\
         [broker]\nnope = 1\n\
         [database]\nnope = 1\n\
         [service]\nnope = 1\n\
         [runtime]\nnope = 1\n\
         [deploy]\nnope = 1\n\
         [[handler]]\nname = \"h\"\nnope = 1\n",
    )
    .unwrap();
    let problems = match Config::load(&path) {
        Err(ConfigError::Invalid { problems }) => problems,
        other => panic!("a config with unknown keys loaded: {other:?}"),
    };
    let mut keys = BTreeMap::new();
    for problem in problems {
        let line = problem.to_string();
        let Some((before, list)) = line.split_once("unknown field `nope`, expected one of ") else {
            continue;
        };
        let section = if before.ends_with("[[handler]] `h`: ") {
            "[[handler]]".to_owned()
        } else if let Some(open) = before.rfind(": [") {
            before[open + 2..]
                .strip_suffix(": ")
                .unwrap_or_else(|| panic!("{line}"))
                .to_owned()
        } else {
            String::new()
        };
        let names: BTreeSet<String> = list
            .split(", ")
            .map(|k| k.trim_matches('`').to_owned())
            .collect();
        assert!(
            keys.insert(section.clone(), names).is_none(),
            "{section} twice"
        );
    }
    keys
}

/// docs/configuration.md's reference: each `### `[section]`` heading under
/// `## Reference` to the first cells of its table's rows.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let start = text
        .find("\n## Reference\n")
        .expect("a `## Reference` section");
    let rest = &text[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section: Option<String> = None;
    for line in rest[..end].lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            let name = heading.trim().trim_matches('`').to_owned();
            keys.entry(name.clone()).or_default();
            section = Some(name);
        } else if let (Some(s), Some(row)) = (&section, line.strip_prefix("| `")) {
            let key = row.split_once('`').unwrap().0;
            assert!(
                keys.get_mut(s).unwrap().insert(key.to_owned()),
                "{s} `{key}` twice in docs/configuration.md"
            );
        }
    }
    keys
}

#[test]
fn the_reference_names_every_key_the_config_accepts() {
    let accepted = accepted();
    let documented = documented();
    let sections: BTreeSet<String> = accepted[""]
        .iter()
        .map(|s| {
            if s == "handler" {
                "[[handler]]".to_owned()
            } else {
                format!("[{s}]")
            }
        })
        .collect();
    assert_eq!(
        sections,
        accepted.keys().filter(|s| !s.is_empty()).cloned().collect(),
        "every section's keys were read from the loader"
    );
    assert_eq!(
        documented.keys().cloned().collect::<BTreeSet<_>>(),
        sections,
        "docs/configuration.md's Reference has one `### ` heading per section"
    );
    let mut wrong = Vec::new();
    for section in &sections {
        let code = &accepted[section];
        let docs = &documented[section];
        for key in code.difference(docs) {
            wrong.push(format!(
                "{section} `{key}` is accepted but not in the reference"
            ));
        }
        for key in docs.difference(code) {
            wrong.push(format!(
                "{section} `{key}` is in the reference but not accepted"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md, Reference:\n{}",
        wrong.join("\n")
    );
    // Not vacuous: the handler table alone has its 28 keys.
    assert!(accepted["[[handler]]"].len() >= 28);
}
