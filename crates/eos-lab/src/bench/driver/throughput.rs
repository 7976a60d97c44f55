//! The throughput phase: each size's rounds (exactly-once, at-least-once, pass-through, the
//! record formats) and the single-record round, each a processor over the same input.

// The driver's state, constants and imports: this is one more `impl Bench`, split by phase.
use super::*;

impl Bench {
    /// Exactly-once, at-least-once and pass-through rounds, interleaved, over one input of
    /// `size`-byte records; and in each round an exactly-once round over the same events in each
    /// registry format of `--format`.
    pub(super) fn throughput(&mut self, size: usize) -> anyhow::Result<SizeThroughput> {
        let input = self.name(&format!("{size}b-in"));
        tracing::info!(topic = %input, records = self.options.records, value_bytes = size, "writing the input");
        let spec = self.workload_spec(self.options.records, size, self.seed_base + size as u64);
        let summary = self.produce_spec(&input, spec.clone(), 0)?;
        let (partitions, target) = self.input_extent(&input)?;
        let mut format_inputs = Vec::new();
        for format in self.options.registry_formats().collect::<Vec<_>>() {
            format_inputs.push(self.format_input(format, size, &spec, target)?);
        }

        let mut rounds = RoundsOfSize {
            formats: vec![Vec::new(); format_inputs.len()],
            ..RoundsOfSize::default()
        };
        for round in 1..=self.options.rounds {
            self.json_rounds(size, round, (&input, &partitions, target), &mut rounds)?;
            for (format_input, figures) in format_inputs.iter().zip(&mut rounds.formats) {
                figures.push(self.format_round(size, round, format_input, target)?);
            }
        }
        let mut inputs = vec![input];
        inputs.extend(format_inputs.iter().map(|input| input.topic.clone()));
        self.delete_now(&inputs)?;
        Ok(size_throughput(size, &summary, rounds, &format_inputs))
    }

    /// One round of each JSON path over `input`: exactly-once, at-least-once, pass-through.
    pub(super) fn json_rounds(
        &mut self,
        size: usize,
        round: u32,
        (input, partitions, target): (&str, &[i32], i64),
        rounds: &mut RoundsOfSize,
    ) -> anyhow::Result<()> {
        for guarantee in [Guarantee::ExactlyOnce, Guarantee::AtLeastOnce] {
            let short = match guarantee {
                Guarantee::ExactlyOnce => "eo",
                Guarantee::AtLeastOnce => "alo",
            };
            let run = self.processor_run(
                &format!("{size}b-{short}-{round}"),
                guarantee,
                self.options.max_batch,
                input,
            );
            let figures = self.drain(&run, self.options.instances, partitions, target)?;
            tracing::info!(
                value_bytes = size,
                round,
                %guarantee,
                records_per_second = figures.records_per_second.round(),
                measured_seconds = figures.measured_seconds,
                "throughput round done"
            );
            match guarantee {
                Guarantee::ExactlyOnce => rounds.exactly_once.push(figures),
                Guarantee::AtLeastOnce => rounds.at_least_once.push(figures),
            }
        }
        let figures = self.pass_through(input, &format!("{size}b-copy-{round}"), partitions)?;
        tracing::info!(
            value_bytes = size,
            round,
            records_per_second = figures.records_per_second.round(),
            measured_seconds = figures.measured_seconds,
            "pass-through round done"
        );
        rounds.pass_through.push(figures);
        Ok(())
    }

    /// Writes the events of `spec` (the JSON input's, of `json_target` records) in `format` to a
    /// topic of its own, with the input schema registered under its subject.
    pub(super) fn format_input(
        &mut self,
        format: RecordFormat,
        size: usize,
        spec: &WorkloadSpec,
        json_target: i64,
    ) -> anyhow::Result<FormatInput> {
        let topic = self.name(&format!("{size}b-{format}-in"));
        self.topics.push(topic.clone());
        let (id, schema) = self.registry()?.register_input(format, &WORKLOAD, &topic)?;
        let records = encode_workload(spec.clone(), &schema, id)?;
        tracing::info!(%topic, %format, schema_id = %id, records = records.len(), "writing the input");
        let summary = self
            .write_records(&topic, 0, spec.seed, records)
            .with_context(|| format!("producing the {format} input to topic {topic:?}"))?;
        let (partitions, target) = self.input_extent(&topic)?;
        if target != json_target {
            bail!("the {format} input has {target} records, the JSON input {json_target}");
        }
        Ok(FormatInput {
            format,
            topic,
            partitions,
            mean_value_bytes: mean_value_bytes(&summary),
        })
    }

    /// One exactly-once round over a registry format's input, its outputs in that format too
    /// (the output schema registered under the round's output subject first).
    pub(super) fn format_round(
        &mut self,
        size: usize,
        round: u32,
        input: &FormatInput,
        target: i64,
    ) -> anyhow::Result<RoundFigures> {
        let mut run = self.processor_run(
            &format!("{size}b-{}-eo-{round}", input.format),
            Guarantee::ExactlyOnce,
            self.options.max_batch,
            &input.topic,
        );
        run.format = self
            .registry()?
            .output_format(input.format, &WORKLOAD, &run.output)?;
        let figures = self.drain(&run, self.options.instances, &input.partitions, target)?;
        tracing::info!(
            value_bytes = size,
            round,
            format = %input.format,
            records_per_second = figures.records_per_second.round(),
            measured_seconds = figures.measured_seconds,
            "throughput round done"
        );
        Ok(figures)
    }

    pub(super) fn registry(&mut self) -> anyhow::Result<&mut SchemaRegistry> {
        self.registry
            .as_mut()
            .context("a registry format needs --schema-registry-url")
    }

    /// One pass-through round: a plain copy of `input` into a fresh topic of the same layout.
    pub(super) fn pass_through(
        &mut self,
        input: &str,
        label: &str,
        partitions: &[i32],
    ) -> anyhow::Result<RoundFigures> {
        let (output, ends) = self.copy_output(input, &format!("{label}-out"), partitions)?;
        let figures = pass_through::copy(
            &self.settings,
            input,
            &output,
            &ends,
            self.options.stall_timeout,
            &self.stop,
        )?;
        self.delete_now(&[output])?;
        Ok(figures)
    }

    /// A fresh topic `label` with the layout of `input`, for a copy of it made inside this
    /// process, and the end offset of each of `input`'s partitions: where the copy stops.
    pub(super) fn copy_output(
        &mut self,
        input: &str,
        label: &str,
        partitions: &[i32],
    ) -> anyhow::Result<(String, BTreeMap<i32, i64>)> {
        let output = self.name(label);
        self.topics.push(output.clone());
        self.runtime
            .block_on(ensure_topic(&self.settings, &output, self.layout()))
            .with_context(|| format!("creating topic {output:?}"))?;
        let metadata = self.settings.metadata_client()?;
        let ends = watermarks(&self.settings, &metadata, input, partitions)?
            .into_iter()
            .map(|(partition, (_, end))| (partition, end))
            .collect();
        Ok((output, ends))
    }

    /// Exactly-once with one record per transaction.
    pub(super) fn single_record(&mut self, size: usize) -> anyhow::Result<SingleRecordFigures> {
        let records = self.options.single_records;
        let input = self.name("single-in");
        tracing::info!(topic = %input, records, "writing the single-record backlog");
        self.produce(&input, records, size, 0, self.seed_base + 1_000_000)?;
        let (partitions, target) = self.input_extent(&input)?;
        let run = self.processor_run("single", Guarantee::ExactlyOnce, 1, &input);
        let figures = self.drain(&run, 1, &partitions, target)?;
        let bare_transactions_per_second = self.single_record_copy(&input, &partitions)?;
        self.delete_now(&[input])?;
        tracing::info!(
            transactions_per_second = figures.records_per_second.round(),
            bare_transactions_per_second = bare_transactions_per_second.round(),
            "single-record run done"
        );
        Ok(SingleRecordFigures {
            records,
            value_bytes: size,
            transactions_per_second: figures.records_per_second,
            bare_transactions_per_second: Some(bare_transactions_per_second),
            target: SINGLE_RECORD_TARGET,
        })
    }

    /// The floor under the single-record run: the same input copied one record per transaction
    /// by the processor's producer with nothing else in the transaction
    /// ([`pass_through::single_record_transactions`]).
    pub(super) fn single_record_copy(
        &mut self,
        input: &str,
        partitions: &[i32],
    ) -> anyhow::Result<f64> {
        let (output, ends) = self.copy_output(input, "single-bare-out", partitions)?;
        self.groups.push(format!("{output}-copier"));
        let rate = pass_through::single_record_transactions(
            &self.settings,
            input,
            &output,
            &ends,
            self.options.stall_timeout,
            &self.stop,
        )?;
        self.delete_now(&[output])?;
        Ok(rate)
    }
}
