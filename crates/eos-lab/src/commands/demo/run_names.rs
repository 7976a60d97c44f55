//! What names one demo run, so that nothing a run makes is met by another run.

use std::net::SocketAddr;

use eos_testkit::loopback_ports::free_loopback_addr;

use crate::commands::demo::args::DemoArgs;

/// What names the run: one id (the start time and eos-lab's pid) gives the topics, the groups,
/// the database and the provider's name, so nothing a run makes is met by another; and the two
/// addresses the run's provider-sim and dedup-service listen on.
pub(super) struct RunNames {
    pub(super) run_id: String,
    pub(super) seed: u64,
    pub(super) input: String,
    pub(super) output: String,
    pub(super) processor_group: String,
    pub(super) sink_group: String,
    /// dedup-service's intents outlive a run: a fresh name keeps this run's operation ids new.
    pub(super) provider_name: String,
    pub(super) database: String,
    pub(super) provider_addr: SocketAddr,
    pub(super) dedup_addr: SocketAddr,
}

impl RunNames {
    pub(super) fn new(args: &DemoArgs) -> anyhow::Result<Self> {
        let started = time::OffsetDateTime::now_utc().unix_timestamp();
        let run_id = format!("{started}-{}", std::process::id());
        Ok(Self {
            seed: args
                .seed
                .unwrap_or_else(|| u64::try_from(started).unwrap_or_default()),
            input: format!("demo-payments-{run_id}"),
            output: format!("demo-ledger-{run_id}"),
            processor_group: format!("demo-processor-{run_id}"),
            sink_group: format!("demo-sink-{run_id}"),
            provider_name: format!("pay_{}", run_id.replace('-', "_")),
            database: format!("eos_demo_{}", run_id.replace('-', "_")),
            provider_addr: free_loopback_addr()?,
            dedup_addr: free_loopback_addr()?,
            run_id,
        })
    }

    pub(super) fn provider_url(&self) -> String {
        format!("http://{}", self.provider_addr)
    }
}
