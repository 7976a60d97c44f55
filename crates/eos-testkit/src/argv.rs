//! Command lines for the services, built from their own clap types, so a test that starts a
//! service names its flags through the service's `Config`: a renamed or removed field fails to
//! compile, and a renamed flag is looked up, not spelled.
//!
//! ```
//! # #[derive(clap::Parser)]
//! # struct Config {
//! #     #[arg(long)]
//! #     input_topic: String,
//! #     #[arg(long, action = clap::ArgAction::SetTrue)]
//! #     skip_migrations: bool,
//! # }
//! let argv = eos_testkit::argv!(Config {
//!     input_topic: "payments",
//!     skip_migrations: true,
//! });
//! assert_eq!(argv, ["--input-topic", "payments", "--skip-migrations"]);
//! ```

use clap::CommandFactory;

/// A flag's value: text, or a switch that is given (`true`) or left out (`false`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlagValue {
    Text(String),
    Switch(bool),
}

impl From<&str> for FlagValue {
    fn from(value: &str) -> Self {
        Self::Text(value.to_owned())
    }
}

impl From<String> for FlagValue {
    fn from(value: String) -> Self {
        Self::Text(value)
    }
}

impl From<&String> for FlagValue {
    fn from(value: &String) -> Self {
        Self::Text(value.clone())
    }
}

impl From<bool> for FlagValue {
    fn from(value: bool) -> Self {
        Self::Switch(value)
    }
}

macro_rules! numbers_as_text {
    ($($number:ty),*) => {$(
        impl From<$number> for FlagValue {
            fn from(value: $number) -> Self {
                Self::Text(value.to_string())
            }
        }
    )*};
}
numbers_as_text!(i32, i64, u16, u32, u64, usize);

/// Appends the flag of `C`'s argument `field` (a field path as [`argv!`](crate::argv!) writes it, e.g.
/// `kafka . bootstrap_servers`; the argument is its last field) with `value`.
///
/// # Panics
/// When `C` has no argument with that id, or one without a long flag: the test is wrong.
pub fn push_flag<C: CommandFactory>(argv: &mut Vec<String>, field: &str, value: FlagValue) {
    let id = field.rsplit('.').next().unwrap_or(field).trim();
    let command = C::command();
    let long = command
        .get_arguments()
        .find(|arg| arg.get_id() == id)
        .and_then(|arg| arg.get_long())
        .unwrap_or_else(|| panic!("{} has no flag for the field {id}", command.get_name()));
    match value {
        FlagValue::Text(text) => argv.extend([format!("--{long}"), text]),
        FlagValue::Switch(true) => argv.push(format!("--{long}")),
        FlagValue::Switch(false) => {}
    }
}

/// The name of `C`'s clap command: the word that runs a subcommand, e.g. `migrate` of
/// `eos_runtime::service_flags::MigrateArgs`.
pub fn command_name<C: CommandFactory>() -> String {
    C::command().get_name().to_owned()
}

/// The command line `--flag value …` of a service's clap type from its field names:
/// `argv!(eos_processor::Config { kafka.bootstrap_servers: &bootstrap, input_topic: "in" })`.
/// Each field is named through the type, so a renamed or removed field is a compile error; each
/// flag is looked up in the type's clap command ([`push_flag`]).
///
/// A flattened group whose flags are not fields of its type (it is built from private clap
/// arguments, like `eos_runtime::secrets::DatabaseUrlFlags`) names the group's field and the
/// flag's clap id in brackets: `database[database_url]: &url` checks that `database` is a field
/// at compile time and looks up the argument `database_url` in the command.
///
/// `argv!(subcommand Args { … })` is the command line of a subcommand whose flags are `Args`:
/// the command's name first (`migrate`), then its flags.
#[macro_export]
macro_rules! argv {
    (subcommand $config:ty { $($fields:tt)* }) => {{
        let mut argv = ::std::vec![$crate::argv::command_name::<$config>()];
        argv.extend($crate::argv!($config { $($fields)* }));
        argv
    }};
    ($config:ty { $($($field:ident).+ $([$flag:ident])? : $value:expr),* $(,)? }) => {{
        #[allow(dead_code, clippy::no_effect_underscore_binding)]
        fn fields_exist(config: &$config) {
            $( let _ = &config.$($field).+; )*
        }
        let mut argv: ::std::vec::Vec<::std::string::String> = ::std::vec::Vec::new();
        $(
            $crate::argv::push_flag::<$config>(
                &mut argv,
                concat!(stringify!($($field).+) $(, ".", stringify!($flag))?),
                $crate::argv::FlagValue::from($value),
            );
        )*
        argv
    }};
}

#[cfg(test)]
mod tests {
    use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser};

    #[derive(Debug, Args)]
    struct KafkaFlags {
        #[arg(long = "bootstrap-servers")]
        bootstrap_servers: String,
    }

    #[derive(Debug, Parser)]
    #[command(name = "service")]
    struct Config {
        #[command(flatten)]
        kafka: KafkaFlags,
        #[arg(long)]
        input_topic: String,
        #[arg(long = "max-batch")]
        batch: usize,
        #[arg(long, action = clap::ArgAction::SetTrue)]
        dry_run: bool,
        #[command(flatten)]
        database: DatabaseFlags,
    }

    /// A group built from private arguments, as `eos_runtime::secrets::DatabaseUrlFlags` is: its
    /// flag is no field of its type.
    #[derive(Debug)]
    struct DatabaseFlags {
        url: String,
    }

    #[derive(Debug, Args)]
    struct DatabaseArgs {
        #[arg(long)]
        database_url: Option<String>,
    }

    impl clap::FromArgMatches for DatabaseFlags {
        fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
            let args = DatabaseArgs::from_arg_matches(matches)?;
            Ok(Self {
                url: args.database_url.unwrap_or_default(),
            })
        }

        fn update_from_arg_matches(
            &mut self,
            matches: &clap::ArgMatches,
        ) -> Result<(), clap::Error> {
            *self = Self::from_arg_matches(matches)?;
            Ok(())
        }
    }

    impl Args for DatabaseFlags {
        fn augment_args(cmd: clap::Command) -> clap::Command {
            DatabaseArgs::augment_args(cmd)
        }

        fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
            DatabaseArgs::augment_args_for_update(cmd)
        }
    }

    #[test]
    fn flags_come_from_the_clap_type_and_parse_back() {
        let argv = argv!(Config {
            kafka.bootstrap_servers: "127.0.0.1:9092",
            input_topic: String::from("in"),
            batch: 5usize,
            dry_run: true,
        });
        assert_eq!(
            argv,
            [
                "--bootstrap-servers",
                "127.0.0.1:9092",
                "--input-topic",
                "in",
                "--max-batch",
                "5",
                "--dry-run"
            ]
        );
        let parsed = Config::try_parse_from(std::iter::once("service".to_owned()).chain(argv))
            .expect("the command line parses");
        assert_eq!(parsed.kafka.bootstrap_servers, "127.0.0.1:9092");
        assert_eq!(parsed.batch, 5);
        assert!(parsed.dry_run);
    }

    #[test]
    fn a_group_without_fields_names_its_flag_by_id() {
        let argv = argv!(Config {
            kafka.bootstrap_servers: "k:9092",
            input_topic: "in",
            batch: 1usize,
            database[database_url]: "postgres://h/db",
        });
        assert_eq!(
            argv,
            [
                "--bootstrap-servers",
                "k:9092",
                "--input-topic",
                "in",
                "--max-batch",
                "1",
                "--database-url",
                "postgres://h/db"
            ]
        );
        let parsed = Config::try_parse_from(std::iter::once("service".to_owned()).chain(argv))
            .expect("the command line parses");
        assert_eq!(parsed.database.url, "postgres://h/db");
    }

    #[test]
    #[should_panic(expected = "service has no flag for the field database_password")]
    fn a_bracketed_flag_that_does_not_exist_is_refused() {
        let _ = argv!(Config {
            database[database_password]: "x"
        });
    }

    /// A subcommand's own flags, as `eos_runtime::service_flags::MigrateArgs` are.
    #[derive(Debug, Parser)]
    #[command(name = "migrate")]
    struct Migrate {
        #[command(flatten)]
        database: DatabaseFlags,
    }

    #[test]
    fn a_subcommand_comes_first_with_its_own_flags() {
        let argv = argv!(subcommand Migrate {
            database[database_url]: "postgres://h/db"
        });
        assert_eq!(argv, ["migrate", "--database-url", "postgres://h/db"]);
        // As eos_runtime::service_flags::Invocation builds it.
        let command = Config::command()
            .subcommand(Migrate::command())
            .subcommand_negates_reqs(true);
        let matches = command
            .try_get_matches_from(std::iter::once("service".to_owned()).chain(argv))
            .expect("the command line parses");
        let (name, migrate) = matches.subcommand().expect("a subcommand");
        assert_eq!(name, "migrate");
        let migrate = Migrate::from_arg_matches(migrate).expect("its flags parse");
        assert_eq!(migrate.database.url, "postgres://h/db");
    }

    #[test]
    fn a_switch_set_false_is_left_out() {
        let argv = argv!(Config {
            input_topic: "in",
            dry_run: false
        });
        assert_eq!(argv, ["--input-topic", "in"]);
    }

    #[test]
    #[should_panic(expected = "service has no flag for the field kafka")]
    fn a_field_that_is_no_flag_is_refused() {
        let _ = argv!(Config { kafka: "x" });
    }
}
