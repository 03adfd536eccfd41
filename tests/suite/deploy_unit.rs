//! The systemd unit and its environment file (`deploy/`) against the binary
//! they run: systemd must wait longer than the server's own shutdown grace
//! before it kills it, must stop it with a signal the server drains on, and
//! every setting the example file names must be one the binary reads.

use std::path::Path;
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_ai-crew-sync");

/// What the server does after the grace before it exits: stop its workers,
/// close its pool, stop an embedded PostgreSQL (`pg_ctl stop -m fast`).
const AFTER_GRACE_SECS: u64 = 10;

fn deploy_file(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The value of `Key=` in the unit (the last one wins, as in systemd).
fn unit_setting(unit: &str, key: &str) -> String {
    unit.lines()
        .filter_map(|line| line.trim().strip_prefix(&format!("{key}=")))
        .next_back()
        .unwrap_or_else(|| panic!("the unit sets no {key}"))
        .trim()
        .to_string()
}

fn help(args: &[&str]) -> String {
    let out = Command::new(BINARY)
        .env_clear()
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// `--shutdown-grace-secs`'s default, as `serve --help` states it.
fn default_grace_secs() -> u64 {
    let help = help(&["serve", "--help"]);
    let flag = help
        .split("--shutdown-grace-secs")
        .nth(1)
        .expect("serve --help names --shutdown-grace-secs");
    let default = flag
        .split("[default: ")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("--shutdown-grace-secs has a default");
    default.parse().unwrap()
}

/// `NAME=value` lines of the env file, commented out or not.
fn env_example_settings() -> Vec<(String, String)> {
    deploy_file("env.example")
        .lines()
        .map(|line| line.trim_start_matches('#').trim())
        .filter_map(|line| line.split_once('='))
        .filter(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

#[test]
fn the_unit_waits_longer_than_the_shutdown_grace_and_stops_with_a_drained_signal() {
    let unit = deploy_file("ai-crew-sync.service");
    let timeout: u64 = unit_setting(&unit, "TimeoutStopSec")
        .trim_end_matches('s')
        .parse()
        .expect("TimeoutStopSec in whole seconds");
    let grace = default_grace_secs();
    assert!(
        timeout >= grace + AFTER_GRACE_SECS,
        "TimeoutStopSec={timeout} leaves less than {AFTER_GRACE_SECS} s after the default grace of {grace} s"
    );
    // A grace the example suggests must fit as well.
    for (name, value) in env_example_settings() {
        if name == "BUS_SHUTDOWN_GRACE_SECS" {
            let suggested: u64 = value.parse().unwrap();
            assert!(
                timeout >= suggested + AFTER_GRACE_SECS,
                "env.example's BUS_SHUTDOWN_GRACE_SECS={suggested} does not fit TimeoutStopSec={timeout}"
            );
        }
    }
    // `serve` drains on SIGTERM and SIGINT only.
    let signal = unit_setting(&unit, "KillSignal");
    assert!(
        ["SIGTERM", "SIGINT"].contains(&signal.as_str()),
        "KillSignal={signal}"
    );
    assert!(
        unit_setting(&unit, "ExecStart").ends_with("ai-crew-sync serve"),
        "the unit runs serve"
    );
}

#[test]
fn every_setting_in_the_env_example_is_one_the_binary_reads() {
    let help = format!("{}{}", help(&["--help"]), help(&["serve", "--help"]));
    let settings = env_example_settings();
    assert!(settings.iter().any(|(name, _)| name == "DATABASE_URL"));
    for (name, _) in settings {
        // RUST_LOG is read by the logger, not by a flag.
        if name == "RUST_LOG" {
            continue;
        }
        assert!(
            help.contains(&format!("[env: {name}=]")) || help.contains(&format!("[env: {name}]")),
            "deploy/env.example sets {name}, which no flag of `ai-crew-sync serve` reads"
        );
    }
}
