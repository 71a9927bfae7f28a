//! The transactional outbox: what a handler publishes or calls is stored in
//! its message's transaction and sent after the commit (ARCHITECTURE.md,
//! "The outbox"). This module admits a guest's calls against its grants
//! (`grants`, `subject`) and caps (`calls`); `relay` sends the rows, one
//! delivery's publishes to one stream as an atomic batch (`batch`, with
//! what it knows of streams in `streams`); `window` checks at start that
//! target streams drop the relay's copies.

pub mod batch;
pub mod calls;
mod flight;
pub mod grants;
pub mod relay;
mod send;
pub mod streams;
pub mod subject;
pub mod window;

pub use calls::{OutboxCalls, OutboxEntry, Refusal, Target};
pub use grants::OutboxGrants;
