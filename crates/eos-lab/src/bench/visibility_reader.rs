//! A read_committed reader that notes when each event id first became visible, for the relay
//! benches' commit → visible latencies.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use eos_runtime::kafka_clients::{self, Isolation::ReadCommitted};
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Headers as _;
use rdkafka::{ClientConfig, Message as _};

/// Reads topics and notes when each event id (its `event_id` header) first became visible.
pub(super) struct VisibilityReader {
    seen: std::sync::mpsc::Receiver<(String, Instant)>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl VisibilityReader {
    /// Creates `topics` (3 partitions each) and starts reading them, read_committed.
    pub(super) async fn start(
        kafka: &ClientConfig,
        group_prefix: &str,
        topics: &[String],
    ) -> anyhow::Result<Self> {
        let consumer: BaseConsumer = kafka_clients::reader(kafka, group_prefix, ReadCommitted)
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "5")
            .create()?;
        let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
            kafka.clone().create()?;
        let new_topics: Vec<_> = topics
            .iter()
            .map(|t| {
                rdkafka::admin::NewTopic::new(t, 3, rdkafka::admin::TopicReplication::Fixed(-1))
            })
            .collect();
        for result in admin
            .create_topics(&new_topics, &rdkafka::admin::AdminOptions::new())
            .await?
        {
            result.map_err(|(topic, code)| anyhow::anyhow!("cannot create {topic}: {code}"))?;
        }
        consumer.subscribe(&topics.iter().map(String::as_str).collect::<Vec<_>>())?;
        let (sender, seen) = std::sync::mpsc::channel::<(String, Instant)>();
        let stop = Arc::new(AtomicBool::new(false));
        let reader_stop = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            while !reader_stop.load(Ordering::Relaxed) {
                if let Some(Ok(message)) = consumer.poll(Duration::from_millis(20)) {
                    let seen = Instant::now();
                    let id = message.headers().and_then(|headers| {
                        headers
                            .iter()
                            .find(|h| h.key == "event_id")
                            .and_then(|h| h.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                    });
                    if let Some(id) = id {
                        let _ = sender.send((id, seen));
                    }
                }
            }
        });
        Ok(Self { seen, stop, thread })
    }

    /// When each event id was first seen, once `total` ids are or `within` has passed; then stops.
    pub(super) async fn collect(self, total: usize, within: Duration) -> HashMap<String, Instant> {
        let mut seen: HashMap<String, Instant> = HashMap::new();
        let deadline = Instant::now() + within;
        while seen.len() < total && Instant::now() < deadline {
            while let Ok((id, at)) = self.seen.try_recv() {
                seen.entry(id).or_insert(at);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        seen
    }
}
