//! The progress watch of the intent writes (docs/OBSERVABILITY.md "Liveness"), loop
//! `dedup-intent-writes`: work waits while a write call is in flight — a single Begin or Complete
//! queued for the group commit or in its group's statement (`group_commit.rs`), a batch call, a
//! Fail, MarkUnknown or Resolve — and progress is a write the database answered: committed, or
//! refused on the row's state (a stale token, a wrong state). A write that ends with a database
//! error, or whose caller's deadline passed first, is no progress. So a commit that hangs, or a
//! PostgreSQL that takes calls and answers none, shows in `eos_loop_stalled_seconds`, the
//! warning, `/readyz` and, past `--stall-restart`, `/healthz` — unless the writes found
//! PostgreSQL unreachable (an outage, which a restart would not end).
//!
//! The reconciler has a watch of its own (`dedup-reconciler`); reads (Get, ListUnknown) are not
//! watched: nothing waits on them but their caller.

use std::future::Future;
use std::sync::Arc;

use eos_runtime::progress_watch::{InFlight, ProgressWatch, postgres_outage};
use sqlx::PgPool;

use crate::error::DedupError;

/// The `loop` label of the intent writes' watch.
pub(crate) const LOOP: &str = "dedup-intent-writes";

/// The watch of the intent writes, shared by the gRPC handlers and the group commit.
#[derive(Debug, Clone)]
pub(crate) struct WriteWatch {
    watch: Arc<ProgressWatch>,
    /// The writes' pool, for telling an outage of PostgreSQL from a hang (`None` in tests
    /// without a database: no error is an outage).
    pool: Option<PgPool>,
}

impl WriteWatch {
    pub(crate) fn new(watch: Arc<ProgressWatch>, pool: Option<PgPool>) -> Self {
        Self { watch, pool }
    }

    /// One write starts waiting at `step`.
    pub(crate) fn enter(&self, step: &'static str) -> InFlight {
        self.watch.enter(step)
    }

    /// Tells the watch how `calls` ended: with `error` (`None`: answered). Decided now, so the
    /// returned future borrows nothing; it only waits when a pool timeout needs telling apart
    /// from an outage (`postgres_outage`), and may be awaited after the callers are answered.
    pub(crate) fn ended(
        &self,
        calls: Vec<InFlight>,
        error: Option<&DedupError>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let answered = error.is_none_or(DedupError::is_answer);
        let outage = match (error.and_then(DedupError::database_error), &self.pool) {
            (Some(database), Some(pool)) if !answered => Some(postgres_outage(database, pool)),
            _ => None,
        };
        async move {
            if answered {
                calls.into_iter().for_each(InFlight::answered);
                return;
            }
            // The outage marks the stall the calls share: one call tells it.
            if let Some(outage) = outage
                && outage.await
                && let Some(call) = calls.first()
            {
                call.met_outage();
            }
        }
    }

    /// Tells the watch how one call ended, without keeping its caller waiting: telling an
    /// outage apart may take a connection attempt, which runs in a task of its own.
    pub(crate) fn call_ended<T>(&self, call: InFlight, result: &Result<T, DedupError>) {
        match result {
            Ok(_) => call.answered(),
            Err(error) => {
                tokio::spawn(self.ended(vec![call], Some(error)));
            }
        }
    }

    /// Runs one write that does not go through the group commit, under the watch.
    pub(crate) async fn watched<T>(
        &self,
        step: &'static str,
        write: impl Future<Output = Result<T, DedupError>>,
    ) -> Result<T, DedupError> {
        let call = self.enter(step);
        let result = write.await;
        self.call_ended(call, &result);
        result
    }
}
