//! The SQL that must repeat a sink-writer rule agrees with the rule's pure function, on a table of
//! cases against the real PostgreSQL: the fence (`checkpoint_rule::fenced_epoch`), the guarded
//! checkpoint move (`checkpoint_rule::may_advance`, `fenced_partitions`), the versioned upsert
//! (`batch_plan::upsert_applies`) and the idempotent insert (`batch_plan::idempotent_outcome`).
//! The model checker (`crates/eos-model`, docs/MODEL_CHECKING.md) runs the pure functions; this
//! test is what ties its verdict to the statements the service runs.

use eos_core::Checkpoint;
use integration_tests::TestDatabase;
use sink_writer::batch_plan::{self, Candidate, Outcome};
use sink_writer::checkpoint_rule;
use sink_writer::checkpoint_store::{self, Move};
use sink_writer::mapping::MappedRow;
use sink_writer::schema;
use sink_writer::table_writer;
use sink_writer::targets::{Source, TargetKind, TargetSpec};

const SINK: &str = "sink-rules";
const TOPIC: &str = "rules-input";

#[tokio::test(flavor = "multi_thread")]
async fn checkpoint_sql_follows_the_fence_and_advance_rules() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    sink_writer::migrator().run(&db.pool).await?;

    // The fence: one partition per previous epoch (`None`: no row yet).
    let previous: [Option<i64>; 4] = [None, Some(0), Some(1), Some(7)];
    let partitions: Vec<i32> = (0..previous.len() as i32).collect();
    for (&partition, epoch) in partitions.iter().zip(previous) {
        if let Some(epoch) = epoch {
            sqlx::query(
                "INSERT INTO sink_checkpoints (sink, topic, partition, owner_epoch) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(SINK)
            .bind(TOPIC)
            .bind(partition)
            .bind(epoch)
            .execute(&db.pool)
            .await?;
        }
    }
    let fenced = checkpoint_store::fence(&db.pool, SINK, TOPIC, &partitions, "owner-a").await?;
    for (&partition, epoch) in partitions.iter().zip(previous) {
        assert_eq!(
            fenced.get(&partition).copied(),
            Some(checkpoint_rule::fenced_epoch(epoch)),
            "fence of a row at {epoch:?}"
        );
    }

    // The move: one partition per (row epoch, held epoch).
    let mut cases = Vec::new();
    for row_epoch in 1..=3_i64 {
        for held_epoch in 1..=3_i64 {
            cases.push((100 + cases.len() as i32, row_epoch, held_epoch));
        }
    }
    for &(partition, row_epoch, _) in &cases {
        sqlx::query(
            "INSERT INTO sink_checkpoints (sink, topic, partition, owner_epoch, next_offset) \
             VALUES ($1, $2, $3, $4, 5)",
        )
        .bind(SINK)
        .bind(TOPIC)
        .bind(partition)
        .bind(row_epoch)
        .execute(&db.pool)
        .await?;
    }
    let moves: Vec<Move> = cases
        .iter()
        .map(|&(partition, _, held_epoch)| Move {
            to: Checkpoint {
                topic: TOPIC.into(),
                partition,
                next_offset: 9,
            },
            epoch: held_epoch,
        })
        .collect();
    let mut tx = db.pool.begin().await?;
    let moved = checkpoint_store::advance(&mut tx, SINK, &moves).await?;
    tx.commit().await?;
    for &(partition, row_epoch, held_epoch) in &cases {
        let expected = checkpoint_rule::may_advance(row_epoch, held_epoch);
        assert_eq!(
            moved.contains(&partition),
            expected,
            "advance with row epoch {row_epoch}, held {held_epoch}"
        );
        let next: Option<i64> = sqlx::query_scalar(
            "SELECT next_offset FROM sink_checkpoints \
             WHERE sink = $1 AND topic = $2 AND partition = $3",
        )
        .bind(SINK)
        .bind(TOPIC)
        .bind(partition)
        .fetch_one(&db.pool)
        .await?;
        assert_eq!(next, Some(if expected { 9 } else { 5 }));
    }
    let moving: Vec<i32> = cases.iter().map(|&(partition, ..)| partition).collect();
    let refused: Vec<i32> = cases
        .iter()
        .filter(|&&(_, row, held)| !checkpoint_rule::may_advance(row, held))
        .map(|&(partition, ..)| partition)
        .collect();
    assert_eq!(checkpoint_rule::fenced_partitions(&moving, &moved), refused);
    assert_eq!(refused.len(), 6, "the table of cases has refusals to find");
    db.drop_database().await
}

fn spec(table: &str, kind: TargetKind) -> TargetSpec {
    let mut columns = vec![
        ("k".to_owned(), Source::EntityId),
        ("payload".to_owned(), Source::Payload),
    ];
    if kind == TargetKind::Versioned {
        columns.push(("version".to_owned(), Source::Version));
    }
    TargetSpec {
        table: table.into(),
        kind,
        key: "k".into(),
        version_column: (kind == TargetKind::Versioned).then(|| "version".to_owned()),
        columns,
        retention: None,
    }
}

/// A row for the target's write: values in the order of its bound columns.
fn candidate(
    target: &schema::PreparedTarget,
    index: usize,
    key: &str,
    payload: &str,
    version: Option<i64>,
) -> Candidate {
    let values = target
        .shape
        .columns
        .iter()
        .map(|column| match column.name.as_str() {
            "k" => Some(key.to_owned()),
            "payload" => Some(payload.to_owned()),
            "version" => version.map(|v| v.to_string()),
            other => panic!("unexpected column {other}"),
        })
        .collect();
    Candidate {
        record: index,
        row: MappedRow {
            key: key.into(),
            values,
            version,
        },
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn row_sql_follows_the_upsert_and_insert_rules() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    sqlx::query("CREATE TABLE rule_entity (k TEXT PRIMARY KEY, version BIGINT, payload TEXT)")
        .execute(&db.pool)
        .await?;
    sqlx::query("CREATE TABLE rule_events (k TEXT PRIMARY KEY, payload TEXT)")
        .execute(&db.pool)
        .await?;

    // Versioned: every stored version (absent, NULL, 1..3) against every incoming one.
    let versioned = schema::prepare(&db.pool, spec("rule_entity", TargetKind::Versioned)).await?;
    let stored_cases: [Option<Option<i64>>; 5] = [
        None,
        Some(None),
        Some(Some(1)),
        Some(Some(2)),
        Some(Some(3)),
    ];
    let mut cases = Vec::new();
    for stored in stored_cases {
        for incoming in 1..=3_i64 {
            let key = format!("k{}", cases.len());
            if let Some(version) = stored {
                sqlx::query("INSERT INTO rule_entity (k, version, payload) VALUES ($1, $2, 'old')")
                    .bind(&key)
                    .bind(version)
                    .execute(&db.pool)
                    .await?;
            }
            cases.push((key, stored, incoming));
        }
    }
    let candidates: Vec<Candidate> = cases
        .iter()
        .enumerate()
        .map(|(i, (key, _, incoming))| candidate(&versioned, i, key, "new", Some(*incoming)))
        .collect();
    let send = vec![true; candidates.len()];
    let mut conn = db.pool.acquire().await?;
    let write = table_writer::write_target(&mut conn, &versioned, &candidates, &send).await?;
    for (key, stored, incoming) in &cases {
        let expected = match stored {
            None => batch_plan::idempotent_outcome(None) == Outcome::Written,
            Some(version) => batch_plan::upsert_applies(*version, *incoming),
        };
        assert_eq!(
            write.applied.contains(key),
            expected,
            "upsert of version {incoming} over {stored:?}"
        );
        let now: Option<i64> = sqlx::query_scalar("SELECT version FROM rule_entity WHERE k = $1")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        assert_eq!(
            now,
            if expected {
                Some(*incoming)
            } else {
                stored.flatten()
            }
        );
    }

    // Append: nothing stored, the same content stored, other content stored.
    let append = schema::prepare(&db.pool, spec("rule_events", TargetKind::Append)).await?;
    let append_cases = [
        ("absent", None),
        ("same", Some("new")),
        ("other", Some("old")),
    ];
    for (key, stored) in append_cases {
        if let Some(payload) = stored {
            sqlx::query("INSERT INTO rule_events (k, payload) VALUES ($1, $2)")
                .bind(key)
                .bind(payload)
                .execute(&db.pool)
                .await?;
        }
    }
    let candidates: Vec<Candidate> = append_cases
        .iter()
        .enumerate()
        .map(|(i, (key, _))| candidate(&append, i, key, "new", None))
        .collect();
    let send = vec![true; candidates.len()];
    let write = table_writer::write_target(&mut conn, &append, &candidates, &send).await?;
    let mut outcomes = Vec::new();
    for (i, (key, stored)) in append_cases.iter().enumerate() {
        let differs = write.stored.get(&i).map(|row| row.stored.differs);
        let outcome = batch_plan::idempotent_outcome(differs);
        assert_eq!(
            write.applied.contains(*key),
            outcome == Outcome::Written,
            "insert over {stored:?}"
        );
        let now: String = sqlx::query_scalar("SELECT payload FROM rule_events WHERE k = $1")
            .bind(key)
            .fetch_one(&mut *conn)
            .await?;
        assert_eq!(now, stored.unwrap_or("new"), "never overwritten");
        outcomes.push(outcome);
    }
    assert_eq!(
        outcomes,
        [
            Outcome::Written,
            Outcome::Duplicate,
            Outcome::Conflict { earlier: None }
        ]
    );
    drop(conn);
    db.drop_database().await
}
