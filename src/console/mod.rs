//! The operator console: a small server-rendered web application for one outbox (status, blocked
//! aggregates, dead letters, and retry or discard of one, some or every matching dead letter).
//!
//! [`router`] builds it as an [`axum::Router`] that an application mounts in its own server (or
//! `outbox-relay console` serves). Every request needs the token (a login form that sets an
//! HttpOnly, SameSite=Strict session cookie, or `Authorization: Bearer`); actions are POSTs with a
//! same-origin check and a per-session CSRF token; everything a row holds is escaped, and the
//! Content-Security-Policy allows no script at all.
//!
//! ```no_run
//! # async fn example() -> outbox_relay::Result<()> {
//! use outbox_relay::console::{self, ConsoleConfig, Database};
//!
//! let config = ConsoleConfig::new(std::env::var("CONSOLE_TOKEN").unwrap_or_default());
//! let app = console::router(config, Database::url("postgres://ops@db:5432/app"))?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:9465").await?;
//! // The client address goes into the audit log.
//! axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod actions;
mod auth;
mod bulk;
mod pages;
mod queries;
mod routes;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::Client;

use crate::config::Secret;
use crate::error::{Error, Result};

/// The settings of the console. Build it with [`ConsoleConfig::new`] and change the fields you
/// need; [`router`] checks it with [`ConsoleConfig::validate`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConsoleConfig {
    /// What every request must present (login form or bearer header). At least 16 characters.
    pub token: Secret,
    /// The schema holding the outbox (`None`: the connection's search_path). Applied per
    /// transaction with `SET LOCAL search_path`, as the operator commands do.
    pub schema: Option<String>,
    /// Hide and refuse every action: the console only shows.
    pub read_only: bool,
    /// Where the router is mounted (`""` at the root, `"/outbox"` under that prefix): links,
    /// redirects and the cookie path start with it.
    pub base_path: String,
    /// Database connections open at most at once (each request opens its own, short-lived).
    pub max_connections: usize,
    /// Dead letters per transaction of a bulk action.
    pub batch_size: i64,
    /// Rows per page of the dead-letter list.
    pub page_size: i64,
    /// How long a login lasts.
    pub session_ttl: Duration,
}

impl ConsoleConfig {
    /// Defaults for everything but the token: the connection's search_path, actions allowed,
    /// mounted at the root, 4 connections, bulk batches of 500, pages of 50, sessions of 12 h.
    pub fn new(token: impl Into<Secret>) -> Self {
        ConsoleConfig {
            token: token.into(),
            schema: None,
            read_only: false,
            base_path: String::new(),
            max_connections: 4,
            batch_size: 500,
            page_size: 50,
            session_ttl: Duration::from_secs(12 * 3600),
        }
    }

    /// Checks every setting; the error names the field.
    pub fn validate(&self) -> Result<()> {
        let token = self.token.expose();
        if token.trim().len() < 16 {
            return Err(Error::config(
                "token",
                "must be at least 16 characters (a random string, for example from `openssl rand -hex 32`)",
            ));
        }
        if token.chars().any(char::is_control) {
            return Err(Error::config(
                "token",
                "must not contain control characters",
            ));
        }
        if let Some(schema) = &self.schema {
            crate::schema::Schema::new(schema.as_str())?;
        }
        if !self.base_path.is_empty()
            && (!self.base_path.starts_with('/')
                || self.base_path.ends_with('/')
                || self
                    .base_path
                    .chars()
                    .any(|c| !(c.is_ascii_alphanumeric() || "/-_.".contains(c))))
        {
            return Err(Error::config(
                "base_path",
                "must be empty or start with `/`, not end with one, and hold only letters, digits, `-`, `_`, `.` and `/`",
            ));
        }
        if self.max_connections == 0 {
            return Err(Error::config("max_connections", "must be at least 1"));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(Error::config("batch_size", "must be between 1 and 100000"));
        }
        if !(1..=1000).contains(&self.page_size) {
            return Err(Error::config("page_size", "must be between 1 and 1000"));
        }
        if self.session_ttl.is_zero() {
            return Err(Error::config("session_ttl", "must be more than 0"));
        }
        Ok(())
    }
}

type ConnectFuture = Pin<Box<dyn Future<Output = Result<Client>> + Send>>;
type ConnectFn = Arc<dyn Fn() -> ConnectFuture + Send + Sync>;

/// Where the console's connections come from: a connection string ([`crate::connect`], as the
/// relay connects, application name `outbox-relay-console`) or a function of the application's.
#[derive(Clone)]
pub struct Database {
    connect: ConnectFn,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Database { .. }")
    }
}

impl Database {
    /// Connections to `url` (any libpq connection string the relay takes).
    pub fn url(url: impl Into<String>) -> Self {
        let url: Arc<str> = url.into().into();
        Database::connect_with(move || {
            let url = Arc::clone(&url);
            async move { crate::connect(&url, "outbox-relay-console").await }
        })
    }

    /// Connections made by `connect` (for example from the application's own pool settings).
    /// The console drops each when its request is done.
    pub fn connect_with<F, Fut>(connect: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Client>> + Send + 'static,
    {
        Database {
            connect: Arc::new(move || Box::pin(connect())),
        }
    }
}

/// What every handler shares.
pub(crate) struct App {
    pub(crate) config: ConsoleConfig,
    database: Database,
    connections: Arc<Semaphore>,
    pub(crate) sessions: auth::Sessions,
    pub(crate) throttle: auth::Throttle,
    pub(crate) jobs: bulk::Jobs,
    /// The last overview and when it was read: its counts read every pending row and every dead
    /// letter (under a second on a million dead letters with schema version 7, seconds
    /// without it), so browsers reloading it share one reading for [`OVERVIEW_FRESH`], and only
    /// one reading runs at a time. Actions clear it.
    overview: tokio::sync::Mutex<Option<(Instant, Arc<actions::Overview>)>>,
    /// Since when reading the overview has failed (this machine's clock: the database's is what
    /// failed), until a reading works again.
    overview_failing: std::sync::Mutex<Option<crate::timestamp::Timestamp>>,
}

/// How a request proved the token. (Made by the guard in `auth`, read by the handlers and the
/// pages: here, beside [`App`], so that `pages` depends on neither `auth` nor `routes`, which
/// both render pages.)
#[derive(Debug, Clone)]
pub(crate) enum Caller {
    /// A login session: forms carry its CSRF token.
    Session { id: String, csrf: String },
    /// `Authorization: Bearer`: not sent by a browser on its own, so no CSRF token.
    Bearer,
}

/// Who asked, for handlers: how, and from which address (the audit log).
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) caller: Caller,
    pub(crate) addr: Option<std::net::SocketAddr>,
}

impl Identity {
    /// The CSRF token forms of this caller carry (none for bearer callers).
    pub(crate) fn csrf(&self) -> &str {
        match &self.caller {
            Caller::Session { csrf, .. } => csrf,
            Caller::Bearer => "",
        }
    }

    /// The client address for the audit log.
    pub(crate) fn from(&self) -> String {
        self.addr
            .map(|a| a.to_string())
            .unwrap_or_else(|| "unknown".into())
    }
}

/// How long one reading of the overview serves every browser.
const OVERVIEW_FRESH: Duration = Duration::from_secs(5);

impl App {
    /// A connection of its own for one request, within `max_connections`.
    pub(crate) async fn client(&self) -> Result<(Client, OwnedSemaphorePermit)> {
        let permit = Arc::clone(&self.connections)
            .acquire_owned()
            .await
            .map_err(|_| Error::config("max_connections", "the console is shutting down"))?;
        let client = (self.database.connect)().await?;
        Ok((client, permit))
    }

    /// The overview, read again when the last reading is older than [`OVERVIEW_FRESH`].
    pub(crate) async fn overview(&self) -> Result<Arc<actions::Overview>> {
        let mut cached = self.overview.lock().await;
        if let Some((at, overview)) = cached.as_ref() {
            if at.elapsed() < OVERVIEW_FRESH {
                return Ok(Arc::clone(overview));
            }
        }
        let (mut client, _permit) = self.client().await?;
        let overview = Arc::new(actions::overview(&mut client, self.schema()).await?);
        *cached = Some((Instant::now(), Arc::clone(&overview)));
        Ok(overview)
    }

    /// The overview read (`Ok`) or failed (`Err`): since when it has been failing, if it is.
    pub(crate) fn overview_read(&self, ok: bool) -> Option<crate::timestamp::Timestamp> {
        let mut failing = self
            .overview_failing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match ok {
            true => *failing = None,
            false => {
                failing.get_or_insert_with(crate::timestamp::Timestamp::now);
            }
        }
        *failing
    }

    /// After an action: the next overview reads the database again.
    pub(crate) async fn changed(&self) {
        *self.overview.lock().await = None;
    }

    pub(crate) fn schema(&self) -> Option<&str> {
        self.config.schema.as_deref()
    }

    /// `path` under the console's base path (its root is the base path itself: a router nested
    /// at `/outbox` answers `/outbox`, not `/outbox/`).
    pub(crate) fn href(&self, path: &str) -> String {
        if path == "/" && !self.config.base_path.is_empty() {
            return self.config.base_path.clone();
        }
        format!("{}{path}", self.config.base_path)
    }
}

/// The console as a router: pages, actions and the login, behind the token. Fails when `config`
/// does not validate (the error names the field).
pub fn router(config: ConsoleConfig, database: Database) -> Result<axum::Router> {
    config.validate()?;
    let app = Arc::new(App {
        connections: Arc::new(Semaphore::new(config.max_connections)),
        sessions: auth::Sessions::default(),
        throttle: auth::Throttle::default(),
        jobs: bulk::Jobs::default(),
        overview: tokio::sync::Mutex::new(None),
        overview_failing: std::sync::Mutex::new(None),
        database,
        config,
    });
    Ok(routes::router(app))
}
