//! fumarole's configuration file, for every binary: `apiVersion: fumarole.dev/v1alpha1`, a
//! `kind` per binary (`AgentConfiguration`, `SchedulerExtConfiguration`) and one section per
//! subcommand, whose fields are that subcommand's long flags in camelCase:
//!
//! ```yaml
//! apiVersion: fumarole.dev/v1alpha1
//! kind: AgentConfiguration
//! run:
//!   compatLabels: true
//!   recheckInterval: 10s
//!   awaitDeviceChoiceFrom: [volcano]
//! ```
//!
//! The fields are not declared here: they are read off the binary's clap `Command`, and each
//! value is checked by its flag's own value parser, so a flag added in any crate is a setting
//! with no code here. Flags given on the command line or by environment variable win over the
//! file; the file wins over the flags' defaults.
//!
//! Start at [`file::Configuration::parse`] (pure: the file's text in, the arguments it stands
//! for out, or an error naming the field's path); [`cli`] wires it into a binary's argument
//! parsing (`--config FILE` on the subcommands that read one, `config check FILE`).

pub mod cli;
pub mod file;

pub use cli::Spec;
pub use file::{API_VERSION, Configuration, Error, Setting};

#[cfg(test)]
mod testing;
