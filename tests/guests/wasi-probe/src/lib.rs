//! A test guest built for `wasm32-wasip2` (so it imports WASI), run by the
//! host only with `wasi = true`. The payload chooses what it does:
//!
//! - `probe`: tries the environment, arguments, files, stdin, sockets and
//!   name lookup, and rejects with a JSON object saying what it saw, so a test
//!   can assert exact values.
//! - `print` `{stdout, stderr, lines?, log?}`: writes the line `stdout` to
//!   stdout and `stderr` to stderr, each `lines` times (default 1), after
//!   logging `log` through the `log` interface when given; then succeeds.
//! - `sleep` `{ms}`: sleeps on the WASI monotonic clock, then succeeds.
//! - `exit` `{code}`: calls `std::process::exit(code)`.
//! - `abort` `{stderr}`: writes the line `stderr` to stderr, then aborts (a trap).
//!
//! Anything else rejects with a reason starting `bad payload`.

use idem_guest::{Handler, HandlerError, Message};
use serde_json::{Value as Json, json};
use std::io::{Read, Write};

struct Probe;

/// An I/O result as JSON: `{"ok": ...}` or `{"err": "<ErrorKind>"}`.
fn outcome<T>(r: std::io::Result<T>, ok: impl FnOnce(T) -> Json) -> Json {
    match r {
        Ok(v) => json!({ "ok": ok(v) }),
        Err(e) => json!({ "err": format!("{:?}", e.kind()) }),
    }
}

fn probe() -> Json {
    let mut stdin = Vec::new();
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
        "wall_clock_after_2020": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() > 1_577_836_800)
            .unwrap_or(false),
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
