//! Which command takes which of the root's flags. `Cli` declares the
//! database, log and secret-file flags once; declared `global`, clap would
//! list them under every command, and `context show --data-dir X` would be
//! taken and ignored. [`command`] instead gives each flag to the commands
//! that use it (as a global of the highest such command, so it is taken
//! anywhere below it, and its value reaches `Cli` as before):
//!
//! - `--database-url`, `--database-url-file`, `--data-dir`: the commands that
//!   open the database ([`DATABASE_COMMANDS`]);
//! - `--log-format`: those, and `mcp proxy` (a long-running process whose
//!   stderr a host keeps);
//! - `--json`: the commands that print JSON ([`LOCAL_COMMANDS`], [`JSON_COMMANDS`]);
//! - a secret's file flag (`--token-file`, `--nats-url-file`,
//!   `--dashboard-secret-file`): the commands that take that secret's flag.
//!
//! The root keeps each flag too (`ai-crew-sync --data-dir X team list`);
//! [`refuse_unused`] refuses one given there to a command that does not use it.

use clap::{ArgMatches, Command, parser::ValueSource};

/// The local operator commands and `admin bootstrap`: they open the
/// database, and print JSON with `--json`. A path is a prefix: it takes in
/// every command under it.
const LOCAL_COMMANDS: &[&[&str]] = &[
    &["doctor"],
    &["quickstart"],
    &["team"],
    &["agent"],
    &["person"],
    &["conversations"],
    &["token"],
    &["webhook"],
    &["admin", "bootstrap"],
];

/// The server and `migrate`: they open the database.
const SERVER_COMMANDS: &[&[&str]] = &[&["serve"], &["migrate"]];

/// The commands that open the database.
const DATABASE_COMMANDS: &[&[&[&str]]] = &[SERVER_COMMANDS, LOCAL_COMMANDS];

/// Commands besides [`DATABASE_COMMANDS`] whose logs `--log-format` shapes.
const LOGGING_COMMANDS: &[&[&str]] = &[&["mcp", "proxy"]];

/// The commands besides [`LOCAL_COMMANDS`] that print JSON with `--json`.
const JSON_COMMANDS: &[&[&str]] = &[
    &["client"],
    &["admin", "whoami"],
    &["admin", "team"],
    &["admin", "agent"],
    &["admin", "person"],
    &["admin", "token"],
    &["admin", "grant"],
    &["admin", "credential"],
    &["context", "show"],
    &["context", "verify"],
    &["context", "profile", "list"],
];

/// A root flag and what decides which commands take it.
enum Takes {
    /// The commands under any of these paths.
    Under(&'static [&'static [&'static [&'static str]]]),
    /// The commands that declare this argument (a file flag follows its secret's flag).
    Beside(&'static str),
}

/// The root's flags given only to some commands (by clap id).
const PLACED: &[(&str, Takes)] = &[
    ("database_url", Takes::Under(DATABASE_COMMANDS)),
    ("database_url_file", Takes::Under(DATABASE_COMMANDS)),
    ("data_dir", Takes::Under(DATABASE_COMMANDS)),
    (
        "log_format",
        Takes::Under(&[SERVER_COMMANDS, LOCAL_COMMANDS, LOGGING_COMMANDS]),
    ),
    ("json", Takes::Under(&[LOCAL_COMMANDS, JSON_COMMANDS])),
    ("token_file", Takes::Beside("token")),
    ("nats_url_file", Takes::Beside("nats_url")),
    ("dashboard_secret_file", Takes::Beside("dashboard_secret")),
];

fn takes(how: &Takes, path: &[&str], command: &Command) -> bool {
    match how {
        Takes::Under(lists) => lists
            .iter()
            .any(|paths| paths.iter().any(|p| path.starts_with(p))),
        Takes::Beside(id) => command.get_arguments().any(|a| a.get_id() == *id),
    }
}

/// The command line as parsed: `Cli`'s, with each placed flag under the
/// commands that use it.
pub fn command() -> Command {
    let mut root = <super::Cli as clap::CommandFactory>::command();
    let mut flags = Vec::new();
    for (id, how) in PLACED {
        let arg = root
            .get_arguments()
            .find(|a| a.get_id() == *id)
            .unwrap_or_else(|| panic!("Cli declares --{id}"))
            .clone();
        root = root.mut_arg(*id, |a| a.global(false));
        flags.push((*id, how, arg.global(true)));
    }
    let root = root.after_help(
        "Each option above is taken only by the commands that use it (the database ones by \
         those that open the database): a command's --help lists its own.",
    );
    place(root, &mut Vec::new(), &flags, &[])
}

/// Give each flag to the highest commands under `command` that take it.
fn place(
    mut command: Command,
    path: &mut Vec<String>,
    flags: &[(&str, &Takes, clap::Arg)],
    placed_above: &[&str],
) -> Command {
    let names: Vec<String> = command
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        path.push(name.clone());
        command = command.mut_subcommand(&name, |mut sub| {
            let here: Vec<&str> = path.iter().map(String::as_str).collect();
            let mut placed: Vec<&str> = placed_above.to_vec();
            for (id, how, arg) in flags {
                if !placed.contains(id) && takes(how, &here, &sub) {
                    sub = sub.arg(arg.clone());
                    placed.push(id);
                }
            }
            place(sub, path, flags, &placed)
        });
        path.pop();
    }
    command
}

/// A placed flag given before a command that does not use it (`ai-crew-sync
/// --data-dir X context show`) is refused as clap refuses an unknown flag:
/// a command that takes it and ignores it would only mislead. A value from
/// the environment is not refused (it serves the commands that use it).
pub fn refuse_unused(matches: &ArgMatches) {
    let mut command = command();
    command.build();
    let mut leaf = &mut command;
    let mut at = matches;
    while let Some((name, sub)) = at.subcommand() {
        leaf = leaf
            .find_subcommand_mut(name)
            .expect("a parsed subcommand is one of the command's");
        at = sub;
    }
    for (id, _) in PLACED {
        let given = matches.value_source(id) == Some(ValueSource::CommandLine);
        if given && !leaf.get_arguments().any(|a| a.get_id() == *id) {
            let flag = format!("--{}", id.replace('_', "-"));
            leaf.error(
                clap::error::ErrorKind::UnknownArgument,
                format!(
                    "unexpected argument '{flag}' found\n\n  tip: `{}` does not use {flag}; \
                     `--help` lists what it takes",
                    leaf.get_bin_name().unwrap_or(leaf.get_name())
                ),
            )
            .exit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command of the tree, built (globals propagated), with its path.
    fn all_commands() -> Vec<(Vec<String>, Command)> {
        fn walk(command: &Command, path: Vec<String>, out: &mut Vec<(Vec<String>, Command)>) {
            for sub in command.get_subcommands() {
                let mut p = path.clone();
                p.push(sub.get_name().to_string());
                walk(sub, p, out);
            }
            out.push((path, command.clone()));
        }
        let mut root = command();
        root.build();
        let mut out = Vec::new();
        walk(&root, Vec::new(), &mut out);
        out
    }

    fn flags_of(command: &Command) -> Vec<String> {
        command
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect()
    }

    #[test]
    fn every_flag_and_argument_of_every_command_has_help_text() {
        let mut missing = Vec::new();
        for (path, command) in all_commands() {
            if path.iter().any(|p| p == "help") {
                continue;
            }
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || arg.is_hide_set() {
                    continue;
                }
                if arg
                    .get_help()
                    .is_none_or(|h| h.to_string().trim().is_empty())
                {
                    missing.push(format!("`{}` {id}", path.join(" ")));
                }
            }
            if path.iter().any(|p| p == "help") {
                continue;
            }
            if !path.is_empty() && command.get_about().is_none() {
                missing.push(format!("`{}` has no description", path.join(" ")));
            }
        }
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    /// Issue 36: `context` listed --database-url, --data-dir and --log-format.
    #[test]
    fn client_side_commands_take_no_server_flag() {
        let client_side = [
            "context",
            "mcp",
            "client",
            "proxy-config",
            "mcp-config",
            "recipes",
        ];
        let server_only = [
            "database_url",
            "database_url_file",
            "data_dir",
            "dashboard_secret_file",
        ];
        let mut wrong = Vec::new();
        let mut seen = 0;
        for (path, command) in all_commands() {
            let Some(top) = path.first() else { continue };
            let flags = flags_of(&command);
            let admin_remote = top == "admin" && path.get(1).is_some_and(|s| s != "bootstrap");
            if client_side.contains(&top.as_str()) || admin_remote {
                seen += 1;
                for flag in server_only {
                    if flags.iter().any(|f| f == flag) {
                        wrong.push(format!("`{}` lists {flag}", path.join(" ")));
                    }
                }
                let logs = path.starts_with(&["mcp".into(), "proxy".into()]);
                if !logs && flags.iter().any(|f| f == "log_format") {
                    wrong.push(format!("`{}` lists log_format", path.join(" ")));
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
        assert!(seen > 20, "only {seen} client-side commands walked");
    }

    /// A file flag is listed only where the secret it fills is taken.
    #[test]
    fn a_file_flag_is_listed_only_beside_the_flag_it_fills() {
        let mut wrong = Vec::new();
        for (path, command) in all_commands() {
            let flags = flags_of(&command);
            for (file, fills) in [
                ("token_file", "token"),
                ("nats_url_file", "nats_url"),
                ("dashboard_secret_file", "dashboard_secret"),
                ("database_url_file", "database_url"),
            ] {
                if !path.is_empty()
                    && flags.iter().any(|f| f == file)
                    && !flags.iter().any(|f| f == fills)
                {
                    wrong.push(format!("`{}` lists {file} but not {fills}", path.join(" ")));
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// The commands that open the database still take its flags, anywhere
    /// below them.
    #[test]
    fn database_commands_take_the_database_flags() {
        for (path, command) in all_commands() {
            let under = DATABASE_COMMANDS.iter().copied().flatten().any(|p| {
                path.iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
                    .starts_with(p)
            });
            if under && !path.iter().any(|p| p == "help") {
                let flags = flags_of(&command);
                for flag in [
                    "database_url",
                    "database_url_file",
                    "data_dir",
                    "log_format",
                ] {
                    assert!(
                        flags.iter().any(|f| f == flag),
                        "`{}` lacks {flag}",
                        path.join(" ")
                    );
                }
            }
        }
    }
}
