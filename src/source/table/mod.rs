//! `--source notify` (the table source): claims pending rows from `outbox_events` with
//! `FOR UPDATE SKIP LOCKED`, woken by the gated NOTIFY trigger and a fallback ticker.
//!
//! - `processor`: the loop (drain, arm, wait, drain), two batches in flight.
//! - `listener`: LISTEN/NOTIFY, reconnects, arming of the notify trigger; `signals`: wake reasons
//!   and the arming state machine between processor and listener.
//! - `store`: the worker connection and every query of a claim from the table (`sql/queries`);
//!   the wal source builds its own claims on the same connection type.

pub(crate) mod listener;
pub(crate) mod processor;
pub(crate) mod signals;
pub(crate) mod store;
