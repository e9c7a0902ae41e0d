//! The few pgoutput messages the relay reads (protocol version 1, text values): Relation, to know
//! which columns an Insert carries, and Insert. The replication client hands Begin and Commit over
//! as events of their own; Type, Origin and anything else are skipped. Never panics, whatever the
//! bytes: a message that does not parse is an error naming what was wrong.

use std::fmt;

/// A decoded message; values borrow the message's bytes (the relay reads three columns of each
/// row and copies nothing else).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message<'a> {
    Relation(Relation),
    Insert {
        relation: u32,
        values: Vec<Value<'a>>,
    },
    /// A message the relay does not need.
    Other(u8),
}

/// A table as pgoutput describes it before its first change in a session (and after DDL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub columns: Vec<String>,
}

/// One column of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value<'a> {
    Null,
    /// A TOASTed value that did not change (updates only).
    Unchanged,
    Text(&'a [u8]),
    Binary(&'a [u8]),
}

impl Relation {
    /// The position of column `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DecodeError(String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot decode pgoutput message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// Decodes one pgoutput message (the payload of an XLogData).
pub(crate) fn decode(data: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = Reader { data, at: 0 };
    let tag = r.u8("message type")?;
    match tag {
        b'R' => {
            let id = r.u32("relation id")?;
            let namespace = r.string("namespace")?;
            let name = r.string("relation name")?;
            let _replica_identity = r.u8("replica identity")?;
            let count = r.u16("column count")?;
            let mut columns = Vec::with_capacity(usize::from(count).min(1600));
            for _ in 0..count {
                let _flags = r.u8("column flags")?;
                columns.push(r.string("column name")?);
                let _type = r.u32("column type")?;
                let _typmod = r.u32("column type modifier")?;
            }
            Ok(Message::Relation(Relation {
                id,
                namespace,
                name,
                columns,
            }))
        }
        b'I' => {
            let relation = r.u32("relation id")?;
            match r.u8("tuple marker")? {
                b'N' => {}
                other => return Err(r.error(format!("insert tuple marker {other:#04x}"))),
            }
            let count = r.u16("tuple column count")?;
            let mut values = Vec::with_capacity(usize::from(count).min(1600));
            for _ in 0..count {
                values.push(match r.u8("column kind")? {
                    b'n' => Value::Null,
                    b'u' => Value::Unchanged,
                    b't' => Value::Text(r.counted("text value")?),
                    b'b' => Value::Binary(r.counted("binary value")?),
                    other => return Err(r.error(format!("column kind {other:#04x}"))),
                });
            }
            Ok(Message::Insert { relation, values })
        }
        other => Ok(Message::Other(other)),
    }
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn error(&self, what: String) -> DecodeError {
        DecodeError(format!("{what} at byte {}", self.at))
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.data.len())
            .ok_or_else(|| self.error(format!("{what} cut short")))?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A NUL-terminated string.
    fn string(&mut self, what: &str) -> Result<String, DecodeError> {
        let rest = &self.data[self.at.min(self.data.len())..];
        let len = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.error(format!("{what} without its terminator")))?;
        let s = String::from_utf8_lossy(&rest[..len]).into_owned();
        self.at += len + 1;
        Ok(s)
    }

    /// An Int32 length and that many bytes.
    fn counted(&mut self, what: &str) -> Result<&'a [u8], DecodeError> {
        let len = self.u32(what)?;
        let len = usize::try_from(len).map_err(|_| self.error(format!("{what} length")))?;
        self.take(len, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn relation_bytes() -> Vec<u8> {
        let mut b = vec![b'R'];
        b.extend(16_384u32.to_be_bytes());
        b.extend(b"public\0outbox_events\0");
        b.push(b'd');
        b.extend(2u16.to_be_bytes());
        for name in ["id", "aggregate_id"] {
            b.push(1);
            b.extend(name.as_bytes());
            b.push(0);
            b.extend(25u32.to_be_bytes());
            b.extend(u32::MAX.to_be_bytes());
        }
        b
    }

    fn insert_bytes() -> Vec<u8> {
        let mut b = vec![b'I'];
        b.extend(16_384u32.to_be_bytes());
        b.push(b'N');
        b.extend(3u16.to_be_bytes());
        b.push(b't');
        b.extend(2u32.to_be_bytes());
        b.extend(b"42");
        b.push(b'n');
        b.push(b'u');
        b
    }

    #[test]
    fn decodes_a_relation_and_an_insert() {
        let Message::Relation(r) = decode(&relation_bytes()).expect("relation") else {
            panic!("not a relation")
        };
        assert_eq!(
            (r.id, r.namespace.as_str(), r.name.as_str()),
            (16_384, "public", "outbox_events")
        );
        assert_eq!(r.columns, ["id", "aggregate_id"]);
        assert_eq!(r.column("aggregate_id"), Some(1));
        assert_eq!(
            decode(&insert_bytes()).expect("insert"),
            Message::Insert {
                relation: 16_384,
                values: vec![Value::Text(b"42"), Value::Null, Value::Unchanged],
            }
        );
        assert_eq!(decode(b"Yanything").expect("type"), Message::Other(b'Y'));
    }

    #[test]
    fn truncated_messages_are_errors() {
        for full in [relation_bytes(), insert_bytes()] {
            for cut in 0..full.len() {
                assert!(decode(&full[..cut]).is_err(), "cut at {cut}");
            }
        }
        let mut huge = insert_bytes();
        huge.truncate(8);
        huge.extend(1u16.to_be_bytes());
        huge.push(b't');
        huge.extend(u32::MAX.to_be_bytes());
        assert!(decode(&huge).is_err());
    }

    proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode(&data);
        }

        #[test]
        fn never_panics_on_mutated_inserts(
            flips in proptest::collection::vec((0usize..32, any::<u8>()), 1..4)
        ) {
            let mut data = insert_bytes();
            for (at, byte) in flips {
                if let Some(b) = data.get_mut(at) {
                    *b = byte;
                }
            }
            let _ = decode(&data);
        }
    }
}
