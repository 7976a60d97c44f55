//! `eosctl produce`: writes a workload and prints what was written.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use time::OffsetDateTime;

use crate::cli::ProduceArgs;
use crate::commands::{Status, progress_bar};
use crate::kafka_client::{KafkaSettings, TopicLayout};
use crate::produce::{self, ProduceOptions};
use crate::report;
use crate::workload::WorkloadSpec;

pub(crate) async fn run(kafka: KafkaSettings, args: ProduceArgs) -> anyhow::Result<Status> {
    let options = options(&args)?;
    let progress = progress_bar(options.spec.physical_records(), "delivered");

    // Ctrl-C stops sending but still waits for what was sent, so the summary is true.
    let stop = Arc::new(AtomicBool::new(false));
    let signal = {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            eos_runtime::shutdown::wait_for_signal().await;
            tracing::warn!("interrupted: waiting for records already sent");
            stop.store(true, Ordering::Relaxed);
        })
    };
    let result = produce::run(&kafka, options, progress, stop).await;
    signal.abort();
    let summary = result.with_context(|| format!("producing to topic {:?}", args.topic))?;

    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print!("{}", report::produce_text(&summary));
    }
    Ok(Status::Success)
}

/// The workload and where it goes, from the command line; a random seed and now as the base
/// time unless given.
pub fn options(args: &ProduceArgs) -> anyhow::Result<ProduceOptions> {
    let spec = WorkloadSpec {
        seed: args.seed.unwrap_or_else(random_seed),
        count: args.count,
        entities: args.entities,
        duplicate_ratio: args.duplicate_ratio,
        bad_ratio: args.bad_ratio,
        conflict_ratio: args.conflict_ratio,
        value_bytes: args.value_bytes,
        occurred_at_base: args.occurred_at_base.unwrap_or_else(now_to_the_millisecond),
    };
    spec.validate()?;
    Ok(ProduceOptions {
        topic: args.topic.clone(),
        layout: TopicLayout {
            partitions: args.partitions,
            replication_factor: args.replication_factor,
        },
        rate: args.rate,
        delivery_timeout: args.delivery_timeout,
        spec,
    })
}

fn random_seed() -> u64 {
    // Only distinct per run, and short enough to read in event ids; the summary prints it so the
    // run can be reproduced.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            elapsed.subsec_nanos() ^ elapsed.as_secs() as u32
        });
    u64::from(nanos ^ std::process::id().rotate_left(16))
}

fn now_to_the_millisecond() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_millisecond(now.millisecond()).unwrap_or(now)
}
