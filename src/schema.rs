//! The outbox's PostgreSQL schema (`--schema`) as one validated name, and every form the relay
//! applies it in.
//!
//! The name is checked once, here: a plain lowercase identifier, so that each form below is
//! written without quoting rules of its own and no caller builds SQL from an unchecked string.
//!
//! Forms that live in the SQL of the migrations, computed there from `current_schema()` when the
//! migration runs (so that writers and the relay read them from the database, never from here):
//! - the NOTIFY channel: `outbox_event` in `public`, `outbox_event_<schema>` up to 50 characters,
//!   else `outbox_event_<md5 of the schema>` (`outbox_wakeup()`, version 2), with the arming key
//!   beside it;
//! - the publication of `--source wal`: `outbox_relay`, `outbox_relay_<schema>` or
//!   `outbox_relay_<md5>` by the same rule (`outbox_wal_publication()`, version 5).

use std::fmt;

use crate::error::{Error, Result};

/// Default replication slot of `Source::Wal` (with a schema: `outbox_relay_<schema>`).
pub const DEFAULT_SLOT: &str = "outbox_relay";

/// A validated outbox schema name: 1 to 63 characters of `a-z`, `0-9` and `_`, not starting with
/// a digit.
///
/// ```
/// use outbox_relay::Schema;
///
/// let schema = Schema::new("billing")?;
/// assert_eq!(schema.as_str(), "billing");
/// assert_eq!(schema.slot_name(), "outbox_relay_billing");
/// assert!(Schema::new("Billing; DROP").is_err());
/// assert_eq!(Schema::optional(None)?, None);
/// # Ok::<(), outbox_relay::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema(String);

impl Schema {
    /// Checks `name`; the error is a usage error naming the field `schema`.
    pub fn new(name: impl Into<String>) -> Result<Schema> {
        let name = name.into();
        let mut chars = name.chars();
        let ok = matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && name.len() <= 63;
        if ok {
            Ok(Schema(name))
        } else {
            Err(Error::config(
                "schema",
                format!("{name:?} is not a plain lowercase identifier (a-z, 0-9, _)"),
            ))
        }
    }

    /// [`Schema::new`] for an optional setting (`None`: the connection's own search_path).
    pub fn optional(name: Option<&str>) -> Result<Option<Schema>> {
        name.map(Schema::new).transpose()
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The name as an SQL identifier, double-quoted (it never holds a quote).
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// `SET LOCAL search_path TO "<schema>"`: how every pooled connection applies the schema, one
    /// transaction at a time, leaving nothing on the connection after it (a transaction pooler can
    /// share it).
    pub fn set_local_search_path(&self) -> String {
        format!("SET LOCAL search_path TO {}", self.quoted())
    }

    /// `url` with `search_path` set to the schema in its session (the `options` parameter), for a
    /// connection that is never pooled (LISTEN, replication control). The result is a key=value
    /// string holding every parameter of `url`; a URL that sets `options` itself is refused.
    pub fn session_url(&self, url: &str) -> Result<String> {
        self.session_url_for(url, "database_url")
    }

    /// [`Schema::session_url`], with errors about the URL itself naming `field`.
    pub(crate) fn session_url_for(&self, url: &str, field: &'static str) -> Result<String> {
        let mut info = crate::db::conninfo::ConnInfo::parse(url, field)?;
        if info.get("options").is_some() {
            return Err(Error::config(
                "schema",
                "the database URL already sets `options`; put search_path there instead of --schema",
            ));
        }
        info.set("options", format!("-c search_path={}", self.0));
        Ok(info.to_conninfo())
    }

    /// The replication slot `--source wal` streams from unless one is named: `outbox_relay` in
    /// `public` (as without a schema), else `outbox_relay_<schema>`, cut to PostgreSQL's 63
    /// characters. Slots are cluster-wide, so each outbox gets its own.
    pub fn slot_name(&self) -> String {
        if self.0 == "public" {
            return DEFAULT_SLOT.to_string();
        }
        let mut name = format!("{}_{}", DEFAULT_SLOT, self.0);
        name.truncate(63);
        name
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Schema {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::field_of;

    #[test]
    fn only_plain_lowercase_identifiers_are_schemas() {
        for ok in ["app", "_x", "a1_b", &"a".repeat(63)] {
            assert_eq!(Schema::new(ok).expect(ok).as_str(), ok);
        }
        for bad in [
            "",
            "App",
            "1a",
            "a-b",
            "a b",
            "x;drop",
            "a\"b",
            &"a".repeat(64),
        ] {
            let err = Schema::new(bad).expect_err(bad);
            assert!(err.is_usage(), "{bad}");
            assert_eq!(field_of(Schema::new(bad)), Some("schema"), "{bad}");
        }
        assert_eq!(Schema::optional(None).expect("none"), None);
        assert_eq!(field_of(Schema::optional(Some("A"))), Some("schema"));
    }

    #[test]
    fn forms_of_the_schema() {
        let app = Schema::new("app").expect("app");
        assert_eq!(
            app.set_local_search_path(),
            "SET LOCAL search_path TO \"app\""
        );
        assert_eq!(app.quoted(), "\"app\"");
        assert_eq!(app.slot_name(), "outbox_relay_app");
        assert_eq!(
            Schema::new("public").expect("public").slot_name(),
            "outbox_relay"
        );
        let long = Schema::new("s".repeat(63)).expect("long");
        assert_eq!(long.slot_name().len(), 63);
    }

    #[test]
    fn session_urls_add_options_to_any_form() {
        let app = Schema::new("app").expect("app");
        let url = app
            .session_url("postgres://u:p@h/db?sslmode=require")
            .expect("url");
        assert_eq!(
            url,
            "user='u' password='p' host='h' dbname='db' sslmode='require' options='-c search_path=app'"
        );
        let url = app.session_url(r"host=h password = 'a \'b'").expect("url");
        assert_eq!(
            url,
            r"host='h' password='a \'b' options='-c search_path=app'"
        );
        for taken in [
            "host=h options = '-c x=y'",
            "postgres://h/db?options=-c%20x%3Dy",
        ] {
            assert_eq!(field_of(app.session_url(taken)), Some("schema"));
        }
        assert_eq!(
            field_of(app.session_url_for("host=h 's3cret", "listen_database_url")),
            Some("listen_database_url")
        );
    }
}
