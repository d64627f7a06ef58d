//! Reading a configuration file against the commands it configures. Pure: no file is opened
//! here and nothing is printed; [`Configuration::parse`] takes the text and the clap
//! `Command` of each subcommand that has a section, and returns, per section, the settings as
//! the command-line arguments they stand for (`--recheck-interval=10s`), each value already
//! accepted by its flag's value parser. [`Configuration::arguments`] picks the ones a command
//! line leaves open.

use std::collections::BTreeSet;
use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Arg, ArgAction, Command};
use serde_norway::Value;

/// The one version of the file so far.
pub const API_VERSION: &str = "fumarole.dev/v1alpha1";

/// The id and long name of the flag that names the file (`--config FILE`).
pub const CONFIG: &str = "config";

/// Flags that are about the command line itself, not settings.
const NOT_SETTINGS: &[&str] = &["help", "version", CONFIG];

/// Why a configuration file is refused; the `Display` starts with the field's path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Not YAML, or not a mapping at the top.
    #[error("not a YAML mapping: {0}")]
    Yaml(String),
    /// `apiVersion` missing or not [`API_VERSION`].
    #[error("apiVersion: expected {API_VERSION}, got {0}")]
    ApiVersion(String),
    /// `kind` missing or not this binary's.
    #[error("kind: expected {expected}, got {found}")]
    Kind { expected: String, found: String },
    /// A field that names no section or no flag of its section's command.
    #[error("{path}: unknown field{}", did_you_mean(.suggestion))]
    UnknownField {
        path: String,
        /// The known field closest to it, if one is close.
        suggestion: Option<String>,
    },
    /// A value of the wrong shape (a list where one value goes, a mapping, `null`).
    #[error("{path}: expected {expected}, got {found}")]
    Shape {
        path: String,
        expected: &'static str,
        found: String,
    },
    /// A value its flag's parser refuses.
    #[error("{path}: invalid {what} {value:?}{}", reason_suffix(.reason))]
    Invalid {
        path: String,
        /// What the flag takes (its value name: `duration`, `file`), or `value`.
        what: String,
        value: String,
        /// The parser's reason, empty when it gave none.
        reason: String,
    },
}

fn did_you_mean(suggestion: &Option<String>) -> String {
    suggestion
        .as_ref()
        .map(|s| format!(" (did you mean {s}?)"))
        .unwrap_or_default()
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

/// One field of a section: the flag it sets and the arguments that say so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// `run.recheckInterval`.
    pub path: String,
    /// The flag's long name, `recheck-interval`.
    pub long: String,
    /// `["--recheck-interval=10s"]`; empty for a switch set to `false`; one per item of a list.
    pub arguments: Vec<String>,
}

/// A checked configuration file: its sections in file order, each with its settings in file
/// order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Configuration {
    sections: Vec<(String, Vec<Setting>)>,
}

impl Configuration {
    /// Reads `text` as a configuration of `kind` whose sections are the `sections` commands,
    /// each named as its command (`run`, `serve`). Pass commands that were built
    /// (`Command::build`), so that global flags count as the subcommand's own.
    pub fn parse(text: &str, kind: &str, sections: &[&Command]) -> Result<Self, Error> {
        let root: Value = serde_norway::from_str(text).map_err(|e| Error::Yaml(e.to_string()))?;
        let Value::Mapping(root) = root else {
            return Err(Error::Yaml(format!("the top is {}", describe(&root))));
        };
        let field = |name: &str| root.get(name).and_then(Value::as_str).map(str::to_string);
        match field("apiVersion") {
            Some(v) if v == API_VERSION => {}
            other => return Err(Error::ApiVersion(found(other))),
        }
        match field("kind") {
            Some(k) if k == kind => {}
            other => {
                return Err(Error::Kind {
                    expected: kind.to_string(),
                    found: found(other),
                });
            }
        }
        let mut out = Configuration::default();
        for (key, value) in &root {
            let name = key_name(key, "")?;
            if name == "apiVersion" || name == "kind" {
                continue;
            }
            let Some(command) = sections.iter().find(|c| c.get_name() == name) else {
                let known = ["apiVersion", "kind"]
                    .into_iter()
                    .chain(sections.iter().map(|c| c.get_name()));
                return Err(unknown(name.clone(), &name, known));
            };
            out.sections
                .push((name.clone(), section(&name, value, command)?));
        }
        Ok(out)
    }

    /// The settings of section `name` (none when the file has no such section).
    pub fn section(&self, name: &str) -> &[Setting] {
        self.sections
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.as_slice())
            .unwrap_or_default()
    }

    /// The sections, in file order.
    pub fn sections(&self) -> impl Iterator<Item = (&str, &[Setting])> {
        self.sections
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_slice()))
    }

    /// The arguments section `name` adds to a command line of `target` that already sets the
    /// flags in `given` (by long name): the file's settings of flags `target` has, except the
    /// ones given and the ones that conflict with a given one (the command line wins).
    /// `target` may be another command than the section's (`explain` reading `serve`'s
    /// section): settings of flags it lacks are left out.
    pub fn arguments(
        &self,
        name: &str,
        target: &Command,
        given: &BTreeSet<String>,
    ) -> Vec<OsString> {
        let given_args: Vec<&Arg> = target
            .get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| given.contains(l)))
            .collect();
        let mut out = Vec::new();
        for setting in self.section(name) {
            let Some(arg) = target
                .get_arguments()
                .find(|a| a.get_long() == Some(setting.long.as_str()))
            else {
                continue;
            };
            if given.contains(&setting.long) {
                continue;
            }
            if given_args.iter().any(|g| conflict(target, arg, g)) {
                continue;
            }
            out.extend(setting.arguments.iter().map(OsString::from));
        }
        out
    }
}

/// Whether `a` and `b` may not be given together: either says it conflicts with the other, or
/// both are members of a group that takes one.
fn conflict(command: &Command, a: &Arg, b: &Arg) -> bool {
    let names = |x: &Arg, y: &Arg| {
        command
            .get_arg_conflicts_with(x)
            .iter()
            .any(|c| c.get_id() == y.get_id())
    };
    let one_of = command.get_groups().any(|group| {
        let members: Vec<_> = group.get_args().collect();
        members.contains(&a.get_id())
            && members.contains(&b.get_id())
            && !group.clone().is_multiple()
    });
    names(a, b) || names(b, a) || one_of
}

/// The settings of one section, checked against its command's flags.
fn section(name: &str, value: &Value, command: &Command) -> Result<Vec<Setting>, Error> {
    let fields = match value {
        // `run:` with nothing under it: no settings.
        Value::Null => return Ok(Vec::new()),
        Value::Mapping(m) => m,
        other => {
            return Err(Error::Shape {
                path: name.to_string(),
                expected: "a mapping of settings",
                found: describe(other),
            });
        }
    };
    let settable: Vec<(String, &Arg)> = command
        .get_arguments()
        .filter(|a| !NOT_SETTINGS.contains(&a.get_id().as_str()))
        .filter_map(|a| Some((camel_case(a.get_long()?), a)))
        .collect();
    let mut out = Vec::new();
    for (key, value) in fields {
        let field = key_name(key, name)?;
        let path = format!("{name}.{field}");
        let Some((_, arg)) = settable.iter().find(|(f, _)| *f == field) else {
            return Err(unknown(
                path,
                &field,
                settable.iter().map(|(f, _)| f.as_str()),
            ));
        };
        let long = arg.get_long().unwrap_or_default().to_string();
        let arguments = arguments(&path, &long, arg, value)?;
        out.push(Setting {
            path,
            long,
            arguments,
        });
    }
    Ok(out)
}

/// The command-line arguments that set `arg` to `value`, each value checked by the flag's
/// parser.
fn arguments(path: &str, long: &str, arg: &Arg, value: &Value) -> Result<Vec<String>, Error> {
    let flag = |v: &str| format!("--{long}={v}");
    let shape = |expected| Error::Shape {
        path: path.to_string(),
        expected,
        found: describe(value),
    };
    match arg.get_action() {
        ArgAction::SetTrue | ArgAction::SetFalse => {
            let Value::Bool(on) = value else {
                return Err(shape("true or false"));
            };
            let set = *on == matches!(arg.get_action(), ArgAction::SetTrue);
            Ok(if set {
                vec![format!("--{long}")]
            } else {
                Vec::new()
            })
        }
        // clap counts in a u8.
        ArgAction::Count => match value.as_u64().filter(|n| *n <= u64::from(u8::MAX)) {
            Some(n) => Ok((0..n).map(|_| format!("--{long}")).collect()),
            None => Err(shape("a count from 0 to 255")),
        },
        ArgAction::Append => {
            let items: Vec<String> = match value {
                Value::Sequence(items) => items
                    .iter()
                    .map(|item| scalar(item).ok_or_else(|| shape("a list of values")))
                    .collect::<Result<_, _>>()?,
                other => vec![scalar(other).ok_or_else(|| shape("a value or a list of values"))?],
            };
            for item in &items {
                check(path, arg, item)?;
            }
            if items.is_empty() && arg.get_default_values().is_empty() {
                return Ok(Vec::new());
            }
            if items.is_empty() {
                // An empty value replaces the default; the commands read it as "none".
                return Ok(vec![flag("")]);
            }
            Ok(items.iter().map(|i| flag(i)).collect())
        }
        ArgAction::Set => {
            let text = match (value, arg.get_value_delimiter()) {
                (Value::Sequence(items), Some(delimiter)) => items
                    .iter()
                    .map(|item| scalar(item).ok_or_else(|| shape("a list of values")))
                    .collect::<Result<Vec<_>, _>>()?
                    .join(&delimiter.to_string()),
                (other, _) => scalar(other).ok_or_else(|| shape("one value"))?,
            };
            check(path, arg, &text)?;
            Ok(vec![flag(&text)])
        }
        _ => Err(Error::UnknownField {
            path: path.to_string(),
            suggestion: None,
        }),
    }
}

/// Whether `arg`'s value parser takes `text`, tried on a command holding a copy of the flag
/// alone (so that the other flags' requirements do not interfere).
fn check(path: &str, arg: &Arg, text: &str) -> Result<(), Error> {
    let mut probe = Arg::new("value")
        .long("value")
        .action(ArgAction::Append)
        .value_parser(arg.get_value_parser().clone());
    if let Some(delimiter) = arg.get_value_delimiter() {
        probe = probe.value_delimiter(delimiter);
    }
    let result = Command::new("probe")
        .no_binary_name(true)
        .arg(probe)
        .try_get_matches_from([format!("--value={text}")]);
    let Err(e) = result else {
        return Ok(());
    };
    let reason = match e.kind() {
        ErrorKind::InvalidValue => match e.get(ContextKind::ValidValue) {
            Some(ContextValue::Strings(valid)) => format!("expected one of {}", valid.join(", ")),
            _ => String::new(),
        },
        _ => std::error::Error::source(&e)
            .map(ToString::to_string)
            .unwrap_or_else(|| first_line(&e.to_string())),
    };
    Err(Error::Invalid {
        path: path.to_string(),
        what: value_kind(arg),
        value: text.to_string(),
        reason,
    })
}

/// What a flag takes, from its value name: `duration` for `DURATION`; `value` where the name
/// only repeats the flag's.
fn value_kind(arg: &Arg) -> String {
    let name = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map(|n| n.as_str().to_lowercase())
        .unwrap_or_default();
    if name.is_empty() || name.replace('-', "_") == arg.get_id().as_str() {
        "value".to_string()
    } else {
        name
    }
}

fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// A scalar as a command line writes it; `None` for null, lists and mappings.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn key_name(key: &Value, section: &str) -> Result<String, Error> {
    match key {
        Value::String(s) => Ok(s.clone()),
        other => Err(Error::Shape {
            path: if section.is_empty() {
                "(top)".to_string()
            } else {
                section.to_string()
            },
            expected: "field names",
            found: describe(other),
        }),
    }
}

fn found(value: Option<String>) -> String {
    value.map_or_else(|| "nothing".to_string(), |v| format!("{v:?}"))
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Sequence(_) => "a list".to_string(),
        Value::Mapping(_) => "a mapping".to_string(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
        other => scalar(other).map(|s| format!("{s:?}")).unwrap_or_default(),
    }
}

/// `recheck-interval` -> `recheckInterval`.
pub fn camel_case(long: &str) -> String {
    let mut out = String::with_capacity(long.len());
    let mut upper = false;
    for c in long.chars() {
        if c == '-' || c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn unknown<'a>(
    path: impl Into<String>,
    field: &str,
    known: impl Iterator<Item = &'a str>,
) -> Error {
    let suggestion = known
        .map(|k| (edit_distance(&field.to_lowercase(), &k.to_lowercase()), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| k.to_string());
    Error::UnknownField {
        path: path.into(),
        suggestion,
    }
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
