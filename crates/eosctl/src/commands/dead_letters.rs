//! `eosctl dead-letters list` and `eosctl dead-letters redrive`: reads the dead-letter topic and
//! the re-drive logs, picks the dead letters the filters name, and shows or re-drives them.

use std::collections::BTreeSet;

use anyhow::{Context as _, bail};
use serde::Serialize;
use time::OffsetDateTime;

use crate::cli::{DeadLetterFilters, DeadLettersCommand, DeadLettersRedriveArgs};
use crate::commands::Status;
use crate::dead_letters::{self, DeadLetterEntry, RedriveAct, Selection};
use crate::kafka_client::KafkaSettings;
use crate::redrive::{self, Redriven};
use crate::topic_reader::read_topics;

pub(crate) async fn run(
    kafka: KafkaSettings,
    command: DeadLettersCommand,
) -> anyhow::Result<Status> {
    match command {
        DeadLettersCommand::List(args) => {
            let mut selection = selection(&args.filters);
            selection.not_redriven = args.not_redriven;
            let entries = read_entries(&kafka, &args.filters).await?;
            let chosen: Vec<&DeadLetterEntry> = entries
                .iter()
                .filter(|entry| selection.matches(entry))
                .collect();
            if args.json {
                println!("{}", serde_json::to_string(&chosen)?);
            } else {
                print!("{}", dead_letters::list_text(&chosen));
            }
            Ok(Status::Success)
        }
        DeadLettersCommand::Redrive(args) => redrive(kafka, args).await,
    }
}

/// What a re-drive did (or, with `--dry-run`, would do).
#[derive(Debug, Serialize)]
struct RedriveReport {
    redrive_id: String,
    redriven_by: String,
    reason: String,
    dry_run: bool,
    redriven: Vec<Redriven>,
    /// Dead letters the filters chose that are not re-driven, and why.
    skipped: Vec<(String, String)>,
}

async fn redrive(kafka: KafkaSettings, args: DeadLettersRedriveArgs) -> anyhow::Result<Status> {
    let selection = selection(&args.filters);
    if selection.reasons.is_empty()
        && selection.transform_reasons.is_empty()
        && selection.source_topics.is_empty()
        && selection.event_ids.is_empty()
        && selection.since.is_none()
        && selection.until.is_none()
    {
        bail!(
            "choose the dead letters to re-drive: --reason, --transform-reason, --id, \
             --source-topic, --since or --until (`dead-letters list` shows them)"
        );
    }
    let at = OffsetDateTime::now_utc();
    let redrive_id = match args.redrive_id {
        Some(id) => {
            eos_core::redrive::check_redrive_id(&id)?;
            id
        }
        None => dead_letters::new_redrive_id(at, rand::random()),
    };
    let act = RedriveAct {
        redrive_id,
        by: args.by,
        why: args.why,
        at,
    };
    let entries = read_entries(&kafka, &args.filters).await?;
    let mut chosen = Vec::new();
    let mut skipped = Vec::new();
    for entry in entries.iter().filter(|entry| selection.matches(entry)) {
        match dead_letters::not_redrivable(entry) {
            Some(why) => skipped.push((entry.letter.to_string(), why)),
            None => chosen.push(entry.clone()),
        }
    }
    let redriven = if args.dry_run || chosen.is_empty() {
        Vec::new()
    } else {
        redrive::redrive(
            &kafka,
            &args.filters.dlq,
            &chosen,
            &act,
            args.filters.redrive_log.as_deref(),
            args.filters.end_timeout,
        )
        .await
        .with_context(|| format!("re-driving {} dead letters", chosen.len()))?
    };
    let report = RedriveReport {
        redrive_id: act.redrive_id,
        redriven_by: act.by,
        reason: act.why,
        dry_run: args.dry_run,
        redriven,
        skipped,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", redrive_text(&report, &chosen));
    }
    Ok(Status::Success)
}

fn redrive_text(report: &RedriveReport, chosen: &[DeadLetterEntry]) -> String {
    let mut text = String::new();
    if report.dry_run {
        text.push_str(&format!(
            "dry run: {} dead letters would be re-driven as {} by {}:\n",
            chosen.len(),
            report.redrive_id,
            report.redriven_by
        ));
        for entry in chosen {
            text.push_str(&format!(
                "  {} ({}) → {}\n",
                entry.letter,
                entry.event_id.as_deref().unwrap_or("no event id"),
                entry
                    .source
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            ));
        }
    } else {
        text.push_str(&format!(
            "re-drive {} by {} ({}): {} dead letters re-driven\n",
            report.redrive_id,
            report.redriven_by,
            report.reason,
            report.redriven.len()
        ));
        for redriven in &report.redriven {
            text.push_str(&format!(
                "  {} ({}) → {}, logged to {}\n",
                redriven.dead_letter,
                redriven.event_id.as_deref().unwrap_or("no event id"),
                redriven.redrive_record,
                redriven.log_topic
            ));
        }
    }
    for (letter, why) in &report.skipped {
        text.push_str(&format!("  skipped {letter}: {why}\n"));
    }
    text
}

fn selection(filters: &DeadLetterFilters) -> Selection {
    Selection {
        reasons: filters.reasons.clone(),
        transform_reasons: filters.transform_reasons.clone(),
        source_topics: filters.source_topics.clone(),
        event_ids: filters.ids.clone(),
        since: filters.since,
        until: filters.until,
        not_redriven: false,
    }
}

/// Every dead letter of `--dlq`, with the re-drives the logs record: `--redrive-log`, else the
/// log of each source topic the dead letters name.
async fn read_entries(
    kafka: &KafkaSettings,
    filters: &DeadLetterFilters,
) -> anyhow::Result<Vec<DeadLetterEntry>> {
    let read = |topics: Vec<String>| {
        let kafka = kafka.clone();
        let end_timeout = filters.end_timeout;
        async move {
            tokio::task::spawn_blocking(move || {
                let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                read_topics(&kafka, &names, end_timeout, &mut |_| {})
            })
            .await
            .context("reading the topics")?
            .context("reading the topics")
        }
    };
    let letters = read(vec![filters.dlq.clone()])
        .await?
        .pop()
        .context("the dead-letter topic was not read")?;
    if !letters.exists {
        bail!("dead-letter topic {:?} does not exist", filters.dlq);
    }
    let logs: BTreeSet<String> = match &filters.redrive_log {
        Some(log) => BTreeSet::from([log.clone()]),
        None => dead_letters::entries(&letters.records, &[], &filters.event_id)
            .iter()
            .filter_map(|entry| entry.source.as_ref())
            .map(|source| dead_letters::default_redrive_log(&source.topic))
            .collect(),
    };
    let log_records: Vec<_> = read(logs.into_iter().collect())
        .await?
        .into_iter()
        .flat_map(|snapshot| snapshot.records)
        .collect();
    Ok(dead_letters::entries(
        &letters.records,
        &log_records,
        &filters.event_id,
    ))
}
