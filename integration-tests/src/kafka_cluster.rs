//! A private three-node Kafka cluster for the failure tests: each node (broker + KRaft controller)
//! is a child process of `deploy/local/stack kafka-cluster-node`, with replication factor 3 and
//! `min.insync.replicas=2` for every topic, so a test can SIGKILL, stop and restart any one node
//! under load while the cluster stays writable. Each node keeps its data in the cluster's
//! directory, so a restarted node rejoins with what it had, as a broker restarted on its disk.
//! Everything is killed and the directory removed on drop; the stack's own broker is not touched.

use eos_testkit::loopback_ports::free_loopback_ports;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use eos_testkit::{ChildProcess, LogMode};
use rdkafka::consumer::{BaseConsumer, Consumer as _};

use crate::service_process::log_dir;
use crate::{client_config_for, unique_name};

/// Nodes in the cluster: one may be down and two still form the KRaft quorum and the ISR.
pub const NODES: usize = 3;
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// A controlled shutdown moves every leadership away first; on a loaded 2-core machine that
/// takes a while.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
const METADATA_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug)]
struct Node {
    id: i32,
    port: u16,
    controller_port: u16,
    dir: PathBuf,
    process: Option<ChildProcess>,
}

/// A running three-node cluster (see the module docs).
#[derive(Debug)]
pub struct KafkaCluster {
    name: String,
    dir: PathBuf,
    cluster_id: String,
    nodes: Vec<Node>,
}

impl KafkaCluster {
    /// Starts all three nodes and waits until the cluster answers with all three brokers.
    /// Blocking.
    pub fn start(name: &str) -> anyhow::Result<Self> {
        let ports = free_loopback_ports(2 * NODES)?;
        let dir = std::env::temp_dir().join(unique_name(&format!("eos-it-cluster-{name}")));
        let nodes = (0..NODES)
            .map(|index| Node {
                id: index as i32 + 1,
                port: ports[2 * index],
                controller_port: ports[2 * index + 1],
                dir: dir.join(format!("node-{}", index + 1)),
                process: None,
            })
            .collect();
        let mut cluster = Self {
            name: name.to_owned(),
            dir,
            cluster_id: new_cluster_id(),
            nodes,
        };
        for id in cluster.node_ids() {
            cluster.spawn(id)?;
        }
        cluster.wait_for_brokers(NODES)?;
        Ok(cluster)
    }

    pub fn node_ids(&self) -> Vec<i32> {
        self.nodes.iter().map(|node| node.id).collect()
    }

    /// Every node's listener: a client keeps working while any one is down.
    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILL: no controlled shutdown, leaderships and the controller role are lost at once.
    pub fn kill(&mut self, id: i32) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        let mut process = node
            .process
            .take()
            .with_context(|| format!("node {id} is not running"))?;
        process.kill_hard()?;
        Ok(())
    }

    /// SIGTERM and wait for the exit: a controlled shutdown, which hands leaderships over first.
    pub fn stop(&mut self, id: i32) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        let mut process = node
            .process
            .take()
            .with_context(|| format!("node {id} is not running"))?;
        let status = process.terminate(STOP_TIMEOUT)?;
        ensure!(
            status.success() || status.code() == Some(143),
            "node {id} did not stop cleanly: {status}\n{}",
            process.log_tail(20)
        );
        Ok(())
    }

    /// Starts a stopped or killed node again on its data and waits until that node itself
    /// answers as a broker of the cluster. (The cluster's metadata keeps listing a SIGKILLed
    /// broker until its session times out, so asking any node would pass too early.)
    pub fn restart(&mut self, id: i32) -> anyhow::Result<()> {
        self.spawn(id)?;
        let port = self.node(id)?.port;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.ensure_running(id)?;
            // A fresh client each time: its first request can only go to the one address it
            // knows, so an answer comes from this node.
            let client: BaseConsumer = client_config_for(&format!("127.0.0.1:{port}")).create()?;
            let answered = client
                .fetch_metadata(None, METADATA_TIMEOUT)
                .is_ok_and(|metadata| metadata.brokers().len() >= NODES);
            if answered {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "node {id} does not answer on 127.0.0.1:{port} after {START_TIMEOUT:?}\n{}",
                self.server_log_tail(id, 30)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The broker that leads `partition` of `topic` now.
    pub fn leader_of(&self, topic: &str, partition: i32) -> anyhow::Result<i32> {
        let client = self.metadata_client()?;
        let metadata = client.fetch_metadata(Some(topic), METADATA_TIMEOUT)?;
        metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions())
            .find(|p| p.id() == partition)
            .map(|p| p.leader())
            .filter(|leader| *leader >= 0)
            .with_context(|| format!("{topic}/{partition} has no leader"))
    }

    /// Waits until every partition of every topic — the internal ones (transaction state,
    /// consumer offsets) and the services' changelogs and dead letters included — has all three
    /// replicas in sync again: only then may the next node go down without a partition dropping
    /// below `min.insync.replicas`. Meaningful after [`Self::restart`]: a restarted broker
    /// re-registers, which takes it out of every ISR until it has caught up.
    pub fn wait_fully_replicated(&self, timeout: Duration) -> anyhow::Result<()> {
        let client = self.metadata_client()?;
        let deadline = Instant::now() + timeout;
        loop {
            let lagging = match client.fetch_metadata(None, METADATA_TIMEOUT) {
                Ok(metadata) => metadata
                    .topics()
                    .iter()
                    .flat_map(|topic| {
                        topic
                            .partitions()
                            .iter()
                            .filter(|p| p.isr().len() < NODES || p.leader() < 0)
                            .map(|p| {
                                format!(
                                    "{}/{} leader {} isr {:?}",
                                    topic.name(),
                                    p.id(),
                                    p.leader(),
                                    p.isr()
                                )
                            })
                    })
                    .collect::<Vec<_>>(),
                Err(error) => vec![format!("metadata: {error}")],
            };
            if lagging.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "cluster {} not fully replicated after {timeout:?}: {}",
                    self.name,
                    lagging.join("; ")
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The last lines of node `id`'s broker log, for failure messages.
    pub fn server_log_tail(&self, id: i32, lines: usize) -> String {
        let Ok(node) = self.node(id) else {
            return String::new();
        };
        let log = std::fs::read_to_string(node.dir.join("logs/server.log")).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn spawn(&mut self, id: i32) -> anyhow::Result<()> {
        let voters = self
            .nodes
            .iter()
            .map(|node| format!("{}@127.0.0.1:{}", node.id, node.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        let cluster_id = self.cluster_id.clone();
        let name = self.name.clone();
        let node = self.node_mut(id)?;
        ensure!(node.process.is_none(), "node {id} is already running");
        let mut command = Command::new(repo_root().join("deploy/local/stack"));
        command.arg("kafka-cluster-node");
        for (flag, value) in [
            ("--dir", node.dir.display().to_string()),
            ("--node-id", id.to_string()),
            ("--cluster-id", cluster_id),
            ("--port", node.port.to_string()),
            ("--controller-port", node.controller_port.to_string()),
            ("--voters", voters),
        ] {
            command.args([flag, &value]);
        }
        std::fs::create_dir_all(log_dir())?;
        let log = log_dir().join(format!("cluster-{name}-node-{id}.log"));
        node.process = Some(ChildProcess::spawn(
            format!("kafka-cluster-node {id}"),
            command,
            &log,
            LogMode::Append,
        )?);
        Ok(())
    }

    /// Waits until the metadata lists `count` brokers, failing early when a node exits.
    fn wait_for_brokers(&mut self, count: usize) -> anyhow::Result<()> {
        let client = self.metadata_client()?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            for id in self.node_ids() {
                self.ensure_running(id)?;
            }
            let brokers = client
                .fetch_metadata(None, METADATA_TIMEOUT)
                .map(|metadata| metadata.brokers().len())
                .unwrap_or(0);
            if brokers >= count {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "cluster {} shows {brokers} of {count} brokers after {START_TIMEOUT:?}",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Fails, with its logs, when node `id` was started and has exited.
    fn ensure_running(&mut self, id: i32) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        if let Some(process) = node.process.as_mut()
            && !process.is_running()
        {
            let output = process.log_tail(20);
            bail!(
                "kafka-cluster-node {id} exited during start-up\n{output}\n{}",
                self.server_log_tail(id, 30)
            );
        }
        Ok(())
    }

    fn metadata_client(&self) -> anyhow::Result<BaseConsumer> {
        Ok(client_config_for(&self.bootstrap()).create()?)
    }

    fn node(&self, id: i32) -> anyhow::Result<&Node> {
        self.nodes
            .iter()
            .find(|node| node.id == id)
            .with_context(|| format!("no node {id} in the cluster"))
    }

    fn node_mut(&mut self, id: i32) -> anyhow::Result<&mut Node> {
        self.nodes
            .iter_mut()
            .find(|node| node.id == id)
            .with_context(|| format!("no node {id} in the cluster"))
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        // Throw-away nodes: no clean shutdown needed, their data goes with the directory; their
        // broker logs are kept next to the services' logs, for a failure found later.
        for node in &mut self.nodes {
            if let Some(mut process) = node.process.take() {
                let _ = process.kill_hard();
            }
            let kept = log_dir().join(format!("cluster-{}-node-{}-server.log", self.name, node.id));
            let _ = std::fs::copy(node.dir.join("logs/server.log"), kept);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A random cluster id as `kafka-storage random-uuid` prints it: 16 bytes in unpadded base64url
/// (22 characters; the last one carries 2 bits and 4 zero bits), never starting with '-', which
/// would read as a flag.
fn new_cluster_id() -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const LAST: &[u8; 4] = b"AQgw";
    let mut id: String = (0..21)
        .map(|index| {
            let range = if index == 0 { 62 } else { 64 };
            char::from(ALPHABET[rand::random_range(0..range)])
        })
        .collect();
    id.push(char::from(LAST[rand::random_range(0..4)]));
    id
}

/// The workspace root, where `deploy/local/stack` is.
pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}
