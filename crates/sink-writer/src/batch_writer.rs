//! The database transaction of one batch: the checkpoints moved first under the owner epoch,
//! then every target's rows, conflicts and dead-letter rows, then the dead letters produced and
//! awaited, then the commit. When PostgreSQL refuses the batch's data, the batch is written again
//! one record per savepoint and the refused records are dead-lettered.

use std::collections::HashMap;

use metrics::counter;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, error, warn};

use eos_core::DeadLetterReason;

use crate::batch_plan::Candidate;
use crate::batch_spans::{batch_span, record_spans};
use crate::checkpoint_rule;
use crate::checkpoint_store::{self, Move};
use crate::config::OffsetsMode;
use crate::dead_letters;
use crate::decision::{self, BatchDecision, TargetCounts, TargetView};
use crate::error::SinkError;
use crate::loop_settings::LoopSettings;
use crate::mapping::{InputRecord, Refusal};
use crate::metrics as m;
use crate::provider_settlement::{self, ProviderResults};
use crate::provider_target::ProviderTarget;
use crate::schema::PreparedTarget;
use crate::table_writer::{self, ConflictRow, DeadLetterRow, HeldRow};

/// Outcome of a committed batch, for metrics and logs.
#[derive(Debug, Default)]
pub(crate) struct BatchReport {
    pub(crate) records: usize,
    per_target: Vec<(String, TargetCounts)>,
    dead_letters: Vec<DeadLetterReason>,
    /// Target of every held event.
    held: Vec<String>,
    isolated: bool,
}

impl BatchReport {
    /// Whether the batch held an event (a new `sink_held_operations` row, or a replay's).
    pub(crate) fn held_any(&self) -> bool {
        !self.held.is_empty()
    }

    /// Counts a committed batch in the sink's metrics.
    pub(crate) fn record_metrics(&self) {
        counter!(m::RECORDS_IN).increment(self.records as u64);
        counter!(m::BATCHES, "outcome" => if self.isolated { "isolated" } else { "committed" })
            .increment(1);
        for (target, counts) in &self.per_target {
            let target = target.clone();
            counter!(m::ROWS_WRITTEN, "target" => target.clone()).increment(counts.written);
            counter!(m::DUPLICATES, "target" => target.clone()).increment(counts.duplicates);
            counter!(m::CONFLICTS, "target" => target.clone()).increment(counts.conflicts);
            counter!(m::STALE_VERSIONS, "target" => target.clone()).increment(counts.stale);
            counter!(m::SKIPPED, "target" => target).increment(counts.skipped);
        }
        for reason in &self.dead_letters {
            counter!(m::DEAD_LETTERS, "reason" => reason.as_str()).increment(1);
        }
        for target in &self.held {
            counter!(m::HELD_OPERATIONS, "target" => target.clone()).increment(1);
        }
    }
}

/// The database side of one batch, borrowed from the loop for the duration of `block_on`.
pub(crate) struct BatchWriter<'a> {
    pub(crate) settings: &'a LoopSettings,
    pub(crate) pool: &'a PgPool,
    pub(crate) targets: &'a [PreparedTarget],
    pub(crate) providers: &'a [ProviderTarget],
    pub(crate) shutdown: &'a CancellationToken,
    pub(crate) dlq: &'a dead_letters::DeadLetterProducer,
}

impl BatchWriter<'_> {
    /// Decides the batch in memory, settles its provider charges, then writes it in one
    /// transaction — record by record when PostgreSQL refuses the batch's data.
    pub(crate) async fn write(
        &self,
        records: &[InputRecord],
        moves: &[Move],
    ) -> Result<BatchReport, SinkError> {
        let views = views(self.targets);
        let decision = decision::decide(records, &views, &self.settings.events);
        let spans = record_spans(records, &decision, &self.settings.group_id);
        let provider =
            provider_settlement::settle(self.providers, self.shutdown, records, &decision, &spans)
                .await?;
        let transaction = batch_span(records.len(), &spans);
        async {
            match self
                .write_decided(records, moves, &views, &decision, &provider)
                .await
            {
                Err(SinkError::Data(error)) => {
                    warn!(%error, records = records.len(), "postgres refused the batch's data; redoing it one record at a time");
                    self.write_isolated(records, moves, &views, decision, &provider)
                        .await
                }
                other => other,
            }
        }
        .instrument(transaction)
        .await
    }

    /// Moves the checkpoints first: the row locks make a concurrent fence wait for this commit,
    /// and a fence that already happened makes the update match nothing.
    async fn begin_with_checkpoints(
        &self,
        moves: &[Move],
    ) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, SinkError> {
        let mut tx = self.pool.begin().await.map_err(SinkError::from_db)?;
        if self.settings.offsets == OffsetsMode::Postgres {
            let moved = checkpoint_store::advance(&mut tx, &self.settings.group_id, moves)
                .await
                .map_err(SinkError::from_db)?;
            let moving: Vec<i32> = moves.iter().map(|m| m.to.partition).collect();
            let partitions = checkpoint_rule::fenced_partitions(&moving, &moved);
            if !partitions.is_empty() {
                let _ = tx.rollback().await;
                counter!(m::BATCHES, "outcome" => "fenced").increment(1);
                error!(
                    ?partitions,
                    "batch rejected by the epoch fence: a newer owner fenced these partitions; \
                     rolled back, stopping"
                );
                return Err(SinkError::Fenced {
                    topic: self.settings.topic.clone(),
                    partitions,
                });
            }
        }
        Ok(tx)
    }

    async fn write_decided(
        &self,
        records: &[InputRecord],
        moves: &[Move],
        views: &[TargetView<'_>],
        decision: &BatchDecision,
        provider: &ProviderResults,
    ) -> Result<BatchReport, SinkError> {
        let mut tx = self.begin_with_checkpoints(moves).await?;
        let mut report = BatchReport {
            records: records.len(),
            ..BatchReport::default()
        };
        let (counts, mut conflicts) = self
            .write_targets(&mut tx, records, views, decision)
            .await?;
        for (target, counts) in self.targets.iter().zip(counts) {
            report.per_target.push((target.name().to_owned(), counts));
        }
        self.write_results(&mut tx, provider).await?;
        conflicts.extend(provider.conflicts.iter().cloned());
        let mut dead_letters: Vec<(usize, Refusal)> = decision.dead_letters.clone();
        dead_letters.extend(provider.dead_letters.iter().cloned());
        dead_letters.sort_by_key(|(index, _)| *index);
        self.finish(
            &mut tx,
            records,
            &conflicts,
            &provider.held,
            &dead_letters,
            &mut report,
        )
        .await?;
        tx.commit().await.map_err(SinkError::from_db)?;
        Ok(report)
    }

    /// The slow path after PostgreSQL refused a batch's data (a CHECK constraint, a second unique
    /// index, a trigger): each record in its own savepoint; a refused record is dead-lettered with
    /// the database's reason, the others are written as usual.
    async fn write_isolated(
        &self,
        records: &[InputRecord],
        moves: &[Move],
        views: &[TargetView<'_>],
        decision: BatchDecision,
        provider: &ProviderResults,
    ) -> Result<BatchReport, SinkError> {
        let mut tx = self.begin_with_checkpoints(moves).await?;
        let mut report = BatchReport {
            records: records.len(),
            isolated: true,
            ..BatchReport::default()
        };
        let mut totals = vec![TargetCounts::default(); self.targets.len()];
        let mut conflicts: Vec<ConflictRow> = provider.conflicts.clone();
        let mut dead_letters = decision.dead_letters.clone();
        dead_letters.extend(provider.dead_letters.iter().cloned());
        for (index, event) in decision.events.iter().enumerate() {
            if event.is_none() {
                continue;
            }
            let single = std::slice::from_ref(&records[index]);
            let one = decision::decide(single, views, &self.settings.events);
            let mut savepoint = sqlx::Connection::begin(&mut *tx)
                .await
                .map_err(SinkError::from_db)?;
            match self
                .write_targets(&mut savepoint, single, views, &one)
                .await
            {
                Ok((counts, record_conflicts)) => {
                    savepoint.commit().await.map_err(SinkError::from_db)?;
                    for (total, c) in totals.iter_mut().zip(counts) {
                        total.written += c.written;
                        total.duplicates += c.duplicates;
                        total.conflicts += c.conflicts;
                        total.stale += c.stale;
                        total.skipped += c.skipped;
                    }
                    conflicts.extend(record_conflicts);
                }
                Err(SinkError::Data(error)) => {
                    savepoint.rollback().await.map_err(SinkError::from_db)?;
                    dead_letters.push((
                        index,
                        Refusal {
                            reason: DeadLetterReason::InvalidField,
                            detail: format!("postgres refused the row: {error}"),
                        },
                    ));
                }
                Err(other) => return Err(other),
            }
        }
        dead_letters.sort_by_key(|(index, _)| *index);
        self.write_results(&mut tx, provider).await?;
        for (target, counts) in self.targets.iter().zip(totals) {
            report.per_target.push((target.name().to_owned(), counts));
        }
        self.finish(
            &mut tx,
            records,
            &conflicts,
            &provider.held,
            &dead_letters,
            &mut report,
        )
        .await?;
        tx.commit().await.map_err(SinkError::from_db)?;
        Ok(report)
    }

    /// Each provider target's results rows (`[targets.results]`), one statement per table.
    async fn write_results(
        &self,
        conn: &mut PgConnection,
        provider: &ProviderResults,
    ) -> Result<(), SinkError> {
        for (target, rows) in self.providers.iter().zip(&provider.result_rows) {
            if let Some(table) = target.results() {
                table.write(conn, rows).await?;
            }
        }
        Ok(())
    }

    /// Every target's write (one statement each), then the outcomes of every record.
    async fn write_targets(
        &self,
        conn: &mut PgConnection,
        records: &[InputRecord],
        views: &[TargetView<'_>],
        decision: &BatchDecision,
    ) -> Result<(Vec<TargetCounts>, Vec<ConflictRow>), SinkError> {
        let mut counts = Vec::with_capacity(self.targets.len());
        let mut conflicts = Vec::new();
        for (t, (target, view)) in self.targets.iter().zip(views).enumerate() {
            let candidates = &decision.candidates[t];
            let send = &decision.send[t];
            let write = table_writer::write_target(conn, target, candidates, send)
                .await
                .map_err(SinkError::from_db)?;
            let mut outcomes = decision::outcomes(*view, candidates, &write);
            let late = decision::late_winners(candidates, send, &outcomes, &write);
            let stored_now = if late.is_empty() {
                HashMap::new()
            } else {
                let late_rows: Vec<&Candidate> = late.iter().map(|&i| &candidates[i]).collect();
                let stored_now = table_writer::compare_late(conn, target, &late_rows)
                    .await
                    .map_err(SinkError::from_db)?;
                warn!(
                    target = target.name(),
                    rows = late.len(),
                    "another writer stored some keys between this batch's read and its write; \
                     classified against what it stored"
                );
                stored_now
            };
            decision::settle_late(*view, candidates, &late, &stored_now, &mut outcomes);
            let (mut c, target_conflicts) = decision::resolve(
                *view,
                candidates,
                &outcomes,
                &write,
                &stored_now,
                records,
                &decision.events,
            );
            c.skipped = decision.skipped[t];
            counts.push(c);
            conflicts.extend(target_conflicts);
        }
        Ok((counts, conflicts))
    }

    /// Conflicts, held events and dead-letter rows into their tables, then the dead letters into
    /// Kafka — all before the commit (see `dead_letters` for why this order).
    async fn finish(
        &self,
        conn: &mut PgConnection,
        records: &[InputRecord],
        conflicts: &[ConflictRow],
        held: &[HeldRow],
        dead_letters: &[(usize, Refusal)],
        report: &mut BatchReport,
    ) -> Result<(), SinkError> {
        let sink = &self.settings.group_id;
        for row in held {
            warn!(
                target = %row.target,
                event_id = %row.event_id,
                operation_id = %row.operation_id,
                partition = row.partition,
                offset = row.offset,
                reason = %row.reason,
                "held: the provider operation is UNKNOWN and cannot be settled from the provider;                  not charged, not recorded as charged; kept in sink_held_operations until                  `eosctl held resolve`"
            );
        }
        table_writer::insert_held(conn, sink, held)
            .await
            .map_err(SinkError::from_db)?;
        report.held = held.iter().map(|row| row.target.clone()).collect();
        for conflict in conflicts {
            warn!(
                target = %conflict.target,
                key = %conflict.key,
                event_id = %conflict.event_id,
                partition = conflict.partition,
                offset = conflict.offset,
                incoming_fingerprint = %conflict.incoming_fingerprint,
                stored_fingerprint = ?conflict.stored_fingerprint,
                "conflict: same key, other content; kept in sink_conflicts"
            );
        }
        table_writer::insert_conflicts(conn, sink, conflicts)
            .await
            .map_err(SinkError::from_db)?;
        if dead_letters.is_empty() {
            return Ok(());
        }
        let rows: Vec<DeadLetterRow> = dead_letters
            .iter()
            .map(|(index, refusal)| {
                let record = &records[*index];
                DeadLetterRow {
                    topic: record.topic.clone(),
                    partition: record.partition,
                    offset: record.offset,
                    reason: refusal.reason.as_str().to_owned(),
                    detail: printable(&refusal.detail),
                }
            })
            .collect();
        table_writer::insert_dead_letters(conn, sink, &self.settings.dlq_topic, &rows)
            .await
            .map_err(SinkError::from_db)?;
        let letters: Vec<(&InputRecord, DeadLetterReason, &str)> = dead_letters
            .iter()
            .map(|(index, refusal)| (&records[*index], refusal.reason, refusal.detail.as_str()))
            .collect();
        for (record, reason, detail) in &letters {
            warn!(
                partition = record.partition,
                offset = record.offset,
                reason = reason.as_str(),
                detail,
                "dead-lettering record"
            );
        }
        dead_letters::deliver(self.dlq, &self.settings.dlq_topic, &letters)
            .await
            .map_err(SinkError::DeadLetter)?;
        report.dead_letters = letters.iter().map(|(_, reason, _)| *reason).collect();
        Ok(())
    }
}

fn views(targets: &[PreparedTarget]) -> Vec<TargetView<'_>> {
    targets
        .iter()
        .map(|t| TargetView {
            shape: &t.shape,
            kind: t.spec.kind,
        })
        .collect()
}

/// NUL cannot be stored in a text column; a detail is for humans, so escape it.
fn printable(detail: &str) -> String {
    detail.replace('\0', "\\0")
}
