//! The replay proof as a library user runs it (docs/TRANSFORMS.md "Prove it: the replay audit";
//! issue 51): the run read by `eos_transform::replay::read_committed_run`, the replay under the
//! configuration the run had, and the comparison of each dead letter's reason and transform
//! code. Through the example's real binary (`examples/card-authorisations`), told by
//! `--entity key` to key its state by the record key, which is the card's account, where the
//! transform's own contract reads the card (`/card`).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use card_authorisations::{CardAuthorisations, FLAGGED_OUTPUT};
use eos_core::{DeadLetterReason, Event};
use eos_processor::{DEFAULT_OUTPUT, Output, Refusal, SourcePosition, Transform};
use eos_testkit::argv;
use eos_transform::replay::{self, ReplayDeadLetter};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    bootstrap_servers, create_topic, produce_records, unique_name, wait_until_consumed,
};
use serde_json::json;

use crate::card_authorisations::{example_args, example_transform, replay_run};

/// Accounts, each with four cards that spend 30.00 twice a day: 60.00 a card, within the daily
/// limit of 100.00, and 240.00 an account, past it.
const ACCOUNTS: usize = 3;
const CARDS_PER_ACCOUNT: usize = 4;
const LIMIT: &str = "100.00";

/// The example's logic with another code for the same refusal: `over_limit` where the example
/// says `over_daily_limit`. What a run whose committed refusals carry the wrong code looks like
/// to the replay.
struct RenamedRefusal(CardAuthorisations);

impl Transform for RenamedRefusal {
    type State = <CardAuthorisations as Transform>::State;
    const STATE_VERSION: u32 = CardAuthorisations::STATE_VERSION;

    fn contract(&self) -> eos_core::EventContract {
        self.0.contract()
    }

    fn outputs(&self) -> Vec<String> {
        self.0.outputs()
    }

    fn apply(
        &self,
        state: &mut Self::State,
        event: Event,
        source: &SourcePosition,
    ) -> Result<Vec<Output>, Refusal> {
        self.0.apply(state, event, source).map_err(|refusal| {
            if refusal.code.as_deref() == Some("over_daily_limit") {
                Refusal::new("over_limit", refusal.detail)
            } else {
                refusal
            }
        })
    }
}

/// One run, three replays: under the run's configuration (its command line parsed again) the
/// replay is exact, the refusals per account included; under the transform's own contract (per
/// card) it is not — the flags overrode it; and with the right reason but another transform code
/// every refusal is a difference, the outputs all matching.
#[test]
fn the_replay_takes_the_run_s_contract_and_compares_transform_codes() -> anyhow::Result<()> {
    let started = Instant::now();
    let bootstrap = bootstrap_servers();
    let input = unique_name("replay-auths");
    let approved = unique_name("replay-approved");
    let flagged = unique_name("replay-flagged");
    let group = unique_name("replay-cards");
    // One partition: the accounts' keys could all hash to one of two, and the group then never
    // commits an offset on the other.
    tokio::runtime::Runtime::new()?.block_on(create_topic(&input, 1))?;
    let day = time::OffsetDateTime::now_utc().replace_time(time::Time::MIDNIGHT);
    let mut records = Vec::new();
    for round in 0..2 {
        for card in 0..ACCOUNTS * CARDS_PER_ACCOUNT {
            let at = day + time::Duration::minutes((round * 100 + card) as i64);
            let value = json!({
                "auth_id": format!("a-{round}-{card}"),
                "card": format!("c-{card}"),
                "amount": "30.00",
                "currency": "EUR",
                "merchant": "m-1",
                "at": at.format(&time::format_description::well_known::Rfc3339)?,
            });
            let account = format!("acct-{}", card % ACCOUNTS);
            records.push((Some(account), value.to_string().into_bytes()));
        }
    }
    // A re-delivery: a duplicate in the run and in the replay.
    records.push(records[0].clone());
    produce_records(&input, &records)?;
    let args = argv!(card_authorisations::Args {
        processor.kafka.bootstrap_servers: &bootstrap,
        processor.input_topic: &input,
        processor.output_topic: &approved,
        processor.outputs: format!("{FLAGGED_OUTPUT}={flagged}"),
        processor.entity: "key",
        processor.group_id: &group,
        processor.instance.instance_id: "replay-0",
        processor.metrics_addr: "127.0.0.1:0",
        daily_limit: LIMIT,
    });
    let mut processor = ServiceProcess::spawn("card-authorisations", &args, &[])?;
    wait_until_consumed(&bootstrap, &group, &input, Duration::from_secs(60))
        .with_context(|| processor.log_tail(40))?;
    processor.stop_gracefully()?;

    // The run's configuration: exact, with a refusal for every account.
    let (expected, run) = replay_run(&args, example_transform)?;
    let report = run.compare(&expected);
    assert!(report.exact(), "{report}");
    assert_eq!(run.inputs.len(), records.len());
    assert_eq!(expected.duplicates, 1);
    let refusals: Vec<&ReplayDeadLetter> = run.dead_letters.values().collect();
    assert!(refusals.len() >= ACCOUNTS, "{refusals:?}");
    let over_limit =
        ReplayDeadLetter::coded(DeadLetterReason::TransformRefused, "over_daily_limit");
    assert!(
        refusals.iter().all(|letter| **letter == over_limit),
        "{refusals:?}"
    );

    // The transform's own contract, which the run's --entity overrode: each card alone is within
    // its limit, so the replay approves what the run refused.
    let transform = example_transform(&example_args(&args)?);
    let outputs = [DEFAULT_OUTPUT, FLAGGED_OUTPUT].map(str::to_owned).into();
    let own = replay::expected(&transform, &transform.contract(), &outputs, &run.inputs)?;
    let report = run.compare(&own);
    assert!(!report.exact());
    assert!(own.dead_letters.is_empty(), "{report}");
    assert_eq!(
        report.dead_letter_differences.len(),
        refusals.len(),
        "{report}"
    );

    // The right reason with another code: every refusal differs, and says how.
    let (renamed, _) = replay_run(&args, |args| RenamedRefusal(example_transform(args)))?;
    let report = run.compare(&renamed);
    eprintln!("a wrong transform code:\n{report}");
    assert!(!report.exact());
    assert_eq!(
        (report.missing.len(), report.unexpected.len()),
        (0, 0),
        "{report}"
    );
    assert_eq!(report.matched as usize, run.outputs.len());
    assert_eq!(report.dead_letter_differences.len(), refusals.len());
    for difference in &report.dead_letter_differences {
        assert_eq!(difference.committed.as_ref(), Some(&over_limit));
        assert_eq!(
            difference.replayed,
            Some(ReplayDeadLetter::coded(
                DeadLetterReason::TransformRefused,
                "over_limit"
            ))
        );
    }
    eprintln!("replay proof: {:?} in all", started.elapsed());
    Ok(())
}
