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
//! - **wall clock**: the message's publish time, to the millisecond (the
//!   `published-ms` of the WIT message record, the broker's clock), the
//!   same on every read; its resolution reads 1 ms. The host's own time is
//!   never shown;
//! - **monotonic clock**: 0 when the guest call began, advancing with the
//!   time the host measures for the call (resolution 1 ns), so it tells how
//!   long the message has taken and nothing of the host. A guest may sleep
//!   on it; the message's deadline still ends the call (at most about a
//!   second late, since a sleeping guest runs no wasm for the epoch check
//!   to stop);
//! - **random**: seeded from the receipt's key ([`random_seed`]: SHA-256 of
//!   consumer, a zero byte, message id), so every run of one message
//!   (redelivery, replay, redrive) draws the same values and two messages
//!   draw different ones. `wasi:random/random` is the ChaCha20 keystream
//!   of that key (`chacha20`'s `ChaCha20Rng`, stream 0),
//!   `wasi:random/insecure` the same on stream 1, and
//!   `wasi:random/insecure-seed` the first 16 bytes of stream 2 as a
//!   little-endian `u128` (low half first). wasmtime-wasi draws a byte as
//!   the low byte of the next 32-bit word and a `u64` as the next two
//!   words. One request is capped at [`MAX_RANDOM_BYTES`]. Not a secret:
//!   anyone who knows the consumer and the message id can compute it;
//! - **exit**: `wasi:cli/exit` traps, which rolls the message back like any trap.
//!
//! So the wall clock and the random sources are a function of the message,
//! and a handler that writes them writes the same rows however often the
//! message runs; only the monotonic clock's readings vary from run to run.
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
use chacha20::ChaCha20Rng;
use chacha20::rand_core::{Rng as _, SeedableRng as _};
use sha2::{Digest as _, Sha256};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use wasmtime::component::{Linker, ResourceTable};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::clocks::{HostMonotonicClock, HostWallClock};
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

/// The seed of a message's random sources: SHA-256 of `consumer`, one zero
/// byte, and `message_id` (the receipt's key, ARCHITECTURE.md invariant 4).
/// The zero byte keeps (`a`, `bc`) and (`ab`, `c`) apart: a consumer name
/// holds no NUL.
pub fn random_seed(consumer: &str, message_id: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(consumer.as_bytes());
    h.update([0u8]);
    h.update(message_id.as_bytes());
    h.finalize().into()
}

/// What a message gives its WASI context: the receipt's key (the random
/// sources' seed), its publish time (the wall clock) and when the guest
/// call began (the monotonic clock's 0).
#[derive(Debug, Clone)]
pub(crate) struct MessageInputs {
    /// The handler's name (= its durable consumer).
    pub(crate) consumer: Arc<str>,
    /// The message id the receipt is keyed on.
    pub(crate) message_id: String,
    /// Publish time, ms since the Unix epoch (the broker's clock).
    pub(crate) published_ms: i64,
    /// When the guest call began.
    pub(crate) started: Instant,
}

/// `wasi:clocks/wall-clock`: the message's publish time, always.
struct PublishTime(Duration);

impl HostWallClock for PublishTime {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        self.0
    }
}

/// `wasi:clocks/monotonic-clock`: nanoseconds since the guest call began.
struct SinceStart(Instant);

impl HostMonotonicClock for SinceStart {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The three random sources of a message seeded with `seed` (module docs):
/// `wasi:random/random`, `wasi:random/insecure`, `wasi:random/insecure-seed`.
fn random_sources(seed: [u8; 32]) -> (ChaCha20Rng, ChaCha20Rng, u128) {
    let secure = ChaCha20Rng::from_seed(seed);
    let mut insecure = ChaCha20Rng::from_seed(seed);
    insecure.set_stream(1);
    let mut seeder = ChaCha20Rng::from_seed(seed);
    seeder.set_stream(2);
    let mut bytes = [0u8; 16];
    seeder.fill_bytes(&mut bytes);
    (secure, insecure, u128::from_le_bytes(bytes))
}

/// One message's WASI state: the empty context and the resource table.
pub(crate) struct WasiState {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl WasiState {
    /// The empty context described in the module docs for the message
    /// `inputs`, with stdout and stderr sent to `log`.
    pub(crate) fn new(log: &LogSink, inputs: &MessageInputs) -> Self {
        let (secure, insecure, insecure_seed) =
            random_sources(random_seed(&inputs.consumer, &inputs.message_id));
        // A publish time before 1970 reads as the epoch.
        let published = Duration::from_millis(u64::try_from(inputs.published_ms).unwrap_or(0));
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
            .wall_clock(PublishTime(published))
            .monotonic_clock(SinceStart(inputs.started))
            .secure_random(secure)
            .insecure_random(insecure)
            .insecure_random_seed(insecure_seed)
            .max_random_size(MAX_RANDOM_BYTES);
        // No envs, args, preopens or inherit_*: the builder starts empty, and
        // its default socket address check refuses every address. Every
        // clock and random source it has by default is replaced above.
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
    fn the_seed_is_sha256_of_consumer_zero_message_id() {
        assert_eq!(
            hex::encode(random_seed("credit", "evt-1")),
            hex::encode(Sha256::digest(b"credit\0evt-1"))
        );
        assert_ne!(random_seed("a", "bc"), random_seed("ab", "c"));
        assert_ne!(
            random_seed("credit", "evt-1"),
            random_seed("credit", "evt-2")
        );
        assert_ne!(
            random_seed("credit", "evt-1"),
            random_seed("debit", "evt-1")
        );
    }

    #[test]
    fn the_three_random_sources_are_distinct_streams_of_one_key() {
        let seed = random_seed("credit", "evt-1");
        let (mut secure, mut insecure, insecure_seed) = random_sources(seed);
        let (mut again, _, seed_again) = random_sources(seed);
        let words = |r: &mut ChaCha20Rng| [r.next_u32(), r.next_u32(), r.next_u32()];
        let s = words(&mut secure);
        assert_eq!(s, words(&mut again));
        assert_eq!(insecure_seed, seed_again);
        let i = words(&mut insecure);
        assert_ne!(s, i);
        // Stream 0 is `from_seed` as it is; stream 2's first 16 bytes are the seed.
        let mut plain = ChaCha20Rng::from_seed(seed);
        assert_eq!(s, words(&mut plain));
        let mut two = ChaCha20Rng::from_seed(seed);
        two.set_stream(2);
        let (lo, hi) = (two.next_u64(), two.next_u64());
        assert_eq!(insecure_seed, u128::from(lo) | (u128::from(hi) << 64));
    }

    #[test]
    fn the_wall_clock_is_frozen_and_the_monotonic_starts_at_the_call() {
        let wall = PublishTime(Duration::from_millis(1_700_000_000_123));
        assert_eq!(wall.now(), Duration::from_millis(1_700_000_000_123));
        assert_eq!(wall.now(), wall.now());
        assert_eq!(wall.resolution(), Duration::from_millis(1));
        let mono = SinceStart(Instant::now());
        let first = mono.now();
        std::thread::sleep(Duration::from_millis(5));
        let later = mono.now();
        assert!(first < 1_000_000_000, "{first}");
        assert!(later >= first + 5_000_000, "{first} {later}");
    }

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
