//! A position in the sink's input topic, in Kafka's convention for committed offsets.

/// Where reading one partition of the input resumes. `next_offset` is the offset of the next
/// record to read (past the last record written, and past any transaction markers or aborted
/// records behind it), never the last one read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InputPosition {
    pub topic: String,
    pub partition: i32,
    pub next_offset: i64,
}
