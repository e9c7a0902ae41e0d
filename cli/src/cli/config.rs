//! `run`'s flags into the library's configuration: each section from its flags, on top of the
//! section's defaults.

use outbox_relay::config::{
    BatchConfig, MetricsConfig, NatsConfig, PostgresConfig, PublishConfig, RetentionConfig,
    RetryConfig, Secret, SourceConfig, WalConfig,
};
use outbox_relay::RelayConfig;

use super::run::{
    BatchArgs, MetricsArgs, NatsArgs, PostgresArgs, PublishArgs, RetentionArgs, RetryArgs, RunArgs,
    SourceArgs, WalArgs,
};

impl RunArgs {
    /// The relay's configuration: each section from its flags.
    pub fn into_config(self, database_url: String, schema: Option<String>) -> RelayConfig {
        let mut config = RelayConfig::new(database_url);
        config.postgres = self.postgres.into_config(config.postgres, schema);
        config.nats = self.nats.into();
        config.publish = self.publish.into();
        config.batch = self.batch.into();
        config.retry = self.retry.into();
        config.source = self.source.into();
        config.wal = self.wal.into();
        config.retention = self.retention.into();
        config.metrics = self.metrics.into();
        config
    }
}

impl PostgresArgs {
    fn into_config(self, mut c: PostgresConfig, schema: Option<String>) -> PostgresConfig {
        c.listen_url = self.listen_database_url.map(Into::into);
        c.schema = schema;
        c.prepared_statements = self.prepared_statements;
        c
    }
}

/// An empty flag or variable (`NATS_USER=`) counts as not given.
fn non_empty(value: Option<String>) -> Option<Secret> {
    value.filter(|v| !v.is_empty()).map(Secret::from)
}

impl From<NatsArgs> for NatsConfig {
    fn from(a: NatsArgs) -> Self {
        let mut c = NatsConfig::default();
        c.url = a.nats_url.into();
        c.creds = a.nats_creds;
        c.nkey = a.nats_nkey;
        c.user = non_empty(a.nats_user);
        c.password = non_empty(a.nats_password);
        c.tls_ca = a.nats_tls_ca;
        c.tls_cert = a.nats_tls_cert;
        c.tls_key = a.nats_tls_key;
        c.stream = a.stream;
        c.create_stream = a.create_stream;
        c
    }
}

impl From<PublishArgs> for PublishConfig {
    fn from(a: PublishArgs) -> Self {
        let mut c = PublishConfig::default();
        c.subject_prefix = a.subject_prefix;
        c.subject_template = a.subject_template;
        c.header_format = a.headers;
        c.ce_source = a.ce_source;
        c.timeout = a.publish_timeout.into();
        c.transactions = a.transactions;
        c.batches = a.publish_batches;
        c
    }
}

impl From<BatchArgs> for BatchConfig {
    fn from(a: BatchArgs) -> Self {
        let mut c = BatchConfig::default();
        c.size = a.batch_size;
        c.max_bytes = a.max_batch_bytes.0;
        c.ordering = a.ordering;
        c
    }
}

impl From<RetryArgs> for RetryConfig {
    fn from(a: RetryArgs) -> Self {
        let mut c = RetryConfig::default();
        c.max_attempts = a.max_attempts;
        c.initial = a.retry_initial.into();
        c.max = a.retry_max.into();
        c
    }
}

impl From<SourceArgs> for SourceConfig {
    fn from(a: SourceArgs) -> Self {
        let mut c = SourceConfig::default();
        c.source = a.source;
        c.notify_mode = a.notify_mode;
        c.fallback_interval = a.fallback_interval.into();
        c
    }
}

impl From<WalArgs> for WalConfig {
    fn from(a: WalArgs) -> Self {
        let mut c = WalConfig::default();
        c.slot_name = a.slot_name;
        c.marking = a.wal_marking;
        c
    }
}

impl From<RetentionArgs> for RetentionConfig {
    fn from(a: RetentionArgs) -> Self {
        let mut c = RetentionConfig::default();
        c.processed = a.retention;
        c.processed_events = a.processed_events_retention;
        c
    }
}

impl From<MetricsArgs> for MetricsConfig {
    fn from(a: MetricsArgs) -> Self {
        let mut c = MetricsConfig::default();
        c.event_types_max = a.metrics_event_types_max;
        c.addr = a.metrics_addr.0;
        c
    }
}
