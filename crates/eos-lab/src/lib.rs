//! `eos-lab`, the lab of eos-suite: what shows and measures the product rather than operates it.
//! `demo` runs the whole pipeline under faults and audits it; `bench` measures each service and
//! the whole chain. Both run the real service binaries as child processes (the ones next to this
//! binary) against the real broker and PostgreSQL, and use eosctl's operator code — its
//! producer, lag watch, audit and trace — in-process, so the lab checks with exactly what an
//! operator runs.
//!
//! [`bench`](mod@bench) is `bench processor` (its figures in [`bench::figures`], pure and
//! unit-tested) and `bench pipeline`; `chain` starts the services of the demo and of the
//! pipeline benchmark; [`commands`] holds one module per subcommand, which puts these together
//! and prints the result.

pub mod bench;
pub(crate) mod chain;
pub mod cli;
pub mod commands;

pub use cli::{BenchArgs, BenchTarget, Cli, Command};
pub use commands::run;
