//! The PostgreSQL advisory lock keys idem takes, in one place, so no two jobs
//! ever share one and wait for (or fail on) each other by accident.
//!
//! Every key starts with the bytes of "idem" (`0x6964_656d`) followed by a
//! small number, so an operator reading `pg_locks` (`locktype = 'advisory'`,
//! `objid` = the low 32 bits) can tell them apart from other applications'.
//! Advisory locks: <https://www.postgresql.org/docs/current/explicit-locking.html#ADVISORY-LOCKS>.

/// Transaction-level lock around creating the host tables at start
/// (`pg_advisory_xact_lock`): hosts starting together create them once.
pub const HOST_TABLES: i64 = 0x6964_656d_0001;

/// Session-level lock held by the one host running a prune pass
/// (`pg_try_advisory_lock`, never waited for).
pub const PRUNE: i64 = 0x6964_656d_0002;

/// Transaction-level lock around creating and granting a handler's role
/// (`pg_advisory_xact_lock`): hosts starting at once create a role once
/// (`CREATE ROLE` is not idempotent).
pub const ROLE_SETUP: i64 = 0x6964_656d_0003;

/// Every key above, for the test that they differ.
pub const ALL: [i64; 3] = [HOST_TABLES, PRUNE, ROLE_SETUP];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_is_distinct() {
        let mut keys = ALL.to_vec();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), ALL.len(), "{ALL:x?}");
        assert_eq!(
            (HOST_TABLES, PRUNE, ROLE_SETUP),
            (0x6964_656d_0001, 0x6964_656d_0002, 0x6964_656d_0003)
        );
    }
}
