//! The git guard: a `pre-commit` hook ([`install`]) that refuses a commit
//! touching paths another window holds exclusively on the bus (issue 37's
//! path reservations), and the check it runs ([`check`]).
//!
//! Who is "this window", whose own reservations never refuse its commits:
//! - a commit made from an agent's host conversation, whose `mcp proxy`
//!   recorded a window for it ([`WindowState`], found by the conversation's
//!   id in `CLAUDE_CODE_SESSION_ID`, which Claude Code sets for the commands
//!   its Bash tool runs), is checked as that window;
//! - otherwise the check speaks with what applies in the repository
//!   ([`context::resolve`]: `BUS_TOKEN`, else the profile `--profile` /
//!   `BUS_PROFILE`, `.acs.toml` or the default names) as the agent's shared
//!   window, and every other window's exclusive reservation (the same
//!   agent's other windows included) refuses.
//!
//! The paths are those the commit stages ([`git::staged_paths`]), relative
//! to the repository's root, sent to `check_paths` at most
//! [`PATHS_PER_CALL`] a call (only a path over 4096 bytes, which no
//! repository holds, is left out); the bus answers within the project the
//! repository's `.acs.toml` names (`check_paths`' `project`), whichever
//! window asks, else within the asking window's own ([`ask`]).
//!
//! Never block work on an outage: no credential, a bus that is down, slow
//! (past [`GUARD_DEADLINE`]) or that refuses the check, git failing: the
//! commit goes ahead and the check says why on one line.

pub mod git;
pub mod install;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::context::{self, Requested};
use super::project;
use super::window_state::WindowState;
use super::{Connection, object};

/// Everything a check does ends within this.
pub const GUARD_DEADLINE: Duration = Duration::from_secs(4);
/// The most paths one `check_paths` call carries (the tool's own limit).
pub const PATHS_PER_CALL: usize = 200;
/// The longest staged path sent: no repository holds a longer one.
const MAX_PATH_BYTES: usize = 4096;
/// The most refused paths a refusal lists one by one.
const LISTED: usize = 20;

/// Whether `ACS_GUARD`'s value turns the check off (`off`, `0`, `false`,
/// `no`, in any case).
pub fn bypassed(value: Option<&str>) -> bool {
    value.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "off" | "0" | "false" | "no"
        )
    })
}

/// What a check found.
#[derive(Debug)]
pub enum Outcome {
    /// Nothing staged is held exclusively by another window (or nothing is
    /// staged): the commit goes ahead, nothing said.
    Clear,
    /// Refuse the commit: the text says which paths, who holds them and
    /// how to proceed.
    Refused(String),
    /// Not checked (no credential, the bus down or slow, git failing): the
    /// commit goes ahead; the line says why.
    Unchecked(String),
}

/// One staged path another window holds exclusively, and how.
struct Held {
    path: String,
    holder: String,
    pattern: String,
    reason: Option<String>,
    expires_at: String,
    seconds_left: Option<i64>,
}

/// Who the check speaks as.
enum Speaker {
    Window(WindowState),
    Shared {
        url: String,
        token: String,
        who: String,
    },
}

impl Speaker {
    fn describe(&self) -> String {
        match self {
            Speaker::Window(w) => format!(
                "window {}/{} (this Claude Code conversation's, team {})",
                w.agent, w.label, w.team
            ),
            Speaker::Shared { who, .. } => who.clone(),
        }
    }

    async fn connect(&self) -> anyhow::Result<Connection> {
        match self {
            Speaker::Window(w) => w.connect().await,
            Speaker::Shared { url, token, .. } => Connection::open(url, token, None).await,
        }
    }
}

/// Check the commit being made in `repo`. `requested` is what the command
/// line and environment named (as for every client command); `config_dir`
/// where windows are recorded; `host_session` the host conversation's id
/// (`CLAUDE_CODE_SESSION_ID`), when set.
pub async fn check(
    repo: &Path,
    requested: Requested,
    config_dir: &Path,
    host_session: Option<String>,
) -> Outcome {
    match tokio::time::timeout(
        GUARD_DEADLINE,
        check_within(repo, requested, config_dir, host_session),
    )
    .await
    {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(err)) => Outcome::Unchecked(format!("{err:#}")),
        Err(_) => Outcome::Unchecked(format!(
            "the bus did not answer within {} s",
            GUARD_DEADLINE.as_secs()
        )),
    }
}

async fn check_within(
    repo: &Path,
    requested: Requested,
    config_dir: &Path,
    host_session: Option<String>,
) -> anyhow::Result<Outcome> {
    // A path past the bus's length limit would refuse its whole batch; no
    // repository holds one, so it is left out. Every other path is sent,
    // control characters included (`src/api/**` covers `src/api/a\tb.rs`).
    let staged: Vec<String> = git::staged_paths(repo)?
        .into_iter()
        .filter(|p| p.len() <= MAX_PATH_BYTES)
        .collect();
    if staged.is_empty() {
        return Ok(Outcome::Clear);
    }
    let Some(speaker) = speaker(repo, requested, config_dir, host_session)? else {
        return Ok(Outcome::Unchecked(
            "no credential applies here (no window recorded for this conversation, no \
             BUS_TOKEN, no profile): add one with `ai-crew-sync context profile add`, or name \
             one in .acs.toml with `context set-project`"
                .into(),
        ));
    };
    // The repository's project, whoever asks: a proxy's window may be of
    // another project than the repository it commits in.
    let top = git::top_level(repo).unwrap_or_else(|_| repo.to_path_buf());
    let project = project::find(&top)
        .ok()
        .flatten()
        .and_then(|(_, file)| file.project)
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty());
    let bus = speaker.connect().await?;
    let answers = ask(&bus, project.as_deref(), &staged).await;
    bus.close().await;
    let (project, held) = answers?;
    if held.is_empty() {
        return Ok(Outcome::Clear);
    }
    Ok(Outcome::Refused(refusal(&held, &project, &speaker)))
}

/// `check_paths` for every staged path, [`PATHS_PER_CALL`] a call: the
/// project the bus answered for, and what another window holds
/// exclusively. In `project` (`check_paths`' `project`: the one the
/// repository's `.acs.toml` names) when given, else the window's.
async fn ask(
    bus: &Connection,
    project_named: Option<&str>,
    staged: &[String],
) -> anyhow::Result<(String, Vec<Held>)> {
    let mut held = Vec::new();
    let mut project = String::new();
    for batch in staged.chunks(PATHS_PER_CALL) {
        let mut arguments = json!({"paths": batch});
        if let Some(p) = project_named {
            arguments["project"] = json!(p);
        }
        let answer = bus.call("check_paths", object(arguments)).await?;
        if let Some(p) = answer["project"].as_str() {
            project = p.to_string();
        }
        held.extend(held_elsewhere(&answer));
    }
    Ok((project, held))
}

/// The window of this host conversation, else the shared window of what
/// applies in the repository; `None` when nothing gives a credential.
fn speaker(
    repo: &Path,
    requested: Requested,
    config_dir: &Path,
    host_session: Option<String>,
) -> anyhow::Result<Option<Speaker>> {
    if let Some(host) = host_session.filter(|s| !s.trim().is_empty())
        && let Some(window) = WindowState::load(config_dir, &host)?
    {
        return Ok(Some(Speaker::Window(window)));
    }
    let top = git::top_level(repo).unwrap_or_else(|_| repo.to_path_buf());
    let resolved = context::resolve(requested, &top)?;
    let Ok(token) = resolved.token() else {
        return Ok(None);
    };
    let who = match (&resolved.agent, &resolved.profile) {
        (Some(agent), Some(profile)) => format!(
            "agent {}'s shared window (profile {}, from {})",
            agent.value, profile.value, profile.from
        ),
        _ => format!(
            "the shared window of {}",
            resolved.credential.as_deref().unwrap_or("the token given")
        ),
    };
    Ok(Some(Speaker::Shared {
        url: resolved.url.value.clone(),
        token: token.to_string(),
        who,
    }))
}

/// The paths of a `check_paths` answer another window holds exclusively:
/// each exclusive reservation not `mine`, and any path the answer's
/// `exclusive_elsewhere` names without one.
fn held_elsewhere(answer: &Value) -> Vec<Held> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut held = Vec::new();
    for entry in answer["paths"].as_array().into_iter().flatten() {
        for r in entry["reservations"].as_array().into_iter().flatten() {
            if r["exclusive"] != Value::Bool(true) || r["mine"] == Value::Bool(true) {
                continue;
            }
            let holder = match r["holder"].as_str() {
                Some(h) if !h.is_empty() => h.to_string(),
                _ => format!("{}/{}", text(&r["agent"]), text(&r["session"])),
            };
            held.push(Held {
                path: text(&entry["path"]),
                holder,
                pattern: text(&r["pattern"]),
                reason: r["reason"].as_str().map(str::to_string),
                expires_at: text(&r["expires_at"]),
                seconds_left: r["seconds_left"].as_i64(),
            });
        }
    }
    for path in answer["exclusive_elsewhere"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let path = text(path);
        if !held.iter().any(|h| h.path == path) {
            held.push(Held {
                path,
                holder: "another window".into(),
                pattern: String::new(),
                reason: None,
                expires_at: String::new(),
                seconds_left: None,
            });
        }
    }
    held
}

fn left(seconds: i64) -> String {
    match seconds {
        s if s < 60 => format!("{s} s left"),
        s if s < 3600 => format!("{} min left", s / 60),
        s => format!("{} h {} min left", s / 3600, (s % 3600) / 60),
    }
}

/// The refusal: each path, who holds it, the reservation, its reason and
/// expiry; then how to proceed.
fn refusal(held: &[Held], project: &str, speaker: &Speaker) -> String {
    let mut paths: Vec<&str> = held.iter().map(|h| h.path.as_str()).collect();
    paths.dedup();
    let mut text = format!(
        "ai-crew-sync guard: commit refused: {} staged path(s) held exclusively by another \
         window{}:\n",
        paths.len(),
        if project.is_empty() {
            String::new()
        } else {
            format!(" in project {project:?}")
        }
    );
    for h in held.iter().take(LISTED) {
        let _ = write!(text, "  {}: held by {}", h.path, h.holder);
        if !h.pattern.is_empty() {
            let _ = write!(text, " (reservation {:?}", h.pattern);
            if let Some(reason) = &h.reason {
                let _ = write!(text, ", reason {reason:?}");
            }
            if !h.expires_at.is_empty() {
                let _ = write!(text, ", expires {}", h.expires_at);
                if let Some(s) = h.seconds_left {
                    let _ = write!(text, ", {}", left(s));
                }
            }
            text.push(')');
        }
        text.push('\n');
    }
    if held.len() > LISTED {
        let _ = writeln!(text, "  … and {} more", held.len() - LISTED);
    }
    let holders: Vec<&str> = {
        let mut h: Vec<&str> = held.iter().map(|h| h.holder.as_str()).collect();
        h.sort_unstable();
        h.dedup();
        h
    };
    let _ = write!(
        text,
        "To proceed: ask the holder to release it (post_message {{to: \"{}\", body: …}}; they \
         call release_paths), or wait until it expires and commit again, or leave those paths \
         out of this commit (git restore --staged PATH), or commit anyway with `ACS_GUARD=off git \
         commit …` (the holder's work and yours may then collide).\nChecked as {}; its own reservations \
         never refuse its commits.",
        holders.first().copied().unwrap_or("the holder"),
        speaker.describe()
    );
    text
}
