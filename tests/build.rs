//! Turns `guests.txt`, the one list of Rust guest components (which
//! `scripts/build-guests.sh` builds), into `$OUT_DIR/guests.rs`:
//!
//! - `GUESTS`, each line as `(component, package, target)`;
//! - `foreach_guest!(mac)`, which expands `mac!(component)` for every
//!   component, its name with `-` as `_`. `tests/guests.rs` uses it to
//!   require a test named after each one, so a guest added to the list
//!   without a test does not compile.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

const TARGETS: [&str; 2] = ["wasm32-unknown-unknown", "wasm32-wasip2"];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("guests.txt: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    println!("cargo::rerun-if-changed=guests.txt");
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR unset")?;
    let out_dir = std::env::var_os("OUT_DIR").ok_or("OUT_DIR unset")?;
    let list = PathBuf::from(manifest_dir).join("guests.txt");
    let text = std::fs::read_to_string(&list).map_err(|e| format!("{}: {e}", list.display()))?;

    let mut guests: Vec<[&str; 3]> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [component, package, target] = *fields.as_slice() else {
            return Err(format!(
                "line {}: expected `<component> <package> <target>`, got `{line}`",
                n + 1
            ));
        };
        let valid = |s: &str| {
            s.starts_with(|c: char| c.is_ascii_lowercase())
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if !valid(component) || !valid(package) {
            return Err(format!(
                "line {}: names are lower-case letters, digits and `-`, starting with a letter: `{line}`",
                n + 1
            ));
        }
        if !TARGETS.contains(&target) {
            return Err(format!(
                "line {}: target `{target}` is not one of {}",
                n + 1,
                TARGETS.join(", ")
            ));
        }
        let ident = component.replace('-', "_");
        if guests.iter().any(|[c, ..]| c.replace('-', "_") == ident) {
            return Err(format!("line {}: `{component}` is listed twice", n + 1));
        }
        guests.push([component, package, target]);
    }

    let mut out = String::new();
    out.push_str("/// The guest components of `tests/guests.txt`, in its order:\n");
    out.push_str("/// `(component, package, target)`; each is built into\n");
    out.push_str("/// `$CARGO_TARGET_DIR/guests/<component>.wasm`.\n");
    let _ = writeln!(
        out,
        "pub const GUESTS: [(&str, &str, &str); {}] = [",
        guests.len()
    );
    for [component, package, target] in &guests {
        let _ = writeln!(out, "    ({component:?}, {package:?}, {target:?}),");
    }
    out.push_str("];\n\n");
    out.push_str("/// Expands `$mac!(component)` for every guest of `tests/guests.txt`,\n");
    out.push_str("/// the component's name with `-` as `_`.\n");
    out.push_str("#[macro_export]\nmacro_rules! foreach_guest {\n    ($mac:ident) => {\n");
    for [component, ..] in &guests {
        let _ = writeln!(out, "        $mac!({});", component.replace('-', "_"));
    }
    out.push_str("    };\n}\n");
    let dest = PathBuf::from(out_dir).join("guests.rs");
    std::fs::write(&dest, out).map_err(|e| format!("{}: {e}", dest.display()))
}
