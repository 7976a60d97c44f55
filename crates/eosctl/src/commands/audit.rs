//! `eosctl audit`: reads the topics (and, when given, the PostgreSQL targets and the provider's
//! effects), audits them and prints the report.

use std::collections::BTreeSet;

use anyhow::{Context, bail};
use indicatif::ProgressBar;
use time::OffsetDateTime;

use crate::audit::{self, AuditConfig, AuditInput, DEFAULT_EXAMPLE_LIMIT};
use crate::boundary_audit;
use crate::boundary_reader::{self, PostgresScope};
use crate::cli::AuditArgs;
use crate::commands::{Status, progress_bar};
use crate::kafka_client::KafkaSettings;
use crate::replay_audit;
use crate::report::{self, AuditOutcome};
use crate::topic_reader::{self, TopicSnapshot};

pub(crate) async fn run(kafka: KafkaSettings, args: AuditArgs) -> anyhow::Result<Status> {
    let json = args.json;
    if args.replay {
        let dlq = args
            .dlq
            .clone()
            .unwrap_or_else(|| format!("{}.dlq", args.input));
        let config = replay_audit::ReplayAuditConfig {
            transform: args.transform,
            wasm_limits: replay_audit::WasmLimits {
                fuel: args.wasm_fuel,
                max_memory_bytes: args.wasm_max_memory,
                timeout: args.wasm_timeout,
            },
            event_id: args.event_id,
            entity: args.entity,
            occurred_at: args.occurred_at,
            max_record_bytes: args.max_record_bytes,
            filter: args.filter_pointer.zip(args.filter_equals),
            outputs: replay_audit::output_topics(&args.output, &args.named_outputs),
            input: args.input,
            dlq,
            end_timeout: args.end_timeout,
            formats: run_formats(&args.registry, args.input_format, args.output_format)?,
        };
        let outcome = replay_audit::run(kafka, config).await?;
        if json {
            println!("{}", serde_json::to_string(&outcome)?);
        } else {
            print!("{}", replay_audit::text(&outcome));
        }
        return Ok(if outcome.passed {
            Status::Success
        } else {
            Status::ViolationsFound
        });
    }
    let outcome = audit(kafka, args, progress_bar(0, "records read")).await?;
    if json {
        println!("{}", serde_json::to_string(&outcome)?);
    } else {
        print!("{}", report::audit_text(&outcome));
    }
    Ok(if outcome.report.passed {
        Status::Success
    } else {
        Status::ViolationsFound
    })
}

/// Reads what `args` names and audits it; `progress` counts the records read meanwhile. A
/// violation is in the outcome; an error is what kept the audit from running.
pub async fn audit(
    kafka: KafkaSettings,
    args: AuditArgs,
    progress: ProgressBar,
) -> anyhow::Result<AuditOutcome> {
    let dlq = args
        .dlq
        .clone()
        .unwrap_or_else(|| format!("{}.dlq", args.input));
    let formats = run_formats(&args.registry, args.input_format, args.output_format)?;
    let [input, output, dead_letters] = read_run(
        kafka,
        [args.input.clone(), args.output.clone(), dlq],
        args.end_timeout,
        formats,
        progress.clone(),
    )
    .await?;
    progress.finish_and_clear();
    if !input.exists {
        bail!("input topic {:?} does not exist", args.input);
    }

    let config = AuditConfig {
        now: OffsetDateTime::now_utc(),
        dedup_horizon: args.dedup_horizon,
        max_record_bytes: args.max_record_bytes,
        example_limit: DEFAULT_EXAMPLE_LIMIT,
    };
    let mut report = audit::audit(
        &AuditInput {
            input_topic: &input.topic,
            input: &input.records,
            output: &output.records,
            dlq: &dead_letters.records,
        },
        &config,
    );
    for snapshot in [&input, &output, &dead_letters] {
        report.notes.extend(snapshot_notes(snapshot));
    }
    let expected = audit::output_logical_set(&output.records);
    let mut refused = BTreeSet::new();
    let mut held = BTreeSet::new();
    if let Some(database_url) = &args.database_url {
        let scope = PostgresScope {
            sink_table: &args.sink_table,
            state_table: &args.state_table,
            output_topic: &output.topic,
            expected: &expected,
        };
        let targets = boundary_reader::read_postgres(database_url, &scope).await?;
        boundary_audit::audit_postgres(
            &mut report,
            &expected,
            &targets.rows,
            &targets.states,
            DEFAULT_EXAMPLE_LIMIT,
        );
        refused = audit::output_event_ids_at(&output.records, &targets.refused_positions);
        held = audit::output_event_ids_at(&output.records, &targets.held_positions);
    }
    if let Some(provider_url) = &args.provider_url {
        let effects = boundary_reader::read_provider_effects(provider_url).await?;
        boundary_audit::audit_provider(
            &mut report,
            &expected,
            &refused,
            &held,
            &effects,
            &args.provider_operation_prefix,
            DEFAULT_EXAMPLE_LIMIT,
        );
    }
    if let Some(database_url) = &args.outbox_database_url {
        let domain =
            boundary_reader::read_domain_event_ids(database_url, &args.outbox_domain_query).await?;
        boundary_audit::audit_outbox(&mut report, &domain, &input.records, DEFAULT_EXAMPLE_LIMIT);
    }
    Ok(AuditOutcome {
        outbox_domain_query: args
            .outbox_database_url
            .is_some()
            .then_some(args.outbox_domain_query),
        input_topic: input.topic,
        output_topic: output.topic,
        dlq_topic: dead_letters.topic,
        sink_table: args.database_url.is_some().then_some(args.sink_table),
        state_table: args.database_url.is_some().then_some(args.state_table),
        provider_operation_prefix: args
            .provider_url
            .is_some()
            .then_some(args.provider_operation_prefix),
        report,
    })
}

/// The run's input, output and dead-letter topics, each record decoded as the processor decoded
/// it (`formats`); `progress` counts the records read.
async fn read_run(
    kafka: KafkaSettings,
    topics: [String; 3],
    end_timeout: std::time::Duration,
    formats: crate::run_formats::RunFormats,
    progress: ProgressBar,
) -> anyhow::Result<[TopicSnapshot; 3]> {
    tokio::task::spawn_blocking(move || {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let snapshots = topic_reader::read_topics(&kafka, &names, end_timeout, &mut |read| {
            progress.set_position(read);
        })
        .context("reading the topics")?;
        let [mut input, mut output, mut dead_letters] =
            <[TopicSnapshot; 3]>::try_from(snapshots)
                .map_err(|_| anyhow::anyhow!("the reader returned the wrong number of topics"))?;
        crate::run_formats::decode_topics(
            [
                &mut input.records,
                &mut output.records,
                &mut dead_letters.records,
            ],
            &input.topic,
            &output.topic,
            &formats,
        )
        .context("decoding the topics' records")?;
        Ok([input, output, dead_letters])
    })
    .await
    .context("reading the topics")?
}

/// What the reader saw that limits what the audit can prove.
fn snapshot_notes(snapshot: &TopicSnapshot) -> Vec<String> {
    if !snapshot.exists {
        return vec![format!(
            "topic {:?} does not exist; read as empty",
            snapshot.topic
        )];
    }
    snapshot
        .spans
        .iter()
        .filter(|span| span.low > 0)
        .map(|span| {
            format!(
                "topic {:?} partition {} starts at offset {}: earlier records were deleted by retention and are not audited",
                snapshot.topic, span.partition, span.low
            )
        })
        .collect()
}

/// The run's formats from `--input-format`, `--output-format` and the registry's flags.
fn run_formats(
    registry: &eos_schema::RegistryFlags,
    input: eos_schema::RecordFormat,
    output: eos_schema::RecordFormat,
) -> anyhow::Result<crate::run_formats::RunFormats> {
    let registry = registry
        .registry_config(&[("--input-format", input), ("--output-format", output)])
        .map_err(anyhow::Error::msg)?;
    Ok(crate::run_formats::RunFormats {
        input,
        output,
        registry,
    })
}
