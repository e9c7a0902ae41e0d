//! Passwords and tokens taken out of free text (URLs, `key=value` strings, messages) before it is
//! logged or shown. A leaf: errors use it to display themselves.

/// A URL or message with any password replaced by `***`, for logs and errors.
///
/// ```
/// let shown = outbox_relay::redact("connecting to postgres://app:s3cret@db:5432/app failed");
/// assert_eq!(shown, "connecting to postgres://app:***@db:5432/app failed");
/// ```
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    // scheme://user:password@host
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c == '?' || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        // A NATS URL's lone user part is a token: hide it too.
        let token_scheme = ["nats", "tls", "ws", "wss"]
            .iter()
            .any(|s| head.ends_with(&format!("{s}://")));
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), _) if token_scheme && !authority[..at].contains(':') => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon]);
                out.push_str(":***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    redact_key_values(&out)
}

/// `password=...` in key=value strings (spaces around `=` and quoted values included) and query
/// parameters. Free text: only for messages that are not parsed connection strings.
fn redact_key_values(text: &str) -> String {
    const KEY: &str = "password";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find(KEY) {
        let (head, tail) = rest.split_at(pos + KEY.len());
        out.push_str(head);
        let Some(after_eq) = tail.trim_start().strip_prefix('=') else {
            rest = tail;
            continue;
        };
        let value = after_eq.trim_start();
        out.push_str(&tail[..tail.len() - value.len()]);
        out.push_str("***");
        rest = &value[value_len(value)..];
    }
    out.push_str(rest);
    out
}

/// Length of the value at the start of `text`: a single-quoted string (backslash escapes, to the
/// end if unterminated), or a run up to whitespace or to a `&` that starts another `key=`.
fn value_len(text: &str) -> usize {
    let mut chars = text.char_indices();
    let quoted = text.starts_with('\'');
    if quoted {
        chars.next();
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '\'' if quoted => return i + 1,
            c if !quoted && c.is_whitespace() => return i,
            '&' if !quoted && starts_parameter(&text[i + 1..]) => return i,
            _ => {}
        }
    }
    text.len()
}

fn starts_parameter(text: &str) -> bool {
    let key_len = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    key_len > 0 && text[key_len..].starts_with('=')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app:***@db:5432/x?sslmode=require"
        );
        assert_eq!(redact("nats://tok@host:4222"), "nats://***@host:4222");
        assert_eq!(redact("nats://u:p@host:4222"), "nats://u:***@host:4222");
        assert_eq!(redact("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(
            redact("host=db user=app password=s3cret dbname=x"),
            "host=db user=app password=*** dbname=x"
        );
        assert_eq!(
            redact("postgres://a:b@h/x?password=c&x=1"),
            "postgres://a:***@h/x?password=***&x=1"
        );
    }

    #[test]
    fn free_text_redaction_knows_spaces_and_quotes() {
        assert_eq!(
            redact("host=db password = s3cret dbname=x"),
            "host=db password = *** dbname=x"
        );
        assert_eq!(
            redact(r"host=db password='a b\' c' dbname=x"),
            "host=db password=*** dbname=x"
        );
        assert_eq!(redact("password='unterminated s3cret"), "password=***");
        assert_eq!(redact(r"password=a\ b&c x=1"), "password=*** x=1");
        assert_eq!(
            redact("password authentication failed for user \"app\""),
            "password authentication failed for user \"app\""
        );
    }
}
