//! The at-least-once contrast's processor kills, aimed at the state that makes the contrast.
//!
//! Without transactions the processor sends each output as it decides it, then the batch's
//! changelog records (entity state and `seen/<event_id>`), then commits the consumed offsets.
//! A SIGKILL duplicates outputs only when it lands after an output reached the broker and before
//! the changelog record of its event id did: the restarted processor reads that input again from
//! the committed offset and, not knowing the id, applies it again. A kill at a moment chosen by a
//! timer can miss that window (an idle processor, the relay restarting and holding the input
//! back), and then the contrast shows nothing by chance. So the processor is frozen (SIGSTOP),
//! the broker is asked whether such outputs are there, and only then is it killed; otherwise it
//! runs on a moment and is looked at again.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::Value;

use crate::chain::service::Service;
use eosctl::group_offsets::GroupOffsetReader;
use eosctl::kafka_client::{KafkaSettings, METADATA_TIMEOUT};
use eosctl::source_record::SourceRecord;
use eosctl::topic_reader::read_topics;

/// Long enough for requests the processor had already sent when it was frozen (a produce, an
/// offset commit) to be applied by the broker, so what is read is what a restart finds.
const SETTLE: Duration = Duration::from_millis(200);

/// How long the processor runs between two looks.
const RUN_BETWEEN_LOOKS: Duration = Duration::from_millis(150);

/// The topics and group that tell whether a kill now repeats outputs.
pub(super) struct AimedKill<'a> {
    pub kafka: &'a KafkaSettings,
    pub input: &'a str,
    pub output: &'a str,
    pub changelog: &'a str,
    pub group: &'a str,
}

/// How a kill went: aimed when it landed with outputs on the broker that the restart repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KillAim {
    /// Killed while this many outputs were neither committed nor known to the changelog.
    Aimed { repeated_outputs: usize },
    /// No such moment was found in the time allowed; killed anyway.
    Missed,
}

impl AimedKill<'_> {
    /// Freezes the processor, looks, and kills it (restarting it at once) as soon as a look finds
    /// outputs a restart repeats; after `within` without one it kills it anyway and says so.
    pub(super) async fn kill(
        &self,
        processor: &mut Service,
        within: Duration,
    ) -> anyhow::Result<KillAim> {
        let deadline = Instant::now() + within;
        loop {
            processor.pause()?;
            tokio::time::sleep(SETTLE).await;
            let found = self.repeated_outputs().await;
            let repeated_outputs = match found {
                Ok(count) => count,
                Err(error) => {
                    processor.resume()?;
                    return Err(error);
                }
            };
            if repeated_outputs > 0 {
                processor.kill_and_restart().await?;
                return Ok(KillAim::Aimed { repeated_outputs });
            }
            if Instant::now() >= deadline {
                processor.kill_and_restart().await?;
                return Ok(KillAim::Missed);
            }
            processor.resume()?;
            tokio::time::sleep(RUN_BETWEEN_LOOKS).await;
        }
    }

    /// The outputs on the broker that a processor restarted now would write again.
    async fn repeated_outputs(&self) -> anyhow::Result<usize> {
        let kafka = self.kafka.clone();
        let (input, output, changelog, group) = (
            self.input.to_owned(),
            self.output.to_owned(),
            self.changelog.to_owned(),
            self.group.to_owned(),
        );
        tokio::task::spawn_blocking(move || {
            let mut snapshots = read_topics(
                &kafka,
                &[output.as_str(), changelog.as_str()],
                Duration::from_secs(10),
                &mut |_| {},
            )?
            .into_iter();
            let (Some(outputs), Some(changelog)) = (snapshots.next(), snapshots.next()) else {
                anyhow::bail!("the topic reader answered for fewer topics than asked");
            };
            // The changelog is co-partitioned with the input: its partitions are the input's.
            let partitions: Vec<i32> = changelog.spans.iter().map(|s| s.partition).collect();
            let committed = GroupOffsetReader::new(&kafka, &group)?.committed(
                &input,
                &partitions,
                METADATA_TIMEOUT,
            )?;
            Ok(outputs_a_restart_repeats(
                &outputs.records,
                &changelog.records,
                &committed,
            ))
        })
        .await
        .context("the topic reader's task")?
    }
}

/// Outputs whose input is at or past the group's committed offset (a restart reads it again)
/// and whose event id has no `seen/` record in the changelog partition of that input (the
/// restored state does not know it, so it is applied again). Reads the ledger output's `source`
/// position; an output without one is not counted.
fn outputs_a_restart_repeats(
    outputs: &[SourceRecord],
    changelog: &[SourceRecord],
    committed: &BTreeMap<i32, Option<i64>>,
) -> usize {
    // In log order, so that a tombstone (an expired id) removes what came before it.
    let mut seen: HashSet<(i32, &[u8])> = HashSet::new();
    for record in changelog {
        let Some(id) = record
            .key
            .as_deref()
            .and_then(|key| key.strip_prefix(b"seen/"))
        else {
            continue;
        };
        if record.value.is_some() {
            seen.insert((record.partition, id));
        } else {
            seen.remove(&(record.partition, id));
        }
    }
    outputs
        .iter()
        .filter_map(|record| serde_json::from_slice::<Value>(record.value.as_deref()?).ok())
        .filter(|output| {
            let (Some(event_id), Some(partition), Some(offset)) = (
                output["event_id"].as_str(),
                output["source"]["partition"].as_i64(),
                output["source"]["offset"].as_i64(),
            ) else {
                return false;
            };
            let Ok(partition) = i32::try_from(partition) else {
                return false;
            };
            let read_again = offset >= committed.get(&partition).copied().flatten().unwrap_or(0);
            read_again && !seen.contains(&(partition, event_id.as_bytes()))
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: i32, key: &str, value: Option<String>) -> SourceRecord {
        SourceRecord {
            topic: "t".into(),
            partition,
            offset: 0,
            key: Some(key.as_bytes().to_vec()),
            value: value.map(String::into_bytes),
            headers: Vec::new(),
            timestamp_ms: None,
            decoding: Default::default(),
        }
    }

    fn output(event_id: &str, partition: i32, offset: i64) -> SourceRecord {
        record(
            0,
            "entity",
            Some(format!(
                r#"{{"event_id":"{event_id}","source":{{"topic":"in","partition":{partition},"offset":{offset}}}}}"#
            )),
        )
    }

    #[test]
    fn only_outputs_past_the_commit_and_unknown_to_the_changelog_are_repeated() {
        let outputs = [
            // Committed: not read again.
            output("e-1", 0, 9),
            // Read again, and its seen id is in the changelog: dropped as a duplicate.
            output("e-2", 0, 10),
            // Read again, seen id only in another partition's changelog: repeated.
            output("e-3", 0, 11),
            // Read again, nothing in the changelog: repeated.
            output("e-4", 1, 0),
            // Read again, but its seen id was deleted (tombstone): repeated.
            output("e-5", 0, 12),
            // Read again, deleted and then seen again: dropped as a duplicate.
            output("e-6", 0, 13),
        ];
        let changelog = [
            record(0, "seen/e-2", Some("{}".into())),
            record(1, "seen/e-3", Some("{}".into())),
            record(0, "entity/e-4", Some("{}".into())),
            record(0, "seen/e-5", Some("{}".into())),
            record(0, "seen/e-5", None),
            record(0, "seen/e-6", None),
            record(0, "seen/e-6", Some("{}".into())),
        ];
        let committed = BTreeMap::from([(0, Some(10)), (1, None)]);
        assert_eq!(
            outputs_a_restart_repeats(&outputs, &changelog, &committed),
            3
        );
        // Everything committed: nothing is repeated, whatever the changelog holds.
        let committed = BTreeMap::from([(0, Some(14)), (1, Some(1))]);
        assert_eq!(outputs_a_restart_repeats(&outputs, &[], &committed), 0);
    }

    #[test]
    fn outputs_without_a_source_position_are_not_counted() {
        let outputs = [
            record(0, "k", Some(r#"{"event_id":"e-1"}"#.into())),
            record(0, "k", Some("not json".into())),
            record(0, "k", None),
        ];
        assert_eq!(
            outputs_a_restart_repeats(&outputs, &[], &BTreeMap::new()),
            0
        );
    }
}
