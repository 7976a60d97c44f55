//! One trace per event_id across the real binaries — `eosctl produce` → eos-processor →
//! sink-writer → dedup-service (`Begin`, `Complete` / `MarkUnknown`) → provider-sim
//! (`POST /charges`) — exported over OTLP/gRPC to the in-process collector.
//!
//! The run has two phases. Phase A is processed and committed normally. In phase B the processor
//! has every record processed but nothing committed (a long commit interval) when it is
//! SIGKILLed; its successor redoes the whole batch. So every phase-B event must show two
//! processing attempts in its one trace, and — since nothing the killed instance committed can be
//! missing from the collector — every sampled event must have spans from every participant.

use eos_testkit::argv;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use integration_tests::eosctl::{self, Workload};
use integration_tests::otlp_collector::{CollectedSpan, OtlpCollector, SpanKind, env_refs};
use integration_tests::service_process::ServiceProcess;
use integration_tests::{
    TestDatabase, bootstrap_servers, create_topic, end_offsets, unique_name, wait_until_consumed,
};
use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;
use sqlx::PgPool;

/// Every service an event passes through: each must have spans in the event's trace (by the
/// `service.name` its exporter sends).
const PARTICIPANTS: &[&str] = &[
    "eosctl",
    "eos-processor",
    "sink-writer",
    "dedup-service",
    "provider-sim",
];
const EVENTS_PER_PHASE: u64 = 250;
const SAMPLED_EVENTS: usize = 100;
const SEED_A: u64 = 601;
const SEED_B: u64 = 602;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
const SPANS_TIMEOUT: Duration = Duration::from_secs(60);

/// The names of one run, and the environment that points every binary at the collector.
struct TracedPipeline {
    bootstrap: String,
    input: String,
    output: String,
    group: String,
    sink_group: String,
    database_url: String,
    /// The sink's targets file: its provider target (dedup-service + provider-sim).
    sink_config: String,
    otel: Vec<(&'static str, String)>,
}

impl TracedPipeline {
    fn otel_env(&self) -> Vec<(&str, &str)> {
        env_refs(&self.otel)
    }

    /// An eos-processor instance (always the same instance id: a successor fences its
    /// predecessor). `extra` adds environment, e.g. a longer commit interval.
    fn spawn_processor(&self, extra: &[(&str, &str)]) -> anyhow::Result<ServiceProcess> {
        let args = argv!(eos_processor::Config {
            kafka.bootstrap_servers: &self.bootstrap,
            input_topic: &self.input,
            output_topic: &self.output,
            group_id: &self.group,
            instance.instance_id: "traced",
            metrics_addr: "127.0.0.1:0",
            transaction_timeout: "90s",
        });
        let mut envs = self.otel_env();
        envs.extend_from_slice(extra);
        ServiceProcess::spawn("eos-processor", &args, &envs)
    }

    fn spawn_sink(&self) -> anyhow::Result<ServiceProcess> {
        let args = argv!(sink_writer::Config {
            kafka.bootstrap_servers: &self.bootstrap,
            topic: &self.output,
            group_id: &self.sink_group,
            instance.instance_id: "traced",
            database[database_url]: &self.database_url,
            config: &self.sink_config,
            metrics_addr: "127.0.0.1:0",
            max_backoff: "1s",
        });
        ServiceProcess::spawn("sink-writer", &args, &self.otel_env())
    }

    /// provider-sim losing some answers after applying (so some charges go through
    /// MarkUnknown), and dedup-service reconciling them; their URLs.
    fn spawn_effect_stage(
        &self,
        db: &TestDatabase,
    ) -> anyhow::Result<(ServiceProcess, ServiceProcess, String, String)> {
        let args = [
            "--addr",
            "127.0.0.1:0",
            "--seed",
            "3",
            "--drop-response-after-apply-probability",
            "0.05",
        ]
        .map(str::to_owned);
        let mut provider = ServiceProcess::spawn("provider-sim", &args, &self.otel_env())?;
        let provider_url = format!(
            "http://{}",
            provider.wait_for_log_field("http_addr", SPANS_TIMEOUT)?
        );
        let args = argv!(dedup_service::Config {
            listen: "127.0.0.1:0",
            metrics_addr: "127.0.0.1:0",
            database[database_url]: &db.url,
            provider_url: &provider_url,
            reconcile_interval: "200ms",
        });
        let mut dedup = ServiceProcess::spawn("dedup-service", &args, &self.otel_env())?;
        let dedup_url = format!(
            "http://{}",
            dedup.wait_for_log_field("grpc_addr", SPANS_TIMEOUT)?
        );
        Ok((provider, dedup, provider_url, dedup_url))
    }

    fn produce(&self, seed: u64) -> anyhow::Result<serde_json::Value> {
        let workload = Workload {
            count: EVENTS_PER_PHASE,
            entities: 50,
            duplicate_ratio: 0.05,
            bad_ratio: 0.01,
            // A reused id with other content is another send, so another trace: left out here,
            // where every id must have exactly one.
            conflict_ratio: 0.0,
            rate: 0,
            seed,
        };
        eosctl::produce_with_env(&self.bootstrap, &self.input, &workload, &self.otel_env())
    }

    fn wait_processed(&self, processor: &ServiceProcess) -> anyhow::Result<()> {
        wait_until_consumed(&self.bootstrap, &self.group, &self.input, DRAIN_TIMEOUT)
            .with_context(|| processor.log_tail(40))
    }

    /// Waits until the sink's checkpoint of every partition is the end of the output topic.
    async fn wait_sunk(&self, pool: &PgPool, sink: &mut ServiceProcess) -> anyhow::Result<()> {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let output = self.output.clone();
            let ends = tokio::task::spawn_blocking(move || end_offsets(&output)).await??;
            let stored: Vec<(i32, Option<i64>)> = sqlx::query_as(
                "SELECT partition, next_offset FROM sink_checkpoints WHERE sink = $1 AND topic = $2",
            )
            .bind(&self.sink_group)
            .bind(&self.output)
            .fetch_all(pool)
            .await
            .unwrap_or_default();
            let stored: BTreeMap<i32, i64> = stored
                .into_iter()
                .filter_map(|(partition, next)| next.map(|next| (partition, next)))
                .collect();
            if !ends.is_empty() && ends.iter().all(|(p, end)| stored.get(p) == Some(end)) {
                return Ok(());
            }
            anyhow::ensure!(
                sink.is_running(),
                "the sink exited before draining\n{}",
                sink.log_tail(40)
            );
            anyhow::ensure!(
                Instant::now() < deadline,
                "sink not drained after {DRAIN_TIMEOUT:?}: ends {ends:?}, checkpoints \
                 {stored:?}\n{}",
                sink.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn event_ids(seed: u64) -> Vec<String> {
    (0..EVENTS_PER_PHASE)
        .map(|n| format!("evt-{seed}-{n}"))
        .collect()
}

fn of_service<'a>(spans: &'a [CollectedSpan], service: &str) -> Vec<&'a CollectedSpan> {
    spans.iter().filter(|s| s.service_name == service).collect()
}

fn listing(spans: &[CollectedSpan]) -> String {
    spans
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The one trace of `event_id`, checked: one trace id, every span tagged with the id, every
/// participant present, one root (the producer's first send), every parent in the trace.
fn assert_one_intact_trace(collector: &OtlpCollector, event_id: &str) -> Vec<CollectedSpan> {
    let tagged = collector.spans_of_event(event_id);
    let trace_ids: BTreeSet<&str> = tagged.iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(
        trace_ids.len(),
        1,
        "{event_id}: spans in {} traces\n{}",
        trace_ids.len(),
        listing(&tagged)
    );
    let trace_id = trace_ids.first().copied().unwrap_or_default();
    let trace = collector.spans_of_trace(trace_id);
    let context = || format!("{event_id} (trace {trace_id}):\n{}", listing(&trace));

    for span in &trace {
        assert_eq!(
            span.event_id(),
            Some(event_id),
            "every span of the trace carries event_id: {span}\n{}",
            context()
        );
    }
    for participant in PARTICIPANTS {
        assert!(
            !of_service(&trace, participant).is_empty(),
            "no {participant} span in {}",
            context()
        );
    }
    let span_ids: HashSet<&str> = trace.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(
        span_ids.len(),
        trace.len(),
        "span ids repeat in {}",
        context()
    );
    let roots: Vec<&CollectedSpan> = trace
        .iter()
        .filter(|s| s.parent_span_id.is_none())
        .collect();
    assert_eq!(roots.len(), 1, "one root in {}", context());
    assert_eq!(
        (roots[0].service_name.as_str(), roots[0].kind),
        ("eosctl", SpanKind::Producer),
        "the root is the producer's first send in {}",
        context()
    );
    for span in &trace {
        if let Some(parent) = &span.parent_span_id {
            assert!(
                span_ids.contains(parent.as_str()),
                "{span}: parent {parent} is not in {}",
                context()
            );
        }
    }
    trace
}

#[tokio::test(flavor = "multi_thread")]
async fn one_trace_per_event_id_across_all_five_participants() -> anyhow::Result<()> {
    let collector = OtlpCollector::start()?;
    let db = TestDatabase::create().await?;
    let pipeline = TracedPipeline {
        bootstrap: bootstrap_servers(),
        input: unique_name("traced-payments"),
        output: unique_name("traced-ledger"),
        group: unique_name("traced-processor"),
        sink_group: unique_name("traced-sink"),
        database_url: db.url.clone(),
        sink_config: std::env::temp_dir()
            .join(format!("{}.toml", unique_name("traced-targets")))
            .display()
            .to_string(),
        otel: collector.exporter_env(),
    };
    create_topic(&pipeline.input, 3).await?;
    create_topic(&pipeline.output, 3).await?;
    let (mut provider, mut dedup, provider_url, dedup_url) = pipeline.spawn_effect_stage(&db)?;
    std::fs::write(
        &pipeline.sink_config,
        format!(
            "[[targets]]\nkind = \"provider\"\nname = \"traced\"\ndedup_url = \"{dedup_url}\"\n\
             provider_url = \"{provider_url}\"\ncall_timeout = \"1s\"\nlease_ttl = \"10s\"\n"
        ),
    )?;
    let mut sink = pipeline.spawn_sink()?;

    // Phase A: processed and committed, then a graceful stop.
    let mut first = pipeline.spawn_processor(&[])?;
    let summary_a = pipeline.produce(SEED_A)?;
    pipeline.wait_processed(&first)?;
    first.stop_gracefully()?;

    // Phase B: the whole batch processed, none of it committed, then SIGKILL.
    let mut killed = pipeline.spawn_processor(&[("EOS_COMMIT_INTERVAL", "60s")])?;
    let summary_b = pipeline.produce(SEED_B)?;
    let phase_b = event_ids(SEED_B);
    collector
        .wait_until(SPANS_TIMEOUT, |spans| {
            let processed: HashSet<&str> = spans
                .iter()
                .filter(|s| s.service_name == "eos-processor")
                .filter_map(CollectedSpan::event_id)
                .collect();
            phase_b.iter().all(|id| processed.contains(id.as_str()))
        })
        .with_context(|| killed.log_tail(40))?;
    let status = killed.kill_hard()?;
    assert!(status.code().is_none(), "killed by a signal: {status}");

    // Its successor fences it and redoes the batch.
    let mut last = pipeline.spawn_processor(&[])?;
    pipeline.wait_processed(&last)?;
    pipeline.wait_sunk(&db.pool, &mut sink).await?;
    last.stop_gracefully()?;
    sink.stop_gracefully()?;
    dedup.stop_gracefully()?;
    provider.stop_gracefully()?;
    std::fs::remove_file(&pipeline.sink_config)?;

    for summary in [&summary_a, &summary_b] {
        assert_eq!(summary["logical_events"], EVENTS_PER_PHASE);
        assert!(summary["duplicates"].as_u64() > Some(0), "{summary}");
    }

    let phase_a: HashSet<String> = event_ids(SEED_A).into_iter().collect();
    let mut all: Vec<String> = phase_a.iter().cloned().chain(phase_b.clone()).collect();
    all.sort();
    let mut rng = rand::rngs::StdRng::seed_from_u64(SEED_A);
    all.shuffle(&mut rng);
    let mut redelivered = 0;
    for event_id in all.iter().take(SAMPLED_EVENTS) {
        let trace = assert_one_intact_trace(&collector, event_id);
        let sends = of_service(&trace, "eosctl").len();
        let attempts = of_service(&trace, "eos-processor").len();
        redelivered += usize::from(sends > 1);
        if phase_a.contains(event_id) {
            assert_eq!(
                attempts,
                sends,
                "{event_id}: one processing per delivery\n{}",
                listing(&trace)
            );
        } else {
            assert!(
                attempts > sends,
                "{event_id}: the killed attempt and its retry are both in the trace\n{}",
                listing(&trace)
            );
        }
        for span in of_service(&trace, "eos-processor") {
            assert_eq!(span.kind, SpanKind::Consumer, "{span}");
            assert_eq!(span.str_attribute("messaging.system"), Some("kafka"));
            assert_eq!(
                span.str_attribute("messaging.destination.name"),
                Some(pipeline.input.as_str())
            );
            assert_eq!(
                span.str_attribute("messaging.consumer.group.name"),
                Some(pipeline.group.as_str())
            );
        }
        for span in of_service(&trace, "sink-writer")
            .into_iter()
            .filter(|span| span.name == "sink-writer write")
        {
            assert_eq!(span.kind, SpanKind::Consumer, "{span}");
            assert_eq!(
                span.str_attribute("messaging.destination.name"),
                Some(pipeline.output.as_str())
            );
            assert_eq!(
                span.str_attribute("messaging.consumer.group.name"),
                Some(pipeline.sink_group.as_str())
            );
        }
        for span in of_service(&trace, "eosctl") {
            assert_eq!(span.kind, SpanKind::Producer, "{span}");
            assert_eq!(
                span.str_attribute("messaging.destination.name"),
                Some(pipeline.input.as_str())
            );
            assert_eq!(span.str_attribute("messaging.operation.type"), Some("send"));
        }
        let rpc_methods: HashSet<&str> = of_service(&trace, "dedup-service")
            .iter()
            .filter_map(|span| span.str_attribute("rpc.method"))
            .collect();
        // The sink's first round is batched: an item of a batch call is answered in a span of
        // its own, named for the call, in the trace of its event.
        let has = |methods: &[&str]| methods.iter().any(|method| rpc_methods.contains(method));
        assert!(
            has(&["Begin", "BeginBatch"]) && has(&["Complete", "CompleteBatch", "MarkUnknown"]),
            "{event_id}: Begin, then Complete or MarkUnknown\n{}",
            listing(&trace)
        );
        // Besides the RPCs, a reconciliation of this event's charge (checked below).
        for span in of_service(&trace, "dedup-service")
            .into_iter()
            .filter(|span| span.name != "dedup-service reconcile")
        {
            assert_eq!(span.kind, SpanKind::Server, "{span}");
            assert_eq!(span.str_attribute("rpc.system"), Some("grpc"));
            let method = span.str_attribute("rpc.method").unwrap_or_default();
            assert_eq!(span.name, format!("eos.dedup.v1.Dedup/{method}"), "{span}");
        }
        assert!(
            of_service(&trace, "provider-sim")
                .iter()
                .any(|span| span.name == "POST /charges" && span.kind == SpanKind::Server),
            "{event_id}: the charge at the provider\n{}",
            listing(&trace)
        );
    }
    eprintln!(
        "traces: {} spans received, {SAMPLED_EVENTS} events checked, {redelivered} of them \
         re-delivered by the producer",
        collector.span_count()
    );

    // A transaction has many inputs, so its span links to the records' spans instead of having
    // a parent: every link resolves to a record span of the same service, in that record's trace.
    let spans = collector.spans();
    let by_id: BTreeMap<(&str, &str), &CollectedSpan> = spans
        .iter()
        .map(|s| ((s.trace_id.as_str(), s.span_id.as_str()), s))
        .collect();
    for (service, transaction, record) in [
        (
            "eos-processor",
            "eos-processor transaction",
            "eos-processor process",
        ),
        (
            "sink-writer",
            "sink-writer transaction",
            "sink-writer write",
        ),
    ] {
        let transactions: Vec<&CollectedSpan> = spans
            .iter()
            .filter(|s| s.service_name == service && s.name == transaction)
            .collect();
        let links: Vec<_> = transactions.iter().flat_map(|s| &s.links).collect();
        assert!(
            !links.is_empty(),
            "{transaction} spans link to their inputs"
        );
        for link in links {
            let target = by_id.get(&(link.trace_id.as_str(), link.span_id.as_str()));
            assert!(
                target.is_some_and(|t| t.service_name == service && t.name == record),
                "{transaction} links to {link:?}, which is no {record} span"
            );
        }
    }

    // A lost answer's reconciliation joins the trace of its event: the reconcile span is a child
    // of the Begin that acquired the intent, and the look-up at the provider a child of it.
    let reconciles: Vec<&CollectedSpan> = spans
        .iter()
        .filter(|s| s.service_name == "dedup-service" && s.name == "dedup-service reconcile")
        .collect();
    assert!(
        !reconciles.is_empty(),
        "provider-sim dropped 5% of answers, so some charges were reconciled"
    );
    for reconcile in &reconciles {
        let trace: Vec<&CollectedSpan> = spans
            .iter()
            .filter(|s| s.trace_id == reconcile.trace_id)
            .collect();
        let event_id = reconcile.event_id();
        assert!(
            event_id.is_some()
                && trace
                    .iter()
                    .any(|s| s.service_name == "eosctl" && s.event_id() == event_id),
            "{reconcile}: in the trace of its event's send"
        );
        let parent = reconcile
            .parent_span_id
            .as_deref()
            .and_then(|id| by_id.get(&(reconcile.trace_id.as_str(), id)));
        assert!(
            parent.is_some_and(|p| p.name == "eos.dedup.v1.Dedup/Begin"
                || p.name == "eos.dedup.v1.Dedup/BeginBatch"),
            "{reconcile}: child of the Begin that acquired, not of {parent:?}"
        );
        assert!(
            trace.iter().any(|s| s.service_name == "provider-sim"
                && s.parent_span_id.as_deref() == Some(reconcile.span_id.as_str())),
            "{reconcile}: the look-up at the provider is its child"
        );
    }

    // The re-deliveries' own spans: a child of the first send, in the same trace, somewhere in
    // the run (the sample may or may not hold one).
    let by_event = collector.spans_by_event_id();
    let redeliveries = all
        .iter()
        .filter(|id| {
            by_event
                .get(id.as_str())
                .is_some_and(|spans| of_service(spans, "eosctl").len() > 1)
        })
        .count() as u64;
    let duplicates = summary_a["duplicates"].as_u64().unwrap_or(0)
        + summary_b["duplicates"].as_u64().unwrap_or(0);
    assert!(
        redeliveries > 0 && redeliveries <= duplicates,
        "{redeliveries} events with several sends for {duplicates} duplicates"
    );
    db.drop_database().await
}
