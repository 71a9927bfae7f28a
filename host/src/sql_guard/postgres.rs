//! Judges guest SQL with PostgreSQL's own grammar (libpg_query via `pg_query`).
//!
//! The host runs the guest's text unchanged, so only PostgreSQL's reading
//! counts: quotes, `E''` escapes, dollar quotes, nested comments and `U&`
//! escapes are decoded by the server's lexer and grammar (with
//! `standard_conforming_strings = on`, libpg_query's default and the server's).
//! The tree is converted to `serde_json::Value` and walked generically, so no
//! child can be skipped, deny by default: every node type is on an explicit
//! list (`PLAIN_NODES`, or a check of its own in `Judge::node`), and every
//! string in the tree except literal values is an identifier checked against
//! host tables and catalogs.
//!
//! Version skew: libpg_query has PostgreSQL 18's grammar; an older server
//! refuses, rather than reads otherwise, what only the newer grammar accepts
//! (PostgreSQL 15 fails `0x1F`, `1_000` and `$1_0` with "trailing junk", and
//! SQL/JSON, `SYSTEM_USER` or `RETURNING OLD` as syntax or unknown names).
//!
//! Attribute notation: `a.f` and `(a).f` are column references in the tree.
//! When row `a` has no column `f`, PostgreSQL tries `f(a)` ("Function Call"
//! and "Functions as Columns" in the PostgreSQL manual), which resolves only
//! to a function of exactly one argument of `a`'s row type, `record`,
//! `anyelement` or `"any"`; built in, those are value functions (`to_json`,
//! `pg_typeof`), and `a.pg_read_file` fails ("column a.pg_read_file does not
//! exist": a row does not coerce to `text`). But an application's function
//! on a table's row type (possibly `SECURITY DEFINER`) would run that way.
//! Without the catalog a column cannot be told from such a function, so the
//! judge returns every such field name ([`Judged::fields`]) and the guard
//! asks the catalog (see `SqlGuard::check`).

// Guest- and message-supplied bytes are read with `get`, iterators and
// checked splits, never indexed or sliced: an offset out of range would
// panic the host (ARCHITECTURE.md, "The protocol", invariant 8).
#![deny(clippy::indexing_slicing, clippy::string_slice)]

use super::ALLOWED_FUNCTIONS;
use crate::sql_value::{DbError, DbErrorKind};
use pg_query::protobuf::{AExprKind, Token};
use serde_json::{Map, Value};
use std::collections::{BTreeSet, HashSet};

type Obj = Map<String, Value>;
type Verdict = Result<(), DbError>;

/// `Err` of a one-line denial, formatted like `format!`.
macro_rules! refuse {
    ($($arg:tt)*) => { Err(denied(format!($($arg)*))) };
}

/// The highest placeholder number PostgreSQL's protocol can bind.
const MAX_PLACEHOLDER: i64 = 65_535;

/// Nodes nested deeper are refused. `pg_query` fails to decode trees nested
/// over 100 protobuf messages, so this only guards the walker's recursion.
const MAX_DEPTH: usize = 256;

/// Node types allowed with no check of their own: their children (nodes,
/// typed structs such as `Alias`, `OnConflictClause`, `InferClause`,
/// `ReturningClause`, and identifier strings) are walked and judged like any
/// other. Each computes on values of rows already reachable and names nothing.
#[rustfmt::skip]
const PLAIN_NODES: &[&str] = &[
    // Expressions: subscripts and `(row).field`, `ARRAY[...]`, `ROW(...)`, `GREATEST`/`LEAST`.
    "AArrayExpr", "AIndices", "AStar", "BoolExpr", "BooleanTest", "CaseExpr",
    "CaseWhen", "CoalesceExpr", "MinMaxExpr", "NullTest", "RowExpr",
    // Values in lists: `VALUES` rows, name parts, array bounds.
    "Boolean", "Float", "Integer", "List", "String",
    // Query structure (a `RangeSubselect`'s query, also `LATERAL`, is a `SelectStmt`).
    "GroupingSet", "JoinExpr", "RangeSubselect", "ResTarget", "WindowDef",
    // DML parts: `ON CONFLICT (col)`, `SET (a, b) = (...)`, `RETURNING WITH (OLD AS o)`,
    // `DEFAULT` (runs the column default, as omitting the column does).
    "IndexElem", "MultiAssignRef", "ReturningOption", "SetToDefault",
];

/// Functions PostgreSQL's SQL-standard syntax expands to, as
/// `pg_catalog.<name>`, for forms of allowed functions not already named in
/// [`ALLOWED_FUNCTIONS`]: `TRIM(x)` and `TRIM(BOTH ... FROM x)` become
/// `pg_catalog.btrim` (`LEADING`/`TRAILING` become `ltrim`/`rtrim`, and
/// `SUBSTRING(x FROM a FOR b)` becomes `substring`, which are listed).
const SQL_SYNTAX_FUNCTIONS: &[&str] = &["btrim"];

/// Cast targets: plain value types, as `pg_query` names them (`int4`, `bpchar`,
/// ...) and as they can be written quoted. Arrays of these are allowed too.
#[rustfmt::skip]
const PLAIN_TYPES: &[&str] = &[
    "int2", "int4", "int8", "smallint", "integer", "bigint", "numeric", "decimal", "float4",
    "float8", "real", "double precision", "text", "varchar", "bpchar", "char", "bool",
    "boolean", "bytea", "date", "time", "timetz", "timestamp", "timestamptz", "interval",
    "json", "jsonb", "uuid",
];

/// The cast targets a guest may use, as named in the refusal message.
const PLAIN_TYPES_SHOWN: &str = "smallint, integer, bigint, numeric, decimal, real, \
    double precision, text, varchar, char, boolean, bytea, date, time, timetz, timestamp, \
    timestamptz, interval, json, jsonb, uuid, and arrays of these";

/// Words PostgreSQL's date/time input replaces with a reading of the clock
/// ("Special Date/Time Inputs" in the PostgreSQL manual).
const CLOCK_WORDS: &[&str] = &["now", "today", "tomorrow", "yesterday"];

/// Judges one guest statement by PostgreSQL's own grammar and returns the
/// highest `$n` placeholder it uses (0 if none). The caller must then run
/// exactly `sql`, never a re-printed form of it.
///
/// It passes when it is one `SELECT` (also `VALUES`, `TABLE`, set operations),
/// `INSERT` (also `ON CONFLICT`), `UPDATE` or `DELETE`, with `WITH` and
/// `RETURNING` if wanted, in which:
/// - every table read or written is in `granted` (names lower-cased as
///   unquoted identifiers are; `"Accounts"` is not `accounts`), unqualified or
///   under `public.`. A name is a CTE instead only where PostgreSQL resolves
///   it so (PostgreSQL manual, "WITH Queries (Common Table Expressions)" and
///   `SELECT`'s `WITH` clause): unqualified, in `FROM`, under a `WITH` of an
///   enclosing query level, where a non-recursive `WITH` item sees only the
///   items before it and a `WITH RECURSIVE` item all of its clause. A DML
///   target is always a table;
/// - no identifier names a host table (`idem_*`, `_idem_*`) or a catalog
///   (`pg_catalog`, `information_schema`), and no table name starts `pg_`;
/// - every node type is allowed (none of table functions, `SELECT INTO`,
///   `CURRENT_TIMESTAMP`-style SQL value functions, XML, SQL/JSON, utility
///   statements), functions are in [`ALLOWED_FUNCTIONS`] (or `pg_catalog.` and
///   such a name, or the `btrim` `TRIM(...)` expands to), operators are
///   unqualified, casts target plain value types, no string literal holds a
///   word date/time input reads from the clock, and placeholders are
///   `$1..$65535`.
///
/// # Errors
///
/// [`DbErrorKind::Syntax`] when PostgreSQL's grammar rejects the text (message
/// `statement does not parse: ...`); [`DbErrorKind::Denied`] with one line
/// saying what is refused and what to do instead for everything else.
pub(crate) fn judge(sql: &str, granted: &HashSet<String>) -> Result<Judged, DbError> {
    let parsed = pg_query::parse(sql, pg_query::ParserOptions::DEFAULT).map_err(parse_error)?;
    let stmt = match parsed.protobuf.stmts.as_slice() {
        [] => return Err(denied("empty statement; send exactly one")),
        [one] => one,
        many => {
            return refuse!("{} statements in one call; send exactly one", many.len());
        }
    };
    let tree = serde_json::to_value(&stmt.stmt)
        .map_err(|e| denied(format!("statement could not be judged: {e}")))?;
    let (tag, body) = node_of(&tree).ok_or_else(odd)?;
    if !matches!(
        tag,
        "SelectStmt" | "InsertStmt" | "UpdateStmt" | "DeleteStmt"
    ) {
        return Err(statement_refused(&statement_word(sql, tag)));
    }
    let mut judge = Judge {
        granted,
        ctes: Vec::new(),
        max_param: 0,
        depth: 0,
        fields: BTreeSet::new(),
    };
    judge.enter(tag, body)?;
    Ok(Judged {
        params: judge.max_param,
        fields: judge.fields.into_iter().collect(),
    })
}

/// What [`judge`] found in a statement it allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Judged {
    /// The highest placeholder number (`$n`), 0 without placeholders.
    pub params: usize,
    /// Field names selected from a row (`a.f`, `s.t.f`, `(expr).f`), as
    /// PostgreSQL resolves identifiers (unquoted ones folded to lower case),
    /// sorted, without duplicates and without [`ALLOWED_FUNCTIONS`]: each is a
    /// column, or else a call `f(row)` (attribute notation) that the catalog
    /// must rule out.
    pub fields: Vec<String>,
}

/// Walks one statement's tree, carrying the CTE names in scope.
struct Judge<'g> {
    granted: &'g HashSet<String>,
    /// CTE names visible at the current point, outer query levels first. A
    /// query level pushes the names its `WITH` defines and truncates them when
    /// it is done, so sibling subqueries never see each other's CTEs.
    ctes: Vec<String>,
    max_param: usize,
    depth: usize,
    /// See [`Judged::fields`].
    fields: BTreeSet<String>,
}

impl Judge<'_> {
    /// Any JSON value of the tree: arrays, `Node` wrappers, typed structs,
    /// identifier strings.
    fn value(&mut self, v: &Value) -> Verdict {
        match v {
            Value::Array(items) => items.iter().try_for_each(|i| self.value(i)),
            Value::Object(o) => match wrapped(o) {
                Some(Value::Null) => Ok(()),
                Some(inner) => {
                    let (tag, body) = tagged(inner).ok_or_else(odd)?;
                    self.enter(tag, body)
                }
                None => self.fields(o, &[]),
            },
            Value::String(s) => check_name(s),
            Value::Null | Value::Bool(_) | Value::Number(_) => Ok(()),
        }
    }

    /// Every field of a node or typed struct but those in `skip`, which the
    /// caller has judged itself.
    fn fields(&mut self, o: &Obj, skip: &[&str]) -> Verdict {
        o.iter()
            .filter(|(k, _)| !skip.contains(&k.as_str()))
            .try_for_each(|(_, v)| self.value(v))
    }

    fn enter(&mut self, tag: &str, body: &Obj) -> Verdict {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(too_deep());
        }
        let verdict = self.node(tag, body);
        self.depth -= 1;
        verdict
    }

    /// One node, by its type tag: deny by default.
    fn node(&mut self, tag: &str, n: &Obj) -> Verdict {
        match tag {
            "SelectStmt" => self.select(n),
            "InsertStmt" | "UpdateStmt" | "DeleteStmt" => self.modify(n),
            "RangeVar" => self.table(n, true),
            "FuncCall" => self.function(n),
            "TypeCast" => self.cast(n),
            "AConst" => constant(n),
            "ParamRef" => self.param(n),
            "AExpr" => self.operator(n),
            // `x = ANY (SELECT ...)` names its operator; the rest is plain.
            "SubLink" => {
                operator_name(n.get("oper_name"))?;
                self.fields(n, &["oper_name"])
            }
            // `ORDER BY x USING <` names an operator.
            "SortBy" => {
                operator_name(n.get("use_op"))?;
                self.fields(n, &["use_op"])
            }
            "ColumnRef" => {
                // `a.f`, `s.a.f`: the last name may be a function of `a`.
                let parts = list(n, "fields");
                if parts.len() >= 2 {
                    self.field(parts.last());
                }
                self.fields(n, &[])
            }
            "AIndirection" => {
                // `(expr).f`: each `.f` may be a function of what precedes it.
                for part in list(n, "indirection") {
                    self.field(Some(part));
                }
                self.fields(n, &[])
            }
            "LockingClause" => self.locking(n),
            "CollateClause" => self.collate(n),
            t if PLAIN_NODES.contains(&t) => self.fields(n, &[]),
            other => Err(node_refused(other)),
        }
    }

    /// Notes a selected field name (a `String` node; `*` and subscripts are
    /// not names) unless it is an allowed function, which may be called.
    fn field(&mut self, part: Option<&Value>) {
        if let Some(("String", s)) = part.and_then(node_of)
            && let Some(name) = text(s, "sval")
            && !ALLOWED_FUNCTIONS.contains(&name)
        {
            self.fields.insert(name.to_owned());
        }
    }

    /// A query level: `WITH` first (its names scope the rest), then both arms
    /// of a set operation (`larg`/`rarg` are typed `SelectStmt`s), then every
    /// other field.
    fn select(&mut self, s: &Obj) -> Verdict {
        if s.get("into_clause").is_some_and(|v| !v.is_null()) {
            return Err(denied("SELECT INTO creates a table; it is not allowed"));
        }
        let mark = self.ctes.len();
        if let Some(with) = obj(s, "with_clause") {
            self.with(with)?;
        }
        for arm in ["larg", "rarg"] {
            if let Some(arm) = obj(s, arm) {
                self.enter("SelectStmt", arm)?;
            }
        }
        self.fields(s, &["into_clause", "with_clause", "larg", "rarg"])?;
        self.ctes.truncate(mark);
        Ok(())
    }

    /// `INSERT`, `UPDATE` or `DELETE`: its `WITH` scopes the rest, and its
    /// target (`relation`, a typed `RangeVar`) is always a real table.
    fn modify(&mut self, m: &Obj) -> Verdict {
        let mark = self.ctes.len();
        if let Some(with) = obj(m, "with_clause") {
            self.with(with)?;
        }
        self.table(obj(m, "relation").ok_or_else(odd)?, false)?;
        self.fields(m, &["with_clause", "relation"])?;
        self.ctes.truncate(mark);
        Ok(())
    }

    /// A `WITH` clause: judges each item's query with the names PostgreSQL
    /// lets it see, and leaves all of the clause's names in scope for the
    /// caller's query level.
    fn with(&mut self, w: &Obj) -> Verdict {
        let recursive = is_true(w, "recursive");
        let mut ctes = Vec::new();
        for item in list(w, "ctes") {
            let Some(("CommonTableExpr", cte)) = node_of(item) else {
                return Err(odd());
            };
            let name = text(cte, "ctename").ok_or_else(odd)?;
            check_name(name)?;
            ctes.push((name, cte));
        }
        if recursive {
            self.ctes
                .extend(ctes.iter().map(|(name, _)| (*name).to_owned()));
        }
        for (name, cte) in ctes {
            self.fields(cte, &["ctename"])?;
            if !recursive {
                self.ctes.push(name.to_owned());
            }
        }
        Ok(())
    }

    /// A table reference. In `FROM` (`may_be_cte`) an unqualified name of a
    /// CTE in scope is that CTE; anything else is a real table.
    fn table(&mut self, rv: &Obj, may_be_cte: bool) -> Verdict {
        let field = |key| text(rv, key).unwrap_or_default();
        let (catalog, schema, name) = (field("catalogname"), field("schemaname"), field("relname"));
        check_name(catalog)?;
        check_name(schema)?;
        check_name(name)?;
        if !catalog.is_empty() {
            return refuse!(
                "`{catalog}.{schema}.{name}` names a database; use unqualified table names (or `public.`)"
            );
        }
        if !schema.is_empty() && schema != "public" {
            return refuse!(
                "schema `{schema}` is not allowed; use unqualified table names (or `public.`)"
            );
        }
        let cte = may_be_cte && schema.is_empty() && self.ctes.iter().any(|c| c == name);
        if !cte {
            if starts_with_ci(name, "pg_") {
                return refuse!("`{name}` is a system table; handlers cannot read it");
            }
            if !self.granted.contains(name) {
                return refuse!(
                    "table `{name}` is not granted to this handler; grant it in [[handler]] tables"
                );
            }
        }
        self.fields(rv, &["catalogname", "schemaname", "relname"])
    }

    /// `FOR UPDATE OF a, b`: the names refer to `FROM` items of the same
    /// query (PostgreSQL refuses any other), so they get the identifier
    /// checks but are not tables of their own.
    fn locking(&mut self, n: &Obj) -> Verdict {
        for rel in list(n, "locked_rels") {
            let Some(("RangeVar", rv)) = node_of(rel) else {
                return Err(odd());
            };
            self.fields(rv, &[])?;
        }
        self.fields(n, &["locked_rels"])
    }

    fn function(&mut self, f: &Obj) -> Verdict {
        let names = names(f.get("funcname")).ok_or_else(odd)?;
        let allowed = match names.as_slice() {
            [name] => ALLOWED_FUNCTIONS.contains(name),
            ["pg_catalog", name] => {
                ALLOWED_FUNCTIONS.contains(name) || SQL_SYNTAX_FUNCTIONS.contains(name)
            }
            _ => false,
        };
        if !allowed {
            return refuse!(
                "function `{}` is not allowed in handler SQL (allowed: {})",
                names.join("."),
                ALLOWED_FUNCTIONS.join(", ")
            );
        }
        self.fields(f, &["funcname"])
    }

    /// `x::t`, `CAST(x AS t)` and typed literals (`DATE '...'`). `type_name` is
    /// a typed `TypeName`: its names are judged here, its modifiers and array
    /// bounds walked.
    fn cast(&mut self, c: &Obj) -> Verdict {
        let type_name = obj(c, "type_name").ok_or_else(odd)?;
        cast_type(type_name)?;
        self.fields(type_name, &["names"])?;
        self.fields(c, &["type_name"])
    }

    fn param(&mut self, p: &Obj) -> Verdict {
        let number = p.get("number").and_then(Value::as_i64).ok_or_else(odd)?;
        if !(1..=MAX_PLACEHOLDER).contains(&number) {
            return refuse!("placeholder `${number}` is out of range; number them $1..$65535");
        }
        let number = usize::try_from(number).map_err(|_| odd())?;
        self.max_param = self.max_param.max(number);
        Ok(())
    }

    /// `AExpr`: an operator of an allowed kind, written unqualified.
    fn operator(&mut self, a: &Obj) -> Verdict {
        use AExprKind as K;
        let kind = a
            .get("kind")
            .and_then(Value::as_i64)
            .and_then(|k| i32::try_from(k).ok());
        // Exhaustive, so a kind added to the enum must be judged here.
        #[rustfmt::skip]
        let allowed = match kind.and_then(|k| K::try_from(k).ok()).ok_or_else(odd)? {
            K::AexprOp | K::AexprOpAny | K::AexprOpAll | K::AexprDistinct | K::AexprNotDistinct
            | K::AexprNullif | K::AexprIn | K::AexprLike | K::AexprIlike | K::AexprBetween
            | K::AexprNotBetween | K::AexprBetweenSym | K::AexprNotBetweenSym => true,
            K::AexprSimilar => return Err(denied(
                "SIMILAR TO is not allowed in handler SQL; use LIKE or a regular expression operator",
            )),
            K::Undefined => false,
        };
        if !allowed {
            return Err(odd());
        }
        operator_name(a.get("name"))?;
        self.fields(a, &["name"])
    }

    /// `x COLLATE "C"`: a collation named unqualified or under `pg_catalog`.
    fn collate(&mut self, n: &Obj) -> Verdict {
        let names = names(n.get("collname")).ok_or_else(odd)?;
        match names.as_slice() {
            [name] | ["pg_catalog", name] => check_name(name)?,
            _ => {
                return refuse!(
                    "collation `{}` is not allowed; name collations unqualified",
                    names.join(".")
                );
            }
        }
        self.fields(n, &["collname"])
    }
}

/// Refuses an identifier that names a host table or a catalog.
fn check_name(name: &str) -> Verdict {
    if starts_with_ci(name, "idem_") || starts_with_ci(name, "_idem_") {
        return refuse!(
            "`{name}` names a host table; idem_* tables are never reachable from a handler"
        );
    }
    if name.eq_ignore_ascii_case("pg_catalog") || name.eq_ignore_ascii_case("information_schema") {
        return refuse!("`{name}` names a system catalog; handlers cannot read catalogs");
    }
    Ok(())
}

/// `AConst`: a string literal must not read the clock; numbers, booleans, bit
/// strings and `NULL` are plain values.
fn constant(c: &Obj) -> Verdict {
    let Some(val) = c.get("val").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    match tagged(val).ok_or_else(odd)? {
        ("Sval", s) => clock_literal(text(s, "sval").ok_or_else(odd)?),
        ("Ival" | "Fval" | "Boolval" | "Bsval", _) => Ok(()),
        _ => Err(odd()),
    }
}

/// Refuses a string literal holding a word PostgreSQL's date/time input reads
/// from the clock. The input splits text into fields at anything but a letter
/// (`'today 10:00'`, `'10:00today'`, `' NOW '` all read the clock) and matches
/// words case-insensitively, so any whole run of ASCII letters counts. The
/// literal is refused wherever it stands, because an untyped literal takes the
/// type of its context (an untyped `'now'` inserted into a `timestamptz`
/// column is the current time).
fn clock_literal(text: &str) -> Verdict {
    let word = text
        .split(|c: char| !c.is_ascii_alphabetic())
        .find_map(|field| {
            CLOCK_WORDS
                .iter()
                .copied()
                .find(|w| field.eq_ignore_ascii_case(w))
        });
    let Some(word) = word else {
        return Ok(());
    };
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case(word) {
        return refuse!(
            "the literal '{trimmed}' reads the database clock; pass times in the message instead"
        );
    }
    let mut shown: String = text.chars().take(40).collect();
    if text.chars().nth(40).is_some() {
        shown.push_str("...");
    }
    refuse!(
        "the literal '{shown}' contains '{word}', which PostgreSQL reads from the database clock; \
         pass times in the message instead (other text as a parameter)"
    )
}

/// Refuses a cast to anything but a plain value type, saying why.
fn cast_type(type_name: &Obj) -> Verdict {
    let names = names(type_name.get("names")).ok_or_else(odd)?;
    let plain = match names.as_slice() {
        [name] | ["pg_catalog", name] => PLAIN_TYPES.contains(name),
        _ => false,
    };
    // `SETOF t` and `x%TYPE` are not value types (neither parses in a cast).
    if plain && !is_true(type_name, "setof") && !is_true(type_name, "pct_type") {
        return Ok(());
    }
    let last = names
        .last()
        .map(|n| n.to_ascii_lowercase())
        .unwrap_or_default();
    let why = if last.starts_with("reg") {
        "reg* types look names up in the system catalogs".to_owned()
    } else if last == "oid" {
        "oids identify system catalog objects".to_owned()
    } else if last.starts_with("pg_") || ["tid", "xid", "xid8", "cid"].contains(&last.as_str()) {
        "it exposes server internals (row, transaction or WAL positions)".to_owned()
    } else {
        format!("casts may target only plain value types ({PLAIN_TYPES_SHOWN})")
    };
    refuse!("cast to `{}` is not allowed: {why}", names.join("."))
}

/// Refuses a schema-qualified operator (`OPERATOR(pg_catalog.+)`); an
/// unqualified one is looked up like PostgreSQL's own operators.
fn operator_name(list: Option<&Value>) -> Verdict {
    let names = match list {
        None | Some(Value::Null) => return Ok(()),
        Some(list) => names(Some(list)).ok_or_else(odd)?,
    };
    if names.len() > 1 {
        return refuse!(
            "operator `OPERATOR({})` is not allowed; write operators unqualified",
            names.join(".")
        );
    }
    Ok(())
}

/// The keyword naming a refused statement: its first token (`SET`, `COMMIT`,
/// `COPY`, ...), or the node type when the text starts otherwise (`WITH ...
/// MERGE`).
fn statement_word(sql: &str, tag: &str) -> String {
    let first = pg_query::scan(sql).ok().and_then(|scanned| {
        let token = scanned
            .tokens
            .into_iter()
            .find(|t| t.token != Token::SqlComment as i32 && t.token != Token::CComment as i32)?;
        token_text(sql, token.start, token.end).map(str::to_ascii_uppercase)
    });
    match first {
        Some(word)
            if word != "WITH"
                && !word.is_empty()
                && word.bytes().all(|b| b.is_ascii_alphabetic()) =>
        {
            word
        }
        _ => tag_word(tag),
    }
}

fn tag_word(tag: &str) -> String {
    tag.strip_suffix("Stmt").unwrap_or(tag).to_ascii_uppercase()
}

fn statement_refused(word: &str) -> DbError {
    denied(format!(
        "{word} statements are not allowed; a handler runs only SELECT, INSERT, UPDATE or DELETE \
         in the host's transaction"
    ))
}

/// Why common node types outside the allow-list are refused.
#[rustfmt::skip]
const NODE_REFUSALS: &[(&str, &str)] = &[
    ("RangeFunction", "functions in FROM (generate_series, ROWS FROM, ...) are not allowed in \
        handler SQL; read granted tables"),
    ("RangeTableFunc", "XMLTABLE is not allowed in handler SQL"),
    ("RangeTableSample", "TABLESAMPLE is not allowed in handler SQL"),
    ("SqlvalueFunction", "CURRENT_TIMESTAMP, CURRENT_DATE, CURRENT_USER and the other SQL value \
        functions read the clock or session state; pass values in the message instead"),
    ("XmlExpr", "XML expressions are not allowed in handler SQL"),
    ("XmlSerialize", "XML expressions are not allowed in handler SQL"),
    ("NamedArgExpr", "named function arguments (`name => value`) are not allowed in handler SQL"),
    ("GroupingFunc", "GROUPING() is not allowed in handler SQL"),
    ("CurrentOfExpr", "WHERE CURRENT OF needs a cursor; it is not allowed"),
];

/// The refusal for a node type outside the allow-list.
fn node_refused(tag: &str) -> DbError {
    if let Some((_, why)) = NODE_REFUSALS.iter().find(|(t, _)| *t == tag) {
        denied(why)
    } else if tag.starts_with("Json") {
        denied(format!(
            "SQL/JSON syntax (`{tag}`) is not allowed in handler SQL; use the json operators"
        ))
    } else if tag.ends_with("Stmt") {
        statement_refused(&tag_word(tag))
    } else {
        denied(format!("`{tag}` is not allowed in handler SQL"))
    }
}

fn parse_error(e: pg_query::Error) -> DbError {
    match e {
        // prost refuses trees nested more than 100 messages deep.
        pg_query::Error::Decode(_) => too_deep(),
        pg_query::Error::Parse(message) => syntax(&message),
        other => syntax(&other.to_string()),
    }
}

fn syntax(message: &str) -> DbError {
    DbError {
        kind: DbErrorKind::Syntax,
        message: one_line(&format!("statement does not parse: {message}")),
    }
}

fn too_deep() -> DbError {
    denied(
        "statement nests too deeply to judge (about 45 levels of operators or subqueries); \
         split long expressions",
    )
}

/// A tree shape the judge does not know; refused rather than guessed at.
fn odd() -> DbError {
    denied("statement has a form the SQL guard does not recognise; simplify it")
}

/// A denial, on one line (names and literals may hold line breaks).
fn denied(message: impl AsRef<str>) -> DbError {
    DbError::denied(one_line(message.as_ref()))
}

fn one_line(s: &str) -> String {
    s.split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `(tag, body)` of a serialized `Node` (`{"node": {"Tag": {...}}}`).
fn node_of(v: &Value) -> Option<(&str, &Obj)> {
    tagged(wrapped(v.as_object()?)?)
}

/// The inside of a `Node` wrapper: the only struct whose single field is
/// `node` (`SortBy` has a `node` field among others).
fn wrapped(o: &Obj) -> Option<&Value> {
    if o.len() == 1 { o.get("node") } else { None }
}

/// The variant name and body of a serialized oneof (`{"Tag": {...}}`).
fn tagged(v: &Value) -> Option<(&str, &Obj)> {
    let o = v.as_object()?;
    if o.len() != 1 {
        return None;
    }
    let (tag, body) = o.iter().next()?;
    Some((tag.as_str(), body.as_object()?))
}

/// The strings of a list of `String` nodes (qualified names, operators).
fn names(list: Option<&Value>) -> Option<Vec<&str>> {
    list?
        .as_array()?
        .iter()
        .map(|item| match node_of(item)? {
            ("String", s) => s.get("sval")?.as_str(),
            _ => None,
        })
        .collect()
}

fn is_true(o: &Obj, key: &str) -> bool {
    o.get(key).and_then(Value::as_bool) == Some(true)
}

fn obj<'v>(o: &'v Obj, key: &str) -> Option<&'v Obj> {
    o.get(key)?.as_object()
}

fn text<'v>(o: &'v Obj, key: &str) -> Option<&'v str> {
    o.get(key)?.as_str()
}

/// A list field; absent or `null` reads as empty.
fn list<'v>(o: &'v Obj, key: &str) -> &'v [Value] {
    o.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.as_bytes()
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix.as_bytes()))
}

fn token_text(sql: &str, start: i32, end: i32) -> Option<&str> {
    sql.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
}

#[cfg(test)]
#[path = "postgres_tests.rs"]
mod tests;
