//! `eosctl lag`: how far a consumer group is behind a topic, or a wait until it has caught up.

use anyhow::Context;
use indicatif::ProgressBar;

use crate::cli::LagArgs;
use crate::commands::{Status, progress_bar};
use crate::kafka_client::KafkaSettings;
use crate::lag::{self, LagWatcher};
use crate::report;

pub(crate) async fn run(kafka: KafkaSettings, args: LagArgs) -> anyhow::Result<Status> {
    let wait = args.wait.then_some(args.timeout);
    let progress = if args.wait {
        progress_bar(0, "records behind")
    } else {
        ProgressBar::hidden()
    };
    let outcome = {
        let progress = progress.clone();
        let (group, topic) = (args.group.clone(), args.topic.clone());
        tokio::task::spawn_blocking(move || {
            let watcher = LagWatcher::new(&kafka, &group, &topic)?;
            lag::observe_or_wait(&watcher, wait, &mut |total| {
                progress.set_position(u64::try_from(total).unwrap_or(0));
            })
        })
        .await
        .context("watching the lag")?
        .with_context(|| {
            format!(
                "reading the lag of group {:?} on topic {:?}",
                args.group, args.topic
            )
        })?
    };
    progress.finish_and_clear();
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
