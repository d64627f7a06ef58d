//! The configuration file in a binary's argument parsing. A [`Spec`] says the file's `kind`
//! and which subcommands read which section; [`Spec::parse`] stands in for clap's
//! `Parser::parse`: it adds `--config FILE` to those subcommands, parses the command line once
//! to learn the file and which flags the command line or the environment already set, adds
//! the file's settings for the others, and parses again. [`Spec::check`] is the
//! `config check FILE` subcommand. This module reads the file; [`crate::file`] does the rest.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, Command, CommandFactory, FromArgMatches};

use crate::file::{self, CONFIG, Configuration};

/// How one binary reads its configuration file.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// The file's `kind`: `AgentConfiguration`.
    pub kind: &'static str,
    /// `(subcommand, section)`: the subcommands that take `--config FILE`, and the section
    /// each reads. A section holds the flags of the subcommand it is named after; another
    /// subcommand reading it (`explain` reading `serve`) takes the settings of the flags it
    /// shares.
    pub reads: &'static [(&'static str, &'static str)],
}

/// Why the configuration file could not be used; the `Display` names the file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("{}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: std::io::Error,
    },
    /// The file is not a configuration this binary takes.
    #[error("{}: {source}", file.display())]
    Invalid { file: PathBuf, source: file::Error },
    /// The settings of a section do not go together (a flag another one conflicts with or
    /// requires), as the section's command says.
    #[error("{}: {section}: {message}", file.display())]
    Rejected {
        file: PathBuf,
        section: String,
        message: String,
    },
}

/// Why a command line could not be parsed.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The command line itself (clap's error, with its usage text and exit code).
    #[error(transparent)]
    Clap(#[from] clap::Error),
    /// The file `--config` names.
    #[error(transparent)]
    File(#[from] FileError),
}

/// The `config` subcommand of a binary.
#[derive(clap::Args, Debug)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum ConfigCommand {
    /// Check a configuration file and print the command line each of its sections stands
    /// for, one argument per line.
    Check {
        /// The configuration file (YAML).
        file: PathBuf,
    },
}

impl Spec {
    /// `C`'s command with `--config FILE` on the subcommands that read the file, built (so
    /// global flags are each subcommand's too).
    pub fn command<C: CommandFactory>(&self) -> Command {
        let mut cmd = C::command();
        for (subcommand, _) in self.reads {
            cmd = cmd.mut_subcommand(*subcommand, |c| c.arg(config_arg()));
        }
        cmd.build();
        cmd
    }

    /// The command line of this process, with the settings of the file `--config` names;
    /// exits as clap does on a bad command line, and with `error: FILE: PATH: ...` and exit
    /// code 2 on a bad file.
    pub fn parse<P: FromArgMatches + CommandFactory>(&self) -> P {
        self.parse_from(std::env::args_os())
    }

    /// [`Spec::parse`] over `argv` (its first item the binary's name).
    pub fn parse_from<P, I, T>(&self, argv: I) -> P
    where
        P: FromArgMatches + CommandFactory,
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        match self.try_parse_from(argv) {
            Ok(parsed) => parsed,
            Err(ParseError::Clap(e)) => e.exit(),
            Err(ParseError::File(e)) => {
                eprintln!("error: {e}");
                std::process::exit(2)
            }
        }
    }

    /// [`Spec::parse_from`], returning the error.
    pub fn try_parse_from<P, I, T>(&self, argv: I) -> Result<P, ParseError>
    where
        P: FromArgMatches + CommandFactory,
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
        let mut cmd = self.command::<P>();
        let from_file = self.file_arguments(&cmd, &argv)?;
        // Before a `--`, if any, so they stay flags.
        let at = argv
            .iter()
            .skip(1)
            .position(|a| a == "--")
            .map_or(argv.len(), |p| p + 1);
        argv.splice(at..at, from_file);
        let matches = cmd.try_get_matches_from_mut(argv)?;
        P::from_arg_matches(&matches).map_err(|e| ParseError::Clap(e.format(&mut cmd)))
    }

    /// The arguments the file named on this command line adds to it (none without
    /// `--config`).
    fn file_arguments(&self, cmd: &Command, argv: &[OsString]) -> Result<Vec<OsString>, FileError> {
        // A first pass that does not stop at a missing flag the file may supply; a command
        // line that fails for other reasons fails again, with clap's message, in the second.
        let Ok(matches) = cmd.clone().ignore_errors(true).try_get_matches_from(argv) else {
            return Ok(Vec::new());
        };
        let Some((name, sub)) = matches.subcommand() else {
            return Ok(Vec::new());
        };
        let Some((_, section)) = self.reads.iter().find(|(s, _)| *s == name) else {
            return Ok(Vec::new());
        };
        let Some(file) = sub.get_one::<PathBuf>(CONFIG) else {
            return Ok(Vec::new());
        };
        let Some(target) = cmd.find_subcommand(name) else {
            return Ok(Vec::new());
        };
        let configuration = self.read(cmd, file)?;
        let given: BTreeSet<String> = target
            .get_arguments()
            .filter(|a| {
                matches!(
                    sub.value_source(a.get_id().as_str()),
                    Some(ValueSource::CommandLine | ValueSource::EnvVariable)
                )
            })
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        Ok(configuration.arguments(section, target, &given))
    }

    /// Reads and checks the file against the sections' commands.
    fn read(&self, cmd: &Command, file: &Path) -> Result<Configuration, FileError> {
        let text = std::fs::read_to_string(file).map_err(|source| FileError::Read {
            file: file.to_path_buf(),
            source,
        })?;
        let mut names: Vec<&str> = self.reads.iter().map(|(_, s)| *s).collect();
        names.dedup();
        let sections: Vec<&Command> = names
            .iter()
            .filter_map(|n| cmd.find_subcommand(n))
            .collect();
        Configuration::parse(&text, self.kind, &sections).map_err(|source| FileError::Invalid {
            file: file.to_path_buf(),
            source,
        })
    }

    /// `config check FILE`: each section's command line (its subcommand, then its arguments,
    /// one per line), once the section's command accepts it as a whole.
    pub fn check<C: CommandFactory>(&self, file: &Path) -> Result<String, FileError> {
        let cmd = self.command::<C>();
        let configuration = self.read(&cmd, file)?;
        let mut out = String::new();
        for (section, _) in configuration.sections() {
            let Some(target) = cmd.find_subcommand(section) else {
                continue;
            };
            let arguments = configuration.arguments(section, target, &BTreeSet::new());
            let argv = [OsString::from(cmd.get_name()), OsString::from(section)]
                .into_iter()
                .chain(arguments.iter().cloned());
            if let Err(e) = cmd.clone().try_get_matches_from(argv) {
                let message = e.to_string();
                let message = message.lines().next().unwrap_or_default();
                return Err(FileError::Rejected {
                    file: file.to_path_buf(),
                    section: section.to_string(),
                    message: message
                        .strip_prefix("error: ")
                        .unwrap_or(message)
                        .to_string(),
                });
            }
            out.push_str(section);
            out.push('\n');
            for a in &arguments {
                out.push_str(&a.to_string_lossy());
                out.push('\n');
            }
        }
        Ok(out)
    }

    /// Runs the `config` subcommand; returns what it prints.
    pub fn config<C: CommandFactory>(&self, args: &ConfigArgs) -> Result<String, FileError> {
        match &args.command {
            ConfigCommand::Check { file } => self.check::<C>(file),
        }
    }
}

fn config_arg() -> Arg {
    Arg::new(CONFIG)
        .long(CONFIG)
        .value_name("FILE")
        .value_parser(clap::value_parser!(PathBuf))
        .help(
            "Configuration file (apiVersion: fumarole.dev/v1alpha1): this command's flags in \
             camelCase; flags given on the command line or by environment variable win",
        )
}

#[cfg(test)]
mod tests;
