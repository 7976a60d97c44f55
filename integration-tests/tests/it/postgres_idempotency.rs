//! PostgreSQL is real and `INSERT … ON CONFLICT DO NOTHING` is race-free under concurrency.

use integration_tests::TestDatabase;
use rand::seq::SliceRandom as _;

const WRITERS: usize = 16;
const IDS: i64 = 500;

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_idempotent_inserts_leave_one_row_per_id() -> anyhow::Result<()> {
    let db = TestDatabase::create().await?;
    sqlx::query(
        "CREATE TABLE event_sink (event_id TEXT PRIMARY KEY, writer INT NOT NULL, value BIGINT NOT NULL)",
    )
    .execute(&db.pool)
    .await?;

    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let pool = db.pool.clone();
        writers.push(tokio::spawn(async move {
            let mut ids: Vec<i64> = (0..IDS).collect();
            ids.shuffle(&mut rand::rng());
            let mut inserted = 0u64;
            for id in ids {
                let result = sqlx::query(
                    "INSERT INTO event_sink (event_id, writer, value) VALUES ($1, $2, $3)
                     ON CONFLICT (event_id) DO NOTHING",
                )
                .bind(format!("e-{id}"))
                .bind(writer as i32)
                .bind(id)
                .execute(&pool)
                .await?;
                inserted += result.rows_affected();
            }
            Ok::<u64, sqlx::Error>(inserted)
        }));
    }
    let mut inserted_total = 0;
    for writer in writers {
        inserted_total += writer.await??;
    }

    let (rows, distinct, sum): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT event_id), SUM(value)::BIGINT FROM event_sink",
    )
    .fetch_one(&db.pool)
    .await?;
    assert_eq!(rows, IDS);
    assert_eq!(distinct, IDS);
    assert_eq!(sum, (0..IDS).sum::<i64>());
    // Each id was inserted by exactly one writer; the 15 other attempts reported 0 rows.
    assert_eq!(inserted_total, IDS as u64);
    db.drop_database().await
}
