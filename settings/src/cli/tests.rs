#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::time::Duration;

use super::*;
use crate::testing::{Cli, Format, RunArgs, SPEC, ShowArgs, Sub};

fn file(body: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    write!(
        f,
        "apiVersion: fumarole.dev/v1alpha1\nkind: TestConfiguration\n{body}"
    )
    .unwrap();
    f
}

fn parse(argv: &[&str]) -> Result<Cli, ParseError> {
    SPEC.try_parse_from(std::iter::once("testbin").chain(argv.iter().copied()))
}

fn run(argv: &[&str]) -> RunArgs {
    match parse(argv).unwrap().command {
        Sub::Run(args) => args,
        other => panic!("{other:?}"),
    }
}

const FILE: &str = "run:
  compatLabels: true
  recheckInterval: 30s
  awaitDeviceChoiceFrom: [volcano, mine]
  reservedMemory: ['0:memory=1Gi']
  leaderElect: false
  weight: 2
  logFormat: json
";

#[test]
fn the_file_beats_the_defaults() {
    let f = file(FILE);
    let path = f.path().to_str().unwrap();
    let cli = parse(&["run", "--config", path]).unwrap();
    assert_eq!(cli.log_format, Format::Json);
    let Sub::Run(args) = cli.command else {
        panic!()
    };
    assert!(args.compat_labels);
    assert_eq!(args.recheck_interval, Duration::from_secs(30));
    assert_eq!(args.await_device_choice_from, ["volcano", "mine"]);
    assert_eq!(args.reserved_memory, ["0:memory=1Gi"]);
    assert!(!args.leader_elect);
    assert_eq!(args.weight, 2.0);
    // Without --config, the defaults.
    let args = run(&["run"]);
    assert!(!args.compat_labels);
    assert_eq!(args.recheck_interval, Duration::from_secs(10));
    assert_eq!(args.await_device_choice_from, ["volcano"]);
    assert!(args.leader_elect);
}

#[test]
fn flags_beat_the_file() {
    let f = file(FILE);
    let path = f.path().to_str().unwrap();
    // Before or after --config, = or not; lists are replaced, not merged.
    let cli = parse(&[
        "--log-format",
        "text",
        "run",
        "--recheck-interval",
        "5s",
        "--config",
        path,
        "--await-device-choice-from=other",
        "--leader-elect=true",
        "--reserved-memory=1:memory=2Gi",
    ])
    .unwrap();
    assert_eq!(cli.log_format, Format::Text);
    let Sub::Run(args) = cli.command else {
        panic!()
    };
    assert_eq!(args.recheck_interval, Duration::from_secs(5));
    assert_eq!(args.await_device_choice_from, ["other"]);
    assert_eq!(args.reserved_memory, ["1:memory=2Gi"]);
    assert!(args.leader_elect);
    // What the command line leaves alone still comes from the file.
    assert!(args.compat_labels);
    assert_eq!(args.weight, 2.0);
}

#[test]
fn an_env_var_beats_the_file() {
    let f = file("run:\n  nodeName: from-file\n");
    let path = f.path().to_str().unwrap();
    assert_eq!(
        run(&["run", "--config", path]).node_name.as_deref(),
        Some("from-file")
    );
    // SAFETY: no other test reads or writes this variable.
    unsafe { std::env::set_var("FUMAROLE_SETTINGS_TEST_NODE_NAME", "from-env") };
    let from_env = run(&["run", "--config", path]).node_name;
    unsafe { std::env::remove_var("FUMAROLE_SETTINGS_TEST_NODE_NAME") };
    assert_eq!(from_env.as_deref(), Some("from-env"));
}

#[test]
fn the_file_may_supply_what_a_flag_requires_and_a_flag_drops_what_it_conflicts_with() {
    let f = file("run:\n  devicePluginDir: /dp\n  kubeconfig: /k\n");
    let path = f.path().to_str().unwrap();
    let args = run(&["run", "--standalone", "--config", path]);
    assert!(args.standalone);
    assert_eq!(args.device_plugin_dir.unwrap().to_str(), Some("/dp"));
    assert_eq!(args.kubeconfig.unwrap().to_str(), Some("/k"));
    let args = run(&["run", "--config", path, "--snapshot", "/s"]);
    assert_eq!(args.kubeconfig, None);
    assert_eq!(args.snapshot.unwrap().to_str(), Some("/s"));
    // Declared the other way round, and one of a group.
    let f = file("run:\n  snapshot: /s\n  root: /r\n");
    let path = f.path().to_str().unwrap();
    let args = run(&[
        "run",
        "--config",
        path,
        "--kubeconfig",
        "/k",
        "--fixture",
        "x",
    ]);
    assert_eq!((args.snapshot, args.root), (None, None));
    assert_eq!(args.fixture.as_deref(), Some("x"));
}

#[test]
fn another_subcommand_reads_the_flags_it_shares() {
    let f = file(FILE);
    let path = f.path().to_str().unwrap();
    let Sub::Show(ShowArgs { weight, pod }) = parse(&["show", "--pod", "p", "--config", path])
        .unwrap()
        .command
    else {
        panic!()
    };
    assert_eq!((weight, pod.as_str()), (2.0, "p"));
}

#[test]
fn errors_name_the_file_and_the_field() {
    let f = file("run:\n  recheckInterval: ten\n");
    let path = f.path().to_str().unwrap();
    let e = parse(&["run", "--config", path]).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("{path}: run.recheckInterval: invalid duration \"ten\": expected number at 0")
    );
    // Even where the command line sets the flag: the file is wrong.
    assert!(parse(&["run", "--config", path, "--recheck-interval=1s"]).is_err());
    let e = parse(&["run", "--config", "/nonexistent/fumarole.yaml"])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("/nonexistent/fumarole.yaml: "), "{e}");
    // A bad command line is clap's error, as without a file.
    let f = file(FILE);
    let e = parse(&["run", "--config", f.path().to_str().unwrap(), "--nope"]).unwrap_err();
    assert!(matches!(e, ParseError::Clap(_)), "{e}");
}

#[test]
fn check_prints_each_sections_command_line_or_what_does_not_go_together() {
    let f = file("run:\n  compatLabels: true\n  weight: 2\n");
    assert_eq!(
        SPEC.check::<Cli>(f.path()).unwrap(),
        "run\n--compat-labels\n--weight=2\n"
    );
    let f = file("run:\n  kubeconfig: /k\n  snapshot: /s\n");
    let e = SPEC.check::<Cli>(f.path()).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}: run: the argument '--kubeconfig <KUBECONFIG>' cannot be used with",
            f.path().display()
        )),
        "{e}"
    );
    let f = file("run:\n  standalone: true\n");
    assert!(SPEC.check::<Cli>(f.path()).is_err());
    let Sub::Config(args) = parse(&["config", "check", f.path().to_str().unwrap()])
        .unwrap()
        .command
    else {
        panic!()
    };
    assert!(SPEC.config::<Cli>(&args).is_err());
}

#[test]
fn help_still_works_with_a_config_flag() {
    let e = parse(&["run", "--help"]).unwrap_err();
    let ParseError::Clap(e) = e else { panic!() };
    assert!(e.to_string().contains("--config <FILE>"), "{e}");
}
