//! The messages of PostgreSQL's `pgoutput` logical decoding plugin (protocol version 1), as
//! `pg_logical_slot_peek_binary_changes` returns them: one message per row. Only what the logical
//! mode needs is decoded — transaction boundaries, relations and inserts; every other message is
//! recognised by its tag and skipped. Format: PostgreSQL's documentation, "Logical Replication
//! Message Formats".

use std::fmt;
use std::str::FromStr;

/// A WAL position. Ordered as PostgreSQL orders `pg_lsn`; written as PostgreSQL writes it
/// (`16/B374D848`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (high, low) = text
            .split_once('/')
            .ok_or_else(|| format!("{text:?} is not an LSN (high/low in hex)"))?;
        let part = |part: &str| {
            u32::from_str_radix(part, 16).map_err(|e| format!("{text:?} is not an LSN: {e}"))
        };
        Ok(Self((u64::from(part(high)?) << 32) | u64::from(part(low)?)))
    }
}

/// `B`: a transaction's first message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Begin {
    /// The LSN of the transaction's commit record.
    pub final_lsn: Lsn,
    /// Microseconds since 2000-01-01 (PostgreSQL's epoch).
    pub commit_time: i64,
    pub xid: u32,
}

/// `C`: a transaction's last message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Commit {
    pub flags: u8,
    /// Where the commit record starts: a slot at or past it does not decode the transaction again.
    pub commit_lsn: Lsn,
    /// Where the commit record ends.
    pub end_lsn: Lsn,
    pub commit_time: i64,
}

/// `R`: a relation's description, sent before the first change to it in a decoding session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub columns: Vec<String>,
}

/// One column of a tuple: text format, as pgoutput sends it without the `binary` option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Column {
    Null,
    /// A TOASTed value not sent because it did not change (updates only).
    Unchanged,
    Text(String),
}

/// `I`: an inserted row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Insert {
    pub relation_id: u32,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Message {
    Begin(Begin),
    Commit(Commit),
    Relation(Relation),
    Insert(Insert),
    /// Anything else (type, origin, update, delete, truncate, message): not the outbox's.
    Other(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pgoutput message {tag:?} at byte {at}: {detail}")]
pub(crate) struct DecodeError {
    pub tag: char,
    pub at: usize,
    pub detail: String,
}

/// Reads big-endian fields off one message.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    tag: u8,
}

impl<'a> Reader<'a> {
    fn error(&self, detail: impl Into<String>) -> DecodeError {
        DecodeError {
            tag: char::from(self.tag),
            at: self.at,
            detail: detail.into(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error(format!("{n} more bytes expected, the message ends")))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn lsn(&mut self) -> Result<Lsn, DecodeError> {
        Ok(Lsn(u64::from_be_bytes(self.array()?)))
    }

    /// A NUL-terminated string.
    fn cstr(&mut self) -> Result<String, DecodeError> {
        let rest = &self.bytes[self.at..];
        let len = rest
            .iter()
            .position(|b| *b == 0)
            .ok_or_else(|| self.error("unterminated string"))?;
        let text = std::str::from_utf8(&rest[..len])
            .map_err(|e| self.error(format!("string is not UTF-8: {e}")))?
            .to_owned();
        self.at += len + 1;
        Ok(text)
    }

    fn tuple(&mut self) -> Result<Vec<Column>, DecodeError> {
        let count = self.i16()?;
        let count = usize::try_from(count).map_err(|_| self.error(format!("{count} columns")))?;
        let mut columns = Vec::with_capacity(count);
        for _ in 0..count {
            columns.push(match self.u8()? {
                b'n' => Column::Null,
                b'u' => Column::Unchanged,
                b't' => {
                    let len = self.i32()?;
                    let len = usize::try_from(len)
                        .map_err(|_| self.error(format!("column length {len}")))?;
                    let bytes = self.take(len)?;
                    Column::Text(
                        std::str::from_utf8(bytes)
                            .map_err(|e| self.error(format!("column is not UTF-8: {e}")))?
                            .to_owned(),
                    )
                }
                kind => {
                    return Err(self.error(format!(
                        "column kind {:?} (binary columns are never asked for)",
                        char::from(kind)
                    )));
                }
            });
        }
        Ok(columns)
    }
}

/// Decodes one message.
pub(crate) fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let Some(&tag) = bytes.first() else {
        return Err(DecodeError {
            tag: '?',
            at: 0,
            detail: "empty message".into(),
        });
    };
    let mut r = Reader { bytes, at: 1, tag };
    Ok(match tag {
        b'B' => Message::Begin(Begin {
            final_lsn: r.lsn()?,
            commit_time: r.i64()?,
            xid: r.u32()?,
        }),
        b'C' => Message::Commit(Commit {
            flags: r.u8()?,
            commit_lsn: r.lsn()?,
            end_lsn: r.lsn()?,
            commit_time: r.i64()?,
        }),
        b'R' => {
            let id = r.u32()?;
            let namespace = r.cstr()?;
            let name = r.cstr()?;
            let _replica_identity = r.u8()?;
            let count = r.i16()?;
            let count = usize::try_from(count).map_err(|_| r.error(format!("{count} columns")))?;
            let mut columns = Vec::with_capacity(count);
            for _ in 0..count {
                let _flags = r.u8()?;
                columns.push(r.cstr()?);
                let _type_oid = r.u32()?;
                let _type_modifier = r.i32()?;
            }
            Message::Relation(Relation {
                id,
                namespace,
                name,
                columns,
            })
        }
        b'I' => {
            let relation_id = r.u32()?;
            match r.u8()? {
                b'N' => {}
                other => {
                    return Err(r.error(format!(
                        "insert tuple marked {:?}, not 'N'",
                        char::from(other)
                    )));
                }
            }
            Message::Insert(Insert {
                relation_id,
                columns: r.tuple()?,
            })
        }
        other => Message::Other(other),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Hand-built messages, byte for byte as PostgreSQL's `logicalrep_write_*` writes them.
    pub(crate) fn begin(final_lsn: u64, xid: u32) -> Vec<u8> {
        let mut m = vec![b'B'];
        m.extend(final_lsn.to_be_bytes());
        m.extend(789_000_000i64.to_be_bytes());
        m.extend(xid.to_be_bytes());
        m
    }

    pub(crate) fn commit(commit_lsn: u64, end_lsn: u64) -> Vec<u8> {
        let mut m = vec![b'C', 0];
        m.extend(commit_lsn.to_be_bytes());
        m.extend(end_lsn.to_be_bytes());
        m.extend(789_000_001i64.to_be_bytes());
        m
    }

    pub(crate) fn relation(id: u32, name: &str, columns: &[&str]) -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(id.to_be_bytes());
        m.extend(b"public\0");
        m.extend(name.as_bytes());
        m.push(0);
        m.push(b'd');
        m.extend((columns.len() as i16).to_be_bytes());
        for (n, column) in columns.iter().enumerate() {
            m.push(u8::from(n == 0));
            m.extend(column.as_bytes());
            m.push(0);
            m.extend(20u32.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    pub(crate) fn insert(id: u32, columns: &[Option<&str>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(id.to_be_bytes());
        m.push(b'N');
        m.extend((columns.len() as i16).to_be_bytes());
        for column in columns {
            match column {
                None => m.push(b'n'),
                Some(text) => {
                    m.push(b't');
                    m.extend((text.len() as i32).to_be_bytes());
                    m.extend(text.as_bytes());
                }
            }
        }
        m
    }

    #[test]
    fn lsns_print_and_parse_as_postgresql_writes_them() {
        let lsn: Lsn = "16/B374D848".parse().expect("parses");
        assert_eq!(lsn, Lsn(0x16_B374_D848));
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert!("16B374D848".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
        assert!(Lsn(0x1_0000_0000) > Lsn(0xFFFF_FFFF));
    }

    #[test]
    fn begin_commit_relation_and_insert_decode() {
        assert_eq!(
            decode(&begin(0x1_0000_0010, 4242)),
            Ok(Message::Begin(Begin {
                final_lsn: Lsn(0x1_0000_0010),
                commit_time: 789_000_000,
                xid: 4242
            }))
        );
        assert_eq!(
            decode(&commit(0x10, 0x48)),
            Ok(Message::Commit(Commit {
                flags: 0,
                commit_lsn: Lsn(0x10),
                end_lsn: Lsn(0x48),
                commit_time: 789_000_001
            }))
        );
        assert_eq!(
            decode(&relation(16_385, "eos_outbox", &["position", "order_xid"])),
            Ok(Message::Relation(Relation {
                id: 16_385,
                namespace: "public".into(),
                name: "eos_outbox".into(),
                columns: vec!["position".into(), "order_xid".into()],
            }))
        );
        assert_eq!(
            decode(&insert(16_385, &[Some("17"), None, Some("ünï")])),
            Ok(Message::Insert(Insert {
                relation_id: 16_385,
                columns: vec![
                    Column::Text("17".into()),
                    Column::Null,
                    Column::Text("ünï".into())
                ],
            }))
        );
    }

    #[test]
    fn other_messages_are_recognised_and_skipped() {
        for tag in [b'Y', b'O', b'U', b'D', b'T', b'M'] {
            assert_eq!(decode(&[tag, 1, 2, 3]), Ok(Message::Other(tag)));
        }
    }

    #[test]
    fn truncated_or_malformed_messages_are_errors_not_guesses() {
        let mut short = commit(1, 2);
        short.truncate(12);
        let error = decode(&short).expect_err("truncated");
        assert_eq!(error.tag, 'C');
        assert!(error.detail.contains("more bytes"), "{error}");
        assert!(decode(&[]).is_err());
        let mut unterminated = relation(1, "t", &["a"]);
        unterminated.truncate(8);
        assert!(decode(&unterminated).is_err());
        let mut binary = insert(1, &[Some("1")]);
        binary[8] = b'b';
        assert!(decode(&binary).is_err());
        let mut negative = insert(1, &[Some("1")]);
        negative[9..13].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(decode(&negative).is_err());
    }
}
