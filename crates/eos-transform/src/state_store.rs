//! The processor's committed state on disk: one `redb` database per instance (a file under
//! `--state-dir`, in a directory named by group and instance id), holding for each changelog
//! partition the per-entity transform state, the seen-set of event ids, an index of those ids by
//! expiry time, and a local checkpoint of the changelog offset the state covers.
//!
//! Only committed state is ever written here (see [`crate::partition_state`]): a batch's changes
//! are applied after the Kafka transaction carrying them to the changelog has committed. So the
//! store always equals a prefix of the changelog, and its checkpoint says which: a restart on the
//! same disk reads the changelog only from the checkpoint to its end
//! (docs/architecture/processor-state.md, "Processor state on disk").
//!
//! Batches are committed without an fsync ([`Durability::None`]); the checkpoint is committed
//! with one. redb keeps its transactions in order and atomic, so after a crash the store is at
//! some earlier checkpoint together with the state it covers, and replaying the changelog from
//! there (upserts and deletes by key) brings it back.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{
    Database, Durability, ReadOnlyTable, ReadableDatabase as _, ReadableTableMetadata as _,
    TableDefinition, TableHandle as _,
};

use eos_core::Fingerprint;

use crate::seen_event::SeenEvent;

/// redb's page cache per instance. The state itself lives on disk (and in the OS page cache);
/// this bounds what the process keeps resident for it. redb's default is 1 GiB.
pub const STORE_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// Name of the database file inside an instance's state directory.
const STORE_FILE: &str = "state.redb";

/// `<changelog topic>/<partition>` → (next changelog offset covered, unix milliseconds written).
const CHECKPOINTS: TableDefinition<&str, (i64, i64)> = TableDefinition::new("checkpoints");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be opened: another process holds it (redb's file lock), or the
    /// directory is not writable.
    #[error("opening the state store {path}: {detail}")]
    Open { path: PathBuf, detail: String },
    /// A read or write of the store failed (I/O, a corrupt file).
    #[error("state store: {0}")]
    Redb(#[from] redb::Error),
    /// A value in the store does not decode.
    #[error("state store: {0}")]
    Corrupt(String),
}

fn redb_error(error: impl Into<redb::Error>) -> StoreError {
    StoreError::Redb(error.into())
}

/// The database of one processor instance.
#[derive(Debug)]
pub struct StateStore {
    db: Database,
    location: String,
}

/// The local checkpoint of one changelog partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// The changelog offset the store covers up to (exclusive): a warm restore reads from here.
    pub next_offset: i64,
    /// When it was written, unix milliseconds: older than the changelog's `delete.retention.ms`
    /// means tombstones after it may be gone, so the state is rebuilt from the start instead.
    pub written_at_ms: i64,
}

impl StateStore {
    /// Opens (or creates) the store of one instance in `dir`. Fails when another process has it
    /// open: two processes must never share a store.
    pub fn open(dir: &Path) -> Result<Arc<Self>, StoreError> {
        let path = dir.join(STORE_FILE);
        let open_error = |detail: String| StoreError::Open {
            path: path.clone(),
            detail,
        };
        std::fs::create_dir_all(dir).map_err(|e| open_error(e.to_string()))?;
        let db = Database::builder()
            .set_cache_size(STORE_CACHE_BYTES)
            .create(&path)
            .map_err(|e| match e {
                redb::DatabaseError::DatabaseAlreadyOpen => open_error(
                    "another process has it open (every instance needs its own --instance-id \
                     or --state-dir)"
                        .into(),
                ),
                other => open_error(other.to_string()),
            })?;
        Ok(Arc::new(Self {
            db,
            location: path.display().to_string(),
        }))
    }

    /// A store in memory only, for tests and benchmarks of the decision logic.
    pub fn in_memory() -> Result<Arc<Self>, StoreError> {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| StoreError::Open {
                path: PathBuf::from(":memory:"),
                detail: e.to_string(),
            })?;
        Ok(Arc::new(Self {
            db,
            location: ":memory:".into(),
        }))
    }

    pub fn location(&self) -> &str {
        &self.location
    }

    /// The state of changelog partition `partition` of `changelog`; its tables are created when
    /// missing.
    pub fn partition(
        self: &Arc<Self>,
        changelog: &str,
        partition: i32,
    ) -> Result<PartitionStore, StoreError> {
        let store = PartitionStore {
            store: Arc::clone(self),
            names: TableNames::new(changelog, partition),
            view: RefCell::new(None),
        };
        store.create_tables()?;
        Ok(store)
    }

    /// Drops the tables and checkpoints of every changelog other than `keep` (state left by an
    /// earlier `--changelog-topic`, or by an earlier topic of the same name when `keep` is
    /// `None`), so the file keeps no dead state. Returns how many tables went.
    pub fn drop_changelogs_except(&self, keep: Option<&str>) -> Result<usize, StoreError> {
        // Table names and checkpoint keys all start with `<changelog>/`; a topic name has no '/'.
        let prefix = keep.map_or_else(|| "/".to_owned(), |changelog| format!("{changelog}/"));
        let txn = self.db.begin_write().map_err(redb_error)?;
        let mut dropped = 0;
        {
            let stale: Vec<_> = txn
                .list_tables()
                .map_err(redb_error)?
                .filter(|table| {
                    table.name() != CHECKPOINTS.name() && !table.name().starts_with(&prefix)
                })
                .collect();
            for table in stale {
                txn.delete_table(table).map_err(redb_error)?;
                dropped += 1;
            }
            let mut checkpoints = txn.open_table(CHECKPOINTS).map_err(redb_error)?;
            checkpoints
                .retain(|key, _| key.starts_with(&prefix))
                .map_err(redb_error)?;
        }
        txn.commit().map_err(redb_error)?;
        Ok(dropped)
    }
}

/// Table names of one changelog partition.
#[derive(Debug, Clone)]
struct TableNames {
    checkpoint_key: String,
    entities: String,
    seen: String,
    expiry: String,
}

impl TableNames {
    fn new(changelog: &str, partition: i32) -> Self {
        let base = format!("{changelog}/{partition}");
        Self {
            entities: format!("{base}/entities"),
            seen: format!("{base}/seen"),
            expiry: format!("{base}/expiry"),
            checkpoint_key: base,
        }
    }

    /// entity id → the transform's state as JSON (as in the changelog).
    fn entities(&self) -> TableDefinition<'_, &'static str, &'static [u8]> {
        TableDefinition::new(&self.entities)
    }

    /// event id → fingerprint (32 bytes) and expiry (8 bytes, big-endian), then for an event that
    /// was not applied or was re-driven its outcome (see [`encode_seen`]).
    fn seen(&self) -> TableDefinition<'_, &'static str, &'static [u8]> {
        TableDefinition::new(&self.seen)
    }

    /// expiry key (expiry time, ordered, then the event id) → nothing: a sweep reads only the
    /// ids that expired.
    fn expiry(&self) -> TableDefinition<'_, &'static [u8], ()> {
        TableDefinition::new(&self.expiry)
    }
}

/// One change to write: `None` deletes the key.
#[derive(Debug, Clone, Default)]
pub struct StateChanges {
    pub entities: Vec<(String, Option<Vec<u8>>)>,
    pub seen: Vec<(String, Option<SeenEvent>)>,
}

impl StateChanges {
    pub fn len(&self) -> usize {
        self.entities.len() + self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The read side of one partition's tables, kept open between writes: every lookup of a batch
/// reads the same snapshot without opening a transaction each.
struct View {
    entities: ReadOnlyTable<&'static str, &'static [u8]>,
    seen: ReadOnlyTable<&'static str, &'static [u8]>,
    expiry: ReadOnlyTable<&'static [u8], ()>,
}

/// The on-disk state of one changelog partition.
pub struct PartitionStore {
    store: Arc<StateStore>,
    names: TableNames,
    view: RefCell<Option<View>>,
}

impl std::fmt::Debug for PartitionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionStore")
            .field("store", &self.store.location)
            .field("partition", &self.names.checkpoint_key)
            .finish_non_exhaustive()
    }
}

/// Expiry time first, in an order-preserving encoding (sign bit flipped, big-endian), then the
/// event id: byte order is time order.
fn expiry_key(expires_at: i64, event_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + event_id.len());
    key.extend_from_slice(&((expires_at as u64) ^ (1 << 63)).to_be_bytes());
    key.extend_from_slice(event_id.as_bytes());
    key
}

/// The part of a stored seen entry every entry has: fingerprint and expiry.
const SEEN_FIXED_BYTES: usize = 40;

/// What a seen entry says beyond its fingerprint and expiry, stored after them as JSON: only for
/// an event that was dead-lettered or re-driven, so an applied event's entry keeps the 40 bytes
/// stores written before outcomes were recorded hold (and those read as applied).
#[derive(serde::Serialize, serde::Deserialize)]
struct SeenOutcome {
    #[serde(rename = "dl", default, skip_serializing_if = "Option::is_none")]
    dead_letter: Option<eos_core::DeadLetterReason>,
    #[serde(rename = "rd", default, skip_serializing_if = "Vec::is_empty")]
    redrives: Vec<String>,
}

fn encode_seen(seen: &SeenEvent) -> Vec<u8> {
    let mut value = Vec::with_capacity(SEEN_FIXED_BYTES);
    value.extend_from_slice(seen.fingerprint.as_bytes());
    value.extend_from_slice(&seen.expires_at.to_be_bytes());
    if seen.dead_letter.is_some() || !seen.redrives.is_empty() {
        let outcome = SeenOutcome {
            dead_letter: seen.dead_letter,
            redrives: seen.redrives.clone(),
        };
        // A struct of a reason code and strings always serialises.
        value.extend(serde_json::to_vec(&outcome).unwrap_or_default());
    }
    value
}

fn decode_seen(event_id: &str, value: &[u8]) -> Result<SeenEvent, StoreError> {
    let corrupt = || StoreError::Corrupt(format!("seen id {event_id:?} has a malformed value"));
    if value.len() < SEEN_FIXED_BYTES {
        return Err(corrupt());
    }
    let (value, outcome) = value.split_at(SEEN_FIXED_BYTES);
    let outcome = if outcome.is_empty() {
        SeenOutcome {
            dead_letter: None,
            redrives: Vec::new(),
        }
    } else {
        serde_json::from_slice(outcome).map_err(|_| corrupt())?
    };
    let mut hex = String::with_capacity(64);
    for byte in &value[..32] {
        use std::fmt::Write as _;
        let _ = write!(hex, "{byte:02x}");
    }
    let fingerprint: Fingerprint = hex.parse().map_err(|_| corrupt())?;
    let mut expiry = [0u8; 8];
    expiry.copy_from_slice(&value[32..]);
    Ok(SeenEvent {
        fingerprint,
        expires_at: i64::from_be_bytes(expiry),
        dead_letter: outcome.dead_letter,
        redrives: outcome.redrives,
    })
}

impl PartitionStore {
    fn create_tables(&self) -> Result<(), StoreError> {
        let txn = self.store.db.begin_write().map_err(redb_error)?;
        txn.open_table(self.names.entities()).map_err(redb_error)?;
        txn.open_table(self.names.seen()).map_err(redb_error)?;
        txn.open_table(self.names.expiry()).map_err(redb_error)?;
        txn.open_table(CHECKPOINTS).map_err(redb_error)?;
        txn.commit().map_err(redb_error)?;
        Ok(())
    }

    fn with_view<R>(
        &self,
        read: impl FnOnce(&View) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        let mut slot = self.view.borrow_mut();
        if slot.is_none() {
            let txn = self.store.db.begin_read().map_err(redb_error)?;
            *slot = Some(View {
                entities: txn.open_table(self.names.entities()).map_err(redb_error)?,
                seen: txn.open_table(self.names.seen()).map_err(redb_error)?,
                expiry: txn.open_table(self.names.expiry()).map_err(redb_error)?,
            });
        }
        match slot.as_ref() {
            Some(view) => read(view),
            None => Err(StoreError::Corrupt("no read view".into())),
        }
    }

    /// The stored JSON state of `entity_id`.
    pub fn entity(&self, entity_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.with_view(|view| {
            Ok(view
                .entities
                .get(entity_id)
                .map_err(redb_error)?
                .map(|value| value.value().to_vec()))
        })
    }

    /// The stored seen entry of `event_id`.
    pub fn seen(&self, event_id: &str) -> Result<Option<SeenEvent>, StoreError> {
        self.with_view(|view| {
            view.seen
                .get(event_id)
                .map_err(redb_error)?
                .map(|value| decode_seen(event_id, value.value()))
                .transpose()
        })
    }

    /// Up to `limit` ids whose expiry is before `now_secs`, oldest first: the expiry index is
    /// read from its start, so a sweep costs what expired, not the size of the seen-set.
    pub fn expired_ids(&self, now_secs: i64, limit: usize) -> Result<Vec<String>, StoreError> {
        let end = expiry_key(now_secs, "");
        self.with_view(|view| {
            let mut ids = Vec::new();
            for entry in view.expiry.range(..end.as_slice()).map_err(redb_error)? {
                if ids.len() >= limit {
                    break;
                }
                let (key, _) = entry.map_err(redb_error)?;
                let id = key.value().get(8..).unwrap_or_default();
                ids.push(String::from_utf8_lossy(id).into_owned());
            }
            Ok(ids)
        })
    }

    /// (entities, seen ids) stored.
    pub fn counts(&self) -> Result<(u64, u64), StoreError> {
        self.with_view(|view| {
            Ok((
                view.entities.len().map_err(redb_error)?,
                view.seen.len().map_err(redb_error)?,
            ))
        })
    }

    pub fn checkpoint(&self) -> Result<Option<Checkpoint>, StoreError> {
        let txn = self.store.db.begin_read().map_err(redb_error)?;
        let table = txn.open_table(CHECKPOINTS).map_err(redb_error)?;
        Ok(table
            .get(self.names.checkpoint_key.as_str())
            .map_err(redb_error)?
            .map(|value| {
                let (next_offset, written_at_ms) = value.value();
                Checkpoint {
                    next_offset,
                    written_at_ms,
                }
            }))
    }

    /// Writes `changes` in one store transaction, with the checkpoint `covers` (the changelog
    /// offset up to which the store then equals the changelog) when given. A write with a
    /// checkpoint is fsynced; one without is not (see the module doc).
    pub fn write(&self, changes: &StateChanges, covers: Option<i64>) -> Result<(), StoreError> {
        // The snapshot must not pin the pages this write replaces.
        self.view.borrow_mut().take();
        let mut txn = self.store.db.begin_write().map_err(redb_error)?;
        txn.set_durability(if covers.is_some() {
            Durability::Immediate
        } else {
            Durability::None
        })
        .map_err(redb_error)?;
        {
            let mut entities = txn.open_table(self.names.entities()).map_err(redb_error)?;
            for (entity_id, state) in &changes.entities {
                match state {
                    Some(state) => entities.insert(entity_id.as_str(), state.as_slice()),
                    None => entities.remove(entity_id.as_str()),
                }
                .map_err(redb_error)?;
            }
            let mut seen = txn.open_table(self.names.seen()).map_err(redb_error)?;
            let mut expiry = txn.open_table(self.names.expiry()).map_err(redb_error)?;
            for (event_id, entry) in &changes.seen {
                // Replaced or deleted: its old expiry entry goes with it.
                let old = match entry {
                    Some(entry) => seen.insert(event_id.as_str(), encode_seen(entry).as_slice()),
                    None => seen.remove(event_id.as_str()),
                }
                .map_err(redb_error)?
                .map(|value| decode_seen(event_id, value.value()))
                .transpose()?;
                if let Some(old) = old {
                    expiry
                        .remove(expiry_key(old.expires_at, event_id).as_slice())
                        .map_err(redb_error)?;
                }
                if let Some(entry) = entry {
                    expiry
                        .insert(expiry_key(entry.expires_at, event_id).as_slice(), ())
                        .map_err(redb_error)?;
                }
            }
            if let Some(next_offset) = covers {
                let mut checkpoints = txn.open_table(CHECKPOINTS).map_err(redb_error)?;
                checkpoints
                    .insert(
                        self.names.checkpoint_key.as_str(),
                        (next_offset, now_unix_ms()),
                    )
                    .map_err(redb_error)?;
            }
        }
        txn.commit().map_err(redb_error)?;
        Ok(())
    }

    /// Forgets this partition's state and checkpoint, before a full restore.
    pub fn clear(&self) -> Result<(), StoreError> {
        self.view.borrow_mut().take();
        let txn = self.store.db.begin_write().map_err(redb_error)?;
        txn.delete_table(self.names.entities())
            .map_err(redb_error)?;
        txn.delete_table(self.names.seen()).map_err(redb_error)?;
        txn.delete_table(self.names.expiry()).map_err(redb_error)?;
        txn.open_table(CHECKPOINTS)
            .map_err(redb_error)?
            .remove(self.names.checkpoint_key.as_str())
            .map_err(redb_error)?;
        txn.commit().map_err(redb_error)?;
        self.create_tables()
    }
}

pub fn now_unix_ms() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp_nanos() as i64 / 1_000_000
}

/// The directory of one instance's store: `<state_dir>/<group>.<instance id>`, so two instances
/// (which differ by instance id) never share one, and the same instance restarted finds its own.
pub fn instance_dir(state_dir: &Path, group_id: &str, instance_id: &str) -> PathBuf {
    let safe = |name: &str| -> String {
        name.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    state_dir.join(format!("{}.{}", safe(group_id), safe(instance_id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(expires_at: i64) -> SeenEvent {
        SeenEvent::applied(
            Fingerprint::of_json(&serde_json::json!({"n": expires_at})),
            expires_at,
        )
    }

    #[test]
    fn the_expiry_index_follows_every_write() -> Result<(), StoreError> {
        let store = StateStore::in_memory()?;
        let partition = store.partition("changelog", 0)?;
        let changes = StateChanges {
            entities: vec![("a".into(), Some(b"{}".to_vec()))],
            seen: vec![
                ("e-1".into(), Some(seen(-5))),
                ("e-2".into(), Some(seen(10))),
                ("e-3".into(), Some(seen(20))),
            ],
        };
        partition.write(&changes, None)?;
        assert_eq!(partition.expired_ids(15, 100)?, ["e-1", "e-2"]);
        assert_eq!(partition.expired_ids(15, 1)?, ["e-1"], "the limit holds");
        // e-2 re-written with a later expiry, e-1 deleted: their old index entries go.
        partition.write(
            &StateChanges {
                entities: vec![],
                seen: vec![("e-2".into(), Some(seen(30))), ("e-1".into(), None)],
            },
            Some(7),
        )?;
        assert_eq!(partition.expired_ids(25, 100)?, ["e-3"]);
        assert_eq!(partition.seen("e-2")?, Some(seen(30)));
        assert_eq!(partition.seen("e-1")?, None);
        assert_eq!(partition.counts()?, (1, 2));
        assert_eq!(partition.checkpoint()?.map(|c| c.next_offset), Some(7));
        partition.clear()?;
        assert_eq!(partition.counts()?, (0, 0));
        assert_eq!(partition.checkpoint()?, None);
        assert!(partition.expired_ids(i64::MAX, 100)?.is_empty());
        Ok(())
    }

    #[test]
    fn a_store_survives_a_reopen_and_refuses_a_second_process() -> Result<(), StoreError> {
        let dir = std::env::temp_dir().join(format!(
            "eos-state-store-test-{}-{}",
            std::process::id(),
            now_unix_ms()
        ));
        {
            let store = StateStore::open(&dir)?;
            let partition = store.partition("changelog", 2)?;
            partition.write(
                &StateChanges {
                    entities: vec![("a".into(), Some(b"{\"total\":1}".to_vec()))],
                    seen: vec![("e-1".into(), Some(seen(10)))],
                },
                Some(42),
            )?;
            // The same file open twice (another process, in effect) is refused by redb's lock.
            let second = StateStore::open(&dir);
            assert!(
                matches!(&second, Err(StoreError::Open { detail, .. }) if detail.contains("another process")),
                "{second:?}"
            );
            // A partition of another changelog in the same store is dropped on request.
            store.partition("old-changelog", 0)?.write(
                &StateChanges {
                    entities: vec![("x".into(), Some(b"{}".to_vec()))],
                    seen: vec![],
                },
                Some(1),
            )?;
            assert_eq!(store.drop_changelogs_except(Some("changelog"))?, 3);
        }
        let store = StateStore::open(&dir)?;
        let partition = store.partition("changelog", 2)?;
        assert_eq!(partition.entity("a")?, Some(b"{\"total\":1}".to_vec()));
        assert_eq!(partition.seen("e-1")?, Some(seen(10)));
        assert_eq!(partition.checkpoint()?.map(|c| c.next_offset), Some(42));
        assert_eq!(store.partition("old-changelog", 0)?.counts()?, (0, 0));
        drop(partition);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn expiry_keys_sort_by_time_then_id() {
        let mut keys = [
            expiry_key(5, "b"),
            expiry_key(-1, "z"),
            expiry_key(5, "a"),
            expiry_key(1_800_000_000, "a"),
        ];
        keys.sort();
        assert_eq!(
            keys,
            [
                expiry_key(-1, "z"),
                expiry_key(5, "a"),
                expiry_key(5, "b"),
                expiry_key(1_800_000_000, "a"),
            ]
        );
    }
}
