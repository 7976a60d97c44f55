//! The outbox inserts of each committed transaction, put together from `pgoutput`'s messages
//! as they arrive (a replication session's) or as a peek returns them. Its own module, so that
//! the logical source and its replication stream each use it without using each other.

use std::collections::HashMap;

use crate::pgoutput::{self, Lsn, Message};

/// The outbox table, as the publication names it.
pub(crate) const OUTBOX_TABLE: &str = "eos_outbox";

/// One committed transaction's outbox inserts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DecodedTxn {
    pub xid: u32,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    /// Commit time, microseconds since 2000-01-01.
    pub commit_time: i64,
    pub positions: Vec<i64>,
}

/// What one peek returned.
#[derive(Debug, Default)]
pub struct Decoded {
    pub txns: Vec<DecodedTxn>,
    /// Messages returned; at or above the limit asked for, the peek may have stopped early.
    pub messages: usize,
}

/// Turns a peek's messages into transactions: begin, inserts into the outbox, commit.
#[derive(Debug, Default)]
pub struct TxnAssembler {
    /// Relation id → index of its `position` column, for the outbox table.
    relations: HashMap<u32, Option<usize>>,
    open: Option<DecodedTxn>,
    done: Decoded,
}

impl TxnAssembler {
    /// One message of a peek, begin and commit included.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.done.messages += 1;
        match pgoutput::decode(bytes).map_err(|e| e.to_string())? {
            Message::Begin(begin) => self.begin(begin.xid, begin.final_lsn, begin.commit_time),
            Message::Commit(commit) => {
                self.commit(commit.commit_lsn, commit.end_lsn, commit.commit_time)
            }
            message => self.change(message),
        }
    }

    /// A transaction's begin (the stream hands it over decoded).
    pub fn begin(&mut self, xid: u32, final_lsn: Lsn, commit_time: i64) -> Result<(), String> {
        if self.open.is_some() {
            return Err(format!("begin of xid {xid} inside a transaction"));
        }
        self.open = Some(DecodedTxn {
            xid,
            commit_lsn: final_lsn,
            end_lsn: final_lsn,
            commit_time,
            positions: Vec::new(),
        });
        Ok(())
    }

    /// A message between a begin and its commit, as pgoutput encoded it.
    pub fn change_bytes(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.change(pgoutput::decode(bytes).map_err(|e| e.to_string())?)
    }

    fn change(&mut self, message: Message) -> Result<(), String> {
        match message {
            Message::Relation(relation) => {
                let position = (relation.name == OUTBOX_TABLE)
                    .then(|| relation.columns.iter().position(|c| c == "position"))
                    .flatten();
                self.relations.insert(relation.id, position);
            }
            Message::Insert(insert) => {
                let txn = self
                    .open
                    .as_mut()
                    .ok_or("an insert outside a transaction")?;
                let column = self
                    .relations
                    .get(&insert.relation_id)
                    .ok_or_else(|| {
                        format!(
                            "an insert into relation {} not described",
                            insert.relation_id
                        )
                    })?
                    .ok_or_else(|| {
                        format!(
                            "an insert into relation {}, which is not {OUTBOX_TABLE} with a \
                             position column (is the publication only FOR TABLE {OUTBOX_TABLE}?)",
                            insert.relation_id
                        )
                    })?;
                let position = match insert.columns.get(column) {
                    Some(pgoutput::Column::Text(text)) => text
                        .parse::<i64>()
                        .map_err(|e| format!("position {text:?}: {e}"))?,
                    other => return Err(format!("an insert whose position is {other:?}")),
                };
                txn.positions.push(position);
            }
            Message::Begin(begin) => {
                return Err(format!(
                    "begin of xid {} handed over as a change",
                    begin.xid
                ));
            }
            Message::Commit(_) => return Err("a commit handed over as a change".into()),
            Message::Other(_) => {}
        }
        Ok(())
    }

    /// A transaction's commit: the transaction, done (the stream takes it at once; a peek's
    /// are kept for [`Self::finish`]).
    pub fn commit(
        &mut self,
        commit_lsn: Lsn,
        end_lsn: Lsn,
        commit_time: i64,
    ) -> Result<(), String> {
        let mut txn = self.open.take().ok_or("a commit outside a transaction")?;
        txn.commit_lsn = commit_lsn;
        txn.end_lsn = end_lsn;
        txn.commit_time = commit_time;
        // A transaction with no outbox insert still moves the position (pgoutput before
        // PostgreSQL 15 sends those too), so it is kept for its LSNs.
        self.done.txns.push(txn);
        Ok(())
    }

    /// The transactions committed since the last call (the stream's reads).
    pub fn take_committed(&mut self) -> Vec<DecodedTxn> {
        std::mem::take(&mut self.done.txns)
    }

    /// A transaction has begun and not committed yet.
    pub fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    pub fn finish(self) -> Result<Decoded, String> {
        match self.open {
            // A peek returns whole transactions only.
            Some(txn) => Err(format!("the peek ended inside transaction {}", txn.xid)),
            None => Ok(self.done),
        }
    }
}
