//! A small binary's flags for the tests: one of each kind a fumarole binary has (a switch, a
//! duration, a comma-separated list with a default, a repeatable flag, a `--x=false` boolean,
//! a number, an env var, a requirement, a conflict, a group of which one, a global flag).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::cli::{ConfigArgs, Spec};

pub const SPEC: Spec = Spec {
    kind: "TestConfiguration",
    reads: &[("run", "run"), ("show", "run")],
};

#[derive(Parser, Debug)]
#[command(name = "testbin")]
pub struct Cli {
    #[arg(long, global = true, value_enum, default_value_t = Format::Text)]
    pub log_format: Format,
    #[command(subcommand)]
    pub command: Sub,
}

#[derive(Subcommand, Debug)]
pub enum Sub {
    Run(RunArgs),
    Show(ShowArgs),
    Config(ConfigArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[arg(long)]
    pub compat_labels: bool,
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub recheck_interval: Duration,
    #[arg(long, value_delimiter = ',', default_value = "volcano")]
    pub await_device_choice_from: Vec<String>,
    #[arg(long, value_name = "NUMA:RESOURCE=QUANTITY,...")]
    pub reserved_memory: Vec<String>,
    #[arg(long, default_value_t = true, action = ArgAction::Set)]
    pub leader_elect: bool,
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    #[arg(long, env = "FUMAROLE_SETTINGS_TEST_NODE_NAME")]
    pub node_name: Option<String>,
    #[arg(long, requires = "device_plugin_dir")]
    pub standalone: bool,
    #[arg(long, value_name = "DIR")]
    pub device_plugin_dir: Option<PathBuf>,
    #[arg(long, conflicts_with = "snapshot")]
    pub kubeconfig: Option<PathBuf>,
    #[arg(long)]
    pub snapshot: Option<PathBuf>,
    #[arg(long, group = "input")]
    pub root: Option<PathBuf>,
    #[arg(long, group = "input")]
    pub fixture: Option<String>,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    #[arg(long)]
    pub pod: String,
}
