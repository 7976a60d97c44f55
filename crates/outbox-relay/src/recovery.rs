//! Where a relay resumes (docs/architecture/outbox.md): the position committed in Kafka (the
//! authority in exactly-once mode) checked against PostgreSQL's record of it and, in logical
//! mode, against the replication slot; refused when they disagree in a way that means lost data.

use sqlx::PgPool;
use tokio::task::block_in_place;
use tracing::{info, warn};

use eos_core::Guarantee;
use eos_outbox::OutboxCursor;
use eos_outbox::relay_positions::relayed_position;

use crate::error::RelayError;
use crate::logical::LogicalSource;
use crate::pgoutput::Lsn;
use crate::position_topic::{RelayPosition, read_position};
use crate::relay_settings::RelaySettings;

/// The line tests and operators look for: the relay knows where it resumes, its producer is
/// initialised (any earlier relay of its name fenced).
pub(crate) fn log_resuming(settings: &RelaySettings, position: RelayPosition) {
    let relay = &settings.relay_name;
    let guarantee = &settings.guarantee;
    match position {
        RelayPosition::Xmin(cursor) => info!(
            relay = %relay,
            mode = "xmin",
            order_xid = cursor.order_xid,
            position = cursor.position,
            guarantee = %guarantee,
            "resuming after this outbox position"
        ),
        RelayPosition::Logical { lsn, table_after } => info!(
            relay = %relay,
            mode = "logical",
            slot = settings.logical.as_ref().map(LogicalSource::slot),
            lsn = lsn.0,
            at = %lsn,
            table_after = ?table_after,
            guarantee = %guarantee,
            "resuming after this outbox position"
        ),
    }
}

/// Where to resume: [`recover_xmin`] or [`recover_logical`].
pub(crate) async fn recover_position(
    settings: &RelaySettings,
    pool: &PgPool,
) -> Result<RelayPosition, RelayError> {
    let recorded = relayed_position(pool, &settings.relay_name).await?;
    if settings.guarantee == Guarantee::AtLeastOnce {
        return Ok(RelayPosition::Xmin(recorded.unwrap_or_default()));
    }
    let committed = block_in_place(|| {
        read_position(
            &settings.client_config,
            &settings.positions_topic,
            &settings.relay_name,
            settings.position_read_timeout(),
        )
    })?;
    match &settings.logical {
        None => recover_xmin(settings, committed, recorded).map(RelayPosition::Xmin),
        Some(source) => recover_logical(settings, source, committed, recorded).await,
    }
}

/// xmin mode: the position committed in Kafka, unless PostgreSQL records a later one, which means
/// Kafka lost committed records: refuse rather than publish again.
fn recover_xmin(
    settings: &RelaySettings,
    committed: Option<RelayPosition>,
    recorded: Option<OutboxCursor>,
) -> Result<OutboxCursor, RelayError> {
    let position_error = |detail: String| RelayError::Position {
        relay: settings.relay_name.clone(),
        detail,
    };
    let committed = match committed {
        Some(RelayPosition::Xmin(cursor)) => Some(cursor),
        Some(RelayPosition::Logical { lsn, .. }) => {
            return Err(position_error(format!(
                "the last position committed to {} is a logical one (WAL {lsn}); --mode xmin \
                 cannot tell which rows it covers. Run with --mode logical, or see \
                 docs/architecture/outbox.md for switching modes",
                settings.positions_topic
            )));
        }
        None => None,
    };
    match (committed, recorded) {
        (Some(committed), Some(recorded)) if recorded > committed => Err(position_error(format!(
            "PostgreSQL records position {recorded:?} as published, but the last position \
             committed to {} is {committed:?}: Kafka lost committed records, so the records \
             after it may be missing or would be published twice. Check the topics, then \
             update or delete the relay's row in eos_outbox_relay_positions",
            settings.positions_topic
        ))),
        (None, Some(recorded)) => {
            warn!(
                topic = %settings.positions_topic,
                position = recorded.position,
                "the position topic has no position for this relay; resuming after PostgreSQL's \
                 (rows published after it but before the last crash are published again)"
            );
            Ok(recorded)
        }
        (committed, _) => Ok(committed.unwrap_or_default()),
    }
}

/// logical mode (docs/architecture/outbox.md). Kafka's position is the authority; the slot
/// must be at or behind it (it is moved up to it here) and still hold its WAL. With no logical
/// position yet, the slot is created if missing and the rows committed before it existed are
/// published from the table first: all of them, or those after an xmin-mode position (a relay
/// switching modes), or after PostgreSQL's record when Kafka has none.
async fn recover_logical(
    settings: &RelaySettings,
    source: &LogicalSource,
    committed: Option<RelayPosition>,
    recorded: Option<OutboxCursor>,
) -> Result<RelayPosition, RelayError> {
    source.prepare().await?;
    let slot = source.usable_slot().await?;
    let slot_error = |detail: String| RelayError::Slot {
        slot: source.slot().to_owned(),
        detail,
    };
    let table_after = match committed {
        Some(RelayPosition::Logical { lsn, table_after }) => {
            let Some((_, confirmed)) = slot else {
                return Err(slot_error(format!(
                    "does not exist, but relay {}'s position in {} is WAL {lsn}: the changes \
                     after it can no longer be decoded (a dropped slot, or a failover to a \
                     standby without it). Not guessing where to resume: see docs/ARCHITECTURE.md \
                     \"Outbox\" for the recovery",
                    settings.relay_name, settings.positions_topic
                )));
            };
            if confirmed > lsn {
                return Err(slot_error(format!(
                    "is at WAL {confirmed}, past relay {}'s position {lsn} in {}: the WAL \
                     between them is released, so rows may be missing from Kafka. Not guessing \
                     (docs/architecture/outbox.md)",
                    settings.relay_name, settings.positions_topic
                )));
            }
            let end = source.marks().await?.flush_lsn;
            if lsn > end {
                return Err(slot_error(format!(
                    "relay {}'s position in {} is WAL {lsn}, past the end of this server's WAL \
                     ({end}): another server's position, or a failover lost WAL whose rows were \
                     published. Not guessing (docs/architecture/outbox.md)",
                    settings.relay_name, settings.positions_topic
                )));
            }
            // Behind Kafka: the transactions in between are in Kafka already.
            advance_taking_the_slot(source, lsn).await?;
            return Ok(RelayPosition::Logical { lsn, table_after });
        }
        Some(RelayPosition::Xmin(cursor)) => cursor,
        None => {
            if let Some(recorded) = recorded {
                warn!(
                    topic = %settings.positions_topic,
                    order_xid = recorded.order_xid,
                    position = recorded.position,
                    "the position topic has no position for this relay; publishing the outbox's \
                     rows after PostgreSQL's record of it (rows published after it but before the \
                     last crash are published again)"
                );
            }
            recorded.unwrap_or_default()
        }
    };
    // No logical position in Kafka: the rows committed before the slot's position come from the
    // table (after `table_after`), those committed after it from the slot.
    let consistent = match slot {
        Some((_, confirmed)) => confirmed,
        None => source.create_slot().await?,
    };
    Ok(RelayPosition::Logical {
        lsn: consistent,
        table_after: Some(table_after),
    })
}

/// Moves the slot to Kafka's position. This relay has just fenced every earlier one with its
/// name, so a session still on the slot that keeps PostgreSQL from moving it (SQLSTATE 55006,
/// after `LogicalSource::advance`'s own wait) is a fenced relay's that took the slot back after
/// start-up ended its session: it is ended again, and the move tried once more.
async fn advance_taking_the_slot(source: &LogicalSource, lsn: Lsn) -> Result<(), RelayError> {
    match source.advance(lsn).await {
        Err(error) if error.is_slot_held_elsewhere() => {
            let ended = source.end_foreign_session().await?;
            warn!(slot = source.slot(), ended_pid = ended, %error, "ended the session of a fenced relay holding the slot again");
            source.advance(lsn).await
        }
        other => other,
    }
}
