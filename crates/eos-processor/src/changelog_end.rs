//! What this instance knows of the end of each changelog partition it owns, and how often its
//! local checkpoint moves up to it (`local_checkpoint.rs`). Its own module, so that the loop
//! (which holds it) and the checkpoint (which reads and moves it) each use it without using each
//! other.

use std::time::{Duration, Instant};

/// How often the local checkpoint of each changelog partition is moved up to what the store
/// holds (an fsync of the store each): what a restart on the same disk reads of the changelog is
/// about this much of its tail.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// What this instance knows of the end of one changelog partition it owns.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChangelogEnd {
    /// The store's checkpoint: it equals the changelog below this offset.
    pub(crate) checkpointed: i64,
    pub(crate) checkpointed_at: Instant,
    /// Where the changelog ends if only this instance wrote to it since the restore: each
    /// committed batch adds its records plus a commit marker (exactly-once). `None` after an
    /// abort (how much of an aborted batch reached the log is unknown): the checkpoint then
    /// stays until the next restore.
    pub(crate) expected_end: Option<i64>,
}
