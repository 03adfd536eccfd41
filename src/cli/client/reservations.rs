//! `client paths …`: path reservations in this window's project
//! (`reserve_paths`, `release_paths`, `renew_reservations`,
//! `list_reservations`, `check_paths`), and how their answers read as text.

use clap::Subcommand;
use serde_json::{Value, json};

use super::show::{items, table_of, text, when};
use super::{Print, Request, request};

#[derive(Subcommand, Debug)]
pub(super) enum PathsCommand {
    /// Reserve the paths you are about to edit (reserve_paths): gitignore-style globs
    /// relative to the repository root, exclusive unless --shared. All or nothing unless
    /// --partial; a refusal names each holder and exits 1.
    Reserve {
        /// Globs such as `src/api/**`, `README.md`, `src/[ab]*.rs` (at most 100).
        #[arg(required = true, value_name = "GLOB")]
        patterns: Vec<String>,
        /// Shared: coexists with other shared reservations, excludes exclusive ones.
        #[arg(long)]
        shared: bool,
        /// Seconds to hold them, 5..86400 (default 1800). Reserve again or `paths renew`
        /// to extend.
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<i64>,
        /// One line saying what you are doing, shown to others.
        #[arg(long)]
        reason: Option<String>,
        /// Take what is free and list what is not, instead of refusing the whole call.
        #[arg(long)]
        partial: bool,
    },
    /// Release this window's reservations (release_paths): the patterns named, or all of
    /// them when none is named.
    Release {
        /// Patterns as reserved; none: every reservation of this window.
        #[arg(value_name = "GLOB")]
        patterns: Vec<String>,
    },
    /// Move every live reservation of this window to expire from now (renew_reservations).
    Renew {
        /// Seconds from now, 5..86400 (default 1800).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<i64>,
    },
    /// Live reservations of this window's project (list_reservations).
    List {
        /// Only those whose pattern covers this repository path.
        #[arg(long, value_name = "PATH")]
        path: Option<String>,
        /// Only those this agent holds (any of its windows).
        #[arg(long)]
        agent: Option<String>,
    },
    /// Who holds these repository paths (check_paths). Exits 1 when another window holds one
    /// of them exclusively, so a script can stop before editing.
    Check {
        /// Repository-relative file paths (at most 200).
        #[arg(required = true, value_name = "PATH")]
        paths: Vec<String>,
    },
}

/// How to show a reservation tool's answer.
pub(super) enum Show {
    Reserved,
    Released,
    Renewed,
    Listed,
    Checked,
}

fn shown(tool: &str, arguments: Value, show: Show) -> Request {
    request(tool, arguments, Print::Paths(show))
}

pub(super) fn prepare(command: PathsCommand) -> Request {
    match command {
        PathsCommand::Reserve {
            patterns,
            shared,
            ttl,
            reason,
            partial,
        } => shown(
            "reserve_paths",
            json!({"paths": patterns, "exclusive": !shared, "ttl_seconds": ttl,
                   "reason": reason, "partial": partial}),
            Show::Reserved,
        ),
        PathsCommand::Release { patterns } => {
            let paths = (!patterns.is_empty()).then_some(patterns);
            shown("release_paths", json!({"paths": paths}), Show::Released)
        }
        PathsCommand::Renew { ttl } => shown(
            "renew_reservations",
            json!({"ttl_seconds": ttl}),
            Show::Renewed,
        ),
        PathsCommand::List { path, agent } => shown(
            "list_reservations",
            json!({"path": path, "agent": agent}),
            Show::Listed,
        ),
        PathsCommand::Check { paths } => {
            shown("check_paths", json!({"paths": paths}), Show::Checked)
        }
    }
}

/// Print an answer as text (`--json` is handled by the caller). `check`
/// fails when another window holds one of the paths exclusively.
pub(super) fn print(show: Show, answer: &Value) -> anyhow::Result<()> {
    match show {
        Show::Reserved => reserved(answer),
        Show::Released => released(answer),
        Show::Renewed => table(&answer["reservations"]),
        Show::Listed => {
            table(&answer["reservations"]);
            if answer["more"] == true {
                println!("(more reservations exist than were listed)");
            }
        }
        Show::Checked => return checked(answer),
    }
    Ok(())
}

fn how(reservation: &Value) -> &'static str {
    if reservation["exclusive"] == true {
        "exclusive"
    } else {
        "shared"
    }
}

fn table(reservations: &Value) {
    table_of(
        reservations,
        &[
            "pattern",
            "how",
            "holder",
            "expires",
            "seconds left",
            "reason",
        ],
        |r| {
            vec![
                text(&r["pattern"]),
                how(r).to_string(),
                text(&r["holder"]),
                when(&r["expires_at"]),
                text(&r["seconds_left"]),
                text(&r["reason"]),
            ]
        },
    );
}

fn reserved(answer: &Value) {
    for granted in items(&answer["granted"]) {
        let verb = if granted["extended"] == true {
            "extended"
        } else {
            "reserved"
        };
        println!(
            "{verb} {} ({}) until {} ({} s)",
            text(&granted["pattern"]),
            how(granted),
            when(&granted["expires_at"]),
            text(&granted["seconds_left"])
        );
    }
    for refused in items(&answer["refused"]) {
        let holders: Vec<String> = items(&refused["conflicts"])
            .iter()
            .map(|c| {
                format!(
                    "{} ({}, {})",
                    text(&c["holder"]),
                    text(&c["pattern"]),
                    how(c)
                )
            })
            .collect();
        println!(
            "not reserved {}: held by {}",
            text(&refused["pattern"]),
            holders.join("; ")
        );
    }
    if items(&answer["granted"]).is_empty() && items(&answer["refused"]).is_empty() {
        println!("(nothing reserved)");
    }
}

fn released(answer: &Value) {
    for pattern in items(&answer["released"]) {
        println!("released {}", text(pattern));
    }
    for pattern in items(&answer["not_held"]) {
        println!("not held by this window: {}", text(pattern));
    }
    if items(&answer["released"]).is_empty() && items(&answer["not_held"]).is_empty() {
        println!("(this window held no reservations)");
    }
}

fn checked(answer: &Value) -> anyhow::Result<()> {
    for path in items(&answer["paths"]) {
        let covering = items(&path["reservations"]);
        if covering.is_empty() {
            println!("{}: free", text(&path["path"]));
            continue;
        }
        let holders: Vec<String> = covering
            .iter()
            .map(|c| {
                let who = if c["mine"] == true {
                    "this window".to_string()
                } else {
                    text(&c["holder"])
                };
                format!("{who} ({}, {})", text(&c["pattern"]), how(c))
            })
            .collect();
        println!("{}: {}", text(&path["path"]), holders.join("; "));
    }
    let elsewhere: Vec<String> = items(&answer["exclusive_elsewhere"])
        .iter()
        .map(text)
        .collect();
    if !elsewhere.is_empty() {
        anyhow::bail!(
            "another window holds {} exclusively: ask its holder before editing",
            elsewhere.join(", ")
        );
    }
    Ok(())
}
