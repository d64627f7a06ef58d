//! The binary's subcommands, one module each; they parse flags and wire the library together.

pub mod defrag;
pub mod explain;
pub mod serve;
