//! A relay run inside the benchmark's process (the relay benchmarks' own, and the staleness
//! run's several), on outbox-relay's library: its loop, its position topic, a progress watch.

use eos_runtime::ops_http::Readiness;
use eos_runtime::progress_watch::{ProgressWatch, StallPolicy, StallState};
use outbox_relay::relay_loop::{RelayLoop, RelaySettings};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Starts a relay with `settings` (its positions topic created when missing), running in this
/// process until the returned token is cancelled.
pub(crate) async fn spawn_relay(
    settings: RelaySettings,
    pool: &PgPool,
) -> anyhow::Result<(
    CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    outbox_relay::position_topic::ensure_positions_topic(
        &settings.client_config,
        &settings.positions_topic,
        &eos_runtime::topic_config::TopicReplicationFlags::default(),
    )
    .await?;
    // The bench reads no health endpoint: the watch only keeps the loop's gauge.
    let progress = ProgressWatch::spawn(
        "outbox-relay",
        StallPolicy::default(),
        &StallState::default(),
    )?;
    let relay = RelayLoop::start(settings, pool.clone(), progress).await?;
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let task = tokio::spawn(async move {
        relay
            .run(&token, &Readiness::default())
            .await
            .map_err(anyhow::Error::from)
    });
    Ok((shutdown, task))
}
