//! The relay outage: outbox-relay SIGKILLed mid-run and kept down while the clients go on
//! paying, so that a backlog of several of its batches waits for it when it comes back, then
//! SIGKILLed once more in the middle of working that backlog off.
//!
//! A backlog of more than two batches is what a deploy, a Kafka outage or a burst leaves, and a
//! relay that can publish its usual trickle can still fail to drain one; the kill mid catch-up
//! lands where the relay has published part of the backlog and recorded its position, so the
//! restart must resume from that position rather than from where the outage left it.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::CommandFactory as _;
use serde::Serialize;

use crate::chain::service::Service;
use crate::commands::demo::scrape::metric_sum;

/// How often the relay's published count is read while aiming the kill mid catch-up: well
/// under the time one batch takes, so the kill lands between batches rather than after the
/// last one.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// When the outage starts and how long it lasts, from the workload's start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct OutagePlan {
    pub(super) start: Duration,
    pub(super) down_for: Duration,
}

impl OutagePlan {
    /// `None` for a zero outage. The outage sits in the middle of the workload, with payments
    /// before it (the relay is at work when it is killed) and after it (the backlog keeps
    /// growing while it catches up); one longer than the workload starts early and outlasts it.
    pub(super) fn new(down_for: Duration, workload: Duration) -> Option<Self> {
        if down_for.is_zero() {
            return None;
        }
        let start = match workload.checked_sub(down_for) {
            Some(spare) if !spare.is_zero() => spare / 2,
            _ => workload / 10,
        };
        Some(Self { start, down_for })
    }

    pub(super) fn end(&self) -> Duration {
        self.start + self.down_for
    }

    /// Whether the relay is down at `at` (a timed relay kill then waits for the outage's end).
    pub(super) fn covers(&self, at: Duration) -> bool {
        self.start <= at && at < self.end()
    }
}

/// What the outage came to, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct RelayOutage {
    /// How long the relay was down, from its SIGKILL to its restart.
    pub down_seconds: f64,
    /// The relay's `--batch-size`: most rows in one of its Kafka transactions.
    pub batch_size: i64,
    /// Outbox rows committed and not yet published when the relay came back.
    pub backlog_rows: i64,
    /// `backlog_rows / batch_size`.
    pub backlog_batches: f64,
    /// Rows the restarted relay had published when the kill mid catch-up landed.
    pub published_before_kill: i64,
    /// The kill landed with part of the backlog published and part not (otherwise it landed
    /// before the first half of the backlog was out within the time allowed, or after all of it).
    pub killed_mid_catch_up: bool,
}

impl RelayOutage {
    pub(super) fn new(
        down_for: Duration,
        batch_size: i64,
        backlog_rows: i64,
        published_before_kill: i64,
    ) -> Self {
        Self {
            down_seconds: down_for.as_secs_f64(),
            batch_size,
            backlog_rows,
            backlog_batches: backlog_rows as f64 / batch_size.max(1) as f64,
            published_before_kill,
            killed_mid_catch_up: published_before_kill > 0 && published_before_kill < backlog_rows,
        }
    }

    /// One line of the report's faults.
    pub(super) fn fault_line(&self) -> String {
        let rows = |n: i64| eosctl::report::grouped(n);
        let kill = if self.killed_mid_catch_up {
            format!(
                "SIGKILLed again mid catch-up, after {} of them",
                rows(self.published_before_kill)
            )
        } else {
            format!(
                "SIGKILLed again, not mid catch-up: after {} of them",
                rows(self.published_before_kill)
            )
        };
        format!(
            "outbox-relay down {:.1}s (SIGKILLed, restarted after the delay) while the clients \
             paid: {} rows waiting when it came back, {:.1} batches of {}; {kill}",
            self.down_seconds,
            rows(self.backlog_rows),
            self.backlog_batches,
            rows(self.batch_size),
        )
    }
}

/// The batch size the relay runs with: `--relay-batch-size`, else what the relay itself would
/// take (its environment variable, which the relay inherits from this process, or its default),
/// read from the relay's own flag definition so that the two cannot drift apart.
pub(super) fn relay_batch_size(flag: Option<i64>) -> anyhow::Result<i64> {
    if let Some(size) = flag {
        return Ok(size);
    }
    let command = outbox_relay::config::Config::command();
    let arg = command
        .get_arguments()
        .find(|arg| arg.get_id() == "batch_size")
        .context("outbox-relay has no --batch-size")?;
    if let Some(value) = arg
        .get_env()
        .and_then(std::env::var_os)
        .and_then(|value| value.into_string().ok())
    {
        return value
            .parse()
            .with_context(|| format!("the relay's batch size from its environment: {value:?}"));
    }
    arg.get_default_values()
        .first()
        .and_then(|value| value.to_str())
        .context("outbox-relay's --batch-size has no default")?
        .parse()
        .context("outbox-relay's default --batch-size")
}

/// SIGKILLs the just restarted `relay` (restarting it at once) once it has published half of
/// `backlog` rows, read from its own `outbox_relay_records_published_total` (which starts at 0
/// in every process): a batch committed, more waiting. After `within` without getting there it
/// kills it anyway. Returns the rows it had published.
pub(super) async fn kill_mid_catch_up(
    relay: &mut Service,
    backlog: i64,
    within: Duration,
) -> anyhow::Result<i64> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()?;
    let url = format!("http://{}/metrics", relay.ops_addr);
    let target = ((backlog + 1) / 2).max(1);
    let deadline = Instant::now() + within;
    let mut published = 0;
    loop {
        relay.check_running()?;
        // Not answering yet (starting) reads as nothing published.
        if let Ok(response) = client.get(&url).send().await
            && let Ok(text) = response.text().await
        {
            published = metric_sum(&text, outbox_relay::metrics::RECORDS_PUBLISHED, &[]);
        }
        if published >= target || Instant::now() >= deadline {
            relay.kill_and_restart().await?;
            return Ok(published);
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outage_sits_in_the_middle_of_the_workload() {
        let secs = Duration::from_secs_f64;
        let plan = OutagePlan::new(secs(6.0), secs(10.6)).expect("an outage");
        assert_eq!(plan.start, secs(2.3));
        assert!((plan.end().as_secs_f64() - 8.3).abs() < 1e-9);
        assert!(!plan.covers(secs(2.2)) && plan.covers(secs(2.3)) && plan.covers(secs(8.2)));
        assert!(!plan.covers(plan.end()));
        // Longer than the workload: starts early, outlasts it.
        let plan = OutagePlan::new(secs(6.0), secs(5.0)).expect("an outage");
        assert_eq!(plan.start, secs(0.5));
        assert_eq!(OutagePlan::new(Duration::ZERO, secs(10.0)), None);
    }

    #[test]
    fn the_relay_batch_size_is_the_flag_or_the_relay_s_own_default() -> anyhow::Result<()> {
        assert_eq!(relay_batch_size(Some(100))?, 100);
        // The relay's own default, unless the environment overrides it for the relay too.
        if std::env::var_os("OUTBOX_BATCH_SIZE").is_none() {
            assert_eq!(relay_batch_size(None)?, 5000);
        }
        Ok(())
    }

    #[test]
    fn a_kill_is_mid_catch_up_only_with_part_of_the_backlog_out() {
        let outage = |published| RelayOutage::new(Duration::from_secs(6), 5000, 12_000, published);
        assert!(outage(10_000).killed_mid_catch_up);
        assert!(!outage(0).killed_mid_catch_up);
        assert!(!outage(12_000).killed_mid_catch_up);
        assert_eq!(outage(5000).backlog_batches, 2.4);
        assert!(
            outage(10_000)
                .fault_line()
                .contains("12,000 rows waiting when it came back, 2.4 batches of 5,000"),
            "{}",
            outage(10_000).fault_line()
        );
    }
}
