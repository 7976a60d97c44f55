//! payments-api and outbox-relay, when the payments come through the outbox: started, and the
//! relay taken down and brought back for its outage.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use eos_runtime::kafka_settings::ChildKafkaProperties;
use eos_testkit::loopback_ports::free_loopback_addr;

use crate::chain::service::Service;
use crate::commands::demo::args::DemoArgs;
use crate::commands::demo::command_line::strings;
use crate::commands::demo::database::outbox_backlog;
use crate::commands::demo::registry_format::RegistryFormat;
use crate::commands::demo::relay_outage;

/// payments-api and outbox-relay, when the payments come through the outbox.
pub(super) struct OutboxServices {
    pub(super) api: Service,
    pub(super) api_addr: SocketAddr,
    pub(super) relay: Service,
    pub(super) relay_name: String,
    /// The relay's `--batch-size`, given or its own default.
    pub(super) relay_batch_size: i64,
    /// What a relay process is started from again after an outage.
    relay_start: RelayStart,
    pub(super) database_url: String,
}

/// outbox-relay's command line, environment and paths.
struct RelayStart {
    bin_dir: PathBuf,
    run_dir: PathBuf,
    args: Vec<String>,
    ops: SocketAddr,
    database_url: String,
    kafka: Arc<ChildKafkaProperties>,
}

impl RelayStart {
    /// A relay not started yet; its log is the relay's log, appended to.
    pub(super) fn service(&self) -> Service {
        Service::new(
            "outbox-relay",
            &self.bin_dir,
            &self.run_dir,
            self.args.clone(),
            self.ops,
        )
        .with_env("DATABASE_URL", &self.database_url)
        .with_kafka_properties(&self.kafka)
    }
}

impl OutboxServices {
    pub(super) fn new(
        args: &DemoArgs,
        (bin_dir, run_dir): (&Path, &Path),
        (bootstrap_servers, kafka): (&str, &Arc<ChildKafkaProperties>),
        database_url: &str,
        topic: &str,
        relay_name: String,
        registry_format: Option<&RegistryFormat>,
    ) -> anyhow::Result<Self> {
        let api_addr = free_loopback_addr()?;
        let ops = free_loopback_addr()?;
        let api = Service::new(
            "payments-api",
            bin_dir,
            run_dir,
            strings(&[
                "--addr",
                &api_addr.to_string(),
                "--topic",
                topic,
                "--metrics-addr",
                &ops.to_string(),
            ]),
            ops,
        )
        .with_env("DATABASE_URL", database_url);
        let ops = free_loopback_addr()?;
        let mut relay_args = strings(&[
            "--bootstrap-servers",
            bootstrap_servers,
            "--relay-name",
            &relay_name,
            "--guarantee",
            args.guarantee.as_str(),
            "--metrics-addr",
            &ops.to_string(),
        ]);
        if let Some(size) = args.relay_batch_size {
            relay_args.extend(["--batch-size".to_owned(), size.to_string()]);
        }
        if let Some(registry_format) = registry_format {
            relay_args.extend(registry_format.relay_args());
        }
        let relay_start = RelayStart {
            bin_dir: bin_dir.to_path_buf(),
            run_dir: run_dir.to_path_buf(),
            args: relay_args,
            ops,
            database_url: database_url.to_owned(),
            kafka: Arc::clone(kafka),
        };
        Ok(Self {
            api,
            api_addr,
            relay: relay_start.service(),
            relay_name,
            relay_batch_size: relay_outage::relay_batch_size(args.relay_batch_size)?,
            relay_start,
            database_url: database_url.to_owned(),
        })
    }

    /// SIGKILLs the relay and leaves it down until `relay_back`. Dropping the supervisor's
    /// handle is the SIGKILL (eos-testkit's `ChildProcess` kills and reaps on drop); the handle
    /// put in its place is not started yet, and carries the count of kills and the peak memory
    /// of the earlier processes (the killed one's own peak is not read).
    pub(super) fn relay_down(&mut self) -> anyhow::Result<()> {
        // A relay that exited by itself is a failure of the run, not an outage.
        self.relay.check_running()?;
        let down = std::mem::replace(&mut self.relay, self.relay_start.service());
        self.relay.restarts = down.restarts + 1;
        self.relay.peak_rss_kib = down.peak_rss_kib;
        drop(down);
        Ok(())
    }

    /// Starts the relay after `relay_down`; the outbox rows waiting for it then.
    pub(super) async fn relay_back(&mut self) -> anyhow::Result<i64> {
        let backlog = outbox_backlog(&self.database_url, &self.relay_name).await?;
        self.relay.start()?;
        Ok(backlog)
    }

    /// Waits until the relay has published every outbox row.
    pub(super) async fn wait_relayed(&mut self, timeout: Duration) -> anyhow::Result<bool> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            self.relay.check_running()?;
            if outbox_backlog(&self.database_url, &self.relay_name).await? == 0 {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
