//! The stream: the server's version and the stream's settings checked at start, the stream
//! created with `--create-stream`, and which subjects it captures.

use std::time::Duration;

use async_nats::jetstream::{self, stream};

use crate::error::{Error, Result};

use super::Publisher;

/// Duplicate window of streams created by `--create-stream`.
pub const MIN_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Whether a nats-server of `version` takes atomic batches (2.12 and later).
pub(crate) fn takes_atomic_batches(version: &str) -> bool {
    server_at_least(version, (2, 12))
}

/// Whether a nats-server of `version` takes fast-ingest batches (2.14 and later).
pub(crate) fn takes_fast_batches(version: &str) -> bool {
    server_at_least(version, (2, 14))
}

fn server_at_least(version: &str, wanted: (u64, u64)) -> bool {
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= wanted
}

/// Whether the stream subject `filter` captures `subject` (`*` one token, `>` the rest).
pub(super) fn subject_matches(filter: &str, subject: &str) -> bool {
    let mut filter = filter.split('.');
    let mut subject = subject.split('.');
    loop {
        match (filter.next(), subject.next()) {
            (Some(">"), Some(_)) => return true,
            (None, None) => return true,
            (Some(f), Some(s)) if f == "*" || f == s => {}
            _ => return false,
        }
    }
}

impl Publisher {
    /// Checks (or creates) the stream and warns when its duplicate window is shorter than the
    /// longest gap between two publishes of one row.
    pub async fn ensure_stream(&self) -> Result<()> {
        if self.atomic {
            // A server before 2.12 drops allow_atomic from a stream's config and stores a batch's
            // messages one by one: it would not fail, it would not be atomic either.
            let version = self.client.server_info().version;
            if !takes_atomic_batches(&version) {
                return Err(Error::stream(format!(
                    "--transactions atomic needs nats-server 2.12 or later (atomic batches); this server is {version}: upgrade it, or run with --transactions events"
                )));
            }
        }
        if self.fast {
            // A server before 2.14 drops allow_batched from a stream's config and answers no
            // fast-ingest batch.
            let version = self.client.server_info().version;
            if !takes_fast_batches(&version) {
                return Err(Error::stream(format!(
                    "--publish-batches fast-ingest needs nats-server 2.14 or later (fast-ingest batches); this server is {version}: upgrade it, or run with --publish-batches off"
                )));
            }
        }
        let info = match self.js.get_stream(&self.stream).await {
            Ok(mut s) => s
                .info()
                .await
                .map_err(|e| {
                    Error::broker_unavailable(format!(
                        "cannot read the info of stream {}",
                        self.stream
                    ))
                    .caused_by(e)
                })?
                .clone(),
            Err(e) if self.create_stream && is_not_found(&e) => {
                // validate() refused create_stream for a template no stream subject can capture.
                let subject = self.subjects.stream_subject().ok_or_else(|| {
                    Error::config(
                        "subject_template",
                        "starts with a placeholder: create the stream yourself",
                    )
                })?;
                self.create_stream(subject).await?
            }
            Err(e) if is_not_found(&e) => {
                return Err(Error::stream(format!(
                    "stream {} does not exist: create it, or pass --create-stream",
                    self.stream
                )))
            }
            Err(e) => {
                // No answer from JetStream (starting, no leader yet): wait for it.
                return Err(Error::broker_unavailable(format!(
                    "cannot look up stream {}",
                    self.stream
                ))
                .caused_by(e));
            }
        };
        if self.atomic && !info.config.allow_atomic_publish {
            return Err(Error::stream(format!(
                "stream {} does not take atomic batches, which --transactions atomic needs: set allow_atomic on it (a stream update; --create-stream sets it on a stream it creates), or run with --transactions events",
                self.stream
            )));
        }
        if self.fast && !info.config.allow_batch_publish {
            return Err(Error::stream(format!(
                "stream {} does not take fast-ingest batches, which --publish-batches fast-ingest needs: set allow_batched on it (a stream update; --create-stream sets it on a stream it creates), or run with --publish-batches off",
                self.stream
            )));
        }
        if let Ok(mut subjects) = self.stream_subjects.lock() {
            subjects.clone_from(&info.config.subjects);
        }
        self.stream_max_msg_size.store(
            i64::from(info.config.max_message_size),
            std::sync::atomic::Ordering::Relaxed,
        );
        let gap = self.redelivery_gap;
        if info.config.duplicate_window < gap {
            tracing::warn!(
                stream = %self.stream,
                duplicate_window = ?info.config.duplicate_window,
                longest_redelivery_gap = ?gap,
                "the stream's duplicate window is shorter than the longest redelivery gap: a row retried after the window can be stored twice"
            );
        }
        Ok(())
    }

    /// Creates the stream on `subject` (file storage, a duplicate window covering redeliveries).
    async fn create_stream(&self, subject: String) -> Result<stream::Info> {
        let window = MIN_DUPLICATE_WINDOW.max(self.redelivery_gap);
        tracing::info!(stream = %self.stream, subject = %subject, duplicate_window = ?window, "creating stream");
        let mut s = self
            .js
            .create_stream(stream::Config {
                name: self.stream.clone(),
                subjects: vec![subject],
                storage: stream::StorageType::File,
                duplicate_window: window,
                allow_atomic_publish: self.atomic,
                allow_batch_publish: self.fast,
                ..Default::default()
            })
            .await
            .map_err(|e| {
                let message = format!("cannot create stream {}", self.stream);
                // JetStream answered and refused: for the operator. Else: not up yet.
                if matches!(
                    e.kind(),
                    jetstream::context::CreateStreamErrorKind::JetStream(_)
                ) {
                    Error::stream(message).caused_by(e)
                } else {
                    Error::broker_unavailable(message).caused_by(e)
                }
            })?;
        let info = s.info().await.map_err(|e| {
            Error::broker_unavailable(format!("cannot read the info of stream {}", self.stream))
                .caused_by(e)
        })?;
        Ok(info.clone())
    }
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref js)
        if js.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_batches_need_nats_server_2_12() {
        for (version, takes) in [
            ("2.9.10", false),
            ("2.11.4", false),
            ("2.12.0", true),
            ("2.12.0-RC.1", true),
            ("2.15.1", true),
            ("3.0.0", true),
            ("", false),
            ("garbage", false),
        ] {
            assert_eq!(takes_atomic_batches(version), takes, "{version}");
        }
    }

    #[test]
    fn fast_ingest_batches_need_nats_server_2_14() {
        for (version, takes) in [
            ("2.9.10", false),
            ("2.12.3", false),
            ("2.14.0", true),
            ("2.14.0-RC.1", true),
            ("2.15.1", true),
            ("3.0.0", true),
            ("", false),
        ] {
            assert_eq!(takes_fast_batches(version), takes, "{version}");
        }
    }

    #[test]
    fn stream_subjects_capture_as_nats_does() {
        for (filter, subject, captures) in [
            ("outbox.>", "outbox.order.created", true),
            ("outbox.>", "outbox", false),
            ("outbox.*", "outbox.created", true),
            ("outbox.*", "outbox.order.created", false),
            ("outbox.*.created", "outbox.order.created", true),
            ("outbox.order", "outbox.order", true),
            ("outbox.order", "outbox.orders", false),
            ("other.>", "outbox.order.created", false),
        ] {
            assert_eq!(
                subject_matches(filter, subject),
                captures,
                "{filter} {subject}"
            );
        }
    }
}
