//! An HTTP/1.1 receiver on loopback for the outbox's calls: it keeps every
//! request (path, `Idempotency-Key`, body, the status it answered) and
//! answers each with the status a test's policy picks from the key and how
//! many requests with that key came before. Connections are kept alive (as
//! an HTTP client's pool expects); bodies need a `Content-Length`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// One request the receiver got, and what it answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The request target, e.g. `/notify`.
    pub path: String,
    /// The `Idempotency-Key` header (empty when absent).
    pub key: String,
    /// The body, as text (lossy UTF-8).
    pub body: String,
    /// The status answered.
    pub status: u16,
}

/// Picks the status of a request: its `Idempotency-Key` and how many
/// requests with that key came before it; 0 is never to answer (a hanging
/// receiver).
pub type Policy = dyn Fn(&str, usize) -> u16 + Send + Sync;

/// What the receiver got so far.
#[derive(Default)]
struct Got {
    requests: Vec<Request>,
    /// Requests per key.
    per_key: HashMap<String, usize>,
}

/// A running receiver; it stops with the test's runtime.
pub struct HttpReceiver {
    port: u16,
    got: Arc<Mutex<Got>>,
}

impl HttpReceiver {
    /// Listens on `127.0.0.1`, on a free port, answering as `policy` says.
    ///
    /// # Panics
    /// When it cannot listen; outside a tokio runtime.
    pub async fn start(policy: impl Fn(&str, usize) -> u16 + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let got: Arc<Mutex<Got>> = Arc::default();
        let policy: Arc<Policy> = Arc::new(policy);
        let kept = got.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, kept.clone(), policy.clone()));
            }
        });
        HttpReceiver { port, got }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.got.lock().unwrap().requests.clone()
    }

    /// How many requests so far.
    pub fn count(&self) -> usize {
        self.got.lock().unwrap().requests.len()
    }

    /// The keys answered 2xx at least once so far (each once), with the
    /// body of the first such request.
    pub fn done_keys(&self) -> HashMap<String, String> {
        let got = self.got.lock().unwrap();
        let mut done = HashMap::new();
        for r in &got.requests {
            if (200..300).contains(&r.status) {
                done.entry(r.key.clone()).or_insert_with(|| r.body.clone());
            }
        }
        done
    }
}

/// Serves one connection: requests one after the other until the client
/// closes it (or sends what this receiver does not read).
async fn serve(mut conn: tokio::net::TcpStream, got: Arc<Mutex<Got>>, policy: Arc<Policy>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end;
            }
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        buf.drain(..end + 4);
        let header = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
        };
        if header("transfer-encoding").is_some() {
            return;
        }
        let len = header("content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < len {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..len).collect();
        let path = head
            .lines()
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or("")
            .to_owned();
        let key = header("idempotency-key").unwrap_or_default();
        let status = {
            let mut got = got.lock().unwrap();
            let before = got.per_key.get(&key).copied().unwrap_or(0);
            let status = policy(&key, before);
            *got.per_key.entry(key.clone()).or_insert(0) += 1;
            got.requests.push(Request {
                path,
                key,
                body: String::from_utf8_lossy(&body).to_string(),
                status,
            });
            status
        };
        if status == 0 {
            // The policy's "never answer": the connection stays open, silent.
            std::future::pending::<()>().await;
        }
        let reason = if (200..300).contains(&status) {
            "OK"
        } else {
            "Error"
        };
        let answer = format!("HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\n\r\n");
        if conn.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
