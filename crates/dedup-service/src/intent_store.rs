//! The PostgreSQL adapter: every transition is ONE conditional statement (`INSERT … ON CONFLICT`
//! or `UPDATE … WHERE state = ANY(..) AND fencing_token = .. AND <secret matches>`), so two
//! callers can never both
//! pass a check and both act; the triggers of the migration append each transition to
//! `dedup_intent_history` in that same statement. Timestamps come from the database's `now()`,
//! so leases and retention mean the same thing to every instance of the service.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use eos_runtime::postgres_pool::PoolBuilder;
use sqlx::postgres::PgPool;
use time::OffsetDateTime;

use eos_runtime::backoff::{Retryable as _, doubling};

use crate::error::DedupError;
use crate::validation::{BeginItem, CompleteItem, Resolution};
use dedup_client::state_machine::{
    BeginAsk, BeginOutcome, FencingSecret, Intent, IntentState, Transition, begin_outcome,
    expired_outcome,
};

/// The embedded migrations. They share `_sqlx_migrations` with other services' migrations when
/// those use the same database (the demo's sink-writer does), so migrations this service does
/// not know are not an error.
pub fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!();
    migrator.set_ignore_missing(true);
    migrator
}

/// Statements that hit a serialization failure or deadlock changed nothing; run them again.
const CONFLICT_RETRIES: usize = 5;

/// One Begin's answer plus what the metrics want to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginAnswer {
    /// The item's operation.
    pub operation_id: String,
    /// What the Begin answers: acquired (with the token), in progress, the settled state,
    /// a conflict, or expired.
    pub outcome: BeginOutcome,
    /// This very statement turned an expired lease into UNKNOWN.
    pub expired_lease_now: bool,
}

/// Figures for the UNKNOWN backlog over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BacklogCounts {
    pub(crate) backlog: i64,
    /// Transitions into UNKNOWN within the window.
    pub(crate) arrivals: i64,
    /// Transitions out of UNKNOWN within the window.
    pub(crate) cleared: i64,
}

/// The intents in PostgreSQL (`dedup_intents`, with `dedup_intent_history` written by its
/// triggers): every transition of the service, the reconciler and the purge goes through it.
#[derive(Debug, Clone)]
pub struct IntentStore {
    pool: PgPool,
    retention: Duration,
}

/// Opens a pool and applies the migrations.
pub async fn connect(database_url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    let pool = open(database_url, max_connections).await?;
    migrator().run(&pool).await?;
    Ok(pool)
}

/// How the store's pool is opened: every statement here is short, so a stuck one is a bug, not
/// a workload, and the server cancels it.
pub(crate) fn pool_builder(max_connections: u32) -> PoolBuilder {
    PoolBuilder::new(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        .session_setting("SET statement_timeout = '30s'")
}

/// Opens a pool with one attempt; the schema is left as it is.
pub(crate) async fn open(database_url: &str, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    pool_builder(max_connections).connect(database_url).await
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// One `dedup_intents` row as the queries return it: every query that reads intents selects
/// these columns, in this order (`query_as!` checks each against the table).
#[derive(Debug)]
struct IntentRow {
    operation_id: String,
    state: String,
    fingerprint: Vec<u8>,
    fencing_token: i64,
    holder: String,
    request_id: String,
    lease_expires_at: OffsetDateTime,
    acquired_at: OffsetDateTime,
    occurred_at: OffsetDateTime,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
    result: Option<Vec<u8>>,
    failure_reason: Option<String>,
    retryable: bool,
    detail: String,
    trace_context: Option<String>,
    fencing_secret: Vec<u8>,
}

impl TryFrom<IntentRow> for Intent {
    type Error = DedupError;

    fn try_from(row: IntentRow) -> Result<Self, DedupError> {
        let state = IntentState::from_db_str(&row.state)
            .ok_or_else(|| DedupError::CorruptRow(format!("unknown state {:?}", row.state)))?;
        let fencing_secret = FencingSecret::from_bytes(&row.fencing_secret).ok_or_else(|| {
            DedupError::CorruptRow(format!(
                "fencing_secret of {:?} is {} bytes",
                row.operation_id,
                row.fencing_secret.len()
            ))
        })?;
        Ok(Intent {
            operation_id: row.operation_id,
            state,
            fingerprint: row.fingerprint,
            fencing_token: row.fencing_token,
            fencing_secret,
            holder: row.holder,
            request_id: row.request_id,
            lease_expires_at: row.lease_expires_at,
            acquired_at: row.acquired_at,
            occurred_at: row.occurred_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
            result: row.result,
            failure_reason: row.failure_reason,
            retryable: row.retryable,
            detail: row.detail,
            trace_context: row.trace_context,
        })
    }
}

async fn retry_conflicts<T, F, Fut>(attempt: F) -> Result<T, DedupError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, DedupError>>,
{
    attempt
        .retry(
            doubling(Duration::from_millis(5), Duration::from_millis(80))
                .with_jitter()
                .with_max_times(CONFLICT_RETRIES),
        )
        .when(DedupError::is_retryable_conflict)
        .notify(|error, delay| {
            tracing::debug!(%error, retry_in_ms = delay.as_millis() as u64, "retrying after a serialization conflict");
        })
        .await
}

impl IntentStore {
    /// The store over `pool` (migrated: see [`migrator`]); operations older than `retention`
    /// answer EXPIRED and are purged.
    pub fn new(pool: PgPool, retention: Duration) -> Self {
        Self { pool, retention }
    }

    /// Begin for many operations in one statement (one round trip): creates the missing rows,
    /// re-acquires retryable failures, turns expired leases UNKNOWN, and returns every touched
    /// row locked at its latest version. Items older than the retained window are left out of
    /// the statement (never acquired) and answered from a second read.
    pub async fn begin_batch(&self, items: &[BeginItem]) -> Result<Vec<BeginAnswer>, DedupError> {
        let (rows, db_now) = retry_conflicts(|| self.upsert_begin(items)).await?;
        let mut by_id: HashMap<String, Intent> = rows
            .into_iter()
            .map(|row| (row.operation_id.clone(), row))
            .collect();
        let left_out: Vec<String> = items
            .iter()
            .filter(|item| !by_id.contains_key(&item.operation_id))
            .map(|item| item.operation_id.clone())
            .collect();
        let expired = if left_out.is_empty() {
            None
        } else {
            Some(self.read_expired(&left_out).await?)
        };
        let answers: Vec<BeginAnswer> = items
            .iter()
            .map(|item| {
                let ask = BeginAsk {
                    fingerprint: &item.fingerprint,
                    owner: &item.owner,
                    request_id: &item.request_id,
                };
                if let Some(row) = by_id.remove(&item.operation_id) {
                    return Ok(answer(item, &row, &ask, db_now));
                }
                let Some((rows, retained_since, now)) = &expired else {
                    return Err(DedupError::CorruptRow(format!(
                        "begin returned no row for {:?}",
                        item.operation_id
                    )));
                };
                Ok(BeginAnswer {
                    operation_id: item.operation_id.clone(),
                    outcome: expired_outcome(
                        rows.get(&item.operation_id),
                        &ask,
                        *retained_since,
                        *now,
                    ),
                    expired_lease_now: false,
                })
            })
            .collect::<Result<_, DedupError>>()?;
        self.with_stuck_reasons(answers).await
    }

    /// Adds the reconciler's verdict to UNKNOWN answers whose attempt it found stuck for good.
    /// One read, only when some answer is UNKNOWN.
    async fn with_stuck_reasons(
        &self,
        mut answers: Vec<BeginAnswer>,
    ) -> Result<Vec<BeginAnswer>, DedupError> {
        let unknown: Vec<String> = answers
            .iter()
            .filter(|answer| matches!(answer.outcome, BeginOutcome::Unknown { .. }))
            .map(|answer| answer.operation_id.clone())
            .collect();
        if unknown.is_empty() {
            return Ok(answers);
        }
        let stuck = self.stuck_reasons(&unknown).await?;
        for answer in &mut answers {
            if let BeginOutcome::Unknown { stuck_reason, .. } = &mut answer.outcome
                && let Some(reason) = stuck.get(&answer.operation_id)
            {
                *stuck_reason = Some(reason.clone());
            }
        }
        Ok(answers)
    }

    /// The reconciler's stuck verdicts on the current attempt of those of `ids` that are UNKNOWN,
    /// by operation id (a verdict on an earlier attempt no longer counts).
    pub(crate) async fn stuck_reasons(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, String>, DedupError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        Ok(sqlx::query_as::<_, (String, String)>(
            "SELECT operation_id, stuck_reason FROM dedup_intents
             WHERE operation_id = ANY($1) AND state = 'UNKNOWN'
               AND stuck_reason IS NOT NULL AND stuck_fencing_token = fencing_token",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .collect())
    }

    /// Records the reconciler's verdict that the UNKNOWN attempt `fencing_token` cannot be
    /// settled from the provider. The state stays UNKNOWN. False when the intent has moved on
    /// (resolved, or another attempt) since it was read.
    pub(crate) async fn mark_stuck(
        &self,
        operation_id: &str,
        fencing_token: i64,
        reason: &str,
    ) -> Result<bool, DedupError> {
        let updated = sqlx::query(
            "UPDATE dedup_intents SET stuck_reason = $3, stuck_fencing_token = $2
             WHERE operation_id = $1 AND state = 'UNKNOWN' AND fencing_token = $2
               AND stuck_fencing_token IS DISTINCT FROM $2",
        )
        .bind(operation_id)
        .bind(fencing_token)
        .bind(reason)
        .execute(&self.pool)
        .await?;
        Ok(updated.rows_affected() > 0)
    }

    /// The one statement of a Begin batch: inserts the missing rows, re-acquires retryable
    /// failures and turns expired leases UNKNOWN; the rows it touched and the database's now.
    ///
    /// About 150 lines, kept whole: most of it is that statement, one literal that `query!`
    /// checks against the table, and its rows come back as `query!`'s own record type, which no
    /// other function can name.
    async fn upsert_begin(
        &self,
        items: &[BeginItem],
    ) -> Result<(Vec<Intent>, OffsetDateTime), DedupError> {
        let mut ids = Vec::with_capacity(items.len());
        let mut fingerprints = Vec::with_capacity(items.len());
        let mut owners = Vec::with_capacity(items.len());
        let mut request_ids = Vec::with_capacity(items.len());
        let mut leases = Vec::with_capacity(items.len());
        let mut occurred = Vec::with_capacity(items.len());
        let mut trace_contexts = Vec::with_capacity(items.len());
        // A fresh secret per item and statement: it is stored only where this statement acquires
        // (a new row, or a re-acquired retryable failure); elsewhere the row keeps its own.
        let secrets: Vec<FencingSecret> = items.iter().map(|_| FencingSecret::random()).collect();
        let secrets: Vec<&[u8]> = secrets.iter().map(|s| s.as_bytes().as_slice()).collect();
        for item in items {
            ids.push(item.operation_id.as_str());
            fingerprints.push(item.fingerprint.as_slice());
            owners.push(item.owner.as_str());
            request_ids.push(item.request_id.as_str());
            leases.push(millis(item.lease_ttl));
            occurred.push(item.occurred_at);
            trace_contexts.push(item.trace_context.as_deref());
        }
        // The update is `state_machine::begin_transition`, and the equivalence test
        // (integration-tests/tests/it/dedup_transitions.rs) checks every case against it. Its two
        // conditions recur in the update (written out: `query!` checks one literal):
        // a reservation whose lease ran out becomes UNKNOWN — its holder may have called:
        //     (t.state = 'RESERVED' AND t.lease_expires_at <= now())
        // a retryable failure with the same fingerprint is acquired again (new token):
        //     (t.state = 'FAILED' AND t.retryable AND t.fingerprint = EXCLUDED.fingerprint)
        let rows = sqlx::query!(
            r#"INSERT INTO dedup_intents AS t
                 (operation_id, fingerprint, state, fencing_token, holder, request_id,
                  lease_expires_at, acquired_at, occurred_at, created_at, updated_at, detail,
                  trace_context, fencing_secret)
             SELECT i.operation_id, i.fingerprint, 'RESERVED', 1, i.owner, i.request_id,
                    now() + i.lease_ms * interval '1 millisecond', now(), i.occurred_at,
                    now(), now(), 'acquired by ' || i.owner, i.trace_context, i.fencing_secret
             FROM unnest($1::text[], $2::bytea[], $3::text[], $4::text[], $5::bigint[],
                         $6::timestamptz[], $8::text[], $9::bytea[])
                  AS i(operation_id, fingerprint, owner, request_id, lease_ms, occurred_at,
                       trace_context, fencing_secret)
             WHERE i.occurred_at >= now() - $7::bigint * interval '1 millisecond'
             ORDER BY i.operation_id
             ON CONFLICT (operation_id) DO UPDATE SET
                 state = CASE
                     WHEN (t.state = 'RESERVED' AND t.lease_expires_at <= now()) THEN 'UNKNOWN'
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN 'RESERVED'
                     ELSE t.state END,
                 fencing_token = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN t.fencing_token + 1
                     ELSE t.fencing_token END,
                 fencing_secret = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN EXCLUDED.fencing_secret
                     ELSE t.fencing_secret END,
                 holder = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN EXCLUDED.holder
                     ELSE t.holder END,
                 request_id = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN EXCLUDED.request_id
                     ELSE t.request_id END,
                 lease_expires_at = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN EXCLUDED.lease_expires_at
                     ELSE t.lease_expires_at END,
                 acquired_at = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN now()
                     ELSE t.acquired_at END,
                 trace_context = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN EXCLUDED.trace_context
                     ELSE t.trace_context END,
                 result = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN NULL
                     ELSE t.result END,
                 failure_reason = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN NULL
                     ELSE t.failure_reason END,
                 retryable = CASE
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN FALSE
                     ELSE t.retryable END,
                 detail = CASE
                     WHEN (t.state = 'RESERVED' AND t.lease_expires_at <= now())
                         THEN 'lease of ' || t.holder || ' expired without an outcome'
                     WHEN (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint)
                         THEN 'acquired again by ' || EXCLUDED.holder
                              || ' after a retryable failure'
                     ELSE t.detail END,
                 updated_at = CASE
                     WHEN (t.state = 'RESERVED' AND t.lease_expires_at <= now())
                       OR (t.state = 'FAILED' AND t.retryable
                           AND t.fingerprint = EXCLUDED.fingerprint) THEN now()
                     ELSE t.updated_at END
             RETURNING operation_id, state, fingerprint, fencing_token, holder, request_id,
                 lease_expires_at, acquired_at, occurred_at, created_at, updated_at, result,
                 failure_reason, retryable, detail, trace_context, fencing_secret, now() AS "db_now!""#,
            &ids as &[&str],
            &fingerprints as &[&[u8]],
            &owners as &[&str],
            &request_ids as &[&str],
            &leases,
            &occurred,
            millis(self.retention),
            &trace_contexts as &[Option<&str>],
            &secrets as &[&[u8]],
        )
        .fetch_all(&self.pool)
        .await?;
        let mut db_now = None;
        let mut intents = Vec::with_capacity(rows.len());
        for row in rows {
            db_now = Some(row.db_now);
            intents.push(Intent::try_from(IntentRow {
                operation_id: row.operation_id,
                state: row.state,
                fingerprint: row.fingerprint,
                fencing_token: row.fencing_token,
                holder: row.holder,
                request_id: row.request_id,
                lease_expires_at: row.lease_expires_at,
                acquired_at: row.acquired_at,
                occurred_at: row.occurred_at,
                created_at: row.created_at,
                updated_at: row.updated_at,
                result: row.result,
                failure_reason: row.failure_reason,
                retryable: row.retryable,
                detail: row.detail,
                trace_context: row.trace_context,
                fencing_secret: row.fencing_secret,
            })?);
        }
        let db_now = match db_now {
            Some(now) => now,
            None => self.now().await?,
        };
        Ok((intents, db_now))
    }

    /// Rows of operations left out of the upsert as too old, the start of the retained window,
    /// and the database's now.
    async fn read_expired(
        &self,
        ids: &[String],
    ) -> Result<(HashMap<String, Intent>, OffsetDateTime, OffsetDateTime), DedupError> {
        let window = sqlx::query!(
            r#"SELECT now() - $1::bigint * interval '1 millisecond' AS "since!", now() AS "now!""#,
            millis(self.retention),
        )
        .fetch_one(&self.pool)
        .await?;
        let by_id = self.read_many(ids).await?;
        Ok((by_id, window.since, window.now))
    }

    /// The current rows of `ids` that exist, by operation id.
    async fn read_many(&self, ids: &[String]) -> Result<HashMap<String, Intent>, DedupError> {
        let rows = sqlx::query_as!(
            IntentRow,
            "SELECT operation_id, state, fingerprint, fencing_token, holder, request_id,
                 lease_expires_at, acquired_at, occurred_at, created_at, updated_at, result,
                 failure_reason, retryable, detail, trace_context, fencing_secret
             FROM dedup_intents WHERE operation_id = ANY($1)",
            ids,
        )
        .fetch_all(&self.pool)
        .await?;
        let mut by_id = HashMap::with_capacity(rows.len());
        for row in rows {
            let intent = Intent::try_from(row)?;
            by_id.insert(intent.operation_id.clone(), intent);
        }
        Ok(by_id)
    }

    async fn now(&self) -> Result<OffsetDateTime, DedupError> {
        Ok(sqlx::query_scalar!(r#"SELECT now() AS "now!""#)
            .fetch_one(&self.pool)
            .await?)
    }

    /// The intent of `operation_id` as stored; `None` when never begun or purged.
    pub async fn get(&self, operation_id: &str) -> Result<Option<Intent>, DedupError> {
        let row = sqlx::query_as!(
            IntentRow,
            "SELECT operation_id, state, fingerprint, fencing_token, holder, request_id,
                 lease_expires_at, acquired_at, occurred_at, created_at, updated_at, result,
                 failure_reason, retryable, detail, trace_context, fencing_secret
             FROM dedup_intents WHERE operation_id = $1",
            operation_id,
        )
        .fetch_optional(&self.pool)
        .await?;
        row.map(Intent::try_from).transpose()
    }

    /// Complete, Fail or MarkUnknown by the holder of `fencing_token`, proven by its secret.
    ///
    /// The secret is checked inside the one conditional statement, as `sha256(stored) =
    /// sha256(presented)`: PostgreSQL compares bytea with an early exit, so it compares digests,
    /// whose timing says nothing usable about the secret (finding a presented value whose digest
    /// shares a prefix with the stored digest does not bring a caller closer to the secret).
    /// Why a statement changed nothing is then told in Rust, in constant time (`unchanged`).
    pub async fn report(
        &self,
        operation_id: &str,
        fencing_token: i64,
        fencing_secret: &[u8],
        report: HolderReport,
    ) -> Result<Intent, DedupError> {
        let transition = report.transition();
        let (result, failure_reason, retryable, detail) = match &report {
            HolderReport::Complete { result } => (
                Some(result.as_slice()),
                None,
                false,
                "completed by the holder".to_owned(),
            ),
            HolderReport::Fail { reason, retryable } => (
                None,
                Some(reason.as_str()),
                *retryable,
                format!("failed by the holder: {reason}"),
            ),
            HolderReport::MarkUnknown { detail } => (
                None,
                None,
                false,
                format!("marked unknown by the holder: {detail}"),
            ),
        };
        let updated = retry_conflicts(|| async {
            Ok(sqlx::query_as!(
                IntentRow,
                "UPDATE dedup_intents SET state = $3, result = $4, failure_reason = $5,
                     retryable = $6, detail = $7, updated_at = now()
                 WHERE operation_id = $1 AND fencing_token = $2 AND state = ANY($8)
                   AND sha256(fencing_secret) = sha256($9::bytea)
                 RETURNING operation_id, state, fingerprint, fencing_token, holder, request_id,
                     lease_expires_at, acquired_at, occurred_at, created_at, updated_at, result,
                     failure_reason, retryable, detail, trace_context, fencing_secret",
                operation_id,
                fencing_token,
                transition.to_state().as_db_str(),
                result,
                failure_reason,
                retryable,
                &detail,
                &transition.from_db_states(),
                fencing_secret,
            )
            .fetch_optional(&self.pool)
            .await?)
        })
        .await?;
        if let Some(row) = updated {
            return Intent::try_from(row);
        }
        // Nothing changed; read the row only to say why (or that this is a harmless repeat).
        let current = self.get(operation_id).await?;
        unchanged(
            operation_id,
            fencing_token,
            fencing_secret,
            transition,
            current,
        )
    }

    /// Complete for many operations in one statement; one answer per item, in order.
    /// Operation ids must be distinct.
    pub async fn complete_batch(
        &self,
        items: &[CompleteItem],
    ) -> Result<Vec<Result<Intent, DedupError>>, DedupError> {
        let transition = Transition::Complete;
        let ids: Vec<&str> = items.iter().map(|i| i.operation_id.as_str()).collect();
        let tokens: Vec<i64> = items.iter().map(|i| i.fencing_token).collect();
        let results: Vec<&[u8]> = items.iter().map(|i| i.result.as_slice()).collect();
        let secrets: Vec<&[u8]> = items.iter().map(|i| i.fencing_secret.as_slice()).collect();
        let rows = retry_conflicts(|| async {
            Ok(sqlx::query_as!(
                IntentRow,
                "UPDATE dedup_intents t SET state = $4, result = i.result, failure_reason = NULL,
                     retryable = FALSE, detail = 'completed by the holder', updated_at = now()
                 FROM unnest($1::text[], $2::bigint[], $3::bytea[], $6::bytea[])
                     AS i(operation_id, token, result, secret)
                 WHERE t.operation_id = i.operation_id AND t.fencing_token = i.token
                   AND t.state = ANY($5)
                   AND sha256(t.fencing_secret) = sha256(i.secret)
                 RETURNING t.operation_id, t.state, t.fingerprint, t.fencing_token, t.holder,
                     t.request_id, t.lease_expires_at, t.acquired_at, t.occurred_at,
                     t.created_at, t.updated_at, t.result, t.failure_reason, t.retryable,
                     t.detail, t.trace_context, t.fencing_secret",
                &ids as &[&str],
                &tokens,
                &results as &[&[u8]],
                transition.to_state().as_db_str(),
                &transition.from_db_states(),
                &secrets as &[&[u8]],
            )
            .fetch_all(&self.pool)
            .await?)
        })
        .await?;
        let mut done: HashMap<String, Intent> = HashMap::with_capacity(rows.len());
        for row in rows {
            let intent = Intent::try_from(row)?;
            done.insert(intent.operation_id.clone(), intent);
        }
        let left: Vec<String> = items
            .iter()
            .filter(|i| !done.contains_key(&i.operation_id))
            .map(|i| i.operation_id.clone())
            .collect();
        let mut current: HashMap<String, Intent> = HashMap::new();
        if !left.is_empty() {
            current = self.read_many(&left).await?;
        }
        Ok(items
            .iter()
            .map(|item| match done.remove(&item.operation_id) {
                Some(intent) => Ok(intent),
                None => unchanged(
                    &item.operation_id,
                    item.fencing_token,
                    &item.fencing_secret,
                    transition,
                    current.remove(&item.operation_id),
                ),
            })
            .collect())
    }

    /// Settles an UNKNOWN with evidence.
    pub async fn resolve(&self, resolution: &Resolution) -> Result<Intent, DedupError> {
        let transition = match resolution.outcome {
            IntentState::Succeeded => Transition::ResolveSucceeded,
            _ => Transition::ResolveFailed,
        };
        let succeeded = transition == Transition::ResolveSucceeded;
        let detail = format!(
            "resolved {}: {}",
            transition.to_state(),
            resolution.evidence
        );
        let updated = retry_conflicts(|| async {
            Ok(sqlx::query_as!(
                IntentRow,
                "UPDATE dedup_intents SET state = $2, result = $3, failure_reason = $4,
                     retryable = $5, detail = $6, updated_at = now()
                 WHERE operation_id = $1 AND state = ANY($7)
                   AND ($8::bigint IS NULL OR fencing_token = $8)
                 RETURNING operation_id, state, fingerprint, fencing_token, holder, request_id,
                     lease_expires_at, acquired_at, occurred_at, created_at, updated_at, result,
                     failure_reason, retryable, detail, trace_context, fencing_secret",
                &resolution.operation_id,
                transition.to_state().as_db_str(),
                succeeded.then_some(resolution.result.as_slice()),
                (!succeeded).then_some(resolution.evidence.as_str()),
                !succeeded && resolution.retryable,
                &detail,
                &transition.from_db_states(),
                resolution.expected_fencing_token,
            )
            .fetch_optional(&self.pool)
            .await?)
        })
        .await?;
        if let Some(row) = updated {
            return Intent::try_from(row);
        }
        let current =
            self.get(&resolution.operation_id)
                .await?
                .ok_or_else(|| DedupError::NotFound {
                    operation_id: resolution.operation_id.clone(),
                })?;
        if let Some(expected) = resolution.expected_fencing_token
            && expected != current.fencing_token
        {
            return Err(DedupError::StaleToken {
                operation_id: resolution.operation_id.clone(),
                presented: expected,
                current: current.fencing_token,
            });
        }
        if current.state == transition.to_state() {
            return Ok(current);
        }
        Err(DedupError::WrongState {
            operation_id: resolution.operation_id.clone(),
            state: current.state,
            transition,
        })
    }

    /// UNKNOWN intents, oldest first.
    pub(crate) async fn list_unknown(&self, limit: u32) -> Result<Vec<Intent>, DedupError> {
        self.list_unknown_page(None, limit).await
    }

    /// UNKNOWN intents after `after` (`(updated_at, operation_id)` of the previous page's last).
    pub(crate) async fn list_unknown_page(
        &self,
        after: Option<&(OffsetDateTime, String)>,
        limit: u32,
    ) -> Result<Vec<Intent>, DedupError> {
        let rows = sqlx::query_as!(
            IntentRow,
            "SELECT operation_id, state, fingerprint, fencing_token, holder, request_id,
                 lease_expires_at, acquired_at, occurred_at, created_at, updated_at, result,
                 failure_reason, retryable, detail, trace_context, fencing_secret
             FROM dedup_intents
             WHERE state = 'UNKNOWN'
               AND ($2::timestamptz IS NULL OR (updated_at, operation_id) > ($2, $3))
             ORDER BY updated_at, operation_id LIMIT $1",
            i64::from(limit),
            after.map(|(at, _)| *at),
            after.map(|(_, id)| id.as_str()),
        )
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(Intent::try_from).collect()
    }

    /// Turns up to `limit` reservations whose lease ran out into UNKNOWN; their ids.
    pub async fn expire_leases(&self, limit: i64) -> Result<Vec<String>, DedupError> {
        let ids = retry_conflicts(|| async {
            Ok(sqlx::query_scalar!(
                "UPDATE dedup_intents t SET state = 'UNKNOWN',
                     detail = 'lease of ' || t.holder || ' expired without an outcome',
                     updated_at = now()
                 FROM (SELECT operation_id FROM dedup_intents
                       WHERE state = 'RESERVED' AND lease_expires_at <= now()
                       ORDER BY lease_expires_at LIMIT $1
                       FOR UPDATE SKIP LOCKED) due
                 WHERE t.operation_id = due.operation_id
                   AND t.state = 'RESERVED' AND t.lease_expires_at <= now()
                 RETURNING t.operation_id",
                limit,
            )
            .fetch_all(&self.pool)
            .await?)
        })
        .await?;
        Ok(ids)
    }

    /// Deletes up to `limit` settled rows (and their history) past retention; how many.
    /// The rule is [`dedup_client::state_machine::purgeable`]: its states are bound from
    /// [`IntentState::purgeable_db_states`], and the time conditions are its own.
    ///
    /// Only SUCCEEDED and FAILED rows are ever purged. A RESERVED or UNKNOWN row stands for a
    /// provider call whose outcome nobody knows yet: deleting it would let a replay acquire the
    /// operation again and call the provider a second time for what may already be applied.
    /// Such rows stay until reconciled, however old (the UNKNOWN backlog gauge shows them).
    pub async fn purge(&self, limit: i64) -> Result<u64, DedupError> {
        let purgeable_states = IntentState::purgeable_db_states();
        let deleted: i64 = retry_conflicts(|| async {
            Ok(sqlx::query_scalar!(
                r#"WITH doomed AS (
                     SELECT operation_id FROM dedup_intents
                     WHERE state = ANY($3)
                       AND occurred_at < now() - $1::bigint * interval '1 millisecond'
                       AND updated_at < now() - $1::bigint * interval '1 millisecond'
                     LIMIT $2
                     FOR UPDATE SKIP LOCKED),
                 gone AS (
                     DELETE FROM dedup_intents t USING doomed
                     WHERE t.operation_id = doomed.operation_id
                       AND t.state = ANY($3)
                     RETURNING t.operation_id),
                 history AS (
                     DELETE FROM dedup_intent_history h USING gone
                     WHERE h.operation_id = gone.operation_id)
                 SELECT count(*) AS "deleted!" FROM gone"#,
                millis(self.retention),
                limit,
                &purgeable_states,
            )
            .fetch_one(&self.pool)
            .await?)
        })
        .await?;
        Ok(u64::try_from(deleted).unwrap_or(0))
    }

    /// The UNKNOWN backlog and the transitions into and out of UNKNOWN within `window`.
    pub(crate) async fn backlog_counts(
        &self,
        window: Duration,
    ) -> Result<BacklogCounts, DedupError> {
        let counts = sqlx::query!(
            r#"SELECT
                 (SELECT count(*) FROM dedup_intents WHERE state = 'UNKNOWN') AS "backlog!",
                 (SELECT count(*) FROM dedup_intent_history
                  WHERE to_state = 'UNKNOWN'
                    AND at > now() - $1::bigint * interval '1 millisecond') AS "arrivals!",
                 (SELECT count(*) FROM dedup_intent_history
                  WHERE from_state = 'UNKNOWN' AND to_state <> 'UNKNOWN'
                    AND at > now() - $1::bigint * interval '1 millisecond') AS "cleared!""#,
            millis(window),
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(BacklogCounts {
            backlog: counts.backlog,
            arrivals: counts.arrivals,
            cleared: counts.cleared,
        })
    }

    /// The database's clock.
    pub(crate) async fn db_now(&self) -> Result<OffsetDateTime, DedupError> {
        self.now().await
    }
}

/// Why a holder's report changed nothing: not found, a stale token, a secret that is not the
/// token's, a state the transition does not start from — or nothing wrong at all, when the
/// holder repeats what is already recorded (a repeat needs the secret too).
fn unchanged(
    operation_id: &str,
    fencing_token: i64,
    fencing_secret: &[u8],
    transition: Transition,
    current: Option<Intent>,
) -> Result<Intent, DedupError> {
    let current = current.ok_or_else(|| DedupError::NotFound {
        operation_id: operation_id.to_owned(),
    })?;
    if current.fencing_token != fencing_token {
        return Err(DedupError::StaleToken {
            operation_id: operation_id.to_owned(),
            presented: fencing_token,
            current: current.fencing_token,
        });
    }
    if !current.fencing_secret.matches(fencing_secret) {
        return Err(DedupError::WrongFencingSecret {
            operation_id: operation_id.to_owned(),
            fencing_token,
        });
    }
    let repeat = current.state == transition.to_state()
        // "I don't know" from the holder adds nothing once the outcome is known.
        || (transition == Transition::MarkUnknown && current.state.is_settled());
    if repeat {
        return Ok(current);
    }
    Err(DedupError::WrongState {
        operation_id: operation_id.to_owned(),
        state: current.state,
        transition,
    })
}

fn answer(
    item: &BeginItem,
    row: &Intent,
    ask: &BeginAsk<'_>,
    db_now: OffsetDateTime,
) -> BeginAnswer {
    let outcome = begin_outcome(row, ask);
    let expired_lease_now = row.state == IntentState::Unknown && row.updated_at == db_now;
    BeginAnswer {
        operation_id: item.operation_id.clone(),
        outcome,
        expired_lease_now,
    }
}

/// What a holder reports with its fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderReport {
    /// The provider applied the effect; `result` is its record.
    Complete {
        /// The provider's record of the effect.
        result: Vec<u8>,
    },
    /// The provider refused: FAILED, retryable or not.
    Fail {
        /// Why, as the provider said.
        reason: String,
        /// Whether a later Begin may acquire the operation again.
        retryable: bool,
    },
    /// The holder does not know whether the call landed (timeout, lost answer): UNKNOWN, for the
    /// reconciler.
    MarkUnknown {
        /// What the holder saw.
        detail: String,
    },
}

impl HolderReport {
    pub(crate) fn transition(&self) -> Transition {
        match self {
            Self::Complete { .. } => Transition::Complete,
            Self::Fail { .. } => Transition::Fail,
            Self::MarkUnknown { .. } => Transition::MarkUnknown,
        }
    }
}
