//! The transactional outbox: what a handler publishes or calls is stored in
//! its message's transaction and sent after the commit (ARCHITECTURE.md,
//! "The outbox"). This module admits a guest's calls against its grants
//! (`grants`, `subject`) and caps (`calls`); `relay` sends the rows.

pub mod calls;
pub mod grants;
pub mod relay;
pub mod subject;

pub use calls::{OutboxCalls, OutboxEntry, Refusal, Target};
pub use grants::OutboxGrants;
