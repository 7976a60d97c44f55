//! The words the demo's commands are run with: in-process subcommands parsed as their command
//! lines would be, the services' arguments, and the progress lines for people.

/// Progress for people: plain lines on stderr.
pub(super) fn say(line: impl AsRef<str>) {
    eprintln!("{}", line.as_ref());
}

/// A subcommand's arguments from the words a user would type after it: the demo runs `produce`
/// and `audit` in-process with exactly the defaults of their command lines.
pub(super) fn command_args<A: clap::Args + clap::FromArgMatches>(
    words: &[&str],
) -> anyhow::Result<A> {
    let matches = A::augment_args(clap::Command::new("eos-lab"))
        .try_get_matches_from(std::iter::once("eos-lab").chain(words.iter().copied()))?;
    Ok(A::from_arg_matches(&matches)?)
}

/// Owned copies of command-line words.
pub(super) fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use eosctl::cli::{AuditArgs, ProduceArgs};

    use super::*;

    #[test]
    fn in_process_commands_get_their_command_line_defaults() -> anyhow::Result<()> {
        let produce: ProduceArgs =
            command_args(&["--topic", "t", "--count", "10", "--bad-ratio", "0.005"])?;
        assert_eq!((produce.entities, produce.value_bytes), (100, 200));
        assert_eq!(produce.bad_ratio, 0.005);
        assert_eq!(produce.delivery_timeout, Duration::from_secs(60));
        let audit: AuditArgs = command_args(&[
            "--input",
            "i",
            "--output",
            "o",
            "--database-url",
            "postgres://h/d",
        ])?;
        assert_eq!(audit.sink_table, "event_sink");
        assert_eq!(audit.dedup_horizon, Duration::from_secs(7 * 24 * 3600));
        assert!(command_args::<ProduceArgs>(&["--topic", "t", "--count", "x"]).is_err());
        Ok(())
    }
}
