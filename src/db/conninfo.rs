//! libpq connection strings, parsed as libpq reads them: `postgres://` / `postgresql://` URIs and
//! `key=value` conninfo strings (optional spaces around `=`, single-quoted values, backslash
//! escapes). The relay takes its TLS parameters out of the parsed form, hands the rest to
//! tokio-postgres re-serialised (every value quoted), and shows it in logs with the password
//! replaced: nothing here ever matches on the raw text to find a secret.

use std::fmt;

use crate::error::{Error, Result};

/// Parameters whose values are never shown.
const SECRET_KEYS: &[&str] = &["password", "sslpassword"];

/// What a value is replaced with when shown.
pub(crate) const HIDDEN: &str = "***";

/// A parsed connection string: its parameters in order, each key once (when a key is given twice,
/// the last value wins, as in libpq).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct ConnInfo {
    params: Vec<(String, String)>,
}

impl ConnInfo {
    /// Parses a URI (`postgres://` or `postgresql://`) or a `key=value` string. Errors name `field`
    /// and describe the problem without quoting any of the text.
    pub(crate) fn parse(s: &str, field: &'static str) -> Result<ConnInfo> {
        let s = s.trim();
        for scheme in ["postgresql://", "postgres://"] {
            if let Some(rest) = s.strip_prefix(scheme) {
                return parse_uri(rest, field);
            }
        }
        parse_key_values(s, field)
    }

    /// The value of `key`, if set.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Sets `key`, replacing an earlier value in place.
    pub(crate) fn set(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        match self.params.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.params.push((key.to_string(), value)),
        }
    }

    /// Removes `key` and returns its value.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let pos = self.params.iter().position(|(k, _)| k == key)?;
        Some(self.params.remove(pos).1)
    }

    /// A `key='value'` string with every value quoted and escaped, which libpq and tokio-postgres
    /// parse back to exactly these parameters.
    pub(crate) fn to_conninfo(&self) -> String {
        let mut out = String::new();
        for (key, value) in &self.params {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(key);
            out.push('=');
            push_quoted(&mut out, value);
        }
        out
    }

    /// The parameters as `key=value` for logs, with secret values replaced by `***` (quoted only
    /// where needed).
    pub(crate) fn redacted(&self) -> String {
        let mut out = String::new();
        for (key, value) in &self.params {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(key);
            out.push('=');
            if SECRET_KEYS.contains(&key.as_str()) {
                out.push_str(HIDDEN);
            } else if value.is_empty()
                || value.chars().any(|c| is_space(c) || c == '\'' || c == '\\')
            {
                push_quoted(&mut out, value);
            } else {
                out.push_str(value);
            }
        }
        out
    }
}

/// Never prints a secret.
impl fmt::Debug for ConnInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ConnInfo").field(&self.redacted()).finish()
    }
}

fn push_quoted(out: &mut String, value: &str) {
    out.push('\'');
    for c in value.chars() {
        if c == '\'' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
}

/// Whitespace as C's `isspace` (what libpq skips between parameters).
fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r')
}

/// Every libpq keyword is made of ASCII letters, digits and `_`; anything else is refused before it
/// reaches tokio-postgres (whose parser would split on it) and is never echoed in an error.
fn check_key(key: &str, field: &'static str) -> Result<()> {
    if !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(Error::config(
            field,
            "cannot parse the connection string: a parameter name that is not a connection keyword",
        ))
    }
}

/// libpq's `conninfo_parse`: `key = value` pairs separated by whitespace; a value is either a run
/// of non-space characters or a single-quoted string; a backslash takes the next character
/// literally in both.
fn parse_key_values(s: &str, field: &'static str) -> Result<ConnInfo> {
    let malformed =
        |what: &str| Error::config(field, format!("cannot parse the connection string: {what}"));
    let mut info = ConnInfo::default();
    let mut it = s.chars().peekable();
    loop {
        while it.next_if(|&c| is_space(c)).is_some() {}
        if it.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = it.next_if(|&c| c != '=' && !is_space(c)) {
            key.push(c);
        }
        while it.next_if(|&c| is_space(c)).is_some() {}
        if it.next() != Some('=') {
            return Err(malformed(
                "a parameter name not followed by `=` (expected key=value pairs or a postgres:// URL)",
            ));
        }
        check_key(&key, field)?;
        while it.next_if(|&c| is_space(c)).is_some() {}
        let mut value = String::new();
        if it.next_if_eq(&'\'').is_some() {
            loop {
                match it.next() {
                    Some('\'') => break,
                    Some('\\') => {
                        if let Some(c) = it.next() {
                            value.push(c);
                        }
                    }
                    Some(c) => value.push(c),
                    None => return Err(malformed("a quoted value without its closing quote")),
                }
            }
        } else {
            while let Some(c) = it.next_if(|&c| !is_space(c)) {
                if c == '\\' {
                    if let Some(escaped) = it.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        info.set(&key, value);
    }
    Ok(info)
}

/// libpq's URI form: `[user[:password]@][host[:port][,...]][/dbname][?key=value&...]`, each part
/// percent-decoded. `rest` is what follows the scheme.
///
/// The user part ends at the first `@` that comes before any `/` (libpq's rule); failing that, at
/// the first `@` before any `?`, which also accepts an unencoded `/` in a password, as
/// tokio-postgres always has.
fn parse_uri(rest: &str, field: &'static str) -> Result<ConnInfo> {
    let mut info = ConnInfo::default();
    let first_at = rest.find('@');
    let user_end = match first_at {
        Some(at) if rest[..at].find('/').is_none() => Some(at),
        Some(at) if rest[..at].find('?').is_none() => Some(at),
        _ => None,
    };
    let rest = match user_end {
        Some(at) => {
            let userinfo = &rest[..at];
            let (user, password) = match userinfo.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (userinfo, None),
            };
            let user = decode(user, "the user name", field)?;
            if !user.is_empty() {
                info.set("user", user);
            }
            if let Some(password) = password {
                info.set("password", decode(password, "the password", field)?);
            }
            &rest[at + 1..]
        }
        None => rest,
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (hostspec, dbname) = match rest.split_once('/') {
        Some((hostspec, dbname)) => (hostspec, Some(dbname)),
        None => (rest, None),
    };
    if !hostspec.is_empty() {
        let mut hosts = Vec::new();
        let mut ports = Vec::new();
        for chunk in hostspec.split(',') {
            let (host, port) = if let Some(bracketed) = chunk.strip_prefix('[') {
                let (host, after) = bracketed.split_once(']').ok_or_else(|| {
                    Error::config(field, "cannot parse the URL: an IPv6 host without its `]`")
                })?;
                match after {
                    "" => (host, None),
                    _ => match after.strip_prefix(':') {
                        Some(port) => (host, Some(port)),
                        None => {
                            return Err(Error::config(
                                field,
                                "cannot parse the URL: unexpected text after an IPv6 host",
                            ))
                        }
                    },
                }
            } else {
                match chunk.split_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (chunk, None),
                }
            };
            hosts.push(decode(host, "a host name", field)?);
            ports.push(port.map(|p| decode(p, "a port", field)).transpose()?);
        }
        info.set("host", hosts.join(","));
        if ports.iter().any(Option::is_some) {
            let ports: Vec<String> = ports.into_iter().map(Option::unwrap_or_default).collect();
            info.set("port", ports.join(","));
        }
    }
    if let Some(dbname) = dbname.filter(|d| !d.is_empty()) {
        info.set("dbname", decode(dbname, "the database name", field)?);
    }
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            Error::config(field, "cannot parse the URL: a query parameter without `=`")
        })?;
        let key = decode(key, "a parameter name", field)?;
        check_key(&key, field)?;
        let value = decode(value, "a parameter value", field)?;
        // libpq reads JDBC's `ssl=true` as `sslmode=require`.
        if key == "ssl" && value == "true" {
            info.set("sslmode", "require");
        } else {
            info.set(&key, value);
        }
    }
    Ok(info)
}

fn decode(s: &str, what: &str, field: &'static str) -> Result<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|v| v.into_owned())
        .map_err(|_| {
            Error::config(
                field,
                format!("cannot parse the URL: {what} is not UTF-8 once percent-decoded"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Vec<(String, String)> {
        ConnInfo::parse(s, "database_url")
            .unwrap_or_else(|e| panic!("{s}: {e}"))
            .params
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn key_values_as_libpq_reads_them() {
        assert_eq!(
            parse("host=db password = s3cret  dbname =x\tuser= app"),
            pairs(&[
                ("host", "db"),
                ("password", "s3cret"),
                ("dbname", "x"),
                ("user", "app")
            ])
        );
        assert_eq!(
            parse(r"password='a b' application_name = 'it\'s \\ here' sslmode=require"),
            pairs(&[
                ("password", "a b"),
                ("application_name", r"it's \ here"),
                ("sslmode", "require")
            ])
        );
        // Backslashes escape in unquoted values too; quotes may be followed directly by the next
        // parameter; an empty quoted value is a value.
        assert_eq!(
            parse(r"password=a\ b\'c options='-c x=y'host=h dbname=''"),
            pairs(&[
                ("password", r"a b'c"),
                ("options", "-c x=y"),
                ("host", "h"),
                ("dbname", "")
            ])
        );
        // The last of a repeated key wins, in the place of the first.
        assert_eq!(
            parse("host=a port=1 host=b"),
            pairs(&[("host", "b"), ("port", "1")])
        );
        assert_eq!(parse("  "), pairs(&[]));
        // `=` inside a value is just a character.
        assert_eq!(parse("password==x="), pairs(&[("password", "=x=")]));
    }

    #[test]
    fn malformed_key_values_are_refused_without_echoing_them() {
        for bad in [
            "host=db s3cret",
            "host=db password='s3cret",
            r"password='s3cret\'",
            "=s3cret",
            "pass-word=s3cret",
            "host",
        ] {
            assert_refused_without_echo(bad, "database_url");
        }
    }

    /// `bad` is refused with an error that names `field` and does not show the secret.
    fn assert_refused_without_echo(bad: &str, field: &'static str) {
        let err = ConnInfo::parse(bad, field).expect_err(bad).to_string();
        assert!(err.contains(field), "{err}");
        assert!(!err.contains("s3cret"), "{bad}: {err}");
    }

    #[test]
    fn uris_as_libpq_reads_them() {
        assert_eq!(
            parse("postgres://app:s%40cret@db:5433/my%20db?sslmode=require&application_name=a%26b"),
            pairs(&[
                ("user", "app"),
                ("password", "s@cret"),
                ("host", "db"),
                ("port", "5433"),
                ("dbname", "my db"),
                ("sslmode", "require"),
                ("application_name", "a&b")
            ])
        );
        assert_eq!(
            parse("postgresql://h1,[::1]:5433,h3:5434/db"),
            pairs(&[
                ("host", "h1,::1,h3"),
                ("port", ",5433,5434"),
                ("dbname", "db")
            ])
        );
        assert_eq!(
            parse("postgres:///db?host=%2Fvar%2Frun%2Fpostgresql"),
            pairs(&[("dbname", "db"), ("host", "/var/run/postgresql")])
        );
        assert_eq!(parse("postgres://"), pairs(&[]));
        assert_eq!(
            parse("postgres://h?ssl=true"),
            pairs(&[("host", "h"), ("sslmode", "require")])
        );
        // A query parameter overrides the URL's own part.
        assert_eq!(
            parse("postgres://u:p@h/db?password=q&user=v"),
            pairs(&[
                ("user", "v"),
                ("password", "q"),
                ("host", "h"),
                ("dbname", "db")
            ])
        );
        // An `@` in the query is not a user part; an unencoded `/` or `?` in a password is.
        assert_eq!(
            parse("postgres://h/db?application_name=a@b"),
            pairs(&[("host", "h"), ("dbname", "db"), ("application_name", "a@b")])
        );
        assert_eq!(
            parse("postgres://u:pa/ss@h/db"),
            pairs(&[
                ("user", "u"),
                ("password", "pa/ss"),
                ("host", "h"),
                ("dbname", "db")
            ])
        );
        assert_eq!(
            parse("postgres://u:pa?ss@h"),
            pairs(&[("user", "u"), ("password", "pa?ss"), ("host", "h")])
        );
    }

    #[test]
    fn malformed_uris_are_refused_without_echoing_them() {
        for bad in [
            "postgres://u:s3cret@h/db?s3cret",
            "postgres://u:s3cret@[::1/db",
            "postgres://u:%FFs3cret@h/db",
            "postgres://h/db?a%20b=s3cret",
        ] {
            assert_refused_without_echo(bad, "listen_database_url");
        }
    }

    #[test]
    fn serialises_back_to_the_same_parameters() {
        for s in [
            r"host=db password = 'a b\'c\\d' application_name=x\ y options='-c search_path=s'",
            "postgres://u:p%27q@h:1,h2:2/d%20b?application_name=%27%5C",
            "dbname=''",
        ] {
            let info = ConnInfo::parse(s, "database_url").expect("parse");
            let again = ConnInfo::parse(&info.to_conninfo(), "database_url").expect("reparse");
            assert_eq!(info, again, "{s} -> {}", info.to_conninfo());
            // tokio-postgres reads it the same way.
            let config: tokio_postgres::Config =
                info.to_conninfo().parse().expect("tokio-postgres");
            if let Some(password) = info.get("password") {
                assert_eq!(config.get_password(), Some(password.as_bytes()));
            }
            if let Some(name) = info.get("application_name") {
                assert_eq!(config.get_application_name(), Some(name));
            }
            assert_eq!(config.get_dbname(), info.get("dbname"));
        }
    }

    #[test]
    fn redacted_hides_secret_values_only() {
        let info = ConnInfo::parse(
            r"host=db password = 'a b' sslpassword=k application_name='x y' dbname=d",
            "database_url",
        )
        .expect("parse");
        assert_eq!(
            info.redacted(),
            "host=db password=*** sslpassword=*** application_name='x y' dbname=d"
        );
        assert!(!format!("{info:?}").contains("a b"));
        let info = ConnInfo::parse("postgres://app:s3cret@db/x?sslmode=require", "database_url")
            .expect("parse");
        assert_eq!(
            info.redacted(),
            "user=app password=*** host=db dbname=x sslmode=require"
        );
    }
}
