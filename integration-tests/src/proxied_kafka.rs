//! A private single-node Kafka broker whose clients reach it through [`FaultProxy`]s, one per
//! named link, for the network-fault tests. A Kafka client connects to the address the broker
//! advertises, not to its bootstrap address, so a proxy in front of an ordinary listener would
//! carry only the first metadata request: the broker (`deploy/local/stack
//! kafka-proxied-broker`) gets one listener per link, advertised at that link's proxy. Its
//! PLAINTEXT listener ([`ProxiedKafka::bootstrap`]) is never cut: the broker's own traffic
//! (transaction markers), the load generator and the test's checks use it. Killed and its
//! directory removed on drop; the stack's own broker is not touched.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use eos_testkit::{ChildProcess, LogMode};
use rdkafka::consumer::{BaseConsumer, Consumer as _};

use crate::fault_proxy::FaultProxy;
use crate::kafka_cluster::repo_root;
use crate::service_process::log_dir;
use crate::{client_config_for, unique_name};
use eos_testkit::loopback_ports::free_loopback_ports;

const START_TIMEOUT: Duration = Duration::from_secs(120);
const METADATA_TIMEOUT: Duration = Duration::from_secs(3);

/// A running broker and its links (see the module docs).
#[derive(Debug)]
pub struct ProxiedKafka {
    dir: PathBuf,
    port: u16,
    process: ChildProcess,
    links: Vec<(String, FaultProxy)>,
}

impl ProxiedKafka {
    /// Starts a proxy per name in `links` and the broker behind them, and waits until the
    /// broker answers directly and through every link. Needs the multi-threaded runtime.
    pub async fn start(name: &str, links: &[&str]) -> anyhow::Result<Self> {
        let ports = free_loopback_ports(2 + links.len())?;
        let (port, controller_port) = (ports[0], ports[1]);
        let mut proxies = Vec::new();
        for (link, listen) in links.iter().zip(&ports[2..]) {
            let proxy = FaultProxy::start(&format!("127.0.0.1:{listen}")).await?;
            proxies.push(((*link).to_owned(), *listen, proxy));
        }
        let dir = std::env::temp_dir().join(unique_name(&format!("eos-it-proxied-{name}")));
        let mut command = Command::new(repo_root().join("deploy/local/stack"));
        command.arg("kafka-proxied-broker");
        command.args(["--dir", &dir.display().to_string()]);
        command.args(["--port", &port.to_string()]);
        command.args(["--controller-port", &controller_port.to_string()]);
        for (_, listen, proxy) in &proxies {
            command.args([
                "--proxied-port",
                &format!("{listen}:{}", proxy.addr().port()),
            ]);
        }
        std::fs::create_dir_all(log_dir())?;
        let log = log_dir().join(format!("proxied-broker-{name}.log"));
        let process = ChildProcess::spawn(
            format!("kafka-proxied-broker {name}"),
            command,
            &log,
            LogMode::Append,
        )?;
        let mut broker = Self {
            dir,
            port,
            process,
            links: proxies
                .into_iter()
                .map(|(link, _, proxy)| (link, proxy))
                .collect(),
        };
        tokio::task::block_in_place(|| broker.wait_ready())?;
        Ok(broker)
    }

    /// The broker's own listener, outside every link.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The bootstrap address of `link`: a client given it talks to the broker only through
    /// that link's proxy.
    pub fn bootstrap_via(&self, link: &str) -> anyhow::Result<String> {
        Ok(self.link(link)?.endpoint())
    }

    /// The proxy of `link`, to inject faults.
    pub fn link(&self, link: &str) -> anyhow::Result<&FaultProxy> {
        self.links
            .iter()
            .find(|(name, _)| name == link)
            .map(|(_, proxy)| proxy)
            .with_context(|| format!("no link {link}"))
    }

    /// The last lines of the broker's log, for failure messages.
    pub fn server_log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(self.dir.join("logs/server.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Waits until a metadata request answers directly and through every link, with the
    /// broker advertised at that link's proxy.
    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut bootstraps = vec![(self.bootstrap(), self.bootstrap())];
        for (_, proxy) in &self.links {
            bootstraps.push((proxy.endpoint(), proxy.endpoint()));
        }
        for (bootstrap, advertised) in bootstraps {
            let client: BaseConsumer = client_config_for(&bootstrap).create()?;
            loop {
                if !self.process.is_running() {
                    bail!(
                        "kafka-proxied-broker exited during start-up\n{}\n{}",
                        self.process.log_tail(20),
                        self.server_log_tail(30)
                    );
                }
                let brokers: Vec<String> = client
                    .fetch_metadata(None, METADATA_TIMEOUT)
                    .map(|metadata| {
                        metadata
                            .brokers()
                            .iter()
                            .map(|b| format!("{}:{}", b.host(), b.port()))
                            .collect()
                    })
                    .unwrap_or_default();
                if brokers.contains(&advertised) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "kafka-proxied-broker does not advertise {advertised} to a client of \
                         {bootstrap} after {START_TIMEOUT:?} (it says {brokers:?})\n{}",
                        self.server_log_tail(30)
                    );
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        Ok(())
    }
}

impl Drop for ProxiedKafka {
    fn drop(&mut self) {
        // A throw-away broker: no clean shutdown needed, its data goes with the directory.
        let _ = self.process.kill_hard();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
