//! Shared by the agent's binary tests: run `fumarole-agent discover` on a bundled fixture.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::process::Command;

use fumarole_topology::NodeTopology;

/// `fumarole-agent discover ARGS --format FORMAT`'s standard output; fails the test with its
/// standard error when the command fails.
pub fn discover_text(args: &[&str], format: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_fumarole-agent"))
        .arg("discover")
        .args(args)
        .args(["--format", format])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The model of `discover ARGS --format json`, and the JSON itself.
pub fn discover(args: &[&str]) -> (NodeTopology, serde_json::Value) {
    let value: serde_json::Value = serde_json::from_str(&discover_text(args, "json")).unwrap();
    let topology: NodeTopology = serde_json::from_value(value.clone()).unwrap();
    (topology, value)
}
