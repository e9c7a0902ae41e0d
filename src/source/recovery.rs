//! Recovery after a failed batch and the pauses of both sources, written once: which connections
//! to drop, when to fall back to unnamed statements, how long to wait (the wait itself yields to
//! shutdown: [`crate::stop::pause`]).

use std::time::Duration;

use backoff::backoff::Backoff;

use crate::source::store::{Prepare, Store};

/// After a failed batch (either source): connections that may be broken are dropped (the next
/// claim reconnects); the broker's outage needs nothing but the pause.
pub(crate) fn recover<'s, X: Prepare + 's>(
    stores: impl IntoIterator<Item = &'s mut Store<X>>,
    e: &crate::error::Error,
) {
    if e.is_broker_unavailable() {
        return;
    }
    if e.is_prepared_statement_lost() {
        // Behind a transaction pooler that keeps no prepared statements
        // (--prepared-statements true by mistake): unnamed from now on.
        tracing::warn!("prepared statements do not survive between transactions on this connection (a transaction pooler?): sending them unnamed; set --prepared-statements false");
        stores.into_iter().for_each(Store::stop_preparing);
    } else {
        stores.into_iter().for_each(Store::reset);
    }
}

/// The next pause of a trouble backoff (either source).
pub(crate) fn next_delay(
    backoff: &mut backoff::exponential::ExponentialBackoff<backoff::SystemClock>,
) -> Duration {
    backoff.next_backoff().unwrap_or(Duration::from_secs(10))
}
