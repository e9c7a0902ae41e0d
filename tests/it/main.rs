//! The integration tests, in one binary with one module per area. Tests share one throwaway
//! PostgreSQL cluster (`testkit::shared_pg`, a database each); the ones that stop, kill or
//! reconfigure PostgreSQL start a cluster of their own. Servers and helpers come from `testkit/`.
//!
//! `cargo test --test it` runs them all, `cargo test --test it relay::` one module. The modules of
//! the optional features run with `cargo test --all-features --test it -- otel:: sqlx_writer::`.

/// Runs each `async fn name(source: Source)` for both sources, as the tests `name::notify` (the
/// table source) and `name::wal`: every guarantee holds for both (for the wal source with its slot in place, so that
/// the rows written are streamed). `for_each_source!(blocking name, ...)`: the same for a plain
/// `fn name(source: Source)` that builds its own runtime.
macro_rules! for_each_source {
    (blocking $($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[test]
                fn notify() {
                    super::$name(outbox_relay::Source::Notify)
                }

                #[test]
                fn wal() {
                    super::$name(outbox_relay::Source::Wal)
                }
            }
        )+
    };
    ($($name:ident),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn notify() {
                    super::$name(outbox_relay::Source::Notify).await
                }

                #[tokio::test]
                async fn wal() {
                    super::$name(outbox_relay::Source::Wal).await
                }
            }
        )+
    };
}

mod arbitrary_rows;
mod atomic;
mod atomic_poison;
mod chaos;
mod cli;
mod clock;
mod cluster;
mod console;
mod console_browser;
mod deploy_files;
mod edges;
mod fast_ingest;
mod faults;
mod harness;
mod logs;
mod mapping;
mod migration_tools;
mod observability;
#[cfg(feature = "otel")]
mod otel;
mod poison;
mod pooler;
mod privileges;
mod relay;
mod retention;
mod routing;
mod security;
mod shutdown;
#[cfg(feature = "sqlx")]
mod sqlx_writer;
mod tls;
mod transactions;
mod wakeup;
mod wal;
mod wal_content;
mod wal_memory;
mod wal_publication;
mod wal_questions;
mod wal_sweep;
mod wal_truth;
mod wal_visibility;

/// The workspace's root, where the files the tests check are: the tests are a target of the
/// command's package (`cli/`).
fn repo_root() -> &'static std::path::Path {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The harness runs the binary cargo built for this test target.
#[test]
fn harness_runs_this_builds_relay_binary() {
    assert_eq!(
        testkit::relay_bin(),
        std::path::Path::new(env!("CARGO_BIN_EXE_outbox-relay"))
    );
}
