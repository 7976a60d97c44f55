//! One definition of the dedup transition: every statement of dedup-service's store
//! (`intent_store.rs`), run on a real PostgreSQL, decides every case exactly as the Rust rules
//! of `dedup_client::state_machine` do. Those rules are what the model (`eos-model`) checks, so
//! this test is what makes the model's verdict hold for the SQL that runs.
//!
//! The cases: every stored row (none, RESERVED with a live or a run-out lease, SUCCEEDED, FAILED
//! retryable or final, UNKNOWN), inside or past the retained window, against every request
//! (Begin with the same or another fingerprint, by its holder's request or another; Complete,
//! Fail and MarkUnknown, single and batched, with the current or a stale token and the right or
//! a wrong secret; Resolve either way with no, the current or a stale expected token; the lease
//! sweep; the purge). For each, the row after the statement and the answer must be what the
//! Rust rules give.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use dedup_client::state_machine::{
    BeginAsk, BeginOutcome, FencingSecret, Intent, IntentState, Transition, begin_outcome,
    begin_transition, expired_outcome, holder_report_applies, in_retained_window, lease_ran_out,
    purgeable, resolution_applies,
};
use dedup_service::intent_store::{HolderReport, IntentStore, migrator};
use dedup_service::validation::{BeginItem, CompleteItem, Resolution};
use integration_tests::TestDatabase;
use time::OffsetDateTime;

const RETENTION: Duration = Duration::from_secs(3600);
const STORED_FINGERPRINT: [u8; 32] = [1; 32];
const OTHER_FINGERPRINT: [u8; 32] = [2; 32];
const STORED_SECRET: [u8; FencingSecret::LEN] = [7; FencingSecret::LEN];
const WRONG_SECRET: [u8; FencingSecret::LEN] = [8; FencingSecret::LEN];
const STORED_TOKEN: i64 = 3;
const HOLDER: (&str, &str) = ("holder-a", "request-a");
const OTHER: (&str, &str) = ("holder-b", "request-b");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stored {
    Nothing,
    ReservedLive,
    ReservedRunOut,
    Succeeded,
    FailedRetryable,
    FailedFinal,
    Unknown,
}

const STORED: [Stored; 7] = [
    Stored::Nothing,
    Stored::ReservedLive,
    Stored::ReservedRunOut,
    Stored::Succeeded,
    Stored::FailedRetryable,
    Stored::FailedFinal,
    Stored::Unknown,
];

/// How long ago the operation occurred (and the row last changed): inside the retained window,
/// or past it.
const AGES: [Duration; 2] = [Duration::from_secs(60), Duration::from_secs(7200)];

#[derive(Debug, Clone, Copy)]
enum Request {
    Begin {
        fingerprint: [u8; 32],
        asker: (&'static str, &'static str),
    },
    Report {
        transition: Transition,
        retryable: bool,
        token: i64,
        secret: [u8; FencingSecret::LEN],
        batched: bool,
    },
    Resolve {
        transition: Transition,
        expected: Option<i64>,
    },
}

impl Request {
    /// The store statement the request runs.
    fn statement(&self) -> &'static str {
        match self {
            Self::Begin { .. } => "begin",
            Self::Report { batched: true, .. } => "complete batch",
            Self::Report { .. } => "report",
            Self::Resolve { .. } => "resolve",
        }
    }
}

fn requests() -> Vec<Request> {
    let mut requests = Vec::new();
    for fingerprint in [STORED_FINGERPRINT, OTHER_FINGERPRINT] {
        for asker in [HOLDER, OTHER] {
            requests.push(Request::Begin { fingerprint, asker });
        }
    }
    let reports = [
        (Transition::Complete, false, false),
        (Transition::Complete, false, true),
        (Transition::Fail, false, false),
        (Transition::Fail, true, false),
        (Transition::MarkUnknown, false, false),
    ];
    for (transition, retryable, batched) in reports {
        for token in [STORED_TOKEN, STORED_TOKEN - 1] {
            for secret in [STORED_SECRET, WRONG_SECRET] {
                requests.push(Request::Report {
                    transition,
                    retryable,
                    token,
                    secret,
                    batched,
                });
            }
        }
    }
    for transition in [Transition::ResolveSucceeded, Transition::ResolveFailed] {
        for expected in [None, Some(STORED_TOKEN), Some(STORED_TOKEN - 1)] {
            requests.push(Request::Resolve {
                transition,
                expected,
            });
        }
    }
    requests
}

/// What the test compares of a row: the fields a transition decides.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RowFacts {
    state: IntentState,
    fencing_token: i64,
    holder: String,
    request_id: String,
    retryable: bool,
}

fn facts(intent: &Intent) -> RowFacts {
    RowFacts {
        state: intent.state,
        fencing_token: intent.fencing_token,
        holder: intent.holder.clone(),
        request_id: intent.request_id.clone(),
        retryable: intent.retryable,
    }
}

/// A Begin's answer as far as the statement decides it.
fn answer_facts(outcome: &BeginOutcome) -> String {
    match outcome {
        BeginOutcome::Acquired { fencing_token, .. } => {
            format!("acquired token {}", fencing_token.counter)
        }
        BeginOutcome::InProgress { holder, .. } => format!("in progress, held by {holder}"),
        BeginOutcome::Failed { retryable, .. } => format!("failed, retryable {retryable}"),
        other => other.label().to_owned(),
    }
}

/// Writes the stored row of a case, as a sequence of transitions would have left it.
async fn store_row(
    db: &TestDatabase,
    operation_id: &str,
    stored: Stored,
    age: Duration,
) -> anyhow::Result<()> {
    let (state, lease_from_now) = match stored {
        Stored::Nothing => return Ok(()),
        Stored::ReservedLive => (IntentState::Reserved, 3600),
        Stored::ReservedRunOut => (IntentState::Reserved, -1),
        Stored::Succeeded => (IntentState::Succeeded, -30),
        Stored::FailedRetryable | Stored::FailedFinal => (IntentState::Failed, -30),
        Stored::Unknown => (IntentState::Unknown, -30),
    };
    sqlx::query(
        "INSERT INTO dedup_intents
             (operation_id, fingerprint, state, fencing_token, holder, request_id,
              lease_expires_at, acquired_at, occurred_at, created_at, updated_at, result,
              failure_reason, retryable, detail, fencing_secret)
         VALUES ($1, $2, $3, $4, $5, $6,
                 now() + $7 * interval '1 second', now() - $8 * interval '1 second',
                 now() - $8 * interval '1 second', now() - $8 * interval '1 second',
                 now() - $8 * interval '1 second', $9, $10, $11, 'stored by the test', $12)",
    )
    .bind(operation_id)
    .bind(STORED_FINGERPRINT.as_slice())
    .bind(state.as_db_str())
    .bind(STORED_TOKEN)
    .bind(HOLDER.0)
    .bind(HOLDER.1)
    .bind(f64::from(lease_from_now))
    .bind(age.as_secs_f64())
    .bind((state == IntentState::Succeeded).then_some(b"charged".as_slice()))
    .bind((state == IntentState::Failed).then_some("declined"))
    .bind(stored == Stored::FailedRetryable)
    .bind(STORED_SECRET.as_slice())
    .execute(&db.pool)
    .await
    .with_context(|| format!("storing {stored:?} as {operation_id}"))?;
    Ok(())
}

async fn db_now(db: &TestDatabase) -> anyhow::Result<OffsetDateTime> {
    Ok(sqlx::query_scalar("SELECT now()")
        .fetch_one(&db.pool)
        .await?)
}

/// The row a Begin inside the retained window leaves, by the Rust rules.
fn begin_by_rules(
    before: Option<&Intent>,
    template: &Intent,
    fingerprint: &[u8],
    asker: (&str, &str),
    now: OffsetDateTime,
) -> Intent {
    let acquired = |token: i64| Intent {
        state: Transition::Acquire.to_state(),
        fencing_token: token,
        holder: asker.0.to_owned(),
        request_id: asker.1.to_owned(),
        fingerprint: fingerprint.to_vec(),
        retryable: false,
        ..template.clone()
    };
    let Some(before) = before else {
        return acquired(1);
    };
    match begin_transition(before, fingerprint, now) {
        Some(Transition::Reacquire) => Intent {
            fingerprint: before.fingerprint.clone(),
            ..acquired(before.fencing_token + 1)
        },
        Some(transition) => Intent {
            state: transition.to_state(),
            ..before.clone()
        },
        None => before.clone(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_store_statement_decides_every_case_as_the_state_machine_does() -> anyhow::Result<()>
{
    let db = TestDatabase::create().await?;
    migrator().run(&db.pool).await?;
    let store = IntentStore::new(db.pool.clone(), RETENTION);
    let mut cases = 0;
    let mut mismatches = Vec::new();
    // (statement, whether the rules change the row) pairs seen.
    let mut exercised = BTreeSet::new();

    for (n, (stored, age, request)) in STORED
        .iter()
        .flat_map(|stored| AGES.iter().map(move |age| (*stored, *age)))
        .flat_map(|(stored, age)| requests().into_iter().map(move |r| (stored, age, r)))
        .enumerate()
    {
        let operation_id = format!("case-{n}");
        store_row(&db, &operation_id, stored, age).await?;
        let before = store.get(&operation_id).await?;
        let now = db_now(&db).await?;
        let (expected_row, expected_answer, actual_answer) = match request {
            Request::Begin { fingerprint, asker } => {
                let occurred_at = now - age;
                let retained_since = now - RETENTION;
                let ask = BeginAsk {
                    fingerprint: &fingerprint,
                    owner: asker.0,
                    request_id: asker.1,
                };
                let (row, answer) = if in_retained_window(occurred_at, retained_since) {
                    let template = before.clone().unwrap_or_else(|| Intent {
                        operation_id: operation_id.clone(),
                        state: IntentState::Reserved,
                        fingerprint: fingerprint.to_vec(),
                        fencing_token: 1,
                        fencing_secret: FencingSecret::random(),
                        holder: String::new(),
                        request_id: String::new(),
                        lease_expires_at: now,
                        occurred_at,
                        created_at: now,
                        updated_at: now,
                        acquired_at: now,
                        result: None,
                        failure_reason: None,
                        retryable: false,
                        detail: String::new(),
                        trace_context: None,
                    });
                    let after =
                        begin_by_rules(before.as_ref(), &template, &fingerprint, asker, now);
                    let answer = begin_outcome(&after, &ask);
                    (Some(facts(&after)), answer)
                } else {
                    (
                        before.as_ref().map(facts),
                        expired_outcome(before.as_ref(), &ask, retained_since, now),
                    )
                };
                let answers = store
                    .begin_batch(&[BeginItem {
                        operation_id: operation_id.clone(),
                        fingerprint: fingerprint.to_vec(),
                        owner: asker.0.to_owned(),
                        request_id: asker.1.to_owned(),
                        lease_ttl: Duration::from_secs(30),
                        occurred_at,
                        trace_context: None,
                    }])
                    .await?;
                let actual = answers.first().context("one answer per item")?;
                (
                    row,
                    Some(answer_facts(&answer)),
                    Some(answer_facts(&actual.outcome)),
                )
            }
            Request::Report {
                transition,
                retryable,
                token,
                secret,
                batched,
            } => {
                let applies = before
                    .as_ref()
                    .is_some_and(|row| holder_report_applies(row, transition, token, &secret));
                let row = before.as_ref().map(|row| RowFacts {
                    state: if applies {
                        transition.to_state()
                    } else {
                        row.state
                    },
                    retryable: if applies { retryable } else { row.retryable },
                    ..facts(row)
                });
                let changed = if batched {
                    let mut answers = store
                        .complete_batch(&[CompleteItem {
                            operation_id: operation_id.clone(),
                            fencing_token: token,
                            fencing_secret: secret.to_vec(),
                            result: b"charged".to_vec(),
                        }])
                        .await?;
                    answers.pop().context("one answer per item")?.is_ok()
                } else {
                    let report = match transition {
                        Transition::Complete => HolderReport::Complete {
                            result: b"charged".to_vec(),
                        },
                        Transition::Fail => HolderReport::Fail {
                            reason: "declined".into(),
                            retryable,
                        },
                        _ => HolderReport::MarkUnknown {
                            detail: "timed out".into(),
                        },
                    };
                    store
                        .report(&operation_id, token, &secret, report)
                        .await
                        .is_ok()
                };
                // A refused report may still be answered OK (a holder repeating what is
                // recorded); one the rules apply must be.
                let answered_ok = if applies { Some("ok".to_owned()) } else { None };
                (row, answered_ok.clone(), answered_ok.and(Some(ok(changed))))
            }
            Request::Resolve {
                transition,
                expected,
            } => {
                let applies = before
                    .as_ref()
                    .is_some_and(|row| resolution_applies(row, transition, expected));
                let row = before.as_ref().map(|row| RowFacts {
                    state: if applies {
                        transition.to_state()
                    } else {
                        row.state
                    },
                    retryable: if applies { false } else { row.retryable },
                    ..facts(row)
                });
                let answered = store
                    .resolve(&Resolution {
                        operation_id: operation_id.clone(),
                        outcome: transition.to_state(),
                        evidence: "the provider's record".into(),
                        result: b"charged".to_vec(),
                        retryable: false,
                        expected_fencing_token: expected,
                    })
                    .await
                    .is_ok();
                let answered_ok = if applies { Some("ok".to_owned()) } else { None };
                (
                    row,
                    answered_ok.clone(),
                    answered_ok.and(Some(ok(answered))),
                )
            }
        };
        let actual_row = store.get(&operation_id).await?.as_ref().map(facts);
        cases += 1;
        exercised.insert((
            request.statement(),
            expected_row != before.as_ref().map(facts),
        ));
        if actual_row != expected_row || actual_answer != expected_answer {
            mismatches.push(format!(
                "{stored:?}, {}s old, {request:?}:\n  rules: {expected_row:?} / {expected_answer:?}\n  SQL:   {actual_row:?} / {actual_answer:?}",
                age.as_secs()
            ));
        }
    }

    // The sweep and the purge act on every row at once: one pass over a row per stored case.
    for (pass, statement) in ["lease sweep", "purge"].into_iter().enumerate() {
        sqlx::query("TRUNCATE dedup_intents, dedup_intent_history")
            .execute(&db.pool)
            .await?;
        let mut rows = Vec::new();
        for stored in STORED.into_iter().filter(|s| *s != Stored::Nothing) {
            for age in AGES {
                let operation_id = format!("{statement}-{stored:?}-{}", age.as_secs());
                store_row(&db, &operation_id, stored, age).await?;
                let before = store.get(&operation_id).await?.context("stored row")?;
                rows.push((operation_id, stored, age, before));
            }
        }
        let now = db_now(&db).await?;
        if pass == 0 {
            store.expire_leases(1000).await?;
        } else {
            store.purge(1000).await?;
        }
        for (operation_id, stored, age, before) in rows {
            let expected = if pass == 0 {
                let state = if lease_ran_out(&before, now) {
                    Transition::ExpireLease.to_state()
                } else {
                    before.state
                };
                Some(RowFacts {
                    state,
                    ..facts(&before)
                })
            } else {
                (!purgeable(&before, now - RETENTION)).then(|| facts(&before))
            };
            let actual = store.get(&operation_id).await?.as_ref().map(facts);
            cases += 1;
            exercised.insert((statement, expected != Some(facts(&before))));
            if actual != expected {
                mismatches.push(format!(
                    "{stored:?}, {}s old, {statement}:\n  rules: {expected:?}\n  SQL:   {actual:?}",
                    age.as_secs()
                ));
            }
        }
    }

    eprintln!(
        "dedup transitions: {cases} cases, {} mismatches",
        mismatches.len()
    );
    ensure!(
        mismatches.is_empty(),
        "the store's SQL and the state machine disagree in {} of {cases} cases:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    // Every statement met cases the rules change and cases they leave alone, so a statement
    // that always or never acts fails above.
    let statements = [
        "begin",
        "report",
        "complete batch",
        "resolve",
        "lease sweep",
        "purge",
    ];
    for statement in statements {
        for changes in [true, false] {
            ensure!(
                exercised.contains(&(statement, changes)),
                "no case where the rules {} the row for {statement}",
                if changes { "change" } else { "keep" }
            );
        }
    }
    db.drop_database().await?;
    Ok(())
}

fn ok(answered_ok: bool) -> String {
    if answered_ok { "ok" } else { "refused" }.to_owned()
}
