//! [`PostgresConfig`]: where the outbox is and how to talk to it.

use crate::error::{Error, Result};
use crate::schema::Schema;

use super::DatabaseUrl;

/// PostgreSQL: where the outbox is and how to talk to it. TLS settings are the connection
/// string's own (`sslmode`, `sslrootcert`, ...).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// The database holding `outbox_events` (`--database-url`).
    pub url: DatabaseUrl,
    /// A separate URL for the LISTEN and replication-control connection (for example direct to
    /// PostgreSQL when `url` goes through PgBouncer in transaction mode). Defaults to `url`.
    pub listen_url: Option<DatabaseUrl>,
    /// Schema holding the outbox objects (`None`: the connection's search_path, normally
    /// `public`); `validate` checks it as a [`Schema`].
    pub schema: Option<String>,
    /// Prepare the relay's statements once per connection (fastest). Turn off behind a
    /// transaction pooler that does not keep prepared statements between transactions (PgBouncer
    /// before 1.21, or with `max_prepared_statements = 0`): statements are then sent unnamed.
    pub prepared_statements: bool,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: DatabaseUrl::default(),
            listen_url: None,
            schema: None,
            prepared_statements: true,
        }
    }
}

impl PostgresConfig {
    /// Defaults with `url`.
    pub fn new(url: impl Into<DatabaseUrl>) -> Self {
        PostgresConfig {
            url: url.into(),
            ..PostgresConfig::default()
        }
    }

    /// Refuses what the relay cannot connect with; errors name the flag's field.
    pub fn validate(&self) -> Result<()> {
        if self.url.expose().trim().is_empty() {
            return Err(Error::config("database_url", "is required"));
        }
        crate::db::parse_config(self.url.expose(), "database_url")?;
        if let Some(url) = &self.listen_url {
            crate::db::parse_config(url.expose(), "listen_database_url")?;
        }
        Schema::optional(self.schema.as_deref())?;
        Ok(())
    }

    /// The LISTEN (and replication-control) connection's URL: `listen_url` or `url`, with the
    /// schema in its session. That connection is never pooled (LISTEN needs a session of its own);
    /// the worker connections apply the schema per transaction instead, so that they work through
    /// a transaction pooler, which refuses the `options` startup parameter.
    pub(super) fn session_url(&self, schema: Option<&Schema>) -> Result<String> {
        let listen = self.listen_url.as_ref().unwrap_or(&self.url).expose();
        match schema {
            Some(schema) => schema.session_url_for(listen, "listen_database_url"),
            None => Ok(listen.to_string()),
        }
    }
}
