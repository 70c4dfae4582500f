//! The settings file (`--config FILE` or `HMDP_CONFIG`): TOML, one key per
//! flag of the command being run, named as the flag without its dashes
//! (`lock = "reentrant"`, `backend-timeout-ms = 2000`, `fencing = true`).
//! Precedence: a flag, then its environment variable, then the file, then
//! the default. The file's values join the command line as the flags
//! neither the command line nor the environment gave, so clap checks them
//! as it checks flags. `--print-config` shows the effective settings, each
//! with where it came from, secrets masked, in the file's own format.

use std::collections::BTreeSet;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};

use crate::config::redact_url;

/// The flags that name the file and ask for the print-out: never keys.
const OWN_FLAGS: [&str; 3] = ["config", "print-config", "help"];

/// The command line `args` of `command` with the settings file's values
/// added, and the keys the file gave.
pub fn with_file(
    command: &Command,
    args: Vec<OsString>,
) -> anyhow::Result<(Vec<OsString>, BTreeSet<String>)> {
    let Some(path) = file_named(&args) else {
        return Ok((args, BTreeSet::new()));
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the settings file {}", path.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("{} is not TOML", path.display()))?;
    let Some(subcommand) = subcommand_of(command, &args) else {
        return Ok((args, BTreeSet::new()));
    };
    let mut added = Vec::new();
    let mut from_file = BTreeSet::new();
    for (key, value) in &table {
        let Some(arg) = (subcommand.get_arguments())
            .find(|arg| arg.get_long() == Some(key.as_str()))
            .filter(|_| !OWN_FLAGS.contains(&key.as_str()))
        else {
            bail!(
                "{}: `{key}` is not a setting of `{}` (keys are its flags without the dashes: \
                 see --help)",
                path.display(),
                subcommand.get_name()
            );
        };
        let given = |flag: &OsString| {
            let flag = flag.to_string_lossy();
            flag == format!("--{key}") || flag.starts_with(&format!("--{key}="))
        };
        let in_env = arg
            .get_env()
            .is_some_and(|env| std::env::var_os(env).is_some());
        if args.iter().any(given) || in_env {
            continue;
        }
        let value = match value {
            toml::Value::Array(items) => {
                let items: Option<Vec<String>> = items.iter().map(scalar).collect();
                items.map(|items| items.join(","))
            }
            value => scalar(value),
        }
        .with_context(|| {
            format!(
                "{}: `{key}` is not a string, number, boolean or list of them",
                path.display()
            )
        })?;
        match arg.get_action() {
            ArgAction::SetTrue => {
                if value == "true" {
                    added.push(OsString::from(format!("--{key}")));
                }
            }
            _ => added.push(OsString::from(format!("--{key}={value}"))),
        }
        from_file.insert(key.clone());
    }
    let mut args = args;
    args.extend(added);
    Ok((args, from_file))
}

/// The effective settings of the subcommand `matches` ran, one `key =
/// value  # source` line each (the settings file's format), secrets
/// masked: `from_file`, the keys the file gave.
pub fn print_out(command: &Command, matches: &ArgMatches, from_file: &BTreeSet<String>) -> String {
    let Some((name, matches)) = matches.subcommand() else {
        return String::new();
    };
    let subcommand = command
        .find_subcommand(name)
        .expect("matches name one of the command's subcommands");
    let mut out = format!("# the effective settings of `{name}`\n");
    for arg in subcommand.get_arguments() {
        let Some(key) = arg.get_long().filter(|key| !OWN_FLAGS.contains(key)) else {
            continue;
        };
        let id = arg.get_id().as_str();
        let Ok(Some(raw)) = matches.try_get_raw(id) else {
            out += &format!("# {key} (not set)\n");
            continue;
        };
        let value: Vec<String> = raw.map(shown).collect();
        let value = value.join(",");
        let secret = arg.is_hide_env_values_set();
        let source = match matches.value_source(id) {
            Some(ValueSource::CommandLine) if from_file.contains(key) => "file",
            Some(ValueSource::CommandLine) => "flag",
            Some(ValueSource::EnvVariable) => "environment",
            _ => "default",
        };
        let value = if secret { "***".to_owned() } else { value };
        out += &format!("{key} = {}  # {source}\n", as_toml(value));
    }
    out
}

/// A flag's value as the settings file would hold it: a whole number or a
/// boolean bare, anything else a TOML string. A number is written bare only
/// when it reads back as the same text (`007` stays a string).
fn as_toml(value: String) -> toml::Value {
    match value.as_str() {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
        text => match text.parse::<i64>() {
            Ok(n) if n.to_string() == text => toml::Value::Integer(n),
            _ => toml::Value::String(value),
        },
    }
}

/// A TOML scalar as a flag's value; `None` for a table or a list.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(text) => Some(text.clone()),
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(x) => Some(x.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Datetime(at) => Some(at.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) => None,
    }
}

/// A value as it may be shown: a URL's password masked.
fn shown(value: &OsStr) -> String {
    let value = value.to_string_lossy();
    if value.contains("://") {
        redact_url(&value)
    } else {
        value.into_owned()
    }
}

/// The file `--config FILE`, `--config=FILE` or `HMDP_CONFIG` names.
fn file_named(args: &[OsString]) -> Option<std::path::PathBuf> {
    let mut args = args.iter().map(|arg| arg.to_string_lossy());
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args
                .next()
                .map(|path| Path::new(path.as_ref()).to_path_buf());
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(path.into());
        }
    }
    std::env::var_os("HMDP_CONFIG").map(Into::into)
}

/// The subcommand `args` run (its name is the first argument naming one).
fn subcommand_of<'a>(command: &'a Command, args: &[OsString]) -> Option<&'a Command> {
    (args.iter().skip(1)).find_map(|arg| command.find_subcommand(arg))
}
