//! `fumarole-agent discover`: run discovery once and print the result; `fumarole-agent
//! fixture`: list or write out the bundled fixture nodes.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use fumarole_exporter::discover;
use fumarole_exporter::fixtures;

use crate::node::{NodeArgs, find_fixture};
use crate::{diagram, render};

#[derive(Args)]
pub struct DiscoverArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Node name (default: the root's kernel hostname).
    #[arg(long, env = "NODE_NAME")]
    hostname: Option<String>,
}

#[derive(Args)]
pub struct FixtureArgs {
    /// Fixture to write; without it, list the fixtures.
    name: Option<String>,
    /// Directory to write the fixture's filesystem root into (created; must be empty).
    #[arg(long, value_name = "DIR", requires = "name")]
    out: Option<PathBuf>,
}

/// `fumarole-agent fixture [NAME --out DIR]`.
pub fn fixture(args: FixtureArgs) -> Result<()> {
    let (Some(name), Some(out)) = (&args.name, &args.out) else {
        for name in fixtures::NAMES {
            if let Some(f) = fixtures::get(name) {
                println!("{name:<14} {}", f.description);
            }
        }
        return Ok(());
    };
    let fixture = find_fixture(name)?;
    if out.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        bail!("--out {}: directory is not empty", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    fixture
        .materialize(out)
        .with_context(|| format!("writing fixture {name} to {}", out.display()))?;
    println!("{}", out.display());
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Yaml,
    Matrix,
    /// A diagram: packages, NUMA nodes, the PCIe tree, devices, fabric links.
    Svg,
    /// The same graph as Graphviz text.
    Dot,
}

pub fn run(args: DiscoverArgs) -> Result<()> {
    let prepared = args.node.prepare(args.hostname)?;
    let topology = discover::discover(&prepared.options, prepared.nvml.as_ref())?;

    let text = match args.format {
        Format::Json => render::json(&topology)?,
        Format::Yaml => render::yaml(&topology)?,
        Format::Table => render::table(&topology),
        Format::Matrix => render::matrix(&topology),
        // Discovery alone does not know which pod uses a device.
        Format::Svg => diagram::svg(&topology),
        Format::Dot => diagram::dot(&topology),
    };
    print!("{text}");
    Ok(())
}
