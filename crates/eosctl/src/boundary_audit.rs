//! The audit past the output topic: the sink-writer's PostgreSQL targets and the provider's
//! effects must each hold the output's logical set exactly once, by `event_id`; and before the
//! input topic, the outbox: every committed domain row has exactly one event on the input topic,
//! and no event there lacks one.
//!
//! Pure, like [`audit`](crate::audit): rows and effects come in as plain values (read by
//! [`boundary_reader`](crate::boundary_reader)), and the findings go into the same
//! [`AuditReport`] — figures, one check line per rule and per violation kind — so the table, the
//! `--json` shape and the exit status stay those of the topic audit.
//!
//! What each boundary must hold is decided by the output topic ([`output_logical_set`]), not by
//! the input: the sink and the provider target consume the output, so a processor mistake is
//! reported once, by the topic checks, rather than again at every boundary.
//!
//! [`output_logical_set`]: crate::audit::output_logical_set

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize;

use eos_core::EventEnvelope;

use crate::audit::{AuditReport, OutputFacts, Recorder, Violation, check};
use crate::source_record::SourceRecord;

/// A row of the append target (`event_sink`), as far as the audit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRow {
    pub event_id: String,
    pub value: i64,
    /// Hex SHA-256, as the sink stores it.
    pub fingerprint: String,
}

/// A row of the versioned target (`entity_state`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRow {
    pub entity_id: String,
    pub version: i64,
    pub event_id: String,
}

/// One applied effect, as provider-sim's `GET /effects` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ProviderEffect {
    pub key: String,
    pub amount: i64,
    /// Requests with this key while the provider remembered it, the first included.
    pub attempts: u64,
}

/// Output events by id: what every boundary must hold once.
pub type OutputSet = BTreeMap<String, OutputFacts>;

/// Checks the sink's tables against the output: one row per output event with its value and
/// fingerprint, nothing else, the same sum; and per entity the highest version the output carries.
/// `rows` and `states` are those in scope (see [`boundary_reader`](crate::boundary_reader)).
pub fn audit_postgres(
    report: &mut AuditReport,
    expected: &OutputSet,
    rows: &[SinkRow],
    states: &[StateRow],
    example_limit: usize,
) {
    let mut recorder = Recorder::new(example_limit, &Violation::POSTGRES);
    let mut rows_by_id: BTreeMap<&str, Vec<&SinkRow>> = BTreeMap::new();
    for row in rows {
        rows_by_id.entry(&row.event_id).or_default().push(row);
    }
    let mut exactly_once = 0u64;
    for (event_id, event) in expected {
        let Some(copies) = rows_by_id.get(event_id.as_str()) else {
            recorder.add(Violation::MissingRow, 1, || event_id.clone());
            continue;
        };
        if copies.len() > 1 {
            recorder.add(Violation::DuplicatedRow, copies.len() as u64 - 1, || {
                event_id.clone()
            });
        }
        let fingerprint = event.fingerprint.to_hex();
        let differing: Vec<&&SinkRow> = copies
            .iter()
            .filter(|row| row.value != event.value || row.fingerprint != fingerprint)
            .collect();
        if let Some(first) = differing.first() {
            recorder.add(Violation::RowMismatch, differing.len() as u64, || {
                if first.value == event.value {
                    format!("{event_id} (fingerprint {})", first.fingerprint)
                } else {
                    format!(
                        "{event_id} (value {}, the output's {})",
                        first.value, event.value
                    )
                }
            });
        } else if copies.len() == 1 {
            exactly_once += 1;
        }
    }
    for (event_id, copies) in &rows_by_id {
        if !expected.contains_key(*event_id) {
            recorder.add(Violation::UnexpectedRow, copies.len() as u64, || {
                (*event_id).to_owned()
            });
        }
    }

    // Per entity, the highest version the output carries and the events carrying it.
    let mut latest: BTreeMap<&str, (u64, Vec<&str>)> = BTreeMap::new();
    for (event_id, event) in expected {
        let Some(version) = event.version else {
            continue;
        };
        let slot = latest
            .entry(&event.entity_id)
            .or_insert((version, Vec::new()));
        if version > slot.0 {
            *slot = (version, Vec::new());
        }
        if version == slot.0 {
            slot.1.push(event_id);
        }
    }
    let mut states_by_entity: BTreeMap<&str, Vec<&StateRow>> = BTreeMap::new();
    for state in states {
        states_by_entity
            .entry(&state.entity_id)
            .or_default()
            .push(state);
    }
    let mut current = 0u64;
    for (entity, (version, event_ids)) in &latest {
        let stored = states_by_entity.get(entity).map_or(&[][..], Vec::as_slice);
        let Some(state) = stored.first() else {
            recorder.add(Violation::StaleState, 1, || {
                format!("{entity} (no row, the output's latest is version {version})")
            });
            continue;
        };
        if stored.len() > 1 {
            recorder.add(Violation::DuplicatedRow, stored.len() as u64 - 1, || {
                format!("state of {entity}")
            });
            continue;
        }
        let found = i128::from(state.version);
        let example = || {
            format!(
                "{entity} (version {} from {}, the output's latest is {version})",
                state.version, state.event_id
            )
        };
        if found < i128::from(*version) {
            recorder.add(Violation::StaleState, 1, example);
        } else if found > i128::from(*version) {
            recorder.add(Violation::StateAhead, 1, example);
        } else if !event_ids.contains(&state.event_id.as_str()) {
            recorder.add(Violation::RowMismatch, 1, example);
        } else {
            current += 1;
        }
    }
    for (entity, stored) in &states_by_entity {
        if !latest.contains_key(entity) {
            // In scope only because it names one of the output's events, which carry no version
            // for this entity: the sink had no reason to write it.
            recorder.add(Violation::UnexpectedRow, stored.len() as u64, || {
                format!("state of {entity} (from {})", stored[0].event_id)
            });
        }
    }

    let expected_sum: i128 = expected.values().map(|event| i128::from(event.value)).sum();
    let rows_sum: i128 = rows.iter().map(|row| i128::from(row.value)).sum();
    report.figures.postgres_rows = Some(rows.len() as u64);
    report.figures.postgres_sum = Some(rows_sum);
    report.figures.entity_states = Some(states.len() as u64);
    let checks = [
        check(
            "output events with exactly one matching row",
            expected.len() as i128,
            exactly_once.into(),
        ),
        check("sum of row values (cents)", expected_sum, rows_sum),
        check(
            "entities at the output's latest version",
            latest.len() as i128,
            current.into(),
        ),
    ];
    merge(report, checks, recorder, &Violation::POSTGRES);
}

/// Checks the provider's effects against the output: one effect per output event, keyed
/// `<prefix><event_id>`, with the event's value as its amount, and nothing else under the prefix.
/// Events in `refused` (the sink dead-lettered them as not charged) must have no effect instead.
/// Events in `held` (the sink held them: their operation is UNKNOWN and cannot be settled from
/// the provider, docs/architecture/held-operations.md "Held operations") are their own category:
/// whether the provider applied them is exactly what nobody knows yet, so neither an effect nor its
/// absence is a violation, and their effects stay out of the sums.
pub fn audit_provider(
    report: &mut AuditReport,
    expected: &OutputSet,
    refused: &BTreeSet<String>,
    held: &BTreeSet<String>,
    effects: &[ProviderEffect],
    operation_prefix: &str,
    example_limit: usize,
) {
    let mut recorder = Recorder::new(example_limit, &Violation::PROVIDER);
    // Another pipeline's effects (other prefix) are not this audit's business.
    let mut by_event: HashMap<&str, Vec<&ProviderEffect>> = HashMap::new();
    for effect in effects {
        if let Some(event_id) = effect.key.strip_prefix(operation_prefix) {
            by_event.entry(event_id).or_default().push(effect);
        }
    }
    let in_scope: Vec<&ProviderEffect> = by_event.values().flatten().copied().collect();

    let mut exactly_once = 0u64;
    let mut refused_without_effect = 0u64;
    let mut held_events = 0u64;
    let mut charged_sum: i128 = 0;
    for (event_id, event) in expected {
        if held.contains(event_id) {
            held_events += 1;
            continue;
        }
        if refused.contains(event_id) {
            match by_event.get(event_id.as_str()) {
                Some(copies) => {
                    recorder.add(Violation::RefusedButApplied, copies.len() as u64, || {
                        event_id.clone()
                    });
                }
                None => refused_without_effect += 1,
            }
            continue;
        }
        charged_sum += i128::from(event.value);
        let Some(copies) = by_event.get(event_id.as_str()) else {
            recorder.add(Violation::MissingEffect, 1, || event_id.clone());
            continue;
        };
        if copies.len() > 1 {
            recorder.add(Violation::DuplicatedEffect, copies.len() as u64 - 1, || {
                event_id.clone()
            });
        }
        let differing: Vec<&&ProviderEffect> = copies
            .iter()
            .filter(|effect| effect.amount != event.value)
            .collect();
        if let Some(first) = differing.first() {
            recorder.add(Violation::EffectMismatch, differing.len() as u64, || {
                format!(
                    "{event_id} (amount {}, the output's value {})",
                    first.amount, event.value
                )
            });
        } else if copies.len() == 1 {
            exactly_once += 1;
        }
    }
    let mut unexpected: Vec<(&str, usize)> = by_event
        .iter()
        .filter(|(event_id, _)| !expected.contains_key(**event_id))
        .map(|(_, copies)| (copies[0].key.as_str(), copies.len()))
        .collect();
    unexpected.sort_unstable();
    for (key, copies) in unexpected {
        recorder.add(Violation::UnexpectedEffect, copies as u64, || {
            key.to_owned()
        });
    }

    let effects_sum: i128 = by_event
        .iter()
        .filter(|(event_id, _)| !held.contains(**event_id))
        .flat_map(|(_, copies)| copies)
        .map(|effect| i128::from(effect.amount))
        .sum();
    report.figures.provider_effects = Some(in_scope.len() as u64);
    report.figures.provider_sum = Some(effects_sum);
    report.figures.provider_refused = Some(refused_without_effect);
    report.figures.provider_held = Some(held_events);
    report.figures.provider_retries_absorbed = Some(
        in_scope
            .iter()
            .map(|effect| effect.attempts.saturating_sub(1))
            .sum(),
    );
    let checks = [
        check(
            "output events with exactly one provider effect",
            expected
                .keys()
                .filter(|event_id| !refused.contains(*event_id) && !held.contains(*event_id))
                .count() as i128,
            exactly_once.into(),
        ),
        check("sum of provider amounts (cents)", charged_sum, effects_sum),
    ];
    merge(report, checks, recorder, &Violation::PROVIDER);
}

/// Checks the outbox boundary: each of `domain_event_ids` (the committed domain rows) is the
/// event id of exactly one input record, and every input event id is one of them. Input records
/// that are not envelopes are not outbox events (the outbox table cannot hold them) and are left
/// to the topic audit.
pub fn audit_outbox(
    report: &mut AuditReport,
    domain_event_ids: &BTreeSet<String>,
    input: &[SourceRecord],
    example_limit: usize,
) {
    let mut recorder = Recorder::new(example_limit, &Violation::OUTBOX);
    let mut copies: BTreeMap<String, u64> = BTreeMap::new();
    for record in input {
        if let Ok(envelope) = EventEnvelope::parse(record.value.as_deref().unwrap_or_default()) {
            *copies.entry(envelope.event_id.to_string()).or_default() += 1;
        }
    }
    let mut exactly_once = 0u64;
    for event_id in domain_event_ids {
        match copies.get(event_id) {
            None => recorder.add(Violation::DomainRowWithoutEvent, 1, || event_id.clone()),
            Some(1) => exactly_once += 1,
            Some(&n) => recorder.add(Violation::EventPublishedTwice, n - 1, || event_id.clone()),
        }
    }
    for (event_id, &n) in &copies {
        if !domain_event_ids.contains(event_id) {
            recorder.add(Violation::EventWithoutDomainRow, n, || event_id.clone());
        }
    }
    report.figures.outbox_domain_rows = Some(domain_event_ids.len() as u64);
    report.figures.outbox_events = Some(copies.len() as u64);
    let checks = [check(
        "committed domain rows with exactly one event on the input",
        domain_event_ids.len() as i128,
        exactly_once.into(),
    )];
    merge(report, checks, recorder, &Violation::OUTBOX);
}

/// Appends a boundary's check lines — its rules, then one per violation kind — and violations,
/// and re-decides `passed` over every line.
fn merge(
    report: &mut AuditReport,
    rules: impl IntoIterator<Item = crate::audit::Check>,
    recorder: Recorder,
    kinds: &[Violation],
) {
    report.checks.extend(rules);
    for &kind in kinds {
        report
            .checks
            .push(check(kind.description(), 0, recorder.count(kind).into()));
    }
    report.violations.extend(recorder.details);
    report.passed = report.checks.iter().all(|check| check.passed);
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::audit::{AuditConfig, AuditInput, DEFAULT_EXAMPLE_LIMIT, audit, output_logical_set};
    use crate::source_record::SourceRecord;
    use crate::test_support::{INPUT, InputLog, reference_process};

    const PREFIX: &str = "payments:";

    fn versioned(event_id: &str, entity_id: &str, value: i64, version: u64) -> Vec<u8> {
        json!({"event_id": event_id, "entity_id": entity_id, "value": value, "version": version})
            .to_string()
            .into_bytes()
    }

    /// A passing topic audit of a small pipeline, and its output's logical set: entity `a` at
    /// versions 1..=2, `b` at version 1, and `c` without versions.
    fn pipeline() -> (AuditReport, OutputSet) {
        let mut log = InputLog::default();
        log.push(0, &versioned("e-1", "a", 1_000, 1))
            .push(0, &versioned("e-2", "a", 250, 2))
            .push(0, &versioned("e-1", "a", 1_000, 1)) // retry
            .push(1, &versioned("e-3", "b", -70, 1))
            .push(1, &crate::test_support::envelope("e-4", "c", 5));
        let input: Vec<SourceRecord> = log.records;
        let processed = reference_process(&input);
        let report = audit(
            &AuditInput {
                input_topic: INPUT,
                input: &input,
                output: &processed.output,
                dlq: &processed.dlq,
            },
            &AuditConfig {
                now: time::macros::datetime!(2026-03-01 00:00:00 UTC),
                dedup_horizon: std::time::Duration::from_secs(7 * 24 * 3600),
                max_record_bytes: eos_core::envelope::DEFAULT_MAX_RECORD_BYTES,
                example_limit: DEFAULT_EXAMPLE_LIMIT,
            },
        );
        assert!(report.passed);
        (report, output_logical_set(&processed.output))
    }

    /// What a correct sink writes for `expected`.
    fn exact_tables(expected: &OutputSet) -> (Vec<SinkRow>, Vec<StateRow>) {
        let rows = expected
            .iter()
            .map(|(event_id, event)| SinkRow {
                event_id: event_id.clone(),
                value: event.value,
                fingerprint: event.fingerprint.to_hex(),
            })
            .collect();
        let states = vec![state("a", 2, "e-2"), state("b", 1, "e-3")];
        (rows, states)
    }

    fn state(entity_id: &str, version: i64, event_id: &str) -> StateRow {
        StateRow {
            entity_id: entity_id.into(),
            version,
            event_id: event_id.into(),
        }
    }

    /// What a correct provider target leaves at the provider for `expected`.
    fn exact_effects(expected: &OutputSet) -> Vec<ProviderEffect> {
        expected
            .iter()
            .map(|(event_id, event)| effect(&format!("{PREFIX}{event_id}"), event.value, 1))
            .collect()
    }

    fn effect(key: &str, amount: i64, attempts: u64) -> ProviderEffect {
        ProviderEffect {
            key: key.into(),
            amount,
            attempts,
        }
    }

    fn postgres(rows: &[SinkRow], states: &[StateRow]) -> AuditReport {
        let (mut report, expected) = pipeline();
        audit_postgres(&mut report, &expected, rows, states, DEFAULT_EXAMPLE_LIMIT);
        report
    }

    fn provider(effects: &[ProviderEffect]) -> AuditReport {
        provider_with_refusals(effects, &[])
    }

    fn provider_with_refusals(effects: &[ProviderEffect], refused: &[&str]) -> AuditReport {
        provider_with(effects, refused, &[])
    }

    fn provider_with(effects: &[ProviderEffect], refused: &[&str], held: &[&str]) -> AuditReport {
        let (mut report, expected) = pipeline();
        let refused: BTreeSet<String> = refused.iter().map(|id| (*id).to_owned()).collect();
        let held: BTreeSet<String> = held.iter().map(|id| (*id).to_owned()).collect();
        audit_provider(
            &mut report,
            &expected,
            &refused,
            &held,
            effects,
            PREFIX,
            DEFAULT_EXAMPLE_LIMIT,
        );
        report
    }

    fn failing(report: &AuditReport) -> Vec<&str> {
        report
            .checks
            .iter()
            .filter(|check| !check.passed)
            .map(|check| check.name.as_str())
            .collect()
    }

    /// The report fails, `kind` has `count` with `example` first, and no other kind is reported.
    fn assert_only(report: &AuditReport, kind: Violation, count: u64, example: &str) {
        assert!(!report.passed, "{kind} must fail the audit");
        let reported: Vec<(Violation, u64)> = report
            .violations
            .iter()
            .filter(|(_, detail)| detail.count > 0)
            .map(|(kind, detail)| (*kind, detail.count))
            .collect();
        assert_eq!(reported, vec![(kind, count)]);
        assert_eq!(report.violations[&kind].examples[0], example);
        assert!(
            failing(report).contains(&kind.description()),
            "{kind} has a failing line: {:?}",
            failing(report)
        );
    }

    #[test]
    fn exact_tables_pass_with_their_figures() {
        let (_, expected) = pipeline();
        let (rows, states) = exact_tables(&expected);
        let report = postgres(&rows, &states);
        assert!(report.passed, "{:?}", failing(&report));
        assert_eq!(report.figures.postgres_rows, Some(4));
        assert_eq!(report.figures.postgres_sum, Some(1_000 + 250 - 70 + 5));
        assert_eq!(report.figures.entity_states, Some(2));
        for kind in Violation::POSTGRES {
            assert_eq!(report.violation_count(kind), 0, "{kind}");
            assert!(report.checks.iter().any(|c| c.name == kind.description()));
        }
        assert!(!report.violations.contains_key(&Violation::MissingEffect));
    }

    #[test]
    fn a_missing_row_is_reported() {
        let (_, expected) = pipeline();
        let (mut rows, states) = exact_tables(&expected);
        rows.retain(|row| row.event_id != "e-2");
        assert_only(&postgres(&rows, &states), Violation::MissingRow, 1, "e-2");
    }

    #[test]
    fn an_unexpected_row_is_reported() {
        let (_, expected) = pipeline();
        let (mut rows, states) = exact_tables(&expected);
        rows.push(SinkRow {
            event_id: "e-planted".into(),
            value: 0,
            fingerprint: "00".into(),
        });
        // Value 0: only the row count is wrong, the sum still adds up.
        let report = postgres(&rows, &states);
        assert_only(&report, Violation::UnexpectedRow, 1, "e-planted");
        assert_eq!(report.figures.postgres_rows, Some(5));
    }

    #[test]
    fn a_row_with_another_value_or_fingerprint_is_a_mismatch() {
        let (_, expected) = pipeline();
        let (mut rows, states) = exact_tables(&expected);
        rows[0].value += 1;
        let report = postgres(&rows, &states);
        assert_only(
            &report,
            Violation::RowMismatch,
            1,
            "e-1 (value 1001, the output's 1000)",
        );
        assert!(failing(&report).contains(&"sum of row values (cents)"));

        let (mut rows, states) = exact_tables(&expected);
        rows[1].fingerprint = "00".into();
        assert_only(
            &postgres(&rows, &states),
            Violation::RowMismatch,
            1,
            "e-2 (fingerprint 00)",
        );
    }

    #[test]
    fn a_second_row_for_one_event_is_duplicated() {
        let (_, expected) = pipeline();
        let (mut rows, states) = exact_tables(&expected);
        rows.push(rows[3].clone());
        assert_only(
            &postgres(&rows, &states),
            Violation::DuplicatedRow,
            1,
            "e-4",
        );
    }

    #[test]
    fn a_stale_or_absent_state_is_reported() {
        let (_, expected) = pipeline();
        let (rows, _) = exact_tables(&expected);
        let stale = [state("a", 1, "e-1"), state("b", 1, "e-3")];
        assert_only(
            &postgres(&rows, &stale),
            Violation::StaleState,
            1,
            "a (version 1 from e-1, the output's latest is 2)",
        );
        let absent = [state("a", 2, "e-2")];
        assert_only(
            &postgres(&rows, &absent),
            Violation::StaleState,
            1,
            "b (no row, the output's latest is version 1)",
        );
    }

    #[test]
    fn a_state_ahead_of_the_output_is_reported() {
        let (_, expected) = pipeline();
        let (rows, _) = exact_tables(&expected);
        let ahead = [state("a", 3, "e-other"), state("b", 1, "e-3")];
        assert_only(
            &postgres(&rows, &ahead),
            Violation::StateAhead,
            1,
            "a (version 3 from e-other, the output's latest is 2)",
        );
    }

    #[test]
    fn a_state_from_another_event_or_for_an_unversioned_entity_is_reported() {
        let (_, expected) = pipeline();
        let (rows, _) = exact_tables(&expected);
        let other_event = [state("a", 2, "e-1"), state("b", 1, "e-3")];
        assert_only(
            &postgres(&rows, &other_event),
            Violation::RowMismatch,
            1,
            "a (version 2 from e-1, the output's latest is 2)",
        );
        // `c` has no version in the output: a state row from its event should not exist.
        let unversioned = [
            state("a", 2, "e-2"),
            state("b", 1, "e-3"),
            state("c", 1, "e-4"),
        ];
        assert_only(
            &postgres(&rows, &unversioned),
            Violation::UnexpectedRow,
            1,
            "state of c (from e-4)",
        );
    }

    #[test]
    fn exact_effects_pass_and_count_the_retries_absorbed() {
        let (_, expected) = pipeline();
        let mut effects = exact_effects(&expected);
        effects[0].attempts = 3;
        effects[2].attempts = 2;
        // Another pipeline's effect on the same provider is out of scope.
        effects.push(effect("refunds:e-1", 99, 1));
        let report = provider(&effects);
        assert!(report.passed, "{:?}", failing(&report));
        assert_eq!(report.figures.provider_effects, Some(4));
        assert_eq!(report.figures.provider_sum, Some(1_000 + 250 - 70 + 5));
        assert_eq!(report.figures.provider_retries_absorbed, Some(3));
        for kind in Violation::PROVIDER {
            assert_eq!(report.violation_count(kind), 0, "{kind}");
        }
        assert!(!report.violations.contains_key(&Violation::MissingRow));
    }

    #[test]
    fn a_missing_effect_is_reported() {
        let (_, expected) = pipeline();
        let mut effects = exact_effects(&expected);
        effects.retain(|effect| effect.key != "payments:e-3");
        assert_only(&provider(&effects), Violation::MissingEffect, 1, "e-3");
    }

    #[test]
    fn an_event_the_sink_refused_must_have_no_effect() {
        let (_, expected) = pipeline();
        let mut effects = exact_effects(&expected);
        effects.retain(|effect| effect.key != "payments:e-3");
        let report = provider_with_refusals(&effects, &["e-3"]);
        assert!(report.passed, "{:?}", failing(&report));
        assert_eq!(report.figures.provider_refused, Some(1));
        assert_eq!(report.figures.provider_sum, Some(1_000 + 250 + 5));

        // Charged anyway: the sink's dead letter says otherwise.
        let report = provider_with_refusals(&exact_effects(&expected), &["e-3"]);
        assert_only(&report, Violation::RefusedButApplied, 1, "e-3");
        assert_eq!(report.figures.provider_refused, Some(0));
    }

    #[test]
    fn a_held_event_is_its_own_category_whether_or_not_it_was_applied() {
        let (_, expected) = pipeline();
        // Not applied: not a missing effect.
        let mut effects = exact_effects(&expected);
        effects.retain(|effect| effect.key != "payments:e-3");
        let report = provider_with(&effects, &[], &["e-3"]);
        assert!(report.passed, "{:?}", failing(&report));
        assert_eq!(report.figures.provider_held, Some(1));
        assert_eq!(report.figures.provider_sum, Some(1_000 + 250 + 5));
        // Applied (the provider had it after all): not unexpected, and out of the sums.
        let report = provider_with(&exact_effects(&expected), &[], &["e-3"]);
        assert!(report.passed, "{:?}", failing(&report));
        assert_eq!(report.figures.provider_held, Some(1));
        assert_eq!(report.figures.provider_sum, Some(1_000 + 250 + 5));
        // Only the held event is excused: another missing one is still caught.
        effects.retain(|effect| effect.key != "payments:e-1");
        let report = provider_with(&effects, &[], &["e-3"]);
        assert_only(&report, Violation::MissingEffect, 1, "e-1");
    }

    #[test]
    fn a_second_effect_for_one_event_is_duplicated() {
        // A provider that forgot the key (its TTL) charges again under the same key.
        let (_, expected) = pipeline();
        let mut effects = exact_effects(&expected);
        effects.push(effect("payments:e-1", 1_000, 1));
        let report = provider(&effects);
        assert_only(&report, Violation::DuplicatedEffect, 1, "e-1");
        assert!(failing(&report).contains(&"sum of provider amounts (cents)"));
    }

    #[test]
    fn an_effect_for_no_output_event_is_unexpected() {
        let (_, expected) = pipeline();
        let mut effects = exact_effects(&expected);
        effects.push(effect("payments:e-unknown", 0, 1));
        assert_only(
            &provider(&effects),
            Violation::UnexpectedEffect,
            1,
            "payments:e-unknown",
        );
    }

    #[test]
    fn an_effect_with_another_amount_is_a_mismatch() {
        let (_, expected) = pipeline();
        let mut effects = exact_effects(&expected);
        effects[1].amount = 251;
        assert_only(
            &provider(&effects),
            Violation::EffectMismatch,
            1,
            "e-2 (amount 251, the output's value 250)",
        );
    }

    #[test]
    fn a_topic_only_report_keeps_its_json_shape() -> Result<(), serde_json::Error> {
        let (report, _) = pipeline();
        let json = serde_json::to_value(&report)?;
        for figure in ["postgres_rows", "entity_states", "provider_effects"] {
            assert!(json["figures"].get(figure).is_none(), "{figure}");
        }
        assert_eq!(
            json["violations"].as_object().map(serde_json::Map::len),
            Some(Violation::TOPICS.len())
        );

        let (mut report, expected) = pipeline();
        audit_provider(
            &mut report,
            &expected,
            &BTreeSet::new(),
            &BTreeSet::new(),
            &[],
            PREFIX,
            DEFAULT_EXAMPLE_LIMIT,
        );
        let json = serde_json::to_value(&report)?;
        assert_eq!(json["figures"]["provider_effects"], 0);
        assert_eq!(json["violations"]["missing_effect"]["count"], 4);
        assert_eq!(json["passed"], false);
        Ok(())
    }

    /// The outbox boundary over input records `ids` (one record each, in order) against the
    /// committed domain rows `rows`.
    fn outbox_audit(rows: &[&str], ids: &[&str]) -> AuditReport {
        let (mut report, _) = pipeline();
        let input: Vec<SourceRecord> = ids
            .iter()
            .enumerate()
            .map(|(offset, id)| {
                crate::test_support::record(
                    INPUT,
                    0,
                    offset as i64,
                    &crate::test_support::envelope(id, "acct", 1),
                )
            })
            .chain(std::iter::once(crate::test_support::record(
                INPUT,
                0,
                99,
                b"not an envelope",
            )))
            .collect();
        let rows: BTreeSet<String> = rows.iter().map(|id| (*id).to_owned()).collect();
        audit_outbox(&mut report, &rows, &input, DEFAULT_EXAMPLE_LIMIT);
        report
    }

    #[test]
    fn the_outbox_passes_when_each_committed_row_has_one_event() {
        let report = outbox_audit(&["p-1", "p-2"], &["p-1", "p-2"]);
        assert!(report.passed, "{:?}", report.checks);
        assert_eq!(report.figures.outbox_domain_rows, Some(2));
        assert_eq!(report.figures.outbox_events, Some(2));
        for kind in Violation::OUTBOX {
            assert_eq!(report.violation_count(kind), 0, "{kind}");
        }
    }

    #[test]
    fn the_outbox_catches_a_lost_a_doubled_and_an_orphan_event() {
        let report = outbox_audit(&["p-1", "p-2", "p-3"], &["p-1", "p-1", "p-1", "p-2", "p-9"]);
        assert!(!report.passed);
        assert_eq!(report.violation_count(Violation::DomainRowWithoutEvent), 1);
        assert_eq!(report.violation_count(Violation::EventPublishedTwice), 2);
        assert_eq!(report.violation_count(Violation::EventWithoutDomainRow), 1);
        let line = report
            .checks
            .iter()
            .find(|check| check.name.starts_with("committed domain rows"))
            .expect("the outbox's check line");
        assert_eq!((line.expected, line.actual), (3, 1));
    }
}
