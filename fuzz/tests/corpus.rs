//! Replays every committed seed (`corpus/<target>/`) and every crash found so far
//! (`regressions/<target>/`) through its target on stable, so CI keeps them passing.

#![allow(clippy::unwrap_used)]

use std::path::Path;

#[test]
fn seeds_and_regressions_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    every_target_has_a_libfuzzer_binary(root);
    let mut replayed = 0;
    for (name, target) in fumarole_fuzz::TARGETS {
        let mut inputs = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                let data = std::fs::read(&path).unwrap();
                eprintln!("{name}: {}", path.display());
                target(&data);
                inputs += 1;
            }
        }
        assert!(inputs > 0, "target {name} has no committed seed");
        replayed += inputs;
    }
    eprintln!("replayed {replayed} inputs");
}

// One test function: the device-plugin target points hwloc at a fixture through the process
// environment, which must not change while another test thread runs.
fn every_target_has_a_libfuzzer_binary(root: &Path) {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for (name, _) in fumarole_fuzz::TARGETS {
        let file = root.join("fuzz_targets").join(format!("{name}.rs"));
        let source = std::fs::read_to_string(&file).unwrap();
        assert!(
            source.contains(&format!("fumarole_fuzz::{name}(")),
            "{}",
            file.display()
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} not in Cargo.toml"
        );
    }
}
