//! Where an event goes on NATS: the subject template (`--subject-template`), parsed once at start
//! and rendered per row.
//!
//! A template is literal text with placeholders `{event_type}`, `{aggregate_type}` and
//! `{aggregate_id}`; the default is `<subject_prefix>.{event_type}`. The literal text is checked at
//! start; the rendered subject is checked per row, because `aggregate_type` and `aggregate_id` are
//! written by the application (rows written by raw SQL too) and may hold what no subject can (a
//! space, a wildcard, an empty token). Such a row is refused like any other invalid row: it
//! dead-letters and blocks only its own aggregate.

use crate::error::{Error, Result};
use crate::event::OutboxEvent;

/// Longest subject the relay publishes. NATS itself has no subject limit below its control-line
/// size (4 KiB by default); a subject near that is a mistake in the data, not a route.
pub const MAX_SUBJECT_LEN: usize = 1024;

/// A placeholder of the template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    EventType,
    AggregateType,
    AggregateId,
}

impl Field {
    const ALL: [(&'static str, Field); 3] = [
        ("event_type", Field::EventType),
        ("aggregate_type", Field::AggregateType),
        ("aggregate_id", Field::AggregateId),
    ];

    fn of(self, event: &OutboxEvent) -> &str {
        match self {
            Field::EventType => &event.event_type,
            Field::AggregateType => &event.aggregate_type,
            Field::AggregateId => &event.aggregate_id,
        }
    }

    fn name(self) -> &'static str {
        Field::ALL
            .iter()
            .find(|(_, f)| *f == self)
            .map_or("?", |(n, _)| n)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Field(Field),
}

/// A parsed subject template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SubjectTemplate {
    parts: Vec<Part>,
}

impl SubjectTemplate {
    /// Today's routing: `<prefix>.{event_type}`. The prefix was validated by the config.
    pub fn with_prefix(prefix: &str) -> Self {
        SubjectTemplate {
            parts: vec![
                Part::Literal(format!("{prefix}.")),
                Part::Field(Field::EventType),
            ],
        }
    }

    /// Parses and checks a template: known placeholders only, and a valid subject whatever valid
    /// values fill them (each placeholder is tried as `x`).
    pub fn parse(template: &str) -> Result<Self> {
        let bad = |m: String| Error::config("subject_template", m);
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                Some(0) if rest.starts_with('}') => {
                    return Err(bad(format!("{template:?} has a `}}` without its `{{`")))
                }
                Some(0) => {
                    let end = rest
                        .find('}')
                        .ok_or_else(|| bad(format!("{template:?} has a `{{` without its `}}`")))?;
                    let name = &rest[1..end];
                    let field = Field::ALL
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map(|(_, f)| *f)
                        .ok_or_else(|| {
                            bad(format!(
                                "unknown placeholder {{{name}}} in {template:?} (known: {{event_type}}, {{aggregate_type}}, {{aggregate_id}})"
                            ))
                        })?;
                    parts.push(Part::Field(field));
                    rest = &rest[end + 1..];
                }
                Some(i) => {
                    parts.push(Part::Literal(rest[..i].to_string()));
                    rest = &rest[i..];
                }
                None => {
                    parts.push(Part::Literal(rest.to_string()));
                    rest = "";
                }
            }
        }
        let parsed = SubjectTemplate { parts };
        let sample = parsed.fill(|_| "x");
        check_subject(&sample).map_err(|why| bad(format!("{template:?} {why}")))?;
        Ok(parsed)
    }

    fn fill<'a>(&'a self, value: impl Fn(Field) -> &'a str) -> String {
        let mut subject = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => subject.push_str(text),
                Part::Field(field) => subject.push_str(value(*field)),
            }
        }
        subject
    }

    /// The subject of one event; refused (the row's fault) when its values make an invalid subject.
    pub fn render(&self, event: &OutboxEvent) -> Result<String> {
        let subject = self.fill(|field| field.of(event));
        check_subject(&subject).map_err(|why| {
            let fields: Vec<String> = self
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::Field(f) => Some(format!("{}={:?}", f.name(), f.of(event))),
                    Part::Literal(_) => None,
                })
                .collect();
            Error::invalid_event(format!(
                "subject {subject:?} (from {}) {why}",
                fields.join(", ")
            ))
        })?;
        Ok(subject)
    }

    /// The subjects a stream needs to capture every rendered subject: the template's leading
    /// literal tokens followed by `>`, or the whole template when it has no placeholder. `None`
    /// when it starts with a placeholder (a stream on `>` would capture every subject, the
    /// JetStream API's included).
    pub fn stream_subject(&self) -> Option<String> {
        let mut literal = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => literal.push_str(text),
                Part::Field(_) => {
                    // Only whole tokens: `orders.v1-{event_type}` is captured by `orders.>`.
                    let whole = literal.rfind('.').map(|i| &literal[..i])?;
                    return Some(format!("{whole}.>"));
                }
            }
        }
        Some(literal)
    }
}

/// A subject NATS accepts for publishing: dot-separated tokens, none empty, printable ASCII, no
/// wildcard.
fn check_subject(subject: &str) -> std::result::Result<(), String> {
    if subject.len() > MAX_SUBJECT_LEN {
        return Err(format!("is longer than {MAX_SUBJECT_LEN} bytes"));
    }
    for token in subject.split('.') {
        if token.is_empty() {
            return Err("has an empty subject token".into());
        }
        if let Some(c) = token
            .chars()
            .find(|c| !c.is_ascii_graphic() || *c == '*' || *c == '>')
        {
            return Err(format!(
                "contains {c:?}, which cannot appear in a NATS subject token"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::field_of;

    fn event(aggregate_type: &str, aggregate_id: &str, event_type: &str) -> OutboxEvent {
        OutboxEvent {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload: bytes::Bytes::from_static(b"{}"),
            headers: Default::default(),
            attempts: 0,
            created_at: crate::Timestamp::now(),
            defect: None,
            transaction: None,
        }
    }

    #[test]
    fn default_template_is_prefix_dot_event_type() {
        let t = SubjectTemplate::with_prefix("outbox");
        let e = event("order", "42", "order.created");
        assert_eq!(t.render(&e).expect("render"), "outbox.order.created");
        assert_eq!(t.stream_subject().as_deref(), Some("outbox.>"));
        assert_eq!(
            SubjectTemplate::parse("outbox.{event_type}").expect("parse"),
            t
        );
    }

    #[test]
    fn renders_every_placeholder() {
        let t = SubjectTemplate::parse("app.{aggregate_type}.{aggregate_id}.{event_type}")
            .expect("parse");
        let e = event("order", "42", "created");
        assert_eq!(t.render(&e).expect("render"), "app.order.42.created");
        assert_eq!(t.stream_subject().as_deref(), Some("app.>"));
        // A placeholder inside a token: the stream captures the whole tokens before it.
        let t = SubjectTemplate::parse("app.v1-{aggregate_type}").expect("parse");
        assert_eq!(t.render(&e).expect("render"), "app.v1-order");
        assert_eq!(t.stream_subject().as_deref(), Some("app.>"));
        // No placeholder: every event on one subject.
        let t = SubjectTemplate::parse("app.events").expect("parse");
        assert_eq!(t.render(&e).expect("render"), "app.events");
        assert_eq!(t.stream_subject().as_deref(), Some("app.events"));
        // Starting with a placeholder: no stream subject can be derived.
        let t = SubjectTemplate::parse("{aggregate_type}.events").expect("parse");
        assert_eq!(t.stream_subject(), None);
        let t = SubjectTemplate::parse("x{aggregate_type}.events").expect("parse");
        assert_eq!(t.stream_subject(), None);
    }

    #[test]
    fn refuses_templates_that_cannot_make_a_subject() {
        for bad in [
            "",
            "app.{event}",
            "app.{event_type",
            "app.event_type}",
            "app..{event_type}",
            ".{event_type}",
            "app.{event_type}.",
            "app.*.{event_type}",
            "app.>",
            "app {event_type}",
            "app.{}",
            "app.{{event_type}}",
        ] {
            let e = SubjectTemplate::parse(bad).expect_err(bad);
            assert_eq!(field_of::<()>(Err(e)), Some("subject_template"), "{bad}");
        }
    }

    #[test]
    fn refuses_rows_whose_values_make_no_subject() {
        let t = SubjectTemplate::parse("app.{aggregate_type}.{aggregate_id}").expect("parse");
        for id in ["", "a b", "a.", ".a", "a..b", "*", ">", "é", "a\tb"] {
            let e = t.render(&event("order", id, "created")).expect_err(id);
            assert!(e.invalid_event_message().is_some(), "{id}: {e}");
            assert!(e.to_string().contains("aggregate_id"), "{e}");
        }
        // Dots in values add tokens: allowed, as for event types today.
        let e = event("order", "eu.42", "created");
        assert_eq!(t.render(&e).expect("render"), "app.order.eu.42");
        let long = "a".repeat(MAX_SUBJECT_LEN);
        assert!(t.render(&event("order", &long, "created")).is_err());
    }
}
