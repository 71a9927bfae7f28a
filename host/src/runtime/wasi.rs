//! The WASI opt-in: for a handler whose language cannot avoid WASI imports
//! (`wasi = true` in its config), the runtime links WASI preview 2
//! (`wasmtime-wasi`, async) with an empty context. What such a guest sees:
//!
//! - **files**: no preopened directories, so no path resolves: every open,
//!   read, write or directory listing fails with not-found (a Rust guest's
//!   `current_dir()` says `/`, wasi-libc's default, with nothing behind it);
//! - **network**: TCP, UDP and name lookup are disabled and every address
//!   refused: creating a socket fails with `access-denied`, a lookup fails;
//! - **environment and arguments**: none (empty lists, no initial cwd);
//! - **stdin**: closed (a read sees end of stream at once);
//! - **stdout / stderr**: the host's guest log, under the per-message cap it
//!   shares with the `log` interface ([`Limits::max_log_bytes`]), tagged with
//!   the handler, the message id and the stream; writes never fail,
//!   bytes over the cap are dropped and counted;
//! - **clocks**: wasmtime-wasi's defaults, the host's real wall clock and a
//!   monotonic clock. A guest may sleep on the monotonic clock; the
//!   message's deadline still ends the call (at most about a second late,
//!   since a sleeping guest runs no wasm for the epoch check to stop);
//! - **random**: wasmtime-wasi's defaults (a CSPRNG, an insecure fast RNG and
//!   a random seed), with one request capped at [`MAX_RANDOM_BYTES`];
//! - **exit**: `wasi:cli/exit` traps, which rolls the message back like any trap.
//!
//! The context is built on the first WASI call of a message (a guest that
//! never calls WASI costs nothing) and dropped with the message's store.

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

#[cfg(doc)]
use super::Limits;
use super::guest_log::{LogSink, Stream};
use bytes::Bytes;
use std::pin::Pin;
use std::task::{Context, Poll};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// The most bytes one `wasi:random` call may ask for.
pub const MAX_RANDOM_BYTES: u64 = 1 << 20;

/// The most WASI resources (streams, pollables, ...) a guest may hold at once.
const MAX_RESOURCES: usize = 10_000;

/// How much a stdout/stderr write may carry at once; writes never wait.
const WRITE_PERMIT: usize = 64 << 10;

/// The interfaces `wasmtime_wasi::p2::add_to_linker_async` links (the
/// `wasi:cli/imports` world of WASI 0.2), as `package/interface`. Import
/// names carry a version too; any `0.2.x` matches.
const LINKED: [&str; 27] = [
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/exit",
    "wasi:cli/environment",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/ip-name-lookup",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
];

/// Whether `import` (a component import name such as
/// `wasi:cli/environment@0.2.6`) is one the WASI linker provides.
pub(crate) fn is_linked(import: &str) -> bool {
    let Some((interface, version)) = import.split_once('@') else {
        return false;
    };
    version.starts_with("0.2.") && LINKED.contains(&interface)
}

/// Adds WASI preview 2 (async) to `linker`.
///
/// # Errors
///
/// When `linker` already defines one of the WASI interfaces (and does not
/// allow shadowing).
pub(crate) fn add_to_linker<T: WasiView>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_async(linker)
}

/// One message's WASI state: the empty context and the resource table.
pub(crate) struct WasiState {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiState {
    /// The empty context described in the module docs, with stdout and
    /// stderr sent to `log`.
    pub(crate) fn new(log: &LogSink) -> Self {
        let mut builder = WasiCtxBuilder::new();
        builder
            .stdin(tokio::io::empty())
            .stdout(GuestOutput {
                log: log.clone(),
                stream: Stream::Stdout,
            })
            .stderr(GuestOutput {
                log: log.clone(),
                stream: Stream::Stderr,
            })
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .allow_blocking_current_thread(false)
            .max_random_size(MAX_RANDOM_BYTES);
        // No envs, args, preopens or inherit_*: the builder starts empty, and
        // its default socket address check refuses every address.
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        Self {
            ctx: builder.build(),
            table,
        }
    }

    /// The view `wasmtime-wasi`'s host functions use.
    pub(crate) fn view(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.ctx,
            table: &mut self.table,
        }
    }
}

/// A guest's stdout or stderr: every write goes to the message's log at once.
#[derive(Clone)]
struct GuestOutput {
    log: LogSink,
    stream: Stream,
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.log.lock().write(self.stream, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.log.lock().write(self.stream, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wasi_0_2_interfaces_are_recognised_by_name_and_version() {
        assert!(is_linked("wasi:cli/environment@0.2.6"));
        assert!(is_linked("wasi:sockets/udp@0.2.0"));
        assert!(is_linked("wasi:io/streams@0.2.12"));
        assert!(!is_linked("wasi:cli/environment"));
        assert!(!is_linked("wasi:cli/environment@0.3.0-rc-2025-09-16"));
        assert!(!is_linked("wasi:http/types@0.2.6"));
        assert!(!is_linked("wasi:clocks/timezone@0.2.6"));
        assert!(!is_linked("wasi:cli/run@0.2.6"));
    }
}
