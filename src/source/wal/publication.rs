//! This outbox's publication (`--source wal`): whether it publishes every insert into the outbox's
//! table, how `migrate --wal` makes it so, and what a stream's error about it means. A publication
//! changed by hand would otherwise be streamed from in silence: pgoutput sends nothing for a table
//! the publication leaves out, and those rows are in no stream, ever.

use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

const PUBLICATION_STATE: &str = include_str!("../../../sql/queries/wal/publication_state.sql");

/// What PostgreSQL says about this outbox's publication (`publication_state.sql`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Publication {
    pub name: String,
    /// `schema.outbox_events`, for messages.
    pub table: String,
    /// The outbox table's schema (as the replication stream names it).
    pub schema: String,
    /// The outbox table: a publication for all tables streams others too, which are not events.
    pub table_oid: Option<u32>,
    pub exists: bool,
    pub inserts: bool,
    pub all_tables: bool,
    /// The table is in it (by name, by schema, or for all tables).
    pub lists_table: bool,
    /// A row filter, or a column list without the columns the relay reads.
    pub filtered: bool,
    pub statements: Statements,
}

/// `migrate --wal`'s statements for it, with its names quoted by PostgreSQL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Statements {
    create: String,
    publish_inserts: String,
    add_table: String,
    drop_table: String,
}

/// Why a publication does not publish every insert into the outbox's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flaw {
    Missing,
    NoInserts,
    NoTable,
    Filtered,
}

impl Flaw {
    fn describe(self) -> &'static str {
        match self {
            Flaw::Missing => "it does not exist",
            Flaw::NoInserts => "its publish setting has no insert",
            Flaw::NoTable => "the table is not in it",
            Flaw::Filtered => "a row filter or a column list leaves some out",
        }
    }
}

impl Publication {
    /// Reads it in `client`'s session (whose search_path names the outbox's schema).
    pub async fn read<C: GenericClient + Sync>(client: &C) -> Result<Publication> {
        let row = client.query_typed_one(PUBLICATION_STATE, &[]).await?;
        Ok(Publication {
            name: row.try_get("name")?,
            table: row.try_get("table_name")?,
            schema: row.try_get("table_schema")?,
            table_oid: row.try_get("table_oid")?,
            exists: row.try_get("publication_exists")?,
            inserts: row.try_get("publishes_inserts")?,
            all_tables: row.try_get("all_tables")?,
            lists_table: row.try_get("lists_table")?,
            filtered: row.try_get("filters_table")?,
            statements: Statements {
                create: row.try_get("create_statement")?,
                publish_inserts: row.try_get("publish_statement")?,
                add_table: row.try_get("add_statement")?,
                drop_table: row.try_get("drop_statement")?,
            },
        })
    }

    /// What keeps it from publishing every insert into the outbox's table (none: it does).
    pub fn flaws(&self) -> Vec<Flaw> {
        if !self.exists {
            return vec![Flaw::Missing];
        }
        let mut flaws = Vec::new();
        if !self.inserts {
            flaws.push(Flaw::NoInserts);
        }
        if !self.lists_table {
            flaws.push(Flaw::NoTable);
        } else if self.filtered {
            flaws.push(Flaw::Filtered);
        }
        flaws
    }

    /// Its flaws in words (`None`: none).
    pub fn flaws_described(&self) -> Option<String> {
        let flaws = self.flaws();
        (!flaws.is_empty()).then(|| {
            flaws
                .iter()
                .map(|f| f.describe())
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// What is wrong with it, for messages (`None`: nothing).
    pub fn problem(&self) -> Option<String> {
        let flaws = self.flaws_described()?;
        Some(if self.exists {
            format!(
                "publication {} does not publish the inserts into {} ({flaws})",
                self.name, self.table
            )
        } else {
            format!("publication {} does not exist", self.name)
        })
    }

    /// The relay's refusal to stream from it (the binary exits 1), with the fix.
    pub fn refusal(&self) -> Option<Error> {
        let problem = self.problem()?;
        let fix = if self.exists {
            ", which repairs it (the events written meanwhile are caught up from the table)"
        } else {
            ""
        };
        Some(Error::replication(
            format!("{problem}: run `outbox-relay migrate --wal`{fix}"),
            false,
        ))
    }

    /// The statements that make it publish every insert into the outbox's table, in order. A
    /// publication for all tables keeps that form (only its publish setting may need repair).
    pub fn repair(&self) -> Vec<&str> {
        let s = &self.statements;
        let mut out = Vec::new();
        for flaw in self.flaws() {
            match flaw {
                Flaw::Missing => out.push(s.create.as_str()),
                Flaw::NoInserts => out.push(s.publish_inserts.as_str()),
                Flaw::NoTable => out.push(s.add_table.as_str()),
                // Added again, without its filter or column list.
                Flaw::Filtered => out.extend([s.drop_table.as_str(), s.add_table.as_str()]),
            }
        }
        out
    }
}

/// Whether `error` (the replication stream's) is pgoutput not finding `publication`: it looks the
/// publication up as of each change it decodes, so one dropped and created again after the slot's
/// position is missing for the changes written in between, on every start of the stream.
pub(crate) fn missing_in_stream(error: &str, publication: &str) -> bool {
    error.contains(&format!("publication \"{publication}\" does not exist"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Publication {
        Publication {
            name: "outbox_relay".into(),
            table: "public.outbox_events".into(),
            schema: "public".into(),
            table_oid: Some(16384),
            exists: true,
            inserts: true,
            all_tables: false,
            lists_table: true,
            filtered: false,
            statements: Statements {
                create: "create".into(),
                publish_inserts: "publish".into(),
                add_table: "add".into(),
                drop_table: "drop".into(),
            },
        }
    }

    #[test]
    fn a_publication_of_every_insert_into_the_table_needs_nothing() {
        let p = healthy();
        assert!(p.flaws().is_empty());
        assert!(p.problem().is_none() && p.refusal().is_none());
        assert!(p.repair().is_empty());
        // For all tables: the table is listed like any other.
        let all = Publication {
            all_tables: true,
            ..healthy()
        };
        assert!(all.repair().is_empty());
    }

    #[test]
    fn each_flaw_has_its_repair_and_the_refusal_names_the_fix() {
        let missing = Publication {
            exists: false,
            inserts: false,
            lists_table: false,
            ..healthy()
        };
        assert_eq!(missing.flaws(), [Flaw::Missing]);
        assert_eq!(missing.repair(), ["create"]);
        assert_eq!(
            missing.refusal().map(|e| e.to_string()).as_deref(),
            Some("publication outbox_relay does not exist: run `outbox-relay migrate --wal`")
        );
        let changed = Publication {
            inserts: false,
            lists_table: false,
            ..healthy()
        };
        assert_eq!(changed.flaws(), [Flaw::NoInserts, Flaw::NoTable]);
        assert_eq!(changed.repair(), ["publish", "add"]);
        let message = changed.refusal().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.starts_with("publication outbox_relay does not publish the inserts into public.outbox_events (its publish setting has no insert; the table is not in it): run `outbox-relay migrate --wal`"), "{message}");
        let filtered = Publication {
            filtered: true,
            ..healthy()
        };
        assert_eq!(filtered.flaws(), [Flaw::Filtered]);
        assert_eq!(filtered.repair(), ["drop", "add"]);
        let all_without_inserts = Publication {
            all_tables: true,
            inserts: false,
            ..healthy()
        };
        assert_eq!(all_without_inserts.repair(), ["publish"]);
    }

    #[test]
    fn pgoutputs_missing_publication_is_told_from_other_errors() {
        let e = "replication connection: server error: publication \"outbox_relay\" does not exist (SQLSTATE 42704)";
        assert!(missing_in_stream(e, "outbox_relay"));
        assert!(!missing_in_stream(e, "outbox_relay_app"));
        assert!(!missing_in_stream(
            "replication connection: server error: terminating connection due to administrator command (SQLSTATE 57P01)",
            "outbox_relay"
        ));
    }
}
