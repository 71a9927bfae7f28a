//! What a case is and how it must end: [`Outcome`], one hostile message
//! ([`Hostile`]), the payload builders the case lists use, and [`Group`],
//! the cases sent and checked together.

use idem_tests::Backend;
use serde_json::{Value, json};

/// How a case must end.
#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// Committed: a receipt, no dead letter; its `effects` applied.
    Served,
    /// Dead-lettered by a refusal or a database error: no rows reached the
    /// guest and it did not trap.
    Refused,
    /// A `steps` case refused or failed at exactly this step (from 0).
    RefusedAt(usize),
    /// Dead-lettered by a `query` that read exactly these rows.
    Rows(Value),
    /// Dead-lettered with exactly this reason.
    Reason(String),
    /// Dead-lettered as a trap (deadline or memory).
    Trap,
    /// Dead-lettered by a refusal, a database error or a trap: no rows
    /// reached the guest (for work whose speed decides which comes first).
    Failed,
}

/// One hostile message.
pub(crate) struct Hostile {
    pub(crate) name: String,
    pub(crate) payload: Value,
    pub(crate) outcome: Outcome,
    /// (account, amount) added to `accounts` when the case is served.
    pub(crate) effects: Vec<(i64, i64)>,
}

/// A `query` payload.
pub(crate) fn q(sql: &str) -> Value {
    json!({"op": "query", "sql": sql})
}

/// An `sql` (execute) payload.
pub(crate) fn x(sql: &str) -> Value {
    json!({"op": "sql", "sql": sql})
}

/// A `query` payload with parameters.
pub(crate) fn qp(sql: &str, params: Value) -> Value {
    json!({"op": "query", "sql": sql, "params": params})
}

/// A `steps` payload of (`sql` | `query`, text); `reject`: the guest rejects
/// after the last step (so nothing may commit).
pub(crate) fn steps(list: &[(&str, &str)], reject: bool) -> Value {
    let list: Vec<Value> = list
        .iter()
        .map(|(op, sql)| json!({"op": op, "sql": sql}))
        .collect();
    let mut p = json!({"op": "steps", "steps": list});
    if reject {
        p["end"] = json!("reject");
    }
    p
}

/// Rows of one text value.
pub(crate) fn text_row(s: &str) -> Outcome {
    Outcome::Rows(json!([[s]]))
}

/// Rows of one integer value.
pub(crate) fn int_row(n: i64) -> Outcome {
    Outcome::Rows(json!([[n]]))
}

/// The cases of one group, named `group/label`.
pub(crate) struct Group {
    pub(crate) name: &'static str,
    backend: Backend,
    pub(crate) cases: Vec<Hostile>,
    /// Placeholders: `{dir}` (the SQLite database's directory) and `{tmp}`
    /// (a path prefix in /tmp no file may start with).
    dir: String,
    tmp: String,
}

impl Group {
    pub(crate) fn new(name: &'static str, ctx: &Ctx) -> Self {
        Group {
            name,
            backend: ctx.backend,
            cases: Vec::new(),
            dir: ctx.dir.clone(),
            tmp: ctx.tmp.clone(),
        }
    }

    /// Whether the group is for PostgreSQL.
    pub(crate) fn pg(&self) -> bool {
        self.backend == Backend::Postgres
    }

    /// `pg` on PostgreSQL, `sqlite` on SQLite.
    pub(crate) fn by(&self, pg: Outcome, sqlite: Outcome) -> Outcome {
        if self.pg() { pg } else { sqlite }
    }

    /// `v` with the placeholders in its strings replaced.
    fn fill(&self, v: Value) -> Value {
        match v {
            Value::String(s) => {
                Value::String(s.replace("{dir}", &self.dir).replace("{tmp}", &self.tmp))
            }
            Value::Array(a) => Value::Array(a.into_iter().map(|v| self.fill(v)).collect()),
            Value::Object(o) => {
                Value::Object(o.into_iter().map(|(k, v)| (k, self.fill(v))).collect())
            }
            other => other,
        }
    }

    /// Adds a case named `label` (or its position when empty).
    pub(crate) fn add(&mut self, label: &str, payload: Value, outcome: Outcome) -> &mut Hostile {
        let label = if label.is_empty() {
            format!("{:02}", self.cases.len())
        } else {
            label.to_owned()
        };
        let payload = self.fill(payload);
        self.cases.push(Hostile {
            name: format!("{}/{label}", self.name),
            payload,
            outcome,
            effects: Vec::new(),
        });
        self.cases.last_mut().unwrap()
    }

    /// A statement refused (or failed) on both databases.
    pub(crate) fn refused(&mut self, payload: Value) {
        self.add("", payload, Outcome::Refused);
    }
}

impl Hostile {
    /// Declares that the case, served, adds `amount` to `account`.
    pub(crate) fn effect(&mut self, account: i64, amount: i64) -> &mut Self {
        self.effects.push((account, amount));
        self
    }
}

/// What the case lists need to know of the database under test.
pub(crate) struct Ctx {
    pub(crate) backend: Backend,
    /// The SQLite database's directory (empty on PostgreSQL).
    pub(crate) dir: String,
    /// A path prefix in /tmp that no file may start with.
    pub(crate) tmp: String,
}
