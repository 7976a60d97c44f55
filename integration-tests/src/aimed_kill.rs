//! Kills aimed at a state instead of a moment. A test whose assertion needs a SIGKILL to land in
//! a particular state (outputs written but not yet covered by a checkpoint) cannot get it from a
//! timer: the service may be idle, starting, or between two writes when the timer fires, and the
//! test then goes red (or, worse, green) by chance. So the service is frozen (SIGSTOP), the look
//! asks the broker or the database whether the state holds, and only then is it killed;
//! otherwise it runs on a moment and is looked at again.
//!
//! [`outputs_an_at_least_once_restart_repeats`] is the look for eos-processor's at-least-once
//! mode, the test-side twin of the aimed kills of `eos-lab demo`.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::bail;
use eos_testkit::ChildProcess;
use rdkafka::Message as _;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use serde_json::Value;

use crate::{Isolation, client_config_for, end_offsets_on, read_topic_on};

/// Long enough for requests the service had already sent when it was frozen (a produce, an
/// offset commit, a database write) to be applied, so what a look reads is what a restart finds.
const SETTLE: Duration = Duration::from_millis(200);

/// How long the service runs between two looks.
const RUN_BETWEEN_LOOKS: Duration = Duration::from_millis(150);

/// Freezes `process` and asks `look` whether a kill now lands in the state the test needs
/// (`Some(what it found)`). If so, SIGKILLs it (it stays frozen until then, so the state cannot
/// change in between) and returns the finding; otherwise resumes it, lets it run a moment and
/// looks again. After `within` without a finding it returns `None` with the process running:
/// the caller decides whether a kill that proves nothing may still happen.
///
/// A look must be stable: read everything it decides on while the process is frozen, and answer
/// `None` if something it read was still moving (a request in flight past [`SETTLE`]). Even so,
/// a request the process had sent may land after the kill (a database write on a slow disk): a
/// caller that counts on the finding looks again once the process is dead and its sessions are
/// gone, at what its restart will find.
pub fn kill_when<T>(
    process: &mut ChildProcess,
    within: Duration,
    mut look: impl FnMut() -> anyhow::Result<Option<T>>,
) -> anyhow::Result<Option<T>> {
    let deadline = Instant::now() + within;
    loop {
        if !process.is_running() {
            bail!(
                "{} exited while a kill was being aimed at it\n{}",
                process.name(),
                process.log_tail(30)
            );
        }
        process.pause()?;
        std::thread::sleep(SETTLE);
        let found = match look() {
            Ok(found) => found,
            Err(error) => {
                process.resume()?;
                return Err(error);
            }
        };
        if let Some(found) = found {
            let status = process.kill_hard()?;
            anyhow::ensure!(
                status.code().is_none(),
                "killed by a signal, not exited: {status}\n{}",
                process.log_tail(30)
            );
            return Ok(Some(found));
        }
        process.resume()?;
        if Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(RUN_BETWEEN_LOOKS);
    }
}

/// The topics and group of one eos-processor pipeline, for
/// [`outputs_an_at_least_once_restart_repeats`].
#[derive(Debug, Clone, Copy)]
pub struct ProcessorTopics<'a> {
    pub bootstrap: &'a str,
    pub input: &'a str,
    pub output: &'a str,
    pub changelog: &'a str,
    pub group: &'a str,
}

/// A ledger output that a processor restarted now would write again.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepeatedOutput {
    pub event_id: String,
    /// The input position it was decided from.
    pub partition: i32,
    pub offset: i64,
}

/// With eos-processor in at-least-once mode frozen: the outputs on the broker that a restart
/// repeats. Without transactions the processor sends each output as it decides it, then the
/// batch's changelog records (entity state and `seen/<event_id>`), then commits the consumed
/// offsets. A restart reads again from the committed offset with the state the changelog holds,
/// so an output is written again when its input is at or past the group's committed offset and
/// its event id has no `seen/` record in the changelog partition of that input.
///
/// `None` when the topics or the committed offsets moved while they were read (a request still
/// in flight): the answer would not be what a restart finds.
pub fn outputs_an_at_least_once_restart_repeats(
    topics: ProcessorTopics<'_>,
) -> anyhow::Result<Option<Vec<RepeatedOutput>>> {
    let moving = || -> anyhow::Result<_> {
        Ok((
            end_offsets_on(topics.bootstrap, topics.output)?,
            end_offsets_on(topics.bootstrap, topics.changelog)?,
            committed_offsets(topics)?,
        ))
    };
    let before = moving()?;
    // No transactions in this mode, so uncommitted is everything the broker has.
    let outputs = read_topic_on(topics.bootstrap, topics.output, Isolation::ReadUncommitted)?;
    let changelog = read_topic_on(
        topics.bootstrap,
        topics.changelog,
        Isolation::ReadUncommitted,
    )?;
    let after = moving()?;
    if before != after {
        return Ok(None);
    }
    let committed = after.2;
    // In log order, so that a tombstone (an expired id) removes what came before it.
    let mut seen: HashSet<(i32, &[u8])> = HashSet::new();
    for record in &changelog {
        let Some(id) = record.key().and_then(|key| key.strip_prefix(b"seen/")) else {
            continue;
        };
        if record.payload().is_some() {
            seen.insert((record.partition(), id));
        } else {
            seen.remove(&(record.partition(), id));
        }
    }
    let repeated = outputs
        .iter()
        .filter_map(|record| serde_json::from_slice::<Value>(record.payload()?).ok())
        .filter_map(|output| {
            let event_id = output["event_id"].as_str()?.to_owned();
            let partition = i32::try_from(output["source"]["partition"].as_i64()?).ok()?;
            let offset = output["source"]["offset"].as_i64()?;
            let read_again = offset >= committed.get(&partition).copied().unwrap_or(0);
            let known = seen.contains(&(partition, event_id.as_bytes()));
            (read_again && !known).then_some(RepeatedOutput {
                event_id,
                partition,
                offset,
            })
        })
        .collect();
    Ok(Some(repeated))
}

/// [`outputs_an_at_least_once_restart_repeats`] once the processor is dead: what its restart
/// will find, after any request it had sent has landed.
pub fn outputs_a_restart_repeats_after_the_kill(
    topics: ProcessorTopics<'_>,
) -> anyhow::Result<Vec<RepeatedOutput>> {
    for _ in 0..20 {
        std::thread::sleep(SETTLE);
        if let Some(repeated) = outputs_an_at_least_once_restart_repeats(topics)? {
            return Ok(repeated);
        }
    }
    bail!("the topics of {} kept moving after the kill", topics.group)
}

/// The group's committed offset of each input partition that has one.
fn committed_offsets(topics: ProcessorTopics<'_>) -> anyhow::Result<BTreeMap<i32, i64>> {
    let consumer: BaseConsumer = client_config_for(topics.bootstrap)
        .set("group.id", topics.group)
        .create()?;
    let mut list = TopicPartitionList::new();
    for (partition, _) in end_offsets_on(topics.bootstrap, topics.input)? {
        list.add_partition(topics.input, partition);
    }
    let committed = consumer.committed_offsets(list, Duration::from_secs(10))?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|elem| Some((elem.partition(), elem.offset().to_raw()?)))
        .filter(|&(_, offset)| offset >= 0)
        .collect())
}
