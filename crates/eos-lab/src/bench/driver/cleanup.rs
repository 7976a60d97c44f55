//! The topics and groups the benchmark made: deleted as it goes and at the end, patiently when
//! a static member's session must expire first.

// The driver's state, constants and imports: this is one more `impl Bench`, split by phase.
use super::*;

impl Bench {
    pub(super) fn check_interrupted(&self) -> anyhow::Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        Ok(())
    }

    /// Deletes topics as soon as a run is done with them (the 1 KB rounds write gigabytes).
    pub(super) fn delete_now(&mut self, topics: &[String]) -> anyhow::Result<()> {
        if self.options.keep_topics {
            return Ok(());
        }
        self.delete_topics(topics)?;
        self.topics.retain(|t| !topics.contains(t));
        Ok(())
    }

    pub(super) fn delete_topics(&self, topics: &[String]) -> anyhow::Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let admin = self.admin()?;
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let results = self
            .runtime
            .block_on(admin.delete_topics(&names, &options))
            .map_err(|e| self.settings.unreachable(e))?;
        for result in results {
            match result {
                Ok(topic) => tracing::debug!(topic, "deleted topic"),
                // Never created (the run failed before the processor got to it): nothing to do.
                Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((topic, code)) => bail!("cannot delete topic {topic:?}: {code}"),
            }
        }
        Ok(())
    }

    /// Deletes the remaining topics, the schema subjects and the consumer groups. A group whose
    /// static member's session has not expired yet cannot be deleted: that is retried for a
    /// while after a successful run, and left to the broker's offset retention otherwise.
    pub(super) fn clean_up(&mut self, patient: bool) -> anyhow::Result<()> {
        let topics = std::mem::take(&mut self.topics);
        self.delete_topics(&topics)?;
        if let Some(registry) = &mut self.registry {
            registry.delete_subjects();
        }
        let admin = self.admin()?;
        let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let deadline = Instant::now() + GROUP_DELETE_PATIENCE;
        let mut remaining = std::mem::take(&mut self.groups);
        while !remaining.is_empty() {
            let names: Vec<&str> = remaining.iter().map(String::as_str).collect();
            let results = self
                .runtime
                .block_on(admin.delete_groups(&names, &options))
                .map_err(|e| self.settings.unreachable(e))?;
            let mut busy = Vec::new();
            for result in results {
                match result {
                    Ok(_) | Err((_, RDKafkaErrorCode::GroupIdNotFound)) => {}
                    Err((group, RDKafkaErrorCode::NonEmptyGroup)) => busy.push(group),
                    Err((group, code)) => {
                        tracing::warn!(group, %code, "cannot delete consumer group");
                    }
                }
            }
            remaining = busy;
            if remaining.is_empty() || !patient || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        if !remaining.is_empty() {
            tracing::info!(
                groups = ?remaining,
                "consumer groups still had a member's session open and were left to expire"
            );
        }
        tracing::info!("deleted the benchmark's topics");
        Ok(())
    }

    pub(super) fn admin(&self) -> anyhow::Result<AdminClient<DefaultClientContext>> {
        self.settings
            .client_config()
            .create()
            .context("cannot create a Kafka admin client")
    }
}
