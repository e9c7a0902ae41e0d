//! How the worker connection sends its statements ([`Stmt`]: prepared once per connection, or
//! unnamed behind a transaction pooler) and what each of its transactions starts with
//! ([`Session`]). Apart from the connection itself, since the wal source prepares its own
//! statements the same way.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Statement};

use crate::error::Result;
use crate::schema::Schema;

const BEGIN_CLAIM: &str = include_str!("../../../sql/queries/table/begin_claim.sql");

/// A statement of the relay: prepared once per connection, or sent unnamed (parsed and planned
/// each time) where a transaction pooler does not keep prepared statements between transactions.
pub(crate) enum Stmt {
    Prepared(Statement),
    Unnamed(&'static str, &'static [Type]),
}

impl Stmt {
    pub(crate) async fn new(
        client: &Client,
        sql: &'static str,
        types: &'static [Type],
        prepare: bool,
    ) -> Result<Stmt> {
        Ok(if prepare {
            Stmt::Prepared(client.prepare_typed(sql, types).await?)
        } else {
            Stmt::Unnamed(sql, types)
        })
    }

    pub(crate) async fn query_raw(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<tokio_postgres::RowStream, tokio_postgres::Error> {
        match self {
            Stmt::Prepared(statement) => client.query_raw(statement, params.iter().copied()).await,
            Stmt::Unnamed(sql, types) => {
                let typed = params.iter().copied().zip(types.iter().cloned());
                client.query_typed_raw(sql, typed).await
            }
        }
    }

    pub(crate) async fn execute(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        match self {
            Stmt::Prepared(statement) => client.execute(statement, params).await,
            Stmt::Unnamed(sql, types) => {
                let typed: Vec<(&(dyn ToSql + Sync), Type)> =
                    params.iter().copied().zip(types.iter().cloned()).collect();
                client.execute_typed(sql, &typed).await
            }
        }
    }
}

/// How the worker connection talks to PostgreSQL: what a transaction starts with and whether
/// statements are prepared.
#[derive(Clone)]
pub(crate) struct Session {
    /// `BEGIN` with the transaction-local settings (search_path for `--schema`, planner
    /// settings): nothing stays on the connection after the transaction, so a transaction pooler
    /// can share it.
    pub(super) begin: String,
    /// `--schema` applied to one statement run outside a claim.
    wrap: Option<String>,
    pub(super) prepare: bool,
}

impl Session {
    pub fn new(schema: Option<&Schema>, prepare: bool) -> Session {
        let path = schema.map(|s| format!("{};\n", s.set_local_search_path()));
        // After the planner settings: the order of `SET LOCAL`s does not matter.
        let begin = match &path {
            Some(path) => format!("{BEGIN_CLAIM}{path}"),
            None => BEGIN_CLAIM.to_string(),
        };
        Session {
            begin,
            wrap: path,
            prepare,
        }
    }

    /// This session with `sql` (transaction-local settings of the caller's) also run at the
    /// start of every transaction, after the claim's own.
    pub fn begin_with(mut self, sql: &str) -> Session {
        self.begin.push_str(sql);
        self
    }

    /// `sql` (a statement that needs the outbox's schema) as a batch of its own.
    pub(super) fn batch(&self, sql: &str) -> String {
        match &self.wrap {
            Some(path) => format!("BEGIN;\n{path}{sql};\nCOMMIT"),
            None => sql.to_string(),
        }
    }
}
