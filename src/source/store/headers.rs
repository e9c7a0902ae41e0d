//! The `headers` column's JSON as message headers ([`headers_from_json`]): string values as they
//! are, anything else as the row's JSON text, and a row whose headers are not an object a defect.
//! The wal source reads streamed rows' headers with it too.

use std::collections::BTreeMap;

/// `headers` must be a JSON object (or null); string values are sent as they are, other values as
/// their JSON text as the row holds it (a number keeps every digit: jsonb stores numbers as
/// `numeric`, and no float is taken on the way; objects and arrays without their spaces).
/// Anything else is a defect of the row: it is dead-lettered rather than published without the
/// headers its writer meant it to have.
pub(crate) fn headers_from_json(text: Option<&str>) -> (BTreeMap<String, String>, Option<String>) {
    use serde_json::value::RawValue;
    let Some(text) = text else {
        return (BTreeMap::new(), None);
    };
    let defect = |why: String| (BTreeMap::new(), Some(why));
    let raw: &RawValue = match serde_json::from_str(text) {
        Ok(raw) => raw,
        Err(e) => return defect(format!("headers cannot be read as JSON: {e}")),
    };
    let kind = match raw.get().as_bytes().first() {
        Some(b'{') => None,
        Some(b'n') => return (BTreeMap::new(), None),
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b't' | b'f') => Some("a boolean"),
        _ => Some("a number"),
    };
    if let Some(kind) = kind {
        return defect(format!("headers must be a JSON object, found {kind}"));
    }
    // A raw value borrows its text as written (escapes and all); names are read unescaped.
    match serde_json::from_str::<BTreeMap<String, &RawValue>>(raw.get()) {
        Ok(members) => (
            members
                .into_iter()
                .map(|(name, value)| (name, header_value(value)))
                .collect(),
            None,
        ),
        Err(e) => defect(format!("headers cannot be read as JSON: {e}")),
    }
}

/// One header value from its JSON text: a string unquoted, anything else as written, compact.
fn header_value(raw: &serde_json::value::RawValue) -> String {
    let text = raw.get();
    if text.starts_with('"') {
        // Valid JSON (the parser checked it), so this holds.
        return serde_json::from_str(text).unwrap_or_else(|_| text.to_owned());
    }
    compact_json(text)
}

/// `text` (valid JSON) without the whitespace between its tokens; strings and numbers unchanged.
fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_keep_the_rows_text() {
        let (h, defect) = headers_from_json(Some(
            r#"{"big": 123456789012345678901234567890, "dec": 0.12345678901234567890,
                "s": "a \"q\" \u00e9", "o": {"k": [1, "a b", {"x": null}]}, "t": true}"#,
        ));
        assert_eq!(defect, None);
        assert_eq!(h["big"], "123456789012345678901234567890");
        assert_eq!(h["dec"], "0.12345678901234567890");
        assert_eq!(h["s"], "a \"q\" \u{e9}");
        assert_eq!(h["o"], r#"{"k":[1,"a b",{"x":null}]}"#);
        assert_eq!(h["t"], "true");
        assert_eq!(headers_from_json(Some("null")), (BTreeMap::new(), None));
        for (text, why) in [
            ("[1]", "found an array"),
            ("\"x\"", "found a string"),
            ("false", "found a boolean"),
            ("12", "found a number"),
            ("{", "cannot be read as JSON"),
        ] {
            let (h, defect) = headers_from_json(Some(text));
            assert!(h.is_empty());
            assert!(defect.is_some_and(|d| d.contains(why)), "{text}");
        }
    }
}
