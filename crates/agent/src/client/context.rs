//! Which bus, credential, team, agent, project and channel apply here, and
//! why. Every command that talks to a bus as an agent (the console client,
//! `context verify`, and later the stdio proxy and the hooks) asks this one
//! function, so they all agree.
//!
//! The order, first match wins:
//! - a token given as `BUS_TOKEN` (or `--token-file`) is used as it always was, with
//!   `--url` / `BUS_URL` (or the built-in URL); giving a profile as well is
//!   refused, since one of the two would be silently ignored;
//! - otherwise a profile: `--profile` / `BUS_PROFILE`, else the one the
//!   nearest `.acs.toml` names, else the default profile. `--url` /
//!   `BUS_URL` still overrides the profile's URL.
//!
//! Project, channel and role come from the nearest `.acs.toml`.
//!
//! Nothing here prints or serialises a token.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use serde::Serialize;

use super::profiles::Profiles;
use super::project::{self, ProjectFile};

/// The URL a client uses when nothing names one.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8787/mcp";

/// What the command line and environment asked for.
#[derive(Debug, Default, Clone)]
pub struct Requested {
    pub url: Option<String>,
    pub token: Option<String>,
    pub profile: Option<String>,
}

/// One setting and where it came from, in words a person can act on.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Setting {
    pub value: String,
    pub from: String,
}

impl Setting {
    fn new(value: impl Into<String>, from: impl Into<String>) -> Setting {
        Setting {
            value: value.into(),
            from: from.into(),
        }
    }
}

/// What applies in a directory.
#[derive(Debug, Serialize)]
pub struct Resolved {
    pub url: Setting,
    /// The profile in use, if the credential comes from one.
    pub profile: Option<Setting>,
    /// Known from the profile; with a bare token, `whoami` says.
    pub team: Option<Setting>,
    pub agent: Option<Setting>,
    pub project: Option<Setting>,
    pub channel: Option<Setting>,
    /// The window's role label, from `.acs.toml`.
    pub role: Option<Setting>,
    /// Where the credential comes from (never the credential).
    pub credential: Option<String>,
    pub project_file: Option<PathBuf>,
    /// Where profiles are kept (unknown without HOME or BUS_CONFIG_DIR).
    pub profiles_file: Option<PathBuf>,
    #[serde(skip)]
    token: Option<String>,
}

impl Resolved {
    /// The credential to send, or what to do when there is none.
    pub fn token(&self) -> anyhow::Result<&str> {
        self.token.as_deref().ok_or_else(|| {
            anyhow!(
                "no credential: add a profile (`ai-crew-sync context profile add --name P --url \
                 URL --team T --agent A`, which reads the token without echoing it), name one \
                 with --profile / BUS_PROFILE or in .acs.toml (`context set-project`), or set \
                 BUS_TOKEN to an agent token (acs_…)"
            )
        })
    }
}

fn given(value: Option<String>) -> Option<String> {
    value
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Resolve what applies in `dir` (usually the current directory).
pub fn resolve(requested: Requested, dir: &Path) -> anyhow::Result<Resolved> {
    let found = project::find(dir)?;
    let (project_file, file) = match found {
        Some((path, file)) => (Some(path), file),
        None => (None, ProjectFile::default()),
    };
    let from_file = || {
        project_file
            .as_ref()
            .map_or_else(String::new, |p| p.display().to_string())
    };
    // Start from what holds whatever the credential: the URL given (or the
    // built-in one) and what the project file says.
    let url = given(requested.url);
    let url_given = url.is_some();
    let mut resolved = Resolved {
        url: url.map_or_else(
            || Setting::new(DEFAULT_URL, "built-in default"),
            |u| Setting::new(u, "--url / BUS_URL"),
        ),
        profile: None,
        team: None,
        agent: None,
        project: file.project.clone().map(|v| Setting::new(v, from_file())),
        channel: file.channel.clone().map(|v| Setting::new(v, from_file())),
        role: file.role.clone().map(|v| Setting::new(v, from_file())),
        credential: None,
        project_file: project_file.clone(),
        // Where profiles would be; read only when no token was given, so a
        // token alone works whatever state the profiles file is in.
        profiles_file: Profiles::path().ok(),
        token: None,
    };
    let named_profile = given(requested.profile);

    if let Some(token) = given(requested.token) {
        if let Some(name) = named_profile {
            bail!(
                "both a token (BUS_TOKEN / --token-file) and a profile ({name:?}, from --profile / \
                 BUS_PROFILE) were given, and one would be ignored: unset BUS_TOKEN (or drop \
                 --token-file) to use the profile, or drop --profile / BUS_PROFILE to use the token"
            );
        }
        resolved.credential = Some("BUS_TOKEN / --token-file".to_string());
        resolved.token = Some(token);
        return Ok(resolved);
    }

    let profiles = Profiles::load()?;
    let choice = named_profile
        .map(|name| Setting::new(name, "--profile / BUS_PROFILE"))
        .or_else(|| {
            file.profile
                .clone()
                .map(|name| Setting::new(name, from_file()))
        })
        .or_else(|| {
            profiles.default.clone().map(|name| {
                Setting::new(
                    name,
                    format!("the default profile in {}", profiles.file().display()),
                )
            })
        });
    let Some(choice) = choice else {
        return Ok(resolved);
    };
    let profile = profiles.get(&choice.value)?;
    let from_profile = format!("profile {}", choice.value);
    if !url_given {
        resolved.url = Setting::new(profile.url.clone(), &from_profile);
    }
    resolved.team = Some(Setting::new(profile.team.clone(), &from_profile));
    resolved.agent = Some(Setting::new(profile.agent.clone(), &from_profile));
    resolved.credential = Some(format!(
        "the token of profile {} in {}",
        choice.value,
        profiles.file().display()
    ));
    resolved.token = Some(profile.token.clone());
    resolved.profile = Some(choice);
    Ok(resolved)
}
