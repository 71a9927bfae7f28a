//! `idem new`: a handler folder rendered from templates shipped inside the
//! binary (ARCHITECTURE.md, "Handler scaffolding").
//!
//! `host/templates/` holds, embedded at build time:
//! - `strategies/<strategy>/`: each strategy described once:
//!   `strategy.toml` (payload fields, statements and their parameters; see
//!   [`strategy::Description`]), `migration.sql` (valid on PostgreSQL and
//!   SQLite: idem applies the same migration files to either),
//!   `fixtures.toml` and `messages/*.json`;
//! - `lang/<lang>/`: each language's files; a name ending in `.j2` is a
//!   minijinja template rendered with the strategy's description (any
//!   language renders any strategy), other files are copied;
//! - `common/`: `idem.toml` and `README.md`, the same for every language.
//!
//! Besides, the folder gets copies of what a handler builds against: the WIT
//! world, and per language the guest SDK (Rust), the C bindings, the
//! JavaScript helpers or the Python JSON reader, so it builds outside this
//! repository.
//!
//! Everything is rendered to memory first ([`render`]) and written only then
//! ([`write()`]): a bad name, strategy or target folder writes nothing; only
//! a failing disk can leave part of the folder.

pub mod strategy;

use include_dir::{Dir, include_dir};
use minijinja::{Environment, Value, context};
use std::path::{Path, PathBuf};
use strategy::Description;

/// The templates (`host/templates/`).
static TEMPLATES: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/templates");
/// The Rust guest SDK's sources, copied into a Rust handler's `idem-guest/src/`.
static GUEST_SDK: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../guest-sdk/src");
/// The handler world every handler targets.
const WIT: &str = include_str!("../../../wit/handler.wit");
/// The C bindings of that world (wit-bindgen's C generator, as the C examples use).
const C_BINDINGS_C: &str = include_str!("../../../examples/c-common/bindings/handler.c");
const C_BINDINGS_H: &str = include_str!("../../../examples/c-common/bindings/handler.h");
/// The JavaScript helpers every JavaScript example shares.
const JS_HELPERS: &str = include_str!("../../../examples/js-common/idem.js");
/// The JSON reader every Python example shares.
const PY_JSON: &str = include_str!("../../../examples/python-common/idem_json.py");

/// The languages a handler can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust with idem's guest SDK (cargo, wasm-tools).
    Rust,
    /// C with wit-bindgen's bindings (zig cc, wasm-tools).
    C,
    /// JavaScript (componentize-qjs: QuickJS).
    Js,
    /// Python (componentize-py).
    Python,
}

/// The idempotency strategies (docs/strategies.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Strategy {
    /// idem's event-id receipt alone (examples/credit).
    #[default]
    Receipt,
    /// A natural unique key, `ON CONFLICT DO NOTHING` (examples/likes).
    NaturalKey,
    /// A state-based update, applied only when the version advances (examples/projection).
    Version,
    /// An upsert that converges whatever the order (examples/parcel).
    Upsert,
    /// An aggregate that records the operations it applied (examples/counter).
    Aggregate,
}

impl Lang {
    /// Every language.
    pub const ALL: [Lang; 4] = [Lang::Rust, Lang::C, Lang::Js, Lang::Python];

    /// Its name on the command line and under `templates/lang/`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::C => "c",
            Lang::Js => "js",
            Lang::Python => "python",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::C => "C",
            Lang::Js => "JavaScript",
            Lang::Python => "Python",
        }
    }

    /// What building needs, for the README.
    fn needs(self) -> &'static str {
        match self {
            Lang::Rust => {
                "`build.sh` needs Rust with the target `wasm32-unknown-unknown` and `wasm-tools` \
                 (`WASM_TOOLS`, else on `PATH`); cargo fetches `wit-bindgen`, `serde` and \
                 `serde_json` from crates.io."
            }
            Lang::C => {
                "`build.sh` needs zig 0.17 (`IDEM_ZIG`: PyPI `ziglang`) and `wasm-tools` \
                 (`WASM_TOOLS`, else on `PATH`); in an idem checkout `. scripts/toolchains.sh c` \
                 installs and exports both."
            }
            Lang::Js => {
                "`build.sh` needs componentize-qjs 0.4.5 (`IDEM_COMPONENTIZE_QJS`, from npm) \
                 and `wasm-tools` (`WASM_TOOLS`, else on `PATH`); in an idem checkout \
                 `. scripts/toolchains.sh js` installs and exports both."
            }
            Lang::Python => {
                "`build.sh` needs componentize-py 0.25.1 (`IDEM_COMPONENTIZE_PY`, from PyPI) \
                 and `wasm-tools` (`WASM_TOOLS`, else on `PATH`); in an idem checkout \
                 `. scripts/toolchains.sh python` installs and exports both."
            }
        }
    }
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 5] = [
        Strategy::Receipt,
        Strategy::NaturalKey,
        Strategy::Version,
        Strategy::Upsert,
        Strategy::Aggregate,
    ];

    /// Its name on the command line and under `templates/strategies/`.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Receipt => "receipt",
            Strategy::NaturalKey => "natural-key",
            Strategy::Version => "version",
            Strategy::Upsert => "upsert",
            Strategy::Aggregate => "aggregate",
        }
    }
}

/// One file of the folder: its path inside it and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct File {
    /// Relative to the folder, `/`-separated.
    pub path: String,
    /// Its contents.
    pub contents: Vec<u8>,
    /// Whether it is a script to run (`build.sh`): written mode 0755.
    pub executable: bool,
}

/// Whether `name` may name a handler: letters, digits, `-` and `_` (it is a
/// JetStream durable name; the rule config validation applies).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The longest handler name `idem new` takes: it names a folder, a file
/// (`build/NAME.wasm`) and a JetStream durable consumer.
pub const MAX_NAME_BYTES: usize = 64;

/// Names a Rust handler's package may not take: the crates it depends on
/// (a package cannot depend on a crate of its own name).
/// and Rust's keywords, which cargo refuses as package names.
const RUST_RESERVED: [&str; 44] = [
    "serde",
    "serde_json",
    "wit_bindgen",
    "idem_guest",
    "core",
    "std",
    "alloc",
    "test",
    "as",
    "break",
    "const",
    "continue",
    "crate",
    "else",
    "enum",
    "extern",
    "false",
    "fn",
    "for",
    "if",
    "impl",
    "in",
    "let",
    "loop",
    "match",
    "mod",
    "move",
    "mut",
    "pub",
    "ref",
    "return",
    "self",
    "Self",
    "static",
    "struct",
    "super",
    "trait",
    "true",
    "type",
    "unsafe",
    "use",
    "where",
    "while",
    "async",
];

/// Everything `idem new NAME --lang LANG --strategy STRATEGY` writes, in
/// memory, sorted by path.
///
/// # Errors
/// `name` is not a valid handler name, or (a bug of the templates) one does
/// not render.
pub fn render(name: &str, lang: Lang, strategy: Strategy) -> anyhow::Result<Vec<File>> {
    if !valid_name(name) {
        anyhow::bail!(
            "handler name `{}` may use only letters, digits, `-` and `_`, at most {MAX_NAME_BYTES} of them (it is a JetStream durable name)",
            crate::log_format::escape(name)
        );
    }
    if lang == Lang::Rust && RUST_RESERVED.contains(&name.replace('-', "_").as_str()) {
        anyhow::bail!(
            "handler name `{name}` is the name of a crate a Rust handler depends on; choose another"
        );
    }
    let sdir = format!("strategies/{}", strategy.as_str());
    let description = Description::parse(&text(&format!("{sdir}/strategy.toml"))?)
        .map_err(|e| anyhow::anyhow!("templates/{sdir}/strategy.toml: {e}"))?;
    let module = format!("build/{name}.wasm");

    let mut files: Vec<File> = Vec::new();
    // The strategy's own files: migration, fixtures, sample messages.
    add(
        &mut files,
        format!("migrations/{}", description.migration),
        bytes(&format!("{sdir}/migration.sql"))?,
    );
    add(
        &mut files,
        "fixtures.toml".into(),
        bytes(&format!("{sdir}/fixtures.toml"))?,
    );
    let messages = TEMPLATES
        .get_dir(format!("{sdir}/messages"))
        .ok_or_else(|| anyhow::anyhow!("templates/{sdir}/messages is missing"))?;
    let mut samples: Vec<(String, String)> = Vec::new();
    for f in messages.files() {
        let file_name = file_name(f.path());
        let body = String::from_utf8_lossy(f.contents()).trim().to_string();
        samples.push((file_name.clone(), body));
        add(
            &mut files,
            format!("messages/{file_name}"),
            f.contents().to_vec(),
        );
    }
    samples.sort();
    let (first_message, first_message_text) = samples
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("templates/{sdir}/messages is empty"))?;
    // What the handler builds against.
    add(
        &mut files,
        "wit/handler.wit".into(),
        WIT.as_bytes().to_vec(),
    );
    match lang {
        Lang::Rust => {
            add(
                &mut files,
                "idem-guest/Cargo.toml".into(),
                bytes("lang/rust/idem-guest.Cargo.toml")?,
            );
            for f in GUEST_SDK.files() {
                add(
                    &mut files,
                    format!("idem-guest/src/{}", file_name(f.path())),
                    f.contents().to_vec(),
                );
            }
        }
        Lang::C => {
            add(
                &mut files,
                "bindings/handler.c".into(),
                C_BINDINGS_C.as_bytes().to_vec(),
            );
            add(
                &mut files,
                "bindings/handler.h".into(),
                C_BINDINGS_H.as_bytes().to_vec(),
            );
        }
        Lang::Js => add(&mut files, "idem.js".into(), JS_HELPERS.as_bytes().to_vec()),
        Lang::Python => add(
            &mut files,
            "idem_json.py".into(),
            PY_JSON.as_bytes().to_vec(),
        ),
    }
    add(
        &mut files,
        ".gitignore".into(),
        b"/build/\n/target/\nidem.db*\n__pycache__/\n".to_vec(),
    );

    let env = environment();
    let rust_package = if name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        name.to_string()
    } else {
        format!("handler-{name}")
    };
    let mut ctx = context! {
        name,
        lang => lang.as_str(),
        lang_title => lang.title(),
        strategy => strategy.as_str(),
        s => Value::from_serialize(&description),
        module,
        build => "bash build.sh",
        needs => lang.needs(),
        first_message,
        first_message_text,
        rust_lib => rust_package.replace('-', "_"),
        rust_package,
        rust_type => "Component",
    };
    // The language's own files, templates rendered.
    let ldir = format!("lang/{}", lang.as_str());
    let lang_dir = TEMPLATES
        .get_dir(&ldir)
        .ok_or_else(|| anyhow::anyhow!("templates/{ldir} is missing"))?;
    for f in walk(lang_dir) {
        let rel = f
            .path()
            .strip_prefix(&ldir)
            .unwrap_or(f.path())
            .to_string_lossy()
            .replace('\\', "/");
        if rel == "idem-guest.Cargo.toml" {
            continue;
        }
        match rel.strip_suffix(".j2") {
            Some(out) => {
                let body = render_one(&env, &format!("{ldir}/{rel}"), &ctx)?;
                add(&mut files, out.to_string(), body.into_bytes());
            }
            None => add(&mut files, rel, f.contents().to_vec()),
        }
    }
    // idem.toml, then the README, which lists every file.
    let toml = render_one(&env, "common/idem.toml.j2", &ctx)?;
    add(&mut files, "idem.toml".into(), toml.into_bytes());
    let mut listed: Vec<Value> = Vec::new();
    let mut paths: Vec<String> = files.iter().map(|f| f.path.clone()).collect();
    paths.push("README.md".into());
    paths.sort();
    for p in &paths {
        if let Some(what) = describe(p, lang) {
            listed.push(context! { path => p, what });
        }
    }
    ctx = context! { files => listed, ..ctx };
    let readme = render_one(&env, "common/README.md.j2", &ctx)?;
    add(&mut files, "README.md".into(), readme.into_bytes());

    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Writes `files` under `dir`, creating it. Refuses a `dir` that exists and
/// is not an empty directory, before writing anything.
///
/// # Errors
/// `dir` exists and is not empty (or not a directory), or a file cannot be
/// written (then what was written so far stays; the checks before make that
/// a full disk or a permission, not a bad name).
pub fn write(dir: &Path, files: &[File]) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                anyhow::bail!(
                    "{} exists and is not empty: nothing written (pick another NAME or --dir)",
                    dir.display()
                );
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("{}: {e}: nothing written", dir.display()),
    }
    for f in files {
        let path: PathBuf = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, &f.contents)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        if f.executable {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| anyhow::anyhow!("cannot make {} executable: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// The template environment: no auto-escaping (nothing here is HTML),
/// block tags take their line with them, and `strlit`.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(true);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_loader(|name| {
        Ok(TEMPLATES
            .get_file(name)
            .map(|f| String::from_utf8_lossy(f.contents()).into_owned()))
    });
    env.add_filter("strlit", strlit);
    env
}

/// A double-quoted string literal valid in Rust, C, JavaScript and Python
/// for `s`: `\` and `"` escaped; the texts given to it carry no control
/// character ([`Description::parse`] checks the SQL).
fn strlit(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '\\' || c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn render_one(env: &Environment<'static>, name: &str, ctx: &Value) -> anyhow::Result<String> {
    let template = env
        .get_template(name)
        .map_err(|e| anyhow::anyhow!("template {name}: {e:#}"))?;
    template
        .render(ctx)
        .map_err(|e| anyhow::anyhow!("template {name}: {e:#}"))
}

/// What the README says a file is; `None` for files not listed.
fn describe(path: &str, lang: Lang) -> Option<&'static str> {
    Some(match path {
        "README.md" => "this file",
        "idem.toml" => "the config: one `[[handler]]`, SQLite by default",
        "build.sh" => "the build: `bash build.sh`",
        "fixtures.toml" => "messages and the rows expected after them, for `idem test`",
        "wit/handler.wit" => "the `idem:handler` world the component targets",
        "Cargo.toml" => "the crate (a workspace of its own)",
        "src/lib.rs" | "main.c" | "handler.js" | "app.py" => "the handler",
        "idem.js" => {
            "helpers: exact JSON reading, statements, log (shared by idem's JavaScript examples)"
        }
        "idem_json.py" => {
            "helper: exact JSON reading, `read_event` (shared by idem's Python examples)"
        }
        ".gitignore" => return None,
        p if p.starts_with("migrations/") => "the tables, valid SQL on PostgreSQL and SQLite",
        p if p.starts_with("messages/") => "a sample message for `idem invoke`",
        "idem-guest/Cargo.toml" if lang == Lang::Rust => {
            "idem's Rust guest SDK, copied (bindings and API)"
        }
        "bindings/handler.c" => "the world's C bindings (wit-bindgen 0.61)",
        "bindings/handler.h" => return None,
        _ => return None,
    })
}

fn add(files: &mut Vec<File>, path: String, contents: Vec<u8>) {
    let executable = path.ends_with(".sh");
    files.push(File {
        path,
        contents,
        executable,
    });
}

fn walk<'a>(dir: &'a Dir<'a>) -> Vec<&'a include_dir::File<'a>> {
    let mut out: Vec<&include_dir::File<'_>> = dir.files().collect();
    for d in dir.dirs() {
        out.extend(walk(d));
    }
    out
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn bytes(path: &str) -> anyhow::Result<Vec<u8>> {
    TEMPLATES
        .get_file(path)
        .map(|f| f.contents().to_vec())
        .ok_or_else(|| anyhow::anyhow!("templates/{path} is missing"))
}

fn text(path: &str) -> anyhow::Result<String> {
    String::from_utf8(bytes(path)?).map_err(|e| anyhow::anyhow!("templates/{path}: {e}"))
}

#[cfg(test)]
mod tests;
