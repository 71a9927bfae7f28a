//! A test guest whose behaviour the payload chooses: `{"op": "...", ...}`.
//!
//! - `credit` `{account_id, amount}`: the credit example's upsert.
//! - `retry` / `reject` `{reason?}`: returns that handler error.
//! - `trap`: panics (an abort, so a trap).
//! - `loop`: spins forever (stopped by the host's deadline).
//! - `membomb`: allocates until the host's memory limit stops it.
//! - `touch` `{mib, account_id, amount}`: writes one byte in every 4 KiB
//!   page of `mib` MiB it allocates (so the pages are resident), then
//!   credits.
//! - `sql` `{sql, params?, repeat?}`: executes the statement (`repeat` times,
//!   default 1); on failure rejects with `"<kind>: <message>"`.
//! - `query` `{sql, params?}`: runs the query and rejects with
//!   `"rows <columns> <rows>"` (JSON) so a test can read what it returned.
//! - `log` `{bytes, lines?}`: logs `lines` lines (default 1) of `bytes` bytes each.
//! - `retry-once-then-credit` `{account_id, amount}`: retries on the first
//!   delivery, credits on later ones.
//! - `version` `{key, version, retry_first?, subject?}`: sets
//!   `accounts.balance` of `account_id = key` to `version` when it follows
//!   the row's (1 makes the row), else rejects as out of order; retries the
//!   first delivery when `retry_first`; rejects a message whose subject is
//!   not `subject`, when given.
//! - `credit-then-loop-once` `{account_id, amount}`: credits, then on the
//!   first delivery spins (until the host's deadline, or until the host
//!   drops the call at the end of its shutdown grace); on later deliveries
//!   returns after the credit.
//! - `credit-then` `{account_id, amount, then: {op, ...}}`: credits, then
//!   behaves as the `then` object says (so a test sees a hostile step roll
//!   back an earlier write of the same message).
//! - `recurse` `{shadow?}`: recurses without end. By default nothing lives in
//!   linear memory, so the wasm call stack runs out; with `shadow: true` each
//!   call keeps a 4 KiB buffer on the shadow stack in linear memory, which
//!   overflows first.
//! - `huge-error` `{fill, repeat, kind?}`: returns `reject` (`retry` when
//!   `kind` is `"retry"`) with `fill` repeated `repeat` times as the reason.
//! - `steps` `{steps: [{op: "sql" | "query", sql, params?}, ...], end?}`: runs
//!   the steps in order inside the one message. At the first failing step
//!   rejects with `"step <i>: <kind>: <message>"` (`i` from 0). When all
//!   succeed the message commits, unless `end` is `"reject"`: then it rejects
//!   with `"steps <results>"`, `<results>` the JSON array of each query
//!   step's `[columns, rows]` (so a test sees what the sequence read).
//! - `many-texts` `{count, pad, start?}`: executes `count` distinct
//!   statements `SELECT <n> AS n /* <pad bytes> */` (`n` from `start`,
//!   default 0), each text new to the host; on failure rejects like `sql`.
//!
//! - `outbox` `{calls: [{publish: subject | call: endpoint, payload?, key?,
//!   headers?: [[name, value], ...]}, ...], then?: {op, ...}}`: makes each
//!   outbox call in order (`payload` a string, default empty); at the first
//!   refused one rejects with `"outbox <i>: <kind>: <message>"` (`kind`
//!   `not-granted`, `over-limit` or `invalid`); then behaves as `then`
//!   says, or commits.
//!
//! Anything else (or bad JSON) rejects with a reason starting `bad payload`.

use idem_guest::{DbError, Handler, HandlerError, Message, Value, params, tx};
use serde_json::Value as Json;

struct Behave;

fn field<'a>(p: &'a Json, name: &str) -> Result<&'a Json, HandlerError> {
    p.get(name)
        .ok_or_else(|| HandlerError::reject(format!("bad payload: no `{name}`")))
}

fn int(p: &Json, name: &str) -> Result<i64, HandlerError> {
    field(p, name)?
        .as_i64()
        .ok_or_else(|| HandlerError::reject(format!("bad payload: `{name}` is not an integer")))
}

fn text<'a>(p: &'a Json, name: &str) -> Result<&'a str, HandlerError> {
    field(p, name)?
        .as_str()
        .ok_or_else(|| HandlerError::reject(format!("bad payload: `{name}` is not a string")))
}

fn to_value(j: &Json) -> Value {
    match j {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Boolean(*b),
        Json::Number(n) => n
            .as_i64()
            .map_or_else(|| Value::Float(n.as_f64().unwrap_or(0.0)), Value::Integer),
        Json::String(s) => Value::Text(s.clone()),
        other => Value::Text(other.to_string()),
    }
}

fn to_json(v: &Value) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Integer(i) => Json::from(*i),
        Value::Float(f) => Json::from(*f),
        Value::Text(s) => Json::from(s.as_str()),
        Value::Bytes(b) => Json::from(b.clone()),
        Value::Boolean(b) => Json::from(*b),
    }
}

fn params_of(p: &Json) -> Vec<Value> {
    p.get("params")
        .and_then(Json::as_array)
        .map(|a| a.iter().map(to_value).collect())
        .unwrap_or_default()
}

fn db_reject(e: DbError) -> HandlerError {
    HandlerError::Reject(format!("{}: {}", e.kind.as_str(), e.message))
}

/// A query's `[columns, rows]` as JSON.
fn rows_json(rows: &idem_guest::Rows) -> Json {
    let data: Vec<Json> = rows
        .rows
        .iter()
        .map(|r| Json::Array(r.iter().map(to_json).collect()))
        .collect();
    Json::Array(vec![Json::from(rows.columns.clone()), Json::Array(data)])
}

/// The `steps` op: every step in order, stopping at the first error.
fn steps(p: &Json) -> Result<(), HandlerError> {
    let list = field(p, "steps")?
        .as_array()
        .ok_or_else(|| HandlerError::reject("bad payload: `steps` is not an array"))?;
    let mut results = Vec::new();
    for (i, step) in list.iter().enumerate() {
        let sql = text(step, "sql")?;
        let params = params_of(step);
        let failed = |e: DbError| {
            HandlerError::Reject(format!("step {i}: {}: {}", e.kind.as_str(), e.message))
        };
        match text(step, "op")? {
            "sql" => {
                tx::execute(sql, &params).map_err(failed)?;
            }
            "query" => results.push(rows_json(&tx::query(sql, &params).map_err(failed)?)),
            other => {
                return Err(HandlerError::reject(format!(
                    "bad payload: unknown step op `{other}`"
                )));
            }
        }
    }
    if p.get("end").and_then(Json::as_str) == Some("reject") {
        return Err(HandlerError::Reject(format!(
            "steps {}",
            Json::Array(results)
        )));
    }
    Ok(())
}

/// The `many-texts` op: `count` statements whose texts all differ.
fn many_texts(p: &Json) -> Result<(), HandlerError> {
    let count = int(p, "count")?;
    let start = p.get("start").and_then(Json::as_i64).unwrap_or(0);
    let pad = "x".repeat(usize::try_from(int(p, "pad")?).unwrap_or(0));
    let mut sql = String::new();
    for n in start..start.saturating_add(count) {
        sql.clear();
        sql.push_str(&format!("SELECT {n} AS n /* "));
        sql.push_str(&pad);
        sql.push_str(" */");
        tx::execute(&sql, &[]).map_err(db_reject)?;
    }
    Ok(())
}

fn credit(p: &Json) -> Result<(), HandlerError> {
    tx::execute(
        "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) \
         ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance",
        params![int(p, "account_id")?, int(p, "amount")?],
    )?;
    Ok(())
}

impl Handler for Behave {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let p: Json = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("bad payload: {e}")))?;
        behave(&p, &msg)
    }
}

/// Recurses until a stack runs out (see the `recurse` op). `shadow` keeps a
/// 4 KiB buffer per call in linear memory; without it nothing is spilled
/// there (no `black_box`, which takes an address) and only the wasm call
/// stack grows. The work after the call keeps it from becoming a loop.
#[inline(never)]
fn recurse(depth: u64, shadow: bool) -> u64 {
    if depth == u64::MAX {
        // Never reached: a stack runs out long before.
        0
    } else if shadow {
        let mut frame = [0u8; 4096];
        frame[(depth % 4096) as usize] = 1;
        std::hint::black_box(&mut frame);
        let below = recurse(depth + 1, shadow);
        below + u64::from(std::hint::black_box(&frame)[(depth % 4096) as usize])
    } else {
        recurse(depth + 1, shadow).wrapping_mul(3) ^ depth
    }
}

/// `version`: the row of `account_id = key` goes to `version`, which must
/// follow the row's (1 makes the row); anything else rejects as out of
/// order. `retry_first`: retries on the first delivery. `subject`: the
/// subject the message must carry (rejected otherwise).
fn version(p: &Json, msg: &Message) -> Result<(), HandlerError> {
    let (key, v) = (int(p, "key")?, int(p, "version")?);
    if let Some(want) = p.get("subject").and_then(Json::as_str)
        && msg.subject != want
    {
        return Err(HandlerError::reject(format!(
            "subject `{}` is not `{want}`",
            msg.subject
        )));
    }
    if p.get("retry_first").and_then(Json::as_bool) == Some(true) && msg.delivery_count <= 1 {
        return Err(HandlerError::retry("first delivery"));
    }
    let changed = if v == 1 {
        tx::execute(
            "INSERT INTO accounts (account_id, balance) VALUES ($1, 1) ON CONFLICT (account_id) DO NOTHING",
            params![key],
        )?
    } else {
        tx::execute(
            "UPDATE accounts SET balance = $2 WHERE account_id = $1 AND balance = $3",
            params![key, v, v - 1],
        )?
    };
    if changed == 1 {
        Ok(())
    } else {
        Err(HandlerError::reject(format!(
            "out of order: version {v} of key {key} does not follow its row"
        )))
    }
}

fn behave(p: &Json, msg: &Message) -> Result<(), HandlerError> {
    let reason = || {
        p.get("reason")
            .and_then(Json::as_str)
            .unwrap_or("asked to")
            .to_owned()
    };
    match text(p, "op")? {
        "credit" => credit(p),
        "retry" => Err(HandlerError::Retry(reason())),
        "reject" => Err(HandlerError::Reject(reason())),
        "trap" => panic!("asked to trap"),
        "loop" => {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
        "membomb" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        }
        "touch" => {
            let mib = usize::try_from(int(p, "mib")?).unwrap_or(0);
            let mut pages = vec![0u8; mib << 20];
            for (i, page) in pages.chunks_mut(4096).enumerate() {
                if let Some(first) = page.first_mut() {
                    *first = i as u8 | 1;
                }
            }
            std::hint::black_box(&pages);
            credit(p)
        }
        "sql" => {
            let sql = text(p, "sql")?;
            let params = params_of(p);
            let repeat = p.get("repeat").and_then(Json::as_u64).unwrap_or(1);
            for _ in 0..repeat {
                tx::execute(sql, &params).map_err(db_reject)?;
            }
            Ok(())
        }
        "query" => {
            let rows = tx::query(text(p, "sql")?, &params_of(p)).map_err(db_reject)?;
            let data: Vec<Json> = rows
                .rows
                .iter()
                .map(|r| Json::Array(r.iter().map(to_json).collect()))
                .collect();
            Err(HandlerError::Reject(format!(
                "rows {} {}",
                Json::from(rows.columns.clone()),
                Json::Array(data)
            )))
        }
        "log" => {
            let line = "x".repeat(usize::try_from(int(p, "bytes")?).unwrap_or(0));
            for _ in 0..p.get("lines").and_then(Json::as_u64).unwrap_or(1) {
                idem_guest::log::info(&line);
            }
            Ok(())
        }
        "credit-then" => {
            credit(p)?;
            behave(field(p, "then")?, msg)
        }
        "recurse" => {
            let shadow = p.get("shadow").and_then(Json::as_bool).unwrap_or(false);
            let depth = recurse(0, shadow);
            Err(HandlerError::Reject(format!("recursion ended at {depth}")))
        }
        "huge-error" => {
            let reason = text(p, "fill")?.repeat(usize::try_from(int(p, "repeat")?).unwrap_or(0));
            match p.get("kind").and_then(Json::as_str) {
                Some("retry") => Err(HandlerError::Retry(reason)),
                _ => Err(HandlerError::Reject(reason)),
            }
        }
        "steps" => steps(p),
        "many-texts" => many_texts(p),
        "outbox" => {
            outbox_calls(p)?;
            match p.get("then") {
                Some(then) => behave(then, msg),
                None => Ok(()),
            }
        }
        "credit-then-loop-once" => {
            credit(p)?;
            if msg.delivery_count <= 1 {
                // Spins until the runtime's deadline traps it.
                let mut n: u64 = 0;
                loop {
                    n = std::hint::black_box(n.wrapping_add(1));
                }
            }
            Ok(())
        }
        "retry-once-then-credit" => {
            if msg.delivery_count <= 1 {
                Err(HandlerError::retry("first delivery"))
            } else {
                credit(p)
            }
        }
        "version" => version(p, msg),
        other => Err(HandlerError::reject(format!(
            "bad payload: unknown op `{other}`"
        ))),
    }
}

/// The `outbox` op's calls.
fn outbox_calls(p: &Json) -> Result<(), HandlerError> {
    use idem_guest::outbox::{self, OutboxError};
    let calls = field(p, "calls")?
        .as_array()
        .ok_or_else(|| HandlerError::reject("bad payload: `calls` is not an array"))?;
    for (i, c) in calls.iter().enumerate() {
        let payload = c.get("payload").and_then(Json::as_str).unwrap_or("");
        let key = c.get("key").and_then(Json::as_str);
        let headers: Vec<(&str, &str)> = c
            .get("headers")
            .and_then(Json::as_array)
            .map(|hs| {
                hs.iter()
                    .filter_map(|h| Some((h.get(0)?.as_str()?, h.get(1)?.as_str()?)))
                    .collect()
            })
            .unwrap_or_default();
        let done = match (c.get("publish"), c.get("call")) {
            (Some(subject), _) => outbox::publish(
                subject.as_str().unwrap_or(""),
                payload.as_bytes(),
                &headers,
                key,
            ),
            (None, Some(endpoint)) => outbox::call(
                endpoint.as_str().unwrap_or(""),
                payload.as_bytes(),
                &headers,
                key,
            ),
            (None, None) => {
                return Err(HandlerError::reject(
                    "bad payload: a call needs `publish` or `call`",
                ));
            }
        };
        if let Err(e) = done {
            let (kind, m) = match e {
                OutboxError::NotGranted(m) => ("not-granted", m),
                OutboxError::OverLimit(m) => ("over-limit", m),
                OutboxError::Invalid(m) => ("invalid", m),
            };
            return Err(HandlerError::Reject(format!("outbox {i}: {kind}: {m}")));
        }
    }
    Ok(())
}

idem_guest::export_handler!(Behave);
