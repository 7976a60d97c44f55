//! Logical mode's reader of the slot (docs/architecture/outbox.md): a replication session
//! (`START_REPLICATION ... LOGICAL`, pgoutput) that PostgreSQL's walsender feeds as the WAL is
//! written, so each change is decoded once. Reading the slot through
//! `pg_logical_slot_peek_binary_changes` instead decodes again, on every read, all the WAL from
//! the slot's restart point: on a backlog that cost PostgreSQL three times the relay's own CPU.
//!
//! The position protocol is the peek's: a transaction is in Kafka iff its commit record starts
//! before the position. A session starts at a position (PostgreSQL skips every transaction whose
//! commit starts before it) and the slot is confirmed — a standby status update's flush
//! position — only up to a position Kafka has committed ([`WalStream::acknowledge`]), so a crash
//! anywhere decodes again what Kafka may not hold.
//!
//! A read goes on where the last one ended. One that was cut off (its batch's transaction aborted
//! and the prefetched read was dropped), or asked for another position (a recovery read Kafka's
//! position back), starts a new session at the position asked for.

use std::str::FromStr as _;
use std::time::{Duration, Instant};

use pgwire_replication::{ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use sqlx::PgPool;

use crate::error::RelayError;
use crate::pgoutput::Lsn;
use crate::txn_assembler::{DecodedTxn, TxnAssembler};

/// Caught up, how long a read waits for the walsender to hand over the WAL flushed before the
/// read began. The walsender is woken by the flush; a read that gives up early only leaves the
/// rest to the next read (the position never passes what was handed over).
const CATCH_UP_WAIT: Duration = Duration::from_millis(50);
/// A read ends between two transactions once it has taken this long, whatever it found: a
/// stream that keeps handing over transactions without outbox rows still moves the position.
const READ_AT_MOST: Duration = Duration::from_secs(1);
/// How long closing a session may take before its connection is dropped.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// Events the session buffers ahead of the reads: most are inserts carrying their whole row, so
/// this bounds the memory a backlog takes (about 4 MiB of 1 KiB rows); past it the walsender
/// waits, as the socket's flow control makes it.
const BUFFERED_EVENTS: usize = 4096;

/// Where and as whom the replication session connects: the relay's database URL, read as
/// libpq (and sqlx) read it, its `PG*` environment defaults included.
#[derive(Clone)]
pub struct ReplicationTarget {
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    tls: TlsConfig,
    /// `sslmode=prefer` (libpq's default): TLS where the server offers it, plain text where it
    /// does not. The replication client cannot fall back by itself, so
    /// [`ReplicationTarget::settle_preferred_tls`] asks the server how the pool connected.
    tls_preferred: bool,
    application_name: String,
    /// How often the session tells PostgreSQL the confirmed position, once it moved
    /// (`--slot-confirm-interval`).
    confirm_interval: Duration,
}

impl std::fmt::Debug for ReplicationTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password is left out: a secret is never printed (docs/security.md).
        f.debug_struct("ReplicationTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .field("application_name", &self.application_name)
            .field("confirm_interval", &self.confirm_interval)
            .finish_non_exhaustive()
    }
}

impl ReplicationTarget {
    /// The target of the database URL `url` (`postgres://user:password@host:port/db?sslmode=...`).
    pub fn from_url(url: &str) -> Result<Self, RelayError> {
        let invalid = |detail: String| RelayError::Config(format!("the database URL: {detail}"));
        let options = sqlx::postgres::PgConnectOptions::from_str(url)
            .map_err(|error| invalid(error.to_string()))?;
        let parsed = url::Url::parse(url).map_err(|error| invalid(error.to_string()))?;
        let param = |name: &str, env: &str| {
            parsed
                .query_pairs()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.into_owned())
                .or_else(|| std::env::var(env).ok())
        };
        let password = match parsed.password() {
            Some(encoded) => percent_decode(encoded),
            None => std::env::var("PGPASSWORD").unwrap_or_default(),
        };
        use sqlx::postgres::PgSslMode;
        let root_cert = param("sslrootcert", "PGSSLROOTCERT").map(Into::into);
        let mut tls = match options.get_ssl_mode() {
            PgSslMode::Disable | PgSslMode::Allow => TlsConfig::disabled(),
            // libpq's prefer falls back to plain text when the server has no TLS; the
            // replication client does not, so prefer starts as require and is settled against
            // the server (settle_preferred_tls).
            PgSslMode::Prefer | PgSslMode::Require => TlsConfig::require(),
            PgSslMode::VerifyCa => TlsConfig::verify_ca(root_cert),
            PgSslMode::VerifyFull => TlsConfig::verify_full(root_cert),
        };
        if let (Some(cert), Some(key)) =
            (param("sslcert", "PGSSLCERT"), param("sslkey", "PGSSLKEY"))
        {
            tls = tls.with_client_cert(cert, key);
        }
        Ok(Self {
            host: options.get_host().to_owned(),
            port: options.get_port(),
            user: options.get_username().to_owned(),
            password,
            database: options
                .get_database()
                .unwrap_or(options.get_username())
                .to_owned(),
            tls,
            tls_preferred: matches!(options.get_ssl_mode(), PgSslMode::Prefer),
            application_name: options
                .get_application_name()
                .unwrap_or("outbox-relay")
                .to_owned(),
            confirm_interval: Duration::from_secs(1),
        })
    }
}

impl ReplicationTarget {
    /// Settles `sslmode=prefer` as libpq does: the session uses TLS when the pool's own
    /// connection to this server does (the pool falls back to plain text, the replication
    /// client cannot), and plain text when the server offers none. Other modes are kept.
    pub async fn settle_preferred_tls(mut self, pool: &PgPool) -> Result<Self, RelayError> {
        if !self.tls_preferred {
            return Ok(self);
        }
        let pool_uses_tls: bool = sqlx::query_scalar(
            "SELECT coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false)",
        )
        .fetch_one(pool)
        .await?;
        if !pool_uses_tls {
            tracing::info!(
                host = %self.host,
                "the server offers no TLS; the replication session connects in plain text, as \
                 sslmode=prefer does"
            );
            self.tls = TlsConfig::disabled();
        }
        self.tls_preferred = false;
        Ok(self)
    }

    /// Confirms the slot at most every `interval`.
    #[must_use]
    pub fn with_confirm_interval(mut self, interval: Duration) -> Self {
        self.confirm_interval = interval;
        self
    }

    /// The same server and role, another database.
    #[must_use]
    pub fn with_database(mut self, database: impl Into<String>) -> Self {
        self.database = database.into();
        self
    }
}

fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("p={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

/// What one read of the stream found.
#[derive(Debug)]
pub struct StreamRead {
    /// The transactions committing at or after the read's position, in commit order.
    pub txns: Vec<DecodedTxn>,
    /// Every transaction committing before it is handed over: the position once `txns` are
    /// published.
    pub next: Lsn,
    /// The read stopped at its limit: more may be there already.
    pub more: bool,
}

/// One replication session on the slot.
pub struct WalStream {
    client: ReplicationClient,
    assembler: TxnAssembler,
    /// Every transaction committing before it was handed over to a read.
    handed_over: Lsn,
}

impl std::fmt::Debug for WalStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalStream")
            .field("handed_over", &self.handed_over)
            .finish_non_exhaustive()
    }
}

impl WalStream {
    /// A session on `slot` from `start` on, confirming `confirmed` (a position Kafka holds, at or
    /// before `start`) until told more.
    pub async fn start(
        target: &ReplicationTarget,
        (slot, publication): (&str, &str),
        start: Lsn,
        confirmed: Lsn,
    ) -> Result<Self, RelayError> {
        let config = ReplicationConfig::new(
            target.host.clone(),
            target.user.clone(),
            target.password.clone(),
            target.database.clone(),
            slot,
            publication,
        )
        .with_port(target.port)
        .with_tls(target.tls.clone())
        .with_application_name(target.application_name.clone())
        .with_start_lsn(pgwire_replication::Lsn::from_u64(start.0))
        .with_ack_lsn(pgwire_replication::Lsn::from_u64(confirmed.0.min(start.0)))
        .with_status_interval(target.confirm_interval)
        .with_buffer_size(BUFFERED_EVENTS);
        let session_error = |error: pgwire_replication::PgWireError| RelayError::Replication {
            slot: slot.to_owned(),
            detail: error.to_string(),
        };
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(session_error)?;
        client.wait_started().await.map_err(session_error)?;
        tracing::info!(slot, %start, "replication session started");
        Ok(Self {
            client,
            assembler: TxnAssembler::default(),
            handed_over: start,
        })
    }

    /// Ends the session: the walsender lets go of the slot (a few milliseconds later).
    pub async fn close(mut self) {
        match tokio::time::timeout(CLOSE_WAIT, self.client.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::debug!(%error, "the replication session ended with an error")
            }
            Err(_) => self.client.abort(),
        }
    }

    /// Where the next read goes on.
    pub fn handed_over(&self) -> Lsn {
        self.handed_over
    }

    /// Kafka has committed `position`: the slot may be confirmed up to it.
    pub fn acknowledge(&self, position: Lsn) {
        self.client
            .update_applied_lsn(pgwire_replication::Lsn::from_u64(position.0));
    }

    /// The transactions after `after` up to at least `upto` (the WAL flushed when the read
    /// began), stopping at the first commit that brings the rows to `limit`.
    pub async fn read(
        &mut self,
        slot: &str,
        after: Lsn,
        upto: Lsn,
        limit: usize,
    ) -> Result<StreamRead, RelayError> {
        let slot_error = |detail: String| RelayError::Slot {
            slot: slot.to_owned(),
            detail,
        };
        let mut read = HandOver::new(self.handed_over, after, upto, limit);
        let started = Instant::now();
        loop {
            let between = !self.assembler.in_transaction();
            if between && let Some(more) = read.ends(started.elapsed()) {
                self.handed_over = read.handed_over();
                return Ok(read.finish(more));
            }
            // Past `upto`, only what is there already.
            let wait = match between && read.past_upto() {
                true => Duration::ZERO,
                false => CATCH_UP_WAIT,
            };
            let event = match tokio::time::timeout(wait, self.client.recv()).await {
                // In a transaction, wait for its end: a stall shows in the relay's watch.
                Err(_) if !between => continue,
                Err(_) => {
                    self.handed_over = read.handed_over();
                    return Ok(read.finish(false));
                }
                Ok(Ok(Some(event))) => event,
                Ok(Ok(None)) => {
                    return Err(RelayError::Replication {
                        slot: slot.to_owned(),
                        detail: "the server ended the replication session".into(),
                    });
                }
                Ok(Err(error)) => {
                    return Err(RelayError::Replication {
                        slot: slot.to_owned(),
                        detail: error.to_string(),
                    });
                }
            };
            match event {
                ReplicationEvent::Begin {
                    final_lsn,
                    xid,
                    commit_time_micros,
                } => self
                    .assembler
                    .begin(xid, Lsn(final_lsn.as_u64()), commit_time_micros)
                    .map_err(slot_error)?,
                ReplicationEvent::XLogData { data, .. } => {
                    self.assembler.change_bytes(&data).map_err(slot_error)?;
                }
                ReplicationEvent::Commit {
                    lsn,
                    end_lsn,
                    commit_time_micros,
                } => {
                    self.assembler
                        .commit(Lsn(lsn.as_u64()), Lsn(end_lsn.as_u64()), commit_time_micros)
                        .map_err(slot_error)?;
                    for txn in self.assembler.take_committed() {
                        read.committed(txn);
                    }
                }
                ReplicationEvent::KeepAlive { wal_end, .. } if between => {
                    read.walsender_at(Lsn(wal_end.as_u64()));
                }
                ReplicationEvent::KeepAlive { .. } | ReplicationEvent::Message { .. } => {}
                ReplicationEvent::StoppedAt { reached } => {
                    return Err(slot_error(format!(
                        "the replication session stopped at {reached}, though no stop was asked for"
                    )));
                }
            }
        }
    }
}

/// What one read makes of what the session hands over: pure, so eos-model's session model
/// (docs/MODEL_CHECKING.md) reads with it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HandOver {
    after: Lsn,
    upto: Lsn,
    limit: usize,
    rows: usize,
    txns: Vec<DecodedTxn>,
    /// Every transaction committing before it has been handed over.
    handed_over: Lsn,
}

impl HandOver {
    /// A read after `after` (the relay's position) up to at least `upto` (the WAL flushed when
    /// it began) of about `limit` rows, on a session that has handed over up to `handed_over`.
    pub fn new(handed_over: Lsn, after: Lsn, upto: Lsn, limit: usize) -> Self {
        Self {
            after,
            upto,
            limit,
            rows: 0,
            txns: Vec::new(),
            handed_over: handed_over.max(after),
        }
    }

    /// A committed transaction, handed over: published unless it commits before the read's
    /// position (Kafka holds it).
    pub fn committed(&mut self, txn: DecodedTxn) {
        self.handed_over = self.handed_over.max(txn.end_lsn);
        if txn.commit_lsn >= self.after {
            self.rows += txn.positions.len();
            self.txns.push(txn);
        }
    }

    /// The walsender's position from its keepalive, between transactions: every commit before
    /// it has been handed over.
    pub fn walsender_at(&mut self, wal_end: Lsn) {
        self.handed_over = self.handed_over.max(wal_end);
    }

    /// Between transactions: `Some(more)` when the read ends now whatever comes next — at its
    /// limit, or after `READ_AT_MOST` (a stream of transactions without outbox rows still moves
    /// the position) — with more to read at once.
    pub fn ends(&self, elapsed: Duration) -> Option<bool> {
        (self.rows >= self.limit || elapsed >= READ_AT_MOST).then_some(true)
    }

    /// Everything flushed when the read began has been handed over: the read takes only what
    /// is there already.
    pub fn past_upto(&self) -> bool {
        self.handed_over >= self.upto
    }

    pub fn handed_over(&self) -> Lsn {
        self.handed_over
    }

    /// The read's result: its transactions, and the position once they are published.
    pub fn finish(self, more: bool) -> StreamRead {
        StreamRead {
            txns: self.txns,
            next: self.handed_over,
            more,
        }
    }
}

/// Whether a read after `after` goes on with the session the last read left, which has handed
/// over up to `handed_over` (`None`: none is open, or a read was cut off): only at that very
/// position; else a new session starts at `after`.
pub fn session_goes_on(handed_over: Option<Lsn>, after: Lsn) -> bool {
    handed_over == Some(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(commit: u64, end: u64, positions: &[i64]) -> DecodedTxn {
        DecodedTxn {
            xid: 1,
            commit_lsn: Lsn(commit),
            end_lsn: Lsn(end),
            commit_time: 0,
            positions: positions.to_vec(),
        }
    }

    #[test]
    fn a_read_skips_what_kafka_holds_stops_at_its_limit_and_moves_with_the_walsender() {
        // A new session at 0x300 may hand over a transaction committing before it (the slot
        // lags): Kafka holds it, so it is not published, but the position passes it.
        let mut read = HandOver::new(Lsn(0x300), Lsn(0x300), Lsn(0x900), 3);
        read.committed(txn(0x200, 0x230, &[1]));
        read.committed(txn(0x300, 0x330, &[2, 3]));
        assert_eq!(read.ends(Duration::ZERO), None, "2 rows of 3");
        read.committed(txn(0x400, 0x430, &[4]));
        assert_eq!(read.ends(Duration::ZERO), Some(true), "at its limit");
        assert!(!read.past_upto());
        let done = read.finish(true);
        assert_eq!(done.next, Lsn(0x430));
        let positions: Vec<i64> = done.txns.iter().flat_map(|t| t.positions.clone()).collect();
        assert_eq!(positions, vec![2, 3, 4]);

        // Caught up: the walsender's keepalive carries the position past WAL without outbox rows.
        let mut idle = HandOver::new(Lsn(0x430), Lsn(0x430), Lsn(0x500), 3);
        idle.walsender_at(Lsn(0x520));
        assert!(idle.past_upto());
        assert_eq!(
            idle.ends(READ_AT_MOST),
            Some(true),
            "a read ends after READ_AT_MOST"
        );
        let done = idle.finish(false);
        assert!(done.txns.is_empty());
        assert_eq!(done.next, Lsn(0x520));

        assert!(session_goes_on(Some(Lsn(0x430)), Lsn(0x430)));
        assert!(
            !session_goes_on(Some(Lsn(0x430)), Lsn(0x330)),
            "a recovery's position"
        );
        assert!(
            !session_goes_on(None, Lsn(0x430)),
            "a cut-off read left none"
        );
    }

    #[test]
    fn the_target_is_read_from_the_url_as_libpq_reads_it() {
        let target = ReplicationTarget::from_url(
            "postgres://relay:p%40ss%2Bw%20rd@db.example:6543/shop?sslmode=verify-full\
             &sslrootcert=/ca.pem&application_name=relay-1",
        )
        .expect("parses");
        assert_eq!(target.host, "db.example");
        assert_eq!(target.port, 6543);
        assert_eq!(target.user, "relay");
        assert_eq!(target.password, "p@ss+w rd");
        assert_eq!(target.database, "shop");
        assert_eq!(target.application_name, "relay-1");
        assert_eq!(target.tls, TlsConfig::verify_full(Some("/ca.pem".into())));
        assert!(!format!("{target:?}").contains("p@ss"), "{target:?}");
    }
}
