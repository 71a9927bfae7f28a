//! `idem check MODULE [--config idem.toml --handler H]`: what a handler
//! component is (the world and WIT version it targets, its imports, size,
//! digest, compile time) and, with a handler of a config, whether that
//! handler's settings allow it. Contacts nothing.

use crate::config::{Config, ConfigError, HandlerConfig};
use crate::runtime::{LoadError, LoadOptions, Runtime};
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The import through which a guest publishes and calls (ARCHITECTURE.md,
/// "Outbox"): of no use to a handler that grants neither.
const OUTBOX_IMPORT: &str = "idem:handler/outbox@";

/// `idem check`'s arguments.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The handler component (`.wasm`).
    pub module: PathBuf,
    /// A config whose handler (`--handler`) the component is checked
    /// against.
    #[arg(long, short, requires = "handler")]
    pub config: Option<PathBuf>,
    /// The handler of `--config` whose settings must allow the component.
    #[arg(long, requires = "config")]
    pub handler: Option<String>,
}

/// `idem check`: the component's description on stdout and exit 0; or one
/// `idem: …` line per problem on stderr and exit 1 (a file that is no
/// usable component, a config that does not load, a handler it does not
/// have, settings that do not allow the component).
pub fn run(args: &CheckArgs) -> i32 {
    let handler = match (&args.config, &args.handler) {
        (Some(path), Some(name)) => match handler_of(path, name) {
            Ok(h) => Some(h),
            Err(problems) => {
                for p in problems {
                    eprintln!("idem: {p}");
                }
                return 1;
            }
        },
        _ => None,
    };
    let runtime = match Runtime::with_capacity(1) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem: cannot start the WebAssembly runtime: {e:#}");
            return 1;
        }
    };
    let mut started = Instant::now();
    // Without WASI first (the stronger sandbox); a component that imports
    // WASI is then described with it, and the handler's `wasi` judged below.
    let loaded = match runtime.load(&args.module, LoadOptions { wasi: false }) {
        Err(LoadError::WasiNotEnabled { .. }) => {
            started = Instant::now();
            runtime.load(&args.module, LoadOptions { wasi: true })
        }
        other => other,
    };
    let component = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("idem: {e}");
            return 1;
        }
    };
    let compile_ms = started.elapsed().as_millis();
    let size = std::fs::metadata(&args.module).map_or(0, |m| m.len());
    println!("module   {}", args.module.display());
    println!("world    idem:handler/handler ({})", component.wit());
    println!("size     {size} bytes");
    println!("digest   {}", component.digest());
    println!("compile  {compile_ms} ms");
    println!("wasi     {}", if component.wasi() { "yes" } else { "no" });
    println!("imports  {}", component.imports().len());
    for name in component.imports() {
        println!("  {name}");
    }
    let Some(handler) = handler else {
        return 0;
    };
    let problems = refusals(&handler, component.wasi(), component.imports());
    println!(
        "handler  `{}`: {}",
        handler.name,
        if problems.is_empty() {
            "its settings allow this component"
        } else {
            "its settings do not allow this component"
        }
    );
    for p in &problems {
        eprintln!("idem: {}: {p}", args.module.display());
    }
    i32::from(!problems.is_empty())
}

/// Handler `name` of the config at `path`, or the lines that say why not.
fn handler_of(path: &Path, name: &str) -> Result<HandlerConfig, Vec<String>> {
    let config = match Config::load(path) {
        Ok(c) => c,
        Err(ConfigError::Invalid { problems }) => {
            return Err(problems.iter().map(ToString::to_string).collect());
        }
        Err(e) => return Err(vec![e.to_string()]),
    };
    let names: Vec<&str> = config.handlers.iter().map(|h| h.name.as_str()).collect();
    config
        .handlers
        .iter()
        .find(|h| h.name == name)
        .cloned()
        .ok_or_else(|| {
            vec![format!(
                "{}: no handler `{}` (it has: {}); name one of them with --handler",
                path.display(),
                crate::log_format::escape(name),
                names.join(", ")
            )]
        })
}

/// What in `handler`'s settings refuses a component that imports
/// `imports` (`wasi`: some of them are WASI): one line each.
fn refusals(handler: &HandlerConfig, wasi: bool, imports: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    if wasi && !handler.wasi {
        let first = imports
            .iter()
            .find(|i| i.starts_with("wasi:"))
            .map_or("", String::as_str);
        out.push(format!(
            "imports WASI (`{first}`, …) and handler `{}` has `wasi = false`: build it for wasm32-unknown-unknown, or set `wasi = true` for the handler if its language cannot avoid WASI",
            handler.name
        ));
    }
    if imports.iter().any(|i| i.starts_with(OUTBOX_IMPORT))
        && handler.publish.is_empty()
        && handler.endpoints.is_empty()
    {
        out.push(format!(
            "imports idem:handler/outbox and handler `{}` grants no `publish` subjects and no `endpoints`: every send or call it makes fails; grant what it sends to",
            handler.name
        ));
    }
    out
}
