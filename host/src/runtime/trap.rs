//! A trap in one line: what stopped the guest (its deadline, its memory
//! limit, `wasi:cli/exit`, or its own trap) and where, from wasmtime's
//! backtrace: the function and, when the component carries DWARF debug
//! info (`[runtime] trap_source_lines`), the source line.

use super::host_impl::Stop;
use super::{Limits, load};

/// One line for a trap: what stopped the guest and, for a guest's own trap,
/// the wasm function it was in.
pub(super) fn describe_trap(e: &wasmtime::Error, stop: Option<Stop>, limits: &Limits) -> String {
    match stop {
        Some(Stop::Deadline) => format!("exceeded the {:?} deadline", limits.deadline),
        Some(Stop::Memory { desired }) => format!(
            "exceeded the memory limit of {} bytes (asked for {desired})",
            limits.max_memory_bytes
        ),
        None => {
            if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
                return format!("the guest exited with status {} (wasi:cli/exit)", exit.0);
            }
            let what = match e.downcast_ref::<wasmtime::Trap>() {
                Some(trap) => trap.to_string(),
                None => load::one_line(e),
            };
            match e
                .downcast_ref::<wasmtime::WasmBacktrace>()
                .and_then(trap_site)
            {
                Some(at) => format!("{what} ({at})"),
                None => what,
            }
        }
    }
}

/// Where in the guest a trap happened, as `in FUNC` or, when the component
/// carries DWARF, `in FUNC at FILE:LINE:COL`: the innermost frame of the
/// guest's own code, past the frames of Rust's standard library (a panic's
/// machinery, whose files are under `/rustc/`) and of crates from a
/// registry (under cargo's `registry/src/`); without a source line, the
/// innermost frame with a name. Not escaped: a reason is data (a dead
/// letter keeps it as it is), escaped where it is written out.
fn trap_site(bt: &wasmtime::WasmBacktrace) -> Option<String> {
    let library = |file: &str| file.starts_with("/rustc/") || file.contains("/registry/src/");
    let with_line = bt.frames().iter().find_map(|f| {
        f.symbols().iter().find_map(|s| {
            let file = s.file()?;
            let line = s.line()?;
            (!library(file)).then(|| {
                let func = s.name().or(f.func_name()).unwrap_or("?");
                let col = s.column().map(|c| format!(":{c}")).unwrap_or_default();
                format!("in {func} at {file}:{line}{col}")
            })
        })
    });
    let site = with_line.or_else(|| {
        bt.frames()
            .iter()
            .find_map(|f| f.func_name().map(|n| format!("in {n}")))
    })?;
    Some(site)
}
