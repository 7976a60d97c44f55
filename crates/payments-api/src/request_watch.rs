//! The progress watch of the requests (docs/OBSERVABILITY.md "Liveness"), loop `payments-api`:
//! work waits while a request is recording its payment in PostgreSQL (from its transaction's
//! begin to its commit), and progress is a request PostgreSQL answered — a payment committed, a
//! key seen before, or a refusal decided on the account's row. A request that ends with a
//! database error, or whose client went away first, is no progress. So a PostgreSQL that takes
//! requests and answers none (a lock held for ever, a connection that hangs, a pool whose every
//! connection waits on one) shows in `eos_loop_stalled_seconds`, the warning, `/readyz` and,
//! past `--stall-restart`, `/healthz` — unless the requests found PostgreSQL unreachable (an
//! outage, which a restart would not end).
//!
//! Requests refused before they reach PostgreSQL (bad input, a slow body) are not watched: they
//! wait on nothing of the service's.

use std::sync::Arc;

use eos_runtime::progress_watch::{InFlight, ProgressWatch, postgres_outage};
use sqlx::PgPool;

use crate::payment_store::{Recorded, StoreError};

/// The `loop` label of the requests' watch.
pub(crate) const LOOP: &str = "payments-api";

/// What a watched request waits for, as the warning and `/readyz` name it.
const WAITING_FOR: &str = "PostgreSQL to record a payment";

/// The watch every request that records a payment is told to.
#[derive(Debug, Clone)]
pub(crate) struct RequestWatch {
    watch: Arc<ProgressWatch>,
    pool: PgPool,
}

impl RequestWatch {
    pub(crate) fn new(watch: Arc<ProgressWatch>, pool: PgPool) -> Self {
        Self { watch, pool }
    }

    /// A request starts recording its payment.
    pub(crate) fn enter(&self) -> InFlight {
        self.watch.enter(WAITING_FOR)
    }

    /// How the request ended. Telling an outage apart may take a connection attempt
    /// (`postgres_outage`): it runs in a task of its own, so the answer is not held back.
    pub(crate) fn ended(&self, request: InFlight, recorded: &Result<Recorded, StoreError>) {
        let database = match recorded {
            Ok(_) | Err(StoreError::Refused(_)) => return request.answered(),
            Err(error) => error.database_error(),
        };
        if let Some(database) = database {
            let outage = postgres_outage(database, &self.pool);
            tokio::spawn(async move {
                if outage.await {
                    request.met_outage();
                }
            });
        }
    }
}
