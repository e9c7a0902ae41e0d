//! `--source notify` (the table source): claims pending rows from `outbox_events` with
//! `FOR UPDATE SKIP LOCKED`, woken by the gated NOTIFY trigger and a fallback ticker.
//!
//! - `processor`: the loop (drain, arm, wait, drain), two batches in flight.
//! - `listener`: LISTEN/NOTIFY, reconnects, arming of the notify trigger; `signals`: wake reasons
//!   and the arming state machine between processor and listener.
//! - The worker connection and its claims from the table are shared with the wal source (whose
//!   catch-up claims the same way and whose claims by id run on the same connection type): they
//!   live in [`crate::source::store`].

pub(crate) mod listener;
pub(crate) mod processor;
pub(crate) mod signals;
