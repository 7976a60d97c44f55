//! A partition's state is restored from its changelog up to the high watermark, waiting for
//! every transaction still being decided there: the previous owner's last batch can be committed
//! with its markers not yet written when the next owner starts restoring, and that owner's
//! consumer already resumes after the batch's offsets. A restore that stopped at the last stable
//! offset instead skipped the batch's state for good (per-entity totals went back, and later
//! re-deliveries of its events were counted again).

use std::sync::mpsc;
use std::time::Duration;

use anyhow::Context as _;
use eos_processor::changelog::{RestoreOutcome, restore_partition};
use eos_processor::state_store::StateStore;
use eos_processor::{Output, Refusal, SourcePosition, Transform};
use integration_tests::{
    TestProducer, client_config, create_topic, transactional_producer, unique_name,
};
use rdkafka::producer::{BaseRecord, Producer as _};

const TIMEOUT: Duration = Duration::from_secs(30);

/// A transform whose state is any JSON: the restore here is about which records are read, not
/// what they mean.
struct AnyState;

impl Transform for AnyState {
    type State = serde_json::Value;

    fn apply(
        &self,
        _state: &mut serde_json::Value,
        _event: eos_core::Event,
        _source: &SourcePosition,
    ) -> Result<Vec<Output>, Refusal> {
        Ok(Vec::new())
    }
}
/// How long a transaction stays undecided while the restore runs.
const UNDECIDED: Duration = Duration::from_secs(2);

/// One entity's state record, as the processor writes it (`entity/<id>` → its state as JSON).
fn send_entity(producer: &TestProducer, topic: &str, entity: &str) -> anyhow::Result<()> {
    let key = format!("entity/{entity}");
    let value = serde_json::json!({ "count": 1, "total": 100 }).to_string();
    producer
        .send(BaseRecord::to(topic).partition(0).key(&key).payload(&value))
        .map_err(|(error, _)| error)
        .with_context(|| format!("cannot enqueue {key}"))?;
    producer.flush(TIMEOUT)?;
    Ok(())
}

/// Restores partition 0 of `topic` into `store` on another thread, and reports when it is done.
fn restore_in_background(
    topic: &str,
    store: &std::sync::Arc<StateStore>,
) -> mpsc::Receiver<anyhow::Result<(RestoreOutcome, Vec<String>)>> {
    let (done, outcome) = mpsc::channel();
    let (topic, store) = (topic.to_owned(), std::sync::Arc::clone(store));
    std::thread::spawn(move || {
        let restored = (|| {
            let partition = store.partition(&topic, 0)?;
            let outcome = restore_partition(
                &AnyState,
                &client_config(),
                &topic,
                0,
                TIMEOUT,
                &partition,
                Duration::from_secs(86_400),
            )?;
            let held = ["a", "b", "c"]
                .into_iter()
                .filter(|entity| partition.entity(entity).ok().flatten().is_some())
                .map(str::to_owned)
                .collect();
            anyhow::Ok((outcome, held))
        })();
        let _ = done.send(restored);
    });
    outcome
}

/// Writes `entity` in a transaction, starts a restore while it is undecided, checks that the
/// restore waits, then ends the transaction with `decide` and returns what the restore made of it.
fn restore_across_undecided(
    producer: &TestProducer,
    topic: &str,
    store: &std::sync::Arc<StateStore>,
    entity: &str,
    decide: impl FnOnce(&TestProducer) -> anyhow::Result<()>,
) -> anyhow::Result<(RestoreOutcome, Vec<String>)> {
    producer.begin_transaction()?;
    send_entity(producer, topic, entity)?;
    let restore = restore_in_background(topic, store);
    std::thread::sleep(UNDECIDED);
    anyhow::ensure!(
        restore.try_recv().is_err(),
        "the restore ended while a transaction in the changelog was undecided"
    );
    decide(producer)?;
    restore.recv_timeout(TIMEOUT)?
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restore_waits_for_an_undecided_transaction_and_keeps_it_only_if_it_commits()
-> anyhow::Result<()> {
    let topic = unique_name("changelog-restore");
    create_topic(&topic, 1).await?;
    let txn_id = unique_name("changelog-writer");
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        let producer = transactional_producer(&txn_id)?;
        let store = StateStore::in_memory()?;

        producer.begin_transaction()?;
        send_entity(&producer, &topic, "a")?;
        producer.commit_transaction(TIMEOUT)?;

        // b is in the log, its transaction not decided yet when the restore starts.
        let (outcome, held) = restore_across_undecided(&producer, &topic, &store, "b", |p| {
            Ok(p.commit_transaction(TIMEOUT)?)
        })?;
        assert_eq!(
            held,
            ["a", "b"],
            "the committed transaction's state is restored"
        );
        assert_eq!(outcome.records, 2);

        // c's transaction is aborted while the next (warm) restore waits for it.
        let (outcome, held) = restore_across_undecided(&producer, &topic, &store, "c", |p| {
            Ok(p.abort_transaction(TIMEOUT)?)
        })?;
        assert_eq!(
            held,
            ["a", "b"],
            "the aborted transaction's state is not restored"
        );
        assert_eq!(
            outcome.records, 0,
            "the warm restore read only past its checkpoint"
        );
        // a, its marker, b, its marker, c and the abort marker: the store covers them all.
        assert_eq!(outcome.next_offset, 6);
        Ok(())
    })
    .await?
}
