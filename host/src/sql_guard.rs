//! Parses and checks guest SQL before it reaches sqlx (DESIGN invariant 8: a
//! guest touches nothing but the rows of the tables it was granted).
//!
//! A statement passes when it is exactly one `SELECT` (with `WITH`, set
//! operations, subqueries), `INSERT` (with `ON CONFLICT`, `RETURNING`),
//! `UPDATE` or `DELETE`, and:
//! - every table it names (FROM, JOIN, subqueries, CTE bodies, DML targets) is
//!   granted to the handler: unqualified, or qualified with `public.`
//!   (PostgreSQL) / `main.` (SQLite) only. Names defined by a `WITH` clause are
//!   CTEs, not tables, inside the scope where SQL resolves them so. A DML target
//!   is always a table;
//! - no identifier anywhere names a host table (`idem_*`, `_idem_*`) or a
//!   catalog (`pg_catalog`, `information_schema`, `sqlite_master`, ...), and no
//!   table name starts with `pg_` or `sqlite_`;
//! - every function call is in [`ALLOWED_FUNCTIONS`] (no clocks, randomness,
//!   sleeps, sequences, settings or file access);
//! - every cast and typed literal targets a plain value type (no `regclass`,
//!   `oid`, ...), and on PostgreSQL no string literal names the clock (`'now'`,
//!   `'today'`, ...): see the `casts` submodule, also for what it cannot see;
//! - parameters are written `$1..$n`, on both databases.
//!
//! The text that reaches the database is the statement re-printed from the
//! parsed AST, not the guest's text: the database runs exactly what was
//! checked, so comment, quoting or lexer differences between sqlparser and the
//! database cannot smuggle a second statement or a hidden table.

use crate::store::{DbError, DbErrorKind, DbKind, SqlValue};
use sqlparser::ast::{
    Expr, FromTable, Function, Ident, ObjectName, ObjectNamePart, Query, Select, SetExpr,
    Statement, TableFactor, TableObject, Value, ValueWithSpan, Visit, Visitor,
};
use sqlparser::dialect::{Dialect, PostgreSqlDialect, SQLiteDialect};
use sqlparser::parser::Parser;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

mod casts;

/// Functions a guest statement may call (matched case-insensitively, never
/// schema-qualified). Deliberately small: pure value functions and aggregates
/// that exist on both PostgreSQL and SQLite. Clock functions (`now`,
/// `CURRENT_TIMESTAMP`, `datetime('now')`), randomness, `pg_sleep`, sequences,
/// settings and anything touching files or the server are absent: a guest gets
/// no clock beyond the message's publish time.
pub const ALLOWED_FUNCTIONS: &[&str] = &[
    "abs",
    "avg",
    "coalesce",
    "count",
    "greatest",
    "least",
    "length",
    "lower",
    "ltrim",
    "max",
    "min",
    "nullif",
    "replace",
    "round",
    "rtrim",
    "substr",
    "substring",
    "sum",
    "trim",
    "upper",
];

/// Statements longer than this many bytes are refused before parsing.
pub const MAX_SQL_BYTES: usize = 64 * 1024;

/// How many verdicts one guard caches before it starts over.
const CACHE_CAPACITY: usize = 1024;

/// The highest placeholder number accepted (`$65535`, PostgreSQL's limit).
const MAX_PLACEHOLDER: usize = 65_535;

/// SQL text that passed [`SqlGuard::check`]: the statement re-printed from its
/// parsed AST. Only this module can construct one, so holding a `CheckedSql`
/// proves the text was checked; the store builds guest queries only from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedSql {
    text: Arc<str>,
    params: usize,
}

impl CheckedSql {
    /// The checked statement text, exactly as it is sent to the database.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The highest `$n` placeholder in the statement (0 when it has none). The
    /// store requires exactly this many parameters.
    pub fn param_count(&self) -> usize {
        self.params
    }

    /// The text for sqlx, asserted safe because it passed the guard.
    pub(crate) fn to_sqlx(&self) -> sqlx::AssertSqlSafe<Arc<str>> {
        sqlx::AssertSqlSafe(self.text.clone())
    }

    /// The text for sqlx on PostgreSQL, followed by a comment naming the
    /// parameter types (`-- idem:itn` for integer, text, null). sqlx caches
    /// prepared statements by text and reuses the parameter types of the first
    /// preparation; the suffix gives each type signature its own prepared
    /// statement, so a value is never read under another call's types.
    pub(crate) fn to_sqlx_typed(&self, params: &[SqlValue]) -> sqlx::AssertSqlSafe<String> {
        let mut text = String::with_capacity(self.text.len() + 10 + params.len());
        text.push_str(&self.text);
        if !params.is_empty() {
            text.push_str("\n-- idem:");
            for p in params {
                text.push(match p {
                    SqlValue::Null => 'n',
                    SqlValue::Integer(_) => 'i',
                    SqlValue::Float(_) => 'f',
                    SqlValue::Text(_) => 't',
                    SqlValue::Bytes(_) => 'b',
                    SqlValue::Boolean(_) => 'o',
                });
            }
        }
        sqlx::AssertSqlSafe(text)
    }
}

/// Checks one handler's statements against its granted tables, caching the
/// verdict (allowed or the error) per statement text.
pub struct SqlGuard {
    kind: DbKind,
    granted: HashSet<String>,
    cache: Mutex<HashMap<String, Result<CheckedSql, DbError>>>,
}

impl SqlGuard {
    /// A guard for `kind`'s SQL dialect and the handler's `tables` grant list
    /// (names as in `[[handler]] tables`, matched case-insensitively like
    /// unquoted SQL identifiers).
    pub fn new(kind: DbKind, granted_tables: &[String]) -> Self {
        Self {
            kind,
            granted: granted_tables
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Checks `sql`. Errors: [`DbErrorKind::Syntax`] when it does not parse,
    /// [`DbErrorKind::Denied`] with one line saying what is refused and why.
    pub fn check(&self, sql: &str) -> Result<CheckedSql, DbError> {
        if let Some(verdict) = self.lock_cache().get(sql) {
            return verdict.clone();
        }
        let verdict = self.check_uncached(sql);
        let mut cache = self.lock_cache();
        if cache.len() >= CACHE_CAPACITY {
            cache.clear();
        }
        cache.insert(sql.to_owned(), verdict.clone());
        verdict
    }

    fn lock_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, Result<CheckedSql, DbError>>> {
        // A panic while holding the lock cannot leave the map inconsistent.
        self.cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_uncached(&self, sql: &str) -> Result<CheckedSql, DbError> {
        if sql.len() > MAX_SQL_BYTES {
            return Err(DbError::denied(format!(
                "statement is {} bytes; the limit is {MAX_SQL_BYTES}",
                sql.len()
            )));
        }
        let dialect: &dyn Dialect = match self.kind {
            DbKind::Postgres => &PostgreSqlDialect {},
            DbKind::Sqlite => &SQLiteDialect {},
        };
        let mut statements = Parser::parse_sql(dialect, sql).map_err(|e| DbError {
            kind: DbErrorKind::Syntax,
            message: one_line(&format!("statement does not parse: {e}")),
        })?;
        let statement = match (statements.pop(), statements.is_empty()) {
            (Some(s), true) => s,
            (None, _) => return Err(DbError::denied("empty statement; send exactly one")),
            (Some(_), false) => {
                return Err(DbError::denied(format!(
                    "{} statements in one call; send exactly one",
                    statements.len() + 1
                )));
            }
        };
        let mut checker = Checker {
            guard: self,
            scopes: Vec::new(),
            cte_bodies: HashMap::new(),
            max_param: 0,
        };
        if let ControlFlow::Break(e) = statement.visit(&mut checker) {
            return Err(e);
        }
        Ok(CheckedSql {
            text: statement.to_string().into(),
            params: checker.max_param,
        })
    }

    /// An identifier's name as the database resolves it: PostgreSQL folds
    /// unquoted names to lower case and keeps quoted ones; SQLite ignores case.
    fn normalize(&self, ident: &Ident) -> String {
        match (self.kind, ident.quote_style) {
            (DbKind::Postgres, Some(_)) => ident.value.clone(),
            _ => ident.value.to_ascii_lowercase(),
        }
    }
}

/// Names no guest statement may mention anywhere (lower-cased comparison).
const RESERVED_NAMES: &[&str] = &[
    "pg_catalog",
    "information_schema",
    "sqlite_master",
    "sqlite_schema",
    "sqlite_temp_master",
    "sqlite_temp_schema",
];

fn reserved_ident(name: &str) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("idem_") || lower.starts_with("_idem_") {
        Some(format!(
            "`{name}` names a host table; idem_* tables are never reachable from a handler"
        ))
    } else if RESERVED_NAMES.contains(&lower.as_str()) {
        Some(format!(
            "`{name}` names a system catalog; handlers cannot read catalogs"
        ))
    } else {
        None
    }
}

/// One walk over one statement. `scopes` holds, per enclosing query, the CTE
/// names visible there; `cte_bodies` the visible names for CTE bodies not yet
/// entered, keyed by the body's address in the AST.
struct Checker<'g> {
    guard: &'g SqlGuard,
    scopes: Vec<HashSet<String>>,
    cte_bodies: HashMap<usize, HashSet<String>>,
    max_param: usize,
}

fn deny<T>(message: String) -> ControlFlow<DbError, T> {
    ControlFlow::Break(DbError::denied(message))
}

fn address(query: &Query) -> usize {
    std::ptr::from_ref(query) as usize
}

impl Checker<'_> {
    /// Checks a table reference. `allow_cte`: an unqualified name may resolve
    /// to a CTE in scope (false for DML targets, which are always tables).
    fn check_table(&self, name: &ObjectName, allow_cte: bool) -> ControlFlow<DbError> {
        let mut idents = Vec::with_capacity(name.0.len());
        for part in &name.0 {
            match part {
                ObjectNamePart::Identifier(i) => idents.push(i),
                ObjectNamePart::Function(_) => {
                    return deny(format!(
                        "table name `{name}` is computed; name tables directly"
                    ));
                }
            }
        }
        if let Some(why) = idents.iter().find_map(|i| reserved_ident(&i.value)) {
            return deny(why);
        }
        let table = match idents.as_slice() {
            [table] => *table,
            [schema, table] => {
                let allowed = match self.guard.kind {
                    DbKind::Postgres => "public",
                    DbKind::Sqlite => "main",
                };
                if self.guard.normalize(schema) != allowed {
                    return deny(format!(
                        "schema `{}` is not allowed; use unqualified table names (or `{allowed}.`)",
                        schema.value
                    ));
                }
                *table
            }
            _ => {
                return deny(format!(
                    "`{name}` has too many parts; use unqualified table names"
                ));
            }
        };
        let normalized = self.guard.normalize(table);
        if allow_cte
            && idents.len() == 1
            && self.scopes.last().is_some_and(|s| s.contains(&normalized))
        {
            return ControlFlow::Continue(());
        }
        let lower = normalized.to_ascii_lowercase();
        if lower.starts_with("pg_") || lower.starts_with("sqlite_") {
            return deny(format!(
                "`{}` is a system table; handlers cannot read it",
                table.value
            ));
        }
        if self.guard.granted.contains(&normalized) {
            ControlFlow::Continue(())
        } else {
            deny(format!(
                "table `{}` is not granted to this handler; grant it in [[handler]] tables",
                table.value
            ))
        }
    }

    fn check_set_expr(&self, body: &SetExpr) -> ControlFlow<DbError> {
        match body {
            SetExpr::SetOperation { left, right, .. } => {
                self.check_set_expr(left)?;
                self.check_set_expr(right)
            }
            SetExpr::Select(_)
            | SetExpr::Query(_)
            | SetExpr::Values(_)
            | SetExpr::Insert(_)
            | SetExpr::Update(_)
            | SetExpr::Delete(_) => ControlFlow::Continue(()),
            SetExpr::Table(_) => {
                deny("`TABLE name` is not supported; write SELECT * FROM name".into())
            }
            SetExpr::Merge(_) => deny("MERGE is not allowed; use INSERT ... ON CONFLICT".into()),
        }
    }

    fn check_function(&self, f: &Function) -> ControlFlow<DbError> {
        let name = match f.name.0.as_slice() {
            [ObjectNamePart::Identifier(i)] => i.value.to_ascii_lowercase(),
            _ => {
                return deny(format!(
                    "function `{}` is not allowed in handler SQL",
                    f.name
                ));
            }
        };
        if ALLOWED_FUNCTIONS.contains(&name.as_str())
            && matches!(f.parameters, sqlparser::ast::FunctionArguments::None)
        {
            ControlFlow::Continue(())
        } else {
            deny(format!(
                "function `{}` is not allowed in handler SQL (allowed: {})",
                f.name,
                ALLOWED_FUNCTIONS.join(", ")
            ))
        }
    }

    fn check_statement(&self, statement: &Statement) -> ControlFlow<DbError> {
        match statement {
            Statement::Query(_) => ControlFlow::Continue(()),
            Statement::Insert(i) => {
                let exotic = i.ignore
                    || i.overwrite
                    || i.partitioned.is_some()
                    || !i.after_columns.is_empty()
                    || i.has_table_keyword
                    || i.output.is_some()
                    || i.priority.is_some()
                    || i.insert_alias.is_some()
                    || i.settings.is_some()
                    || i.format_clause.is_some()
                    || i.multi_table_insert_type.is_some()
                    || !i.multi_table_into_clauses.is_empty()
                    || !i.multi_table_when_clauses.is_empty()
                    || i.multi_table_else_clause.is_some();
                if exotic {
                    return deny("this INSERT form is not supported; use INSERT INTO t (...) VALUES/SELECT [ON CONFLICT] [RETURNING]".into());
                }
                match &i.table {
                    TableObject::TableName(name) => self.check_table(name, false),
                    TableObject::TableFunction(_) | TableObject::TableQuery(_) => {
                        deny("INSERT must name a table".into())
                    }
                }
            }
            Statement::Update(u) => {
                if !u.table.joins.is_empty()
                    || u.on_cluster.is_some()
                    || u.output.is_some()
                    || u.settings.is_some()
                {
                    return deny("this UPDATE form is not supported; use UPDATE t SET ... [FROM ...] [WHERE ...]".into());
                }
                match &u.table.relation {
                    TableFactor::Table { name, .. } => self.check_table(name, false),
                    _ => deny("UPDATE must name a table".into()),
                }
            }
            Statement::Delete(d) => {
                let from = match &d.from {
                    FromTable::WithFromKeyword(f) | FromTable::WithoutKeyword(f) => f,
                };
                if !d.tables.is_empty()
                    || d.on_cluster.is_some()
                    || d.output.is_some()
                    || d.settings.is_some()
                    || from.len() != 1
                    || from.iter().any(|t| !t.joins.is_empty())
                {
                    return deny("this DELETE form is not supported; use DELETE FROM t [USING ...] [WHERE ...]".into());
                }
                for t in from {
                    match &t.relation {
                        TableFactor::Table { name, .. } => self.check_table(name, false)?,
                        _ => return deny("DELETE must name a table".into()),
                    }
                }
                ControlFlow::Continue(())
            }
            other => {
                let text = other.to_string();
                let word = text
                    .split_whitespace()
                    .next()
                    .unwrap_or("this")
                    .to_ascii_uppercase();
                deny(format!(
                    "{word} statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE in the host's transaction"
                ))
            }
        }
    }

    fn check_placeholder(&mut self, p: &str) -> ControlFlow<DbError> {
        let n = p
            .strip_prefix('$')
            .filter(|d| {
                !d.starts_with('0') && !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())
            })
            .and_then(|d| d.parse::<usize>().ok())
            .filter(|n| (1..=MAX_PLACEHOLDER).contains(n));
        match n {
            Some(n) => {
                self.max_param = self.max_param.max(n);
                ControlFlow::Continue(())
            }
            None => deny(format!(
                "placeholder `{p}` is not supported; write parameters as $1..$n (at most ${MAX_PLACEHOLDER})"
            )),
        }
    }
}

impl Visitor for Checker<'_> {
    type Break = DbError;

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<DbError> {
        self.check_statement(statement)
    }

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<DbError> {
        if query.for_clause.is_some()
            || query.settings.is_some()
            || query.format_clause.is_some()
            || !query.pipe_operators.is_empty()
        {
            return deny("this query form is not supported by idem".into());
        }
        self.check_set_expr(&query.body)?;
        let base = match self.cte_bodies.remove(&address(query)) {
            Some(visible) => visible,
            None => self.scopes.last().cloned().unwrap_or_default(),
        };
        let mut scope = base.clone();
        if let Some(with) = &query.with {
            let names: Vec<String> = with
                .cte_tables
                .iter()
                .map(|c| self.guard.normalize(&c.alias.name))
                .collect();
            for (i, cte) in with.cte_tables.iter().enumerate() {
                // A CTE body sees the CTEs before it; itself only under RECURSIVE.
                let upto = if with.recursive { i + 1 } else { i };
                let mut visible = base.clone();
                visible.extend(names.iter().take(upto).cloned());
                self.cte_bodies.insert(address(&cte.query), visible);
            }
            scope.extend(names);
        }
        self.scopes.push(scope);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &Query) -> ControlFlow<DbError> {
        self.scopes.pop();
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<DbError> {
        if select.into.is_some() {
            return deny("SELECT INTO creates a table; it is not allowed".into());
        }
        if !select.lateral_views.is_empty()
            || !select.connect_by.is_empty()
            || select.prewhere.is_some()
        {
            return deny("this SELECT form is not supported by idem".into());
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<DbError> {
        self.check_table(relation, true)
    }

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<DbError> {
        match factor {
            TableFactor::Table {
                name,
                args,
                with_hints,
                version,
                partitions,
                json_path,
                index_directives,
                ..
            } => {
                if args.is_some() {
                    return deny(format!(
                        "table function `{name}` is not allowed; read granted tables"
                    ));
                }
                if !with_hints.is_empty()
                    || version.is_some()
                    || !partitions.is_empty()
                    || json_path.is_some()
                    || !index_directives.is_empty()
                {
                    return deny(format!(
                        "this form of table reference `{name}` is not supported"
                    ));
                }
                ControlFlow::Continue(())
            }
            TableFactor::Derived { .. } | TableFactor::NestedJoin { .. } => {
                ControlFlow::Continue(())
            }
            _ => deny(
                "this FROM item is not allowed; use granted tables, joins and subqueries".into(),
            ),
        }
    }

    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<DbError> {
        match expr {
            Expr::Function(f) => self.check_function(f),
            Expr::Convert { .. } => deny("CONVERT is not allowed; use CAST".into()),
            Expr::Cast {
                data_type, format, ..
            } => match format {
                Some(_) => deny("CAST ... FORMAT is not allowed".into()),
                None => casts::check_cast_type(data_type),
            },
            Expr::TypedString(t) => casts::check_cast_type(&t.data_type),
            _ => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_value(&mut self, value: &ValueWithSpan) -> ControlFlow<DbError> {
        match &value.value {
            Value::Placeholder(p) => self.check_placeholder(p),
            v if self.guard.kind == DbKind::Postgres => casts::check_pg_literal(v),
            _ => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_ident(&mut self, ident: &Ident) -> ControlFlow<DbError> {
        match reserved_ident(&ident.value) {
            Some(why) => deny(why),
            None => ControlFlow::Continue(()),
        }
    }
}

/// `s` on one line (newlines become spaces).
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, line) in s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{line}");
    }
    out
}

#[cfg(test)]
#[path = "sql_guard_tests.rs"]
mod tests;
