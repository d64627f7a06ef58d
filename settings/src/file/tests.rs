#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use super::*;
use crate::testing::{Cli, SPEC};

const HEAD: &str = "apiVersion: fumarole.dev/v1alpha1\nkind: TestConfiguration\n";

fn parse(body: &str) -> Result<Configuration, Error> {
    let cmd = SPEC.command::<Cli>();
    let run = cmd.find_subcommand("run").unwrap();
    Configuration::parse(&format!("{HEAD}{body}"), SPEC.kind, &[run])
}

fn arguments(body: &str) -> Vec<String> {
    parse(body)
        .unwrap()
        .section("run")
        .iter()
        .flat_map(|s| s.arguments.clone())
        .collect()
}

#[test]
fn a_good_file_stands_for_flags_in_file_order() {
    let text = "run:
  compatLabels: true
  recheckInterval: 30s
  awaitDeviceChoiceFrom: [volcano, my-scheduler]
  reservedMemory: ['0:memory=1Gi', '1:memory=2Gi']
  leaderElect: false
  weight: 2.5
  logFormat: json
";
    assert_eq!(
        arguments(text),
        [
            "--compat-labels",
            "--recheck-interval=30s",
            "--await-device-choice-from=volcano",
            "--await-device-choice-from=my-scheduler",
            "--reserved-memory=0:memory=1Gi",
            "--reserved-memory=1:memory=2Gi",
            "--leader-elect=false",
            "--weight=2.5",
            "--log-format=json",
        ]
    );
    let run = parse(text).unwrap();
    assert_eq!(run.section("run")[1].path, "run.recheckInterval");
    assert_eq!(run.section("run")[1].long, "recheck-interval");
    assert!(run.section("serve").is_empty());
}

#[test]
fn booleans_and_lists_in_every_form() {
    // A switch set to false adds nothing (its default); a scalar is a list of one; an empty
    // list replaces a default with "none" and leaves a flag without one unset.
    assert_eq!(
        arguments("run:\n  compatLabels: false\n"),
        Vec::<String>::new()
    );
    assert_eq!(
        arguments("run:\n  awaitDeviceChoiceFrom: volcano\n"),
        ["--await-device-choice-from=volcano"]
    );
    assert_eq!(
        arguments("run:\n  awaitDeviceChoiceFrom: []\n"),
        ["--await-device-choice-from="]
    );
    assert_eq!(
        arguments("run:\n  reservedMemory: []\n"),
        Vec::<String>::new()
    );
    assert_eq!(
        arguments("run:\n  leaderElect: true\n"),
        ["--leader-elect=true"]
    );
    assert_eq!(arguments("run:\n"), Vec::<String>::new());
    assert_eq!(arguments(""), Vec::<String>::new());
}

#[test]
fn each_error_names_the_field() {
    let error = |body: &str| parse(body).unwrap_err().to_string();
    assert_eq!(
        error("run:\n  recheckInterval: ten\n"),
        "run.recheckInterval: invalid duration \"ten\": expected number at 0"
    );
    assert_eq!(
        error("run:\n  weight: heavy\n"),
        "run.weight: invalid value \"heavy\": invalid float literal"
    );
    assert_eq!(
        error("run:\n  logFormat: xml\n"),
        "run.logFormat: invalid value \"xml\": expected one of text, json"
    );
    assert_eq!(
        error("run:\n  recheckIntervall: 10s\n"),
        "run.recheckIntervall: unknown field (did you mean recheckInterval?)"
    );
    assert_eq!(
        error("run:\n  frobnicate: 1\n"),
        "run.frobnicate: unknown field"
    );
    assert_eq!(error("serve:\n  weight: 1\n"), "serve: unknown field");
    assert_eq!(
        error("rn:\n  weight: 1\n"),
        "rn: unknown field (did you mean run?)"
    );
    // Flags about the command line are not settings.
    assert_eq!(
        error("run:\n  config: x.yaml\n"),
        "run.config: unknown field"
    );
    assert_eq!(error("run:\n  help: true\n"), "run.help: unknown field");
    assert_eq!(
        error("run:\n  compatLabels: yes please\n"),
        "run.compatLabels: expected true or false, got \"yes please\""
    );
    assert_eq!(
        error("run:\n  weight: [1, 2]\n"),
        "run.weight: expected one value, got a list"
    );
    assert_eq!(
        error("run:\n  nodeName: null\n"),
        "run.nodeName: expected one value, got null"
    );
    assert_eq!(
        error("run:\n  reservedMemory: [{a: 1}]\n"),
        "run.reservedMemory: expected a list of values, got a list"
    );
    assert_eq!(
        error("run: [1]\n"),
        "run: expected a mapping of settings, got a list"
    );
}

#[test]
fn version_and_kind_are_checked_first() {
    let cmd = SPEC.command::<Cli>();
    let run = cmd.find_subcommand("run").unwrap();
    let error = |text: &str| {
        Configuration::parse(text, SPEC.kind, &[run])
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error("apiVersion: fumarole.dev/v1\nkind: TestConfiguration\n"),
        "apiVersion: expected fumarole.dev/v1alpha1, got \"fumarole.dev/v1\""
    );
    assert_eq!(
        error("kind: TestConfiguration\n"),
        "apiVersion: expected fumarole.dev/v1alpha1, got nothing"
    );
    assert_eq!(
        error("apiVersion: fumarole.dev/v1alpha1\nkind: AgentConfiguration\n"),
        "kind: expected TestConfiguration, got \"AgentConfiguration\""
    );
    assert!(error("run: [").starts_with("not a YAML mapping: "));
    assert_eq!(error("- run\n"), "not a YAML mapping: the top is a list");
}

#[test]
fn the_command_line_leaves_out_what_it_sets_and_what_conflicts_with_it() {
    let cmd = SPEC.command::<Cli>();
    let run = cmd.find_subcommand("run").unwrap();
    let show = cmd.find_subcommand("show").unwrap();
    let file = parse("run:\n  weight: 2\n  kubeconfig: /k\n  compatLabels: true\n").unwrap();
    let given = |longs: &[&str]| longs.iter().map(|l| l.to_string()).collect::<BTreeSet<_>>();
    let args = |target, g: &[&str]| {
        file.arguments("run", target, &given(g))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        args(run, &[]),
        ["--weight=2", "--kubeconfig=/k", "--compat-labels"]
    );
    assert_eq!(
        args(run, &["weight"]),
        ["--kubeconfig=/k", "--compat-labels"]
    );
    assert_eq!(args(run, &["snapshot"]), ["--weight=2", "--compat-labels"]);
    // Another command reading the section takes only the flags it has.
    assert_eq!(args(show, &[]), ["--weight=2"]);
}

#[test]
fn camel_case_of_long_flags() {
    assert_eq!(camel_case("recheck-interval"), "recheckInterval");
    assert_eq!(camel_case("cdi"), "cdi");
    assert_eq!(camel_case("dra-registry-dir"), "draRegistryDir");
    assert_eq!(edit_distance("kitten", "sitting"), 3);
}
