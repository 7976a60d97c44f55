//! The checkpoint and fence rules of `--offsets postgres`, without I/O: the single statement of
//! each rule, used by the loop and the batch writer, by the model checker (`crates/eos-model`,
//! docs/MODEL_CHECKING.md "The sink checkpoint model"), and compared with the SQL that must repeat
//! them (`checkpoint_store.rs`) by `integration-tests`' `sink_rules` on a table of cases.
//!
//! The protocol (docs/ARCHITECTURE.md): a new owner fences a partition (bumps its owner epoch)
//! and only then reads its checkpoint; a batch moves the checkpoint, under the epoch its owner
//! holds, in the same transaction as its rows; a move whose epoch is no longer the row's matches
//! nothing, and the whole batch rolls back.

/// The owner epoch of a partition's first fence (the row did not exist).
pub const FIRST_EPOCH: i64 = 1;

/// The epoch a fence leaves on a partition whose row held `previous` (`None`: no row yet). The
/// SQL of `checkpoint_store::fence` states it as `INSERT .. 1 .. ON CONFLICT DO UPDATE SET
/// owner_epoch = owner_epoch + 1`.
pub fn fenced_epoch(previous: Option<i64>) -> i64 {
    previous.map_or(FIRST_EPOCH, |epoch| epoch + 1)
}

/// Whether a batch holding `held_epoch` may move a checkpoint whose row holds `row_epoch`: only
/// if no one fenced the partition since this owner did. The SQL of `checkpoint_store::advance`
/// states it as `WHERE c.owner_epoch = m.epoch`.
pub fn may_advance(row_epoch: i64, held_epoch: i64) -> bool {
    row_epoch == held_epoch
}

/// The partitions of a batch's moves (`moving`) whose checkpoint did not move (`moved` is what the
/// guarded update matched): a newer owner fenced them. Not empty: the batch rolls back, rows and
/// all, and this instance stops those partitions.
pub fn fenced_partitions(moving: &[i32], moved: &[i32]) -> Vec<i32> {
    moving
        .iter()
        .copied()
        .filter(|partition| !moved.contains(partition))
        .collect()
}

/// Whether a record at `offset` goes into the batch of a partition whose next expected offset is
/// `next` (`None`: none read since positioning). Kafka may hand out records from before the
/// position the partition was sought to (a fetch in flight across a seek); those were committed
/// by an earlier batch or are about to be read again, and are dropped.
pub fn accepts_record(next: Option<i64>, offset: i64) -> bool {
    next.is_none_or(|next| offset >= next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_creates_at_the_first_epoch_then_bumps() {
        assert_eq!(fenced_epoch(None), FIRST_EPOCH);
        assert_eq!(fenced_epoch(Some(1)), 2);
        assert_eq!(fenced_epoch(Some(41)), 42);
    }

    #[test]
    fn only_the_current_epoch_advances() {
        assert!(may_advance(3, 3));
        assert!(!may_advance(4, 3), "fenced since");
        assert!(!may_advance(3, 4));
    }

    #[test]
    fn unmoved_partitions_are_the_fenced_ones() {
        assert_eq!(fenced_partitions(&[0, 1, 2], &[2, 0]), vec![1]);
        assert!(fenced_partitions(&[0, 1], &[0, 1]).is_empty());
        assert!(fenced_partitions(&[], &[]).is_empty());
    }

    #[test]
    fn records_before_the_position_are_dropped() {
        assert!(accepts_record(None, 0));
        assert!(accepts_record(Some(3), 3));
        assert!(accepts_record(Some(3), 5));
        assert!(!accepts_record(Some(3), 2));
    }
}
