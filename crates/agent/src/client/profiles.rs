//! Local profiles: which bus, team and agent a client speaks as, and the
//! agent's token, kept in `profiles.toml` in the config directory (mode
//! 0600) so that no client config (`.mcp.json`, `config.toml`) ever holds a
//! credential. One profile may be the default.
//!
//! ```toml
//! default = "work"
//!
//! [profiles.work]
//! url = "http://127.0.0.1:8787/mcp"
//! team = "acme"
//! agent = "alice"
//! token = "acs_…"
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, anyhow, bail};
use serde::{Deserialize, Serialize};

use super::local_files;

/// One way of reaching the bus as one agent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The server's MCP endpoint.
    pub url: String,
    pub team: String,
    pub agent: String,
    /// The agent's token (`acs_…`). Never printed.
    pub token: String,
}

/// Every profile on this machine, and the default's name.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profiles {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    #[serde(default)]
    pub profiles: BTreeMap<String, Profile>,
    #[serde(skip)]
    path: PathBuf,
}

impl Profiles {
    /// `profiles.toml` in the config directory.
    pub fn path() -> anyhow::Result<PathBuf> {
        Ok(local_files::config_dir()?.join("profiles.toml"))
    }

    /// The profiles on this machine (none when the file does not exist yet).
    pub fn load() -> anyhow::Result<Profiles> {
        let path = Self::path()?;
        let mut profiles = match local_files::read_private(&path)? {
            None => Profiles::default(),
            Some(text) => toml::from_str(&text).with_context(|| {
                format!(
                    "{} is not a profiles file this version reads; fix it by hand or remove it \
                     and add the profiles again with `context profile add`",
                    path.display()
                )
            })?,
        };
        profiles.path = path;
        Ok(profiles)
    }

    /// Write the file back (atomically, 0600).
    pub fn save(&self) -> anyhow::Result<()> {
        let text = toml::to_string_pretty(self).context("writing profiles as TOML")?;
        local_files::write_private(&self.path, text.as_bytes())
    }

    pub fn file(&self) -> &std::path::Path {
        &self.path
    }

    /// The profile called `name`, or an error listing the ones there are.
    pub fn get(&self, name: &str) -> anyhow::Result<&Profile> {
        self.profiles.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.profiles.keys().map(String::as_str).collect();
            let known = if known.is_empty() {
                "there are none yet".to_string()
            } else {
                format!("there are: {}", known.join(", "))
            };
            anyhow!(
                "no profile named {name:?} in {} ({known}). Add it with `ai-crew-sync context \
                 profile add --name {name} --url URL --team T --agent A`",
                self.path.display()
            )
        })
    }

    /// Refuse what [`Profiles::put`] would refuse, changing nothing: a
    /// command checks before it asks a server about the token.
    pub fn check(name: &str, profile: &Profile) -> anyhow::Result<()> {
        check_name(name)?;
        check_token(&profile.token)
    }

    /// Refuse a profile name [`Profiles::put`] would refuse.
    pub fn check_name(name: &str) -> anyhow::Result<()> {
        check_name(name)
    }

    /// Add or replace `name`; the first profile becomes the default.
    pub fn put(&mut self, name: &str, profile: Profile, make_default: bool) -> anyhow::Result<()> {
        Self::check(name, &profile)?;
        self.profiles.insert(name.to_string(), profile);
        if make_default || self.default.is_none() {
            self.default = Some(name.to_string());
        }
        Ok(())
    }

    /// Make `name` the default.
    pub fn set_default(&mut self, name: &str) -> anyhow::Result<()> {
        self.get(name)?;
        self.default = Some(name.to_string());
        Ok(())
    }

    /// Remove `name` (and the default, when it was that one).
    pub fn remove(&mut self, name: &str) -> anyhow::Result<Profile> {
        self.get(name)?;
        if self.default.as_deref() == Some(name) {
            self.default = None;
        }
        Ok(self.profiles.remove(name).expect("checked above"))
    }
}

/// A profile name: what `--profile`, `BUS_PROFILE` and `.acs.toml` say.
fn check_name(name: &str) -> anyhow::Result<()> {
    let fits = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if !fits {
        bail!(
            "profile name {name:?} is not usable: use 1 to 64 letters, digits, '-', '_' or '.' \
             (e.g. `work` or `acme-alice`)"
        );
    }
    Ok(())
}

/// A profile holds an agent token: session credentials (`acss_`) expire with
/// their window and admin credentials (`acsa_`) cannot call tools.
fn check_token(token: &str) -> anyhow::Result<()> {
    if token.starts_with("acss_") {
        bail!(
            "that is a session credential (acss_…), which lives only as long as its window; a \
             profile keeps the agent's token (acs_…) from `agent add` or `token issue`"
        );
    }
    if token.starts_with("acsa_") {
        bail!(
            "that is an admin credential (acsa_…), which cannot call tools; a profile keeps an \
             agent token (acs_…) from `agent add` or `token issue` (use `admin login` for admin \
             credentials)"
        );
    }
    if !token.starts_with("acs_") || token.chars().any(char::is_whitespace) {
        bail!(
            "that does not look like an agent token: agent tokens start with acs_ and have no \
             spaces (an operator prints one with `agent add` or `token issue`)"
        );
    }
    Ok(())
}
