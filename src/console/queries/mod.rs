//! The console's own statements (`sql/queries/console`): filtered, keyset-paginated dead letters,
//! one event and its followers, the published-per-minute chart and the connected relays. Each
//! runs in a transaction the caller opened with `ops::checked_transaction_in`. One concept a file:
//! `filter` (the list's filter, order and keyset, no SQL), `dead_letters` (the filtered list, its
//! counts, bulk batches and causes), `event` (one event and its followers) and `activity` (the
//! clock, the chart, the relays).

mod activity;
mod dead_letters;
mod event;
mod filter;

pub(crate) use activity::{db_now, per_minute, relays, reported_relays, PerMinute};
pub(crate) use activity::{RelayConnection, ReportedRelay};
pub(crate) use dead_letters::{
    batch, causes, count, filter_time, page, total, Cause, From, ListedDeadLetter,
};
pub(crate) use event::{detail, followers, Detail, Follower};
pub(crate) use filter::{read_time, Filter, Key, Sort, TimeText};
