//! A test guest built for `wasm32-wasip2` (so it imports WASI), run by the
//! host only with `wasi = true`. The payload chooses what it does:
//!
//! - `probe`: tries the environment, arguments, files, stdin, sockets and
//!   name lookup, reads the wall clock and the three random sources, and
//!   rejects with a JSON object saying what it saw, so a test can assert
//!   exact values.
//! - `record`: inserts what the wall clock and the random sources give into
//!   `wasi_seen (message_id, wall_ns, random, insecure, insecure_seed)`
//!   (hex text for the bytes, `<low>:<high>` for the seed), then succeeds.
//! - `print` `{stdout, stderr, lines?, log?}`: writes the line `stdout` to
//!   stdout and `stderr` to stderr, each `lines` times (default 1), after
//!   logging `log` through the `log` interface when given; then succeeds.
//! - `sleep` `{ms}`: sleeps on the WASI monotonic clock, then succeeds.
//! - `exit` `{code}`: calls `std::process::exit(code)`.
//! - `abort` `{stderr}`: writes the line `stderr` to stderr, then aborts (a trap).
//!
//! Anything else rejects with a reason starting `bad payload`.

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde_json::{Value as Json, json};
use std::io::{Read, Write};

/// `wasi:random`, which Rust's standard library does not reach for a
/// guest's own use.
#[allow(missing_docs)]
mod wasi_random {
    wit_bindgen::generate!({
        inline: "
            package idem:wasi-probe;

            world random {
                import wasi:random/random@0.2.6;
                import wasi:random/insecure@0.2.6;
                import wasi:random/insecure-seed@0.2.6;
            }

            package wasi:random@0.2.6 {
                interface random {
                    get-random-bytes: func(len: u64) -> list<u8>;
                    get-random-u64: func() -> u64;
                }
                interface insecure {
                    get-insecure-random-bytes: func(len: u64) -> list<u8>;
                    get-insecure-random-u64: func() -> u64;
                }
                interface insecure-seed {
                    insecure-seed: func() -> tuple<u64, u64>;
                }
            }
        ",
        world: "idem:wasi-probe/random",
        generate_all,
    });
}

use wasi_random::wasi::random::{insecure, insecure_seed, random};

struct Probe;

/// How many bytes `probe` and `record` ask of each random source.
const RANDOM_BYTES: u64 = 16;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the clock and the random sources give: (wall clock in ns since the
/// epoch, random hex, insecure hex, insecure seed as `<low>:<high>`).
fn seen() -> (u64, String, String, String) {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let (lo, hi) = insecure_seed::insecure_seed();
    (
        wall,
        hex(&random::get_random_bytes(RANDOM_BYTES)),
        hex(&insecure::get_insecure_random_bytes(RANDOM_BYTES)),
        format!("{lo}:{hi}"),
    )
}

/// An I/O result as JSON: `{"ok": ...}` or `{"err": "<ErrorKind>"}`.
fn outcome<T>(r: std::io::Result<T>, ok: impl FnOnce(T) -> Json) -> Json {
    match r {
        Ok(v) => json!({ "ok": ok(v) }),
        Err(e) => json!({ "err": format!("{:?}", e.kind()) }),
    }
}

fn probe() -> Json {
    let mut stdin = Vec::new();
    let (wall, random, insecure, seed) = seen();
    json!({
        "env": std::env::vars_os().count(),
        "args": std::env::args_os().count(),
        "cwd": outcome(std::env::current_dir(), |p| json!(p.display().to_string())),
        "read_etc_passwd": outcome(std::fs::read("/etc/passwd"), |b| json!(b.len())),
        "read_relative": outcome(std::fs::read("Cargo.toml"), |b| json!(b.len())),
        "read_dir_root": outcome(std::fs::read_dir("/"), |d| json!(d.count())),
        "write_tmp": outcome(std::fs::write("/tmp/idem-wasi-probe", b"x"), |()| json!(null)),
        "stdin": outcome(std::io::stdin().read_to_end(&mut stdin), |n| json!(n)),
        "tcp_connect": outcome(std::net::TcpStream::connect("127.0.0.1:4222"), |_| json!(null)),
        "udp_bind": outcome(std::net::UdpSocket::bind("127.0.0.1:0"), |_| json!(null)),
        "dns": outcome(std::net::ToSocketAddrs::to_socket_addrs(&("localhost", 80)), |a| json!(a.count())),
        "wall_clock_ns": wall,
        "random": random,
        "insecure": insecure,
        "insecure_seed": seed,
    })
}

fn text<'a>(p: &'a Json, name: &str) -> Option<&'a str> {
    p.get(name).and_then(Json::as_str)
}

impl Handler for Probe {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let p: Json = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("bad payload: {e}")))?;
        match text(&p, "op").unwrap_or_default() {
            "probe" => Err(HandlerError::Reject(probe().to_string())),
            "record" => {
                let (wall, random, insecure, seed) = seen();
                let wall = i64::try_from(wall).map_err(HandlerError::reject)?;
                tx::execute(
                    "INSERT INTO wasi_seen (message_id, wall_ns, random, insecure, insecure_seed) VALUES ($1, $2, $3, $4, $5)",
                    params![msg.identity.as_str(), wall, random, insecure, seed],
                )?;
                Ok(())
            }
            "print" => {
                if let Some(line) = text(&p, "log") {
                    idem_guest::log::info(line);
                }
                let lines = p.get("lines").and_then(Json::as_u64).unwrap_or(1);
                let (out, err) = (text(&p, "stdout"), text(&p, "stderr"));
                let mut stdout = std::io::stdout().lock();
                let mut stderr = std::io::stderr().lock();
                for _ in 0..lines {
                    if let Some(out) = out {
                        writeln!(stdout, "{out}").map_err(HandlerError::retry)?;
                    }
                    if let Some(err) = err {
                        writeln!(stderr, "{err}").map_err(HandlerError::retry)?;
                    }
                }
                stdout.flush().map_err(HandlerError::retry)?;
                Ok(())
            }
            "sleep" => {
                let ms = p.get("ms").and_then(Json::as_u64).unwrap_or(0);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(())
            }
            "exit" => {
                let code = p.get("code").and_then(Json::as_i64).unwrap_or(0);
                std::process::exit(i32::try_from(code).unwrap_or(1))
            }
            "abort" => {
                eprintln!("{}", text(&p, "stderr").unwrap_or_default());
                std::process::abort()
            }
            other => Err(HandlerError::reject(format!(
                "bad payload: unknown op `{other}`"
            ))),
        }
    }
}

idem_guest::export_handler!(Probe);
