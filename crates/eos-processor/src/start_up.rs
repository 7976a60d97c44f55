//! Start-up apart from running (docs/CODE_STYLE.md): [`build`] does the wiring, and every
//! failure it can meet (flags that do not fit the transform, topics, the outputs' schemas)
//! happens there, before a record is read; [`Ready::run`] runs the transaction loop.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use anyhow::Context as _;
use eos_runtime::ops_http::OpsEndpoint;
use eos_runtime::progress_watch::ProgressWatch;
use tokio_util::sync::CancellationToken;

use crate::config::{self, Config};
use crate::error::ProcessorError;
use crate::loop_settings::LoopSettings;
use crate::output_format::{self, OutputEncoder};
use crate::partition_state::DecisionPolicy;
use crate::transaction_loop::TransactionLoop;
use crate::transform::Transform;
use crate::{boundary, metrics, topics};
use eos_schema::{
    ParsedSchema, ReaderSchema, RecordDecoder, RecordFormat, RegistryClient, RegistryConfig,
    SchemaVersion,
};

/// Where the contract finds each part, for the start-up log.
fn describe(contract: &eos_core::EventContract) -> String {
    let place = |location: &eos_core::FieldLocation| location.to_string();
    format!(
        "event id at {}, entity at {}{}",
        place(&contract.event_id),
        place(&contract.entity),
        contract
            .occurred_at
            .as_ref()
            .map(|pointer| format!(", event time at {pointer}"))
            .unwrap_or_default()
    )
}

/// Checks the configuration against the transform, serves the ops endpoint, makes the topics,
/// looks up the outputs' schemas (a registry format), and settles the loop's settings. `None`
/// when `shutdown` came while the registry could not answer.
pub(crate) async fn build<T: Transform>(
    config: Config,
    transform: T,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Ready<T>>> {
    config.validate().map_err(ProcessorError::Config)?;
    config
        .check_outputs(transform.writes_default_output(), &transform.outputs())
        .map_err(ProcessorError::Config)?;
    let outputs = config.output_topics();
    let contract = config.event_contract(transform.contract());
    tracing::info!(
        contract = describe(&contract),
        state_version = T::STATE_VERSION,
        "event contract"
    );
    let kafka = config
        .kafka
        .settings(config::OWN_KAFKA_PROPERTIES)
        .context("Kafka settings")?;
    kafka.log_at_start();
    let mut boundary = boundary(&config);
    let module_digest = transform.module_digest();
    boundary.transform = module_digest
        .as_ref()
        .map(|digest| format!("webassembly module {digest}"));
    let ops = OpsEndpoint::start(config.metrics_addr, boundary, metrics::describe).await?;
    if let Some(digest) = module_digest {
        ::metrics::gauge!(metrics::TRANSFORM_MODULE_INFO, "digest" => digest).set(1.0);
    }

    let client_config = kafka.client_config();
    let plan = topics::TopicPlan {
        input: config.input_topic.clone(),
        outputs: outputs.values().cloned().collect(),
        dlq: config.dlq_topic(),
        changelog: config.changelog_topic(),
        partitions: config.partitions,
    };
    let (topics, dead_letter_max_bytes) = prepare_topics(&client_config, &plan, &config).await?;
    let Some((input, output_encoder)) = record_formats(&config, &outputs, shutdown).await? else {
        // Stopped while the registry could not answer: nothing ran.
        ops.stop().await;
        return Ok(None);
    };
    let settings = LoopSettings {
        guarantee: config.guarantee,
        input_topic: config.input_topic.clone(),
        outputs: outputs.clone(),
        dlq_topic: config.dlq_topic(),
        changelog_topic: config.changelog_topic(),
        group_id: config.group_id.clone(),
        instance_id: config.instance.instance_id(),
        transactional_id: config.transactional_id(),
        commit_interval: config.commit_interval,
        max_batch: config.max_batch,
        policy: DecisionPolicy {
            horizon_secs: config.dedup_horizon.as_secs() as i64,
            contract,
            outputs: outputs.keys().cloned().collect::<BTreeSet<_>>(),
            output_fit: output_encoder
                .clone()
                .map(|encoder| encoder as Arc<dyn eos_transform::partition_state::OutputFit>),
        },
        transaction_timeout: config.transaction_timeout,
        fault_abort_every: config.fault_abort_every,
        dead_letter_max_bytes,
        client_config,
        state_dir: config.instance_state_dir(),
        changelog_delete_retention: topics.changelog_delete_retention,
        changelog_created: topics.changelog_created,
    };
    let progress = ProgressWatch::spawn("eos-processor", config.stall.policy(), &ops.stalls)
        .context("starting the progress watch")?;
    Ok(Some(Ready {
        ops,
        settings,
        transform,
        input,
        output_encoder,
        progress,
    }))
}

/// The input's decoder and the outputs' encoder, with the schemas they need found in the
/// registry (the outputs' subjects, `--input-reader-schema`); `None` when `shutdown` came while
/// the registry could not answer.
async fn record_formats(
    config: &Config,
    outputs: &BTreeMap<String, String>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<(RecordDecoder, Option<Arc<OutputEncoder>>)>> {
    let registry = config
        .input_format
        .registry_config()
        .map_err(ProcessorError::Config)?;
    let output_plan = config
        .input_format
        .output_plan(outputs)
        .map_err(ProcessorError::Config)?;
    let any_registry_output = output_plan
        .values()
        .any(|(format, _)| *format != RecordFormat::Json);
    let output_encoder = match (any_registry_output, &registry) {
        (false, _) | (_, None) => None,
        (true, Some(registry)) => {
            let Some(encoder) = OutputEncoder::load(&output_plan, registry.clone(), shutdown)
                .await
                .map_err(ProcessorError::Config)?
            else {
                return Ok(None);
            };
            Some(Arc::new(encoder))
        }
    };
    let reader = match (&config.input_format.input_reader_schema, &registry) {
        (Some(reader), Some(registry)) => {
            let Some(reader) = reader_schema(reader, registry, shutdown)
                .await
                .map_err(ProcessorError::Config)?
            else {
                return Ok(None);
            };
            Some(reader)
        }
        _ => None,
    };
    let mut input = RecordDecoder::new(
        config.input_format.input_format,
        &config.input_topic,
        registry,
    )
    .context("the schema registry's client")?;
    if let Some(reader) = reader {
        input = input.with_reader(reader);
    }
    Ok(Some((input, output_encoder)))
}

/// `--input-reader-schema`'s schema, which must be Avro; `Ok(None)` when shut down while the
/// registry could not answer.
async fn reader_schema(
    (subject, version): &(String, SchemaVersion),
    registry: &RegistryConfig,
    shutdown: &CancellationToken,
) -> Result<Option<ReaderSchema>, String> {
    let client = RegistryClient::new(registry.clone()).map_err(|error| error.to_string())?;
    let Some((id, schema)) =
        output_format::subject_schema(&client, (subject, *version), shutdown).await?
    else {
        return Ok(None);
    };
    let ParsedSchema::Avro(schema) = schema else {
        return Err(format!(
            "--input-reader-schema {subject}: schema id {id} is {}, not Avro",
            eos_schema::record_decoder::schema_name(&schema)
        ));
    };
    tracing::info!(subject, schema_id = %id, "every input record is read as this schema");
    Ok(Some(ReaderSchema {
        subject: subject.clone(),
        id,
        schema,
    }))
}

/// The topics made or checked, and the largest dead letter the producer can write.
async fn prepare_topics(
    client_config: &rdkafka::ClientConfig,
    plan: &topics::TopicPlan,
    config: &Config,
) -> anyhow::Result<(topics::TopicsReady, usize)> {
    let topics = topics::ensure_topics(client_config, plan, &config.topics)
        .await
        .context("checking topics")?;
    tracing::info!(
        input_partitions = topics.input_partitions,
        changelog_delete_retention = ?topics.changelog_delete_retention,
        "topics ready"
    );
    let dead_letter_max_bytes = eos_core::dead_letter::message_limit(
        client_config.get("message.max.bytes"),
        eos_runtime::topic_config::max_message_bytes(
            client_config,
            &plan.dlq,
            std::time::Duration::from_secs(10),
        )
        .await,
    );
    tracing::info!(
        dead_letter_max_bytes,
        "largest dead letter the producer can write"
    );
    Ok((topics, dead_letter_max_bytes))
}

/// A processor ready to run: its topics made, its outputs' schemas known.
pub(crate) struct Ready<T> {
    /// `/metrics`, `/healthz`, `/readyz` and `/boundary`, serving since start-up; stopped last.
    ops: OpsEndpoint,
    settings: LoopSettings,
    transform: T,
    input: RecordDecoder,
    output_encoder: Option<Arc<OutputEncoder>>,
    progress: Arc<ProgressWatch>,
}

impl<T: Transform> Ready<T> {
    /// Runs the transaction loop on a blocking thread until `shutdown` is cancelled or a fatal
    /// error, then stops the ops endpoint.
    pub(crate) async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self {
            ops,
            settings,
            transform,
            input,
            output_encoder,
            progress,
        } = self;
        let readiness = ops.readiness.clone();
        let result = tokio::task::spawn_blocking(move || {
            TransactionLoop::new(settings, transform, (readiness, progress))?
                .with_input(input)
                .with_output(output_encoder)
                .run(&shutdown)
        })
        .await
        .context("the transaction loop panicked");
        ops.stop().await;
        result?.map_err(anyhow::Error::from)
    }
}
