//! The run's processes together: the four every run has and, when the payments come through
//! the outbox, payments-api and outbox-relay; and what is done to all of them at once (their
//! Prometheus targets, their counters, their stop, their peak memory).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;

use crate::chain::service::Service;
use crate::commands::demo::command_line::say;
use crate::commands::demo::database::drop_relay_slot;
use crate::commands::demo::outbox_services::OutboxServices;
use crate::commands::demo::scrape::{Scraped, scrape};

/// Every process of one run, not started until the run drives them.
pub(super) struct RunProcesses {
    pub(super) provider: Service,
    pub(super) dedup: Service,
    pub(super) processor: Service,
    pub(super) sink: Service,
    pub(super) outbox: Option<OutboxServices>,
}

impl RunProcesses {
    /// Each process, in the order they start.
    fn all(&self) -> Vec<&Service> {
        let mut services = vec![&self.provider, &self.dedup, &self.processor, &self.sink];
        if let Some(outbox) = &self.outbox {
            services.extend([&outbox.api, &outbox.relay]);
        }
        services
    }

    /// Writes the /metrics addresses for Prometheus's `file_sd_configs`: written whole to a
    /// temporary file and renamed, since Prometheus re-reads the file whenever it changes.
    pub(super) fn write_prometheus_targets(&self, path: &Path) -> anyhow::Result<()> {
        let groups: Vec<serde_json::Value> = self
            .all()
            .iter()
            .map(|service| {
                serde_json::json!({
                    "targets": [service.ops_addr.to_string()],
                    "labels": { "job": service.name },
                })
            })
            .collect();
        let partial = path.with_extension("partial");
        std::fs::write(&partial, serde_json::to_vec_pretty(&groups)?)
            .with_context(|| format!("writing {}", partial.display()))?;
        std::fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }

    /// The counters, read before SIGTERM ends the processes that hold them.
    pub(super) async fn scrape(&self) -> Scraped {
        Scraped {
            processor: scrape(self.processor.ops_addr).await,
            sink: scrape(self.sink.ops_addr).await,
            dedup: scrape(self.dedup.ops_addr).await,
            provider: scrape(self.provider.ops_addr).await,
        }
    }

    /// Stops every process but provider-sim (the audit still asks it), whatever happened, and
    /// drops the relay's replication slot, which would hold the server's WAL after the run.
    /// Whether each exited 0 on SIGTERM; with `tell`, one that did not is named.
    pub(super) async fn stop_all_but_the_provider(
        &mut self,
        database_url: &str,
        tell: bool,
    ) -> bool {
        let mut stopped_cleanly = true;
        let mut services = vec![&mut self.sink, &mut self.processor, &mut self.dedup];
        if let Some(outbox) = self.outbox.as_mut() {
            services.extend([&mut outbox.relay, &mut outbox.api]);
        }
        for service in services {
            let clean = service.stop().await.unwrap_or(false);
            if !clean && tell {
                say(format!(
                    "   {} did not exit 0 on SIGTERM; see {}",
                    service.name,
                    service.log.display()
                ));
            }
            stopped_cleanly &= clean;
        }
        if let Some(outbox) = &self.outbox {
            let slot = outbox_relay::config::slot_name_from(&outbox.relay_name);
            if let Err(error) = drop_relay_slot(database_url, &slot).await {
                say(format!(
                    "   cannot drop the relay's replication slot {slot}: {error:#}"
                ));
            }
        }
        stopped_cleanly
    }

    /// Each process's peak resident memory, of those that reported one.
    pub(super) fn peak_rss_kib(&self) -> BTreeMap<String, u64> {
        self.all()
            .into_iter()
            .filter(|service| service.peak_rss_kib > 0)
            .map(|service| (service.name.to_owned(), service.peak_rss_kib))
            .collect()
    }

    /// Whether any process was SIGKILLed and restarted.
    pub(super) fn any_killed(&self) -> bool {
        self.processor.restarts
            + self.sink.restarts
            + self
                .outbox
                .as_ref()
                .map_or(0, |outbox| outbox.relay.restarts)
            > 0
    }
}
