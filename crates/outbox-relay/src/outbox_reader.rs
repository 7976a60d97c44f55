//! Where the relay's rows come from: one reader per mode behind one trait, so that the loop
//! reads, prefetches and publishes the same way in both (docs/architecture/outbox.md). The xmin
//! reader is here; the logical one is `logical.rs`'s `LogicalSource`, which holds the slot.

use futures::future::BoxFuture;
use sqlx::PgPool;

use eos_outbox::{OutboxRow, read_after};

use crate::error::RelayError;
use crate::pgoutput::Lsn;
use crate::position_topic::RelayPosition;

/// Reads the committed rows after a position.
pub(crate) trait OutboxReader: Send + Sync + std::fmt::Debug {
    /// At most about `limit` rows after `after`, in the order they are published, with the
    /// position once they are. A position of the other mode is refused.
    fn read(
        &self,
        after: RelayPosition,
        limit: i64,
    ) -> BoxFuture<'_, Result<OutboxRead, RelayError>>;
}

/// One read of the outbox.
#[derive(Debug)]
pub struct OutboxRead {
    pub rows: Vec<OutboxRow>,
    /// The position once `rows` are published.
    pub position: RelayPosition,
    /// The read stopped at its limit: read again at once.
    pub more: bool,
    /// Logical mode: set once a batch's position reaches the WAL marks' insert LSN (see
    /// [`PurgeMark`]).
    pub purge_mark: Option<PurgeMark>,
}

/// Set once a batch's position reaches `insert_lsn`: every row with `order_xid` below `xmin` is
/// then published, so `purge_relayed` may go up to `(xmin, 0)`.
pub type PurgeMark = (i64, Lsn);

/// xmin mode: the table read in `(order_xid, position)` order, below the snapshot's xmin
/// (`eos_outbox::read_after`).
#[derive(Debug, Clone)]
pub(crate) struct XminReader {
    pub(crate) pool: PgPool,
}

impl OutboxReader for XminReader {
    fn read(
        &self,
        after: RelayPosition,
        limit: i64,
    ) -> BoxFuture<'_, Result<OutboxRead, RelayError>> {
        Box::pin(async move {
            let RelayPosition::Xmin(cursor) = after else {
                return Err(RelayError::Config(format!(
                    "position {after:?} reached the xmin reader"
                )));
            };
            let rows = read_after(&self.pool, cursor, limit).await?;
            let last = rows.last().map_or(cursor, |row| row.cursor);
            let more = rows.len() as i64 >= limit;
            Ok(OutboxRead {
                rows,
                position: RelayPosition::Xmin(last),
                more,
                purge_mark: None,
            })
        })
    }
}
