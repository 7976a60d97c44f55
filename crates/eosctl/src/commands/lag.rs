//! `eosctl lag`: how far a consumer group is behind a topic, or a wait until it has caught up.

use std::time::Duration;

use anyhow::Context;
use indicatif::ProgressBar;

use crate::cli::LagArgs;
use crate::commands::{Status, progress_bar};
use crate::kafka_client::KafkaSettings;
use crate::lag::{self, LagOutcome, LagWatcher};
use crate::report;

pub(crate) async fn run(kafka: KafkaSettings, args: LagArgs) -> anyhow::Result<Status> {
    let wait = args.wait.then_some(args.timeout);
    let progress = if args.wait {
        progress_bar(0, "records behind")
    } else {
        ProgressBar::hidden()
    };
    let outcome = observe(kafka, &args.group, &args.topic, wait, progress).await?;
    if args.json {
        println!("{}", serde_json::to_string(&outcome)?);
    } else {
        print!("{}", lag::lag_text(&outcome));
    }
    if outcome.timed_out {
        eprintln!(
            "timed out after {}: group {:?} is still {} records behind on topic {:?}",
            humantime::format_duration(args.timeout),
            args.group,
            report::grouped(outcome.report.total_lag),
            args.topic
        );
        return Ok(Status::NotCaughtUp);
    }
    Ok(Status::Success)
}

/// The group's lag on the topic now, or, with `wait`, once it is 0 or `wait` has passed;
/// `progress` counts the records behind meanwhile and is cleared at the end.
pub async fn observe(
    kafka: KafkaSettings,
    group: &str,
    topic: &str,
    wait: Option<Duration>,
    progress: ProgressBar,
) -> anyhow::Result<LagOutcome> {
    let outcome = {
        let progress = progress.clone();
        let (owned_group, owned_topic) = (group.to_owned(), topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let watcher = LagWatcher::new(&kafka, &owned_group, &owned_topic)?;
            lag::observe_or_wait(&watcher, wait, &mut |total| {
                progress.set_position(u64::try_from(total).unwrap_or(0));
            })
        })
        .await
        .context("watching the lag")?
        .with_context(|| format!("reading the lag of group {group:?} on topic {topic:?}"))?
    };
    progress.finish_and_clear();
    Ok(outcome)
}
