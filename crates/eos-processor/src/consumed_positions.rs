//! The input positions a batch has consumed, as the offsets its commit records.
//!
//! A committed offset is the next offset to read, never the last one read: a restarted reader
//! resumes exactly at the committed offset, so committing the last one read would process that
//! record twice.

use std::collections::HashMap;

use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

/// Per input partition, the offset to read next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ConsumedPositions {
    next_offsets: HashMap<i32, i64>,
}

impl ConsumedPositions {
    /// The record at `offset` of `partition` was read: the next to read is the one after it.
    pub(crate) fn read(&mut self, partition: i32, offset: i64) {
        self.next_offsets.insert(partition, offset + 1);
    }

    /// The consumer's position on `partition` is `next`: records it skipped without returning
    /// them (transaction markers, aborted records) are consumed too. Never moves backwards.
    pub(crate) fn advance_to(&mut self, partition: i32, next: i64) {
        let entry = self.next_offsets.entry(partition).or_insert(next);
        *entry = (*entry).max(next);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.next_offsets.is_empty()
    }

    /// The next offset to read per partition.
    pub(crate) fn next_offsets(&self) -> impl Iterator<Item = (i32, i64)> + '_ {
        self.next_offsets.iter().map(|(&p, &next)| (p, next))
    }

    /// The offsets to commit for `topic`, one per partition read.
    pub(crate) fn to_offsets(&self, topic: &str) -> Result<TopicPartitionList, KafkaError> {
        let mut offsets = TopicPartitionList::new();
        for (&partition, &next) in &self.next_offsets {
            offsets.add_partition_offset(topic, partition, Offset::Offset(next))?;
        }
        Ok(offsets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_the_offset_after_the_last_one_read() {
        let mut positions = ConsumedPositions::default();
        positions.read(0, 41);
        positions.read(0, 42);
        positions.read(3, 7);
        let offsets = positions.to_offsets("payments").expect("valid offsets");
        assert_eq!(offsets.count(), 2);
        let next = |partition| {
            offsets
                .find_partition("payments", partition)
                .map(|elem| elem.offset())
        };
        assert_eq!(next(0), Some(Offset::Offset(43)));
        assert_eq!(next(3), Some(Offset::Offset(8)));
    }

    #[test]
    fn a_position_past_markers_moves_the_offset_forward_only() {
        let mut positions = ConsumedPositions::default();
        positions.read(0, 41);
        positions.advance_to(0, 44);
        positions.advance_to(0, 40);
        positions.advance_to(1, 7);
        let next: HashMap<i32, i64> = positions.next_offsets().collect();
        assert_eq!(next, HashMap::from([(0, 44), (1, 7)]));
    }
}
