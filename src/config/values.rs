//! With the `clap` feature: the config's enums (and [`ScriptFormat`]) as `clap::ValueEnum`s, under
//! the names the `outbox-relay` command accepts, so that a command line built on the library takes
//! the same values.

use super::{
    HeaderFormat, NotifyMode, Ordering, PublishBatches, Source, TransactionMode, WalMarking,
};
use crate::migrate::ScriptFormat;

/// `clap::ValueEnum` with the values the `outbox-relay` command accepts. Written out rather than
/// derived: the derive would turn each variant's documentation into help text of its value, and
/// so change `--help` and the man pages.
macro_rules! value_enum {
    ($($ty:ident { $($variant:ident = $name:literal),+ $(,)? })+) => {$(
        #[cfg_attr(docsrs, doc(cfg(feature = "clap")))]
        impl clap::ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($ty::$variant),+]
            }

            fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
                Some(clap::builder::PossibleValue::new(match self {
                    $($ty::$variant => $name),+
                }))
            }
        }
    )+};
}

value_enum! {
    Ordering { Aggregate = "aggregate", None = "none" }
    NotifyMode { Gated = "gated", Always = "always", Poll = "poll" }
    Source { Notify = "notify", Wal = "wal" }
    WalMarking { Delete = "delete", Update = "update" }
    HeaderFormat { Outbox = "outbox", CloudEvents = "cloudevents", Both = "both" }
    TransactionMode { Events = "events", Atomic = "atomic" }
    PublishBatches { Off = "off", FastIngest = "fast-ingest" }
    ScriptFormat { Script = "script", Bare = "bare", Goose = "goose" }
}
