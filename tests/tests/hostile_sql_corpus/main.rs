//! A corpus of hostile SQL, judged by effect.
//!
//! Each database (PostgreSQL, SQLite) gets one real host: the `idem` binary
//! (`idem-test-host`, a child process so its memory can be read), a private
//! nats-server and a fresh database holding a table no handler is granted,
//! `secrets`, whose one row is a canary. The `behave` guest runs every case as
//! it says: one statement (`sql`, which commits when it succeeds; `query`,
//! which rejects with the rows it read), or several statements in one message
//! (`steps`, stopping at the first error). Every hostile message is followed
//! by a well-behaved credit on the same handler, and the `credit` example
//! handler is served alongside.
//!
//! Cases run in groups (one publish burst, one wait, one round of checks).
//! Nothing is judged by the guard's wording; after each group:
//! - every case ended as expected: served (a receipt, no dead letter) or
//!   dead-lettered (refused or failed, with no rows read; with exactly the
//!   rows given; as a trap), by the exact set of receipts and dead letters;
//! - the canary was not read: no dead-letter reason holds it in any spelling,
//!   and it was not changed (one row, same value);
//! - `idem_receipts` and `idem_dead_letters` hold exactly the expected rows
//!   (nothing deleted, nothing forged), every account its exact balance (each
//!   follow-up credit applied exactly once), and `notes` and `ledger`
//!   (granted, with triggers that reach `secrets` or end the transaction) are
//!   empty;
//! - no new objects: PostgreSQL's catalogs (relations, functions, large
//!   objects, schemas, triggers, rules, privileges, roles, databases,
//!   prepared transactions) and SQLite's schema and header are unchanged,
//!   and no file appeared next to the SQLite database or at the paths cases
//!   name;
//! - no session state left: on PostgreSQL no advisory lock, no backend busy
//!   or renamed (`application_name`) once the group is settled, and a guest
//!   reading setting-dependent values (date and bytea output, time zone,
//!   float digits; SQLite's `LIKE` case) sees a fresh session's values;
//! - the host is alive, its peak memory (`VmHWM`) stays under 1 GiB (twice
//!   PostgreSQL's 1 GB field limit in the one case built to reach that
//!   limit) and its resident memory comes back under it after each group.
//!
//! At the end the host's own counters (processed, dead-lettered, traps,
//! retries) must match exactly. Failures are collected and reported together.
//! `IDEM_CORPUS_CASES=<substring>` runs only the cases whose name or payload
//! contains it (the checks still run).
//!
//! The statements of past escapes are the cases named `past-escape/...`;
//! the last group sends 20,000 distinct statement texts (the guard's verdict
//! cache is bounded). Two PostgreSQL cases need a host of their own:
//! `postgres_row_near_field_limit` (one huge value, so the peak memory is its
//! own) and `postgres_attribute_notation_calls_no_function_outside_the_allow_list`
//! (functions the application defined on a granted table's row type).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod cases_exhaustion;
mod cases_lexical;
mod cases_past_escapes;
mod cases_reach;
mod cases_server;
mod cases_statements;
mod checks;
mod harness;
mod outcome;

use cases_exhaustion::{memory, nesting, sleeps};
use cases_lexical::{comments, dollar_quotes, multi, params, quotes, unicode};
use cases_past_escapes::past_escapes;
use cases_reach::{conflicts, ctes, reach};
use cases_server::{catalogs, locks, roles, settings};
use cases_statements::{attach, ddl, transactions, utility};
use harness::{CorpusHost, DEADLINE};
use idem_tests::*;
use outcome::{Ctx, Group, Outcome, q};
use std::time::Instant;

fn corpus(ctx: &Ctx) -> Vec<Group> {
    vec![
        past_escapes(ctx),
        quotes(ctx),
        dollar_quotes(ctx),
        comments(ctx),
        unicode(ctx),
        conflicts(ctx),
        ctes(ctx),
        catalogs(ctx),
        settings(ctx),
        roles(ctx),
        locks(ctx),
        sleeps(ctx),
        multi(ctx),
        attach(ctx),
        transactions(ctx),
        utility(ctx),
        ddl(ctx),
        reach(ctx),
        nesting(ctx),
        params(ctx),
        memory(ctx),
    ]
}

async fn run_corpus(backend: Backend) {
    let started = Instant::now();
    let mut a = CorpusHost::start(backend, DEADLINE, &[]).await;
    let groups = corpus(&a.ctx());
    let total: usize = groups.iter().map(|g| g.cases.len()).sum();
    eprintln!(
        "{backend:?}: {total} hostile cases in {} groups",
        groups.len()
    );
    assert!(total >= 150, "{total} cases");
    for g in &groups {
        a.run_group(g).await;
    }
    a.verdict_cache().await;
    a.finish();
    eprintln!("{backend:?}: corpus done in {:?}", started.elapsed());
}

on_both_databases!(corpus, run_corpus);

/// PostgreSQL sends a row whole, and the host counts it against
/// `max_result_kib` once it has arrived (before decoding it): one 900 MB
/// value (under PostgreSQL's 1 GB field limit, built by allowed `replace`
/// calls) is refused, the host's peak memory stays within twice
/// PostgreSQL's limit (the driver's read buffer, docs/handlers.md "What a
/// handler can and cannot do"), and its resident memory comes back down (the
/// connection's buffer is given back). Its own host, so the peak is this
/// message's, with a deadline long enough for PostgreSQL to build the value
/// on a busy machine (on an idle one, a 400 MB value arrives within the
/// default 5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_row_near_field_limit() {
    let mut a = CorpusHost::start(Backend::Postgres, "30s", &[]).await;
    a.memory_limit_kib = 2 * (1 << 20) + (1 << 18);
    a.resident_limit_kib = 256 << 10;
    let mut grow = "'xxxxxxxxx'".to_owned();
    for _ in 0..8 {
        grow = format!("replace({grow}, 'x', 'xxxxxxxxxx')");
    }
    let mut g = Group::new("row-near-field-limit", &a.ctx());
    g.add(
        "value-900-mb",
        q(&format!("SELECT {grow} AS s")),
        Outcome::Refused,
    );
    a.run_group(&g).await;
    a.finish();
}

/// PostgreSQL reads `row.f` as `f(row)` when the row has no column `f`
/// ("Functions as Columns" in its manual), so a function the application
/// defined on a granted table's row type is callable through attribute
/// notation, although the allow-list refuses the same call written
/// `f(row)`. Here `reveal(accounts)` is SECURITY DEFINER and reads
/// `secrets`; `peek(accounts)` reads it as the caller (the handler role
/// stops it); `grab(accounts)` takes a session advisory lock. Each call must
/// be refused like the direct one, and the canary must stay unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_attribute_notation_calls_no_function_outside_the_allow_list() {
    let mut a = CorpusHost::start(
        Backend::Postgres,
        DEADLINE,
        &[
            "CREATE FUNCTION reveal(accounts) RETURNS text LANGUAGE sql STABLE SECURITY DEFINER \
             AS 'SELECT v FROM secrets'",
            "CREATE FUNCTION grab(accounts) RETURNS bigint LANGUAGE plpgsql \
             AS 'BEGIN PERFORM pg_advisory_lock(424242); RETURN 1; END'",
            "CREATE FUNCTION peek(accounts) RETURNS text LANGUAGE sql STABLE \
             AS 'SELECT v FROM secrets'",
        ],
    )
    .await;
    let mut g = Group::new("attribute-notation", &a.ctx());
    g.refused(q(
        "SELECT reveal(a) AS r FROM accounts a WHERE account_id = 500",
    ));
    g.refused(q(
        "SELECT grab(a) AS g FROM accounts a WHERE account_id = 500",
    ));
    g.add(
        "definer-function-as-column",
        q("SELECT a.reveal FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    g.add(
        "definer-function-as-field",
        q("SELECT (a).reveal FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    g.add(
        "definer-function-in-where",
        q("SELECT account_id FROM accounts a WHERE a.reveal LIKE 'C%'"),
        Outcome::Refused,
    );
    g.add(
        "invoker-function-as-column",
        q("SELECT a.peek FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    g.add(
        "lock-function-as-column",
        q("SELECT a.grab FROM accounts a WHERE account_id = 500"),
        Outcome::Refused,
    );
    a.run_group(&g).await;
    a.finish();
}
