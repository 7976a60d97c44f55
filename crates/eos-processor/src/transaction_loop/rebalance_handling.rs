//! What a rebalance does to the loop: its callbacks run inside `poll`, which only records them
//! (`eos_runtime::rebalance`); they are handled here when `poll` returns, before the record it
//! returned. A revoke drops the uncommitted batch and aborts the open transaction that holds
//! outputs of the revoked partitions; an assignment restores each partition's state first
//! (docs/architecture/loop-invariants.md, "Loop invariants").

use metrics::gauge;
use rdkafka::Message as _;
use rdkafka::consumer::Consumer;
use tracing::{info, warn};

use eos_runtime::rebalance::RebalanceEvent;

use super::TransactionLoop;
use crate::batch::Batch;
use crate::error::ProcessorError;
use crate::metrics as m;
use crate::transform::Transform;

impl<T: Transform> TransactionLoop<T> {
    pub(super) fn handle_rebalance_events(&mut self) -> Result<(), ProcessorError> {
        for event in self.consumer.context().take() {
            match event {
                RebalanceEvent::Revoked { partitions, lost } => {
                    // The uncommitted batch goes (see the module doc), and with it the open
                    // transaction holding its outputs.
                    let transaction_open = self.batch.transaction_open();
                    if !self.batch.is_empty() {
                        info!(
                            records = self.batch.records_in(),
                            lost,
                            transaction_open,
                            "dropping the uncommitted batch: partitions revoked"
                        );
                    }
                    self.batch = Batch::default();
                    // Records held for the schema registry go too: their next owner reads them.
                    self.held
                        .retain(|held| !partitions.contains(&held.partition()));
                    for partition in &partitions {
                        self.states.revoke(*partition);
                        self.committed_next.remove(partition);
                    }
                    if transaction_open {
                        warn!(
                            ?partitions,
                            lost,
                            "aborting the open transaction: it holds outputs of revoked \
                             partitions, which their next owner writes"
                        );
                        let after = self.committer.abort(&self.consumer)?;
                        self.recover(after)?;
                    }
                    info!(?partitions, lost, "partitions revoked");
                    self.readiness.set(false);
                }
                RebalanceEvent::Assigned { partitions } => {
                    info!(?partitions, "partitions assigned; restoring state");
                    for &partition in &partitions {
                        self.states.restore(partition, &self.transform)?;
                    }
                    self.readiness.set(true);
                }
            }
        }
        gauge!(m::ASSIGNED_PARTITIONS).set(self.states.len() as f64);
        Ok(())
    }
}
