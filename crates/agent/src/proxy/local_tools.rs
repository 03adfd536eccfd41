//! The proxy's own tools, answered without forwarding:
//!
//! - `session_status`: which window this conversation is, as which agent, with
//!   which labels, until when its credential holds, which bus, and the
//!   default channel as the bus decides it (`whoami`). Never a secret.
//! - `configure_session {project, role, channel, profile}`: project, role and
//!   channel go to the bus in a heartbeat (it validates them; a refusal
//!   changes nothing here either), and the bus decides the default channel
//!   from them; a profile switch is verified with `whoami`, stays in the
//!   team, and reports the claims and locks that stay with the window it
//!   leaves.

use std::sync::Arc;

use rmcp::model::{CallToolResult, Tool};
use serde_json::{Map, Value, json};

use super::window;
use super::{Proxy, refusal};
use crate::client::{self, profiles::Profiles};

/// How long session_status waits for the bus to say the default channel.
const STATUS_WHOAMI_BOUND: std::time::Duration = std::time::Duration::from_secs(3);

pub(super) fn definitions() -> Vec<Tool> {
    let tools = json!([
        {
            "name": "session_status",
            "description": "This conversation's window on the ai-crew-sync bus: label and address, \
                agent, team, profile, project, role, the channel set for the window, the default \
                channel as the bus decides it (the one whoami names: the channel set, else the \
                project's, else the window label's), when the window's credential expires (the \
                proxy renews it), the bus URL, whether the bus is reachable, and bus_tools: how \
                many of the bus's tools are listed here (besides these two). Never shows a \
                secret.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
            "annotations": {"readOnlyHint": true}
        },
        {
            "name": "configure_session",
            "description": "Set this window's project and role labels (teammates find you by \
                them), its channel (its default channel: where post_message goes when it names \
                no channel or recipient, and team_digest's focus; without one the bus uses the \
                project's, else the window label's), all sent to the bus in a heartbeat, \"\" \
                clears; or switch to another local profile of the same team (verified with \
                whoami; claims and locks held by this window stay with the agent you leave, and \
                are listed).",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "project": {"type": "string", "description": "Project label (<= 256 bytes); \"\" clears."},
                    "role": {"type": "string", "description": "Role label, e.g. reviewer (<= 256 bytes); \"\" clears."},
                    "channel": {"type": "string", "description": "This window's default channel, before the project's and the window label's (a channel name, not `inbox` or `all`); \"\" clears."},
                    "profile": {"type": "string", "description": "A local profile name (see `ai-crew-sync context profile list`)."}
                },
                "additionalProperties": false
            }
        }
    ]);
    serde_json::from_value(tools).expect("the local tool definitions are valid")
}

/// Answer a local tool; `None` when `name` is not one.
pub(super) async fn call(
    proxy: &Arc<Proxy>,
    name: &str,
    arguments: Option<&Map<String, Value>>,
) -> Option<CallToolResult> {
    let empty = Map::new();
    let arguments = arguments.unwrap_or(&empty);
    match name {
        "session_status" => Some(match only(arguments, &[]) {
            Err(message) => refusal("invalid", &message),
            Ok(()) => CallToolResult::structured(proxy.status().await),
        }),
        "configure_session" => Some(proxy.configure(arguments).await),
        _ => None,
    }
}

/// Refuse arguments the tool does not take, naming the ones it does.
fn only(arguments: &Map<String, Value>, known: &[&str]) -> Result<(), String> {
    if let Some(unknown) = arguments.keys().find(|k| !known.contains(&k.as_str())) {
        let takes = if known.is_empty() {
            "it takes no arguments".to_string()
        } else {
            format!("it takes {}", known.join(", "))
        };
        return Err(format!(
            "unknown argument `{unknown}`: {takes}. Nothing was changed."
        ));
    }
    Ok(())
}

impl Proxy {
    async fn status(&self) -> Value {
        let host = self.host();
        // The default channel is the bus's decision: asked, never guessed.
        let me = if self.bound.read().await.window.is_some() {
            tokio::time::timeout(STATUS_WHOAMI_BOUND, self.call_json("whoami", Map::new()))
                .await
                .ok()
                .and_then(Result::ok)
        } else {
            None
        };
        let bound = self.bound.read().await;
        let labels = self.labels.lock().await.clone();
        let trouble = self.trouble.lock().await.clone();
        let tools = self.offered_bus_tools().await.as_ref().map(Vec::len);
        let asked = |key: &str| me.as_ref().map(|me| me[key].clone());
        let mut status = json!({
            "label": host.label,
            "label_from": host.source,
            "window": bound.window.as_ref().map(|w| w.address.clone()),
            "agent": bound.agent,
            "team": bound.team,
            "profile": bound.profile,
            "project": labels.project,
            "role": labels.role,
            "channel": asked("channel").unwrap_or_else(|| json!(labels.channel)),
            "default_channel": asked("default_channel"),
            "default_channel_from": asked("default_channel_from"),
            "credential_epoch": bound.window.as_ref().map(|w| w.epoch),
            "credential_expires_at": bound.window.as_ref().map(|w| w.expires_at),
            "bus_url": bound.url,
            "connected": bound.window.is_some() && trouble.is_none(),
            "problem": trouble,
            "bus_tools": tools,
        });
        if let Some(refused) = labels.channel_refused {
            status["channel_refused"] = json!(format!(
                "the bus refused the channel {refused}; fix it in .acs.toml or set one with \
                 configure_session"
            ));
        }
        status
    }

    async fn configure(self: &Arc<Self>, arguments: &Map<String, Value>) -> CallToolResult {
        if let Err(message) = only(arguments, &["project", "role", "channel", "profile"]) {
            return refusal("invalid", &message);
        }
        let text = |key: &str| match arguments.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(other) => Err(format!(
                "`{key}` must be a string, got {other}. Nothing was changed."
            )),
        };
        let (project, role, channel, profile) = match (
            text("project"),
            text("role"),
            text("channel"),
            text("profile"),
        ) {
            (Ok(a), Ok(b), Ok(c), Ok(d)) => (a, b, c, d),
            (Err(m), ..) | (_, Err(m), ..) | (_, _, Err(m), _) | (.., Err(m)) => {
                return refusal("invalid", &m);
            }
        };
        if project.is_none() && role.is_none() && channel.is_none() && profile.is_none() {
            return refusal(
                "invalid",
                "configure_session needs at least one of project, role, channel, profile. \
                 Nothing was changed.",
            );
        }
        let mut answer = Map::new();
        if let Some(profile) = profile {
            match self.switch_profile(&profile).await {
                Ok(switched) => {
                    answer.insert("profile_switch".into(), switched);
                }
                Err(message) => return refusal("invalid", &message),
            }
        }
        if project.is_some() || role.is_some() || channel.is_some() {
            // The bus checks every label (the one channel-name rule is
            // its own) and decides the default channel from them.
            let mut beat = Map::new();
            for (key, value) in [
                ("project", &project),
                ("role", &role),
                ("channel", &channel),
            ] {
                if let Some(value) = value {
                    beat.insert(key.into(), Value::String(value.clone()));
                }
            }
            if let Err(err) = self.call_json("heartbeat", beat).await {
                let done = if answer.contains_key("profile_switch") {
                    "The profile switch was made; project, role and channel were not set: "
                } else {
                    "Nothing was changed: "
                };
                return refusal("invalid", &format!("{done}{err:#}"));
            }
            let mut labels = self.labels.lock().await;
            if let Some(p) = project {
                labels.project = (!p.is_empty()).then_some(p);
            }
            if let Some(r) = role {
                labels.role = (!r.is_empty()).then_some(r);
            }
            if let Some(c) = channel {
                labels.channel = (!c.is_empty()).then_some(c);
                labels.channel_refused = None;
            }
        }
        answer.insert("session".into(), self.status().await);
        CallToolResult::structured(Value::Object(answer))
    }

    /// Switch to `name`: verified, same team, new window credential for the
    /// same label under the profile's agent.
    async fn switch_profile(&self, name: &str) -> Result<Value, String> {
        let profiles = Profiles::load().map_err(|e| format!("{e:#}. Nothing was changed."))?;
        let profile = profiles
            .get(name)
            .map_err(|e| format!("{e:#}. Nothing was changed."))?
            .clone();
        let theirs = client::whoami(&profile.url, &profile.token, None)
            .await
            .map_err(|e| {
                format!("profile {name} did not verify with whoami: {e:#}. Nothing was changed.")
            })?;
        let ours = self.call_json("whoami", Map::new()).await.map_err(|e| {
            format!("could not ask who this window is now: {e:#}. Nothing was changed.")
        })?;
        if theirs["team_id"] != ours["team_id"] {
            return Err(format!(
                "profile {name} speaks for team {} but this window is in team {}: a switch stays \
                 in the team (claims, locks and conversations do not cross teams). Nothing was \
                 changed. Start another MCP server with --profile {name} for that team.",
                theirs["team"], ours["team"]
            ));
        }
        let same_agent = theirs["agent_id"] == ours["agent_id"];
        let (tasks, locks) = if same_agent {
            (Vec::new(), Vec::new())
        } else {
            self.held_here().await
        };
        if !same_agent {
            self.mark_offline().await;
        }
        let agent = theirs["agent"].as_str().unwrap_or_default().to_string();
        let _one = self.rebinding.lock().await;
        self.rebind(
            &profile.url,
            &profile.token,
            Some(name.to_string()),
            &theirs,
        )
        .await
        .map_err(|e| format!("{e:#}. The window was not switched."))?;
        let note = if same_agent {
            "same agent: this window's claims and locks stay with it".to_string()
        } else {
            format!(
                "the tasks and locks listed stay held by {} (the window you left) until their \
                 leases lapse; switch back to complete or release them",
                ours["address"].as_str().unwrap_or_default()
            )
        };
        Ok(json!({
            "from": {"agent": ours["agent"], "address": ours["address"]},
            "to": {"profile": name, "agent": agent},
            "tasks_left_behind": tasks,
            "locks_left_behind": locks,
            "note": note,
        }))
    }

    /// Claims and locks this window holds now, as `key`/`name` with what
    /// identifies them to a person.
    async fn held_here(&self) -> (Vec<Value>, Vec<Value>) {
        let tasks = self
            .call_json(
                "list_tasks",
                window::object(json!({"status": "claimed", "mine_only": true, "limit": 50})),
            )
            .await
            .map(|list| {
                list["tasks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| json!({"key": t["key"], "title": t["title"]}))
                    .collect()
            })
            .unwrap_or_default();
        let label = self.host().label;
        let agent = self.bound.read().await.agent.clone().unwrap_or_default();
        let locks = self
            .call_json("list_locks", Map::new())
            .await
            .map(|list| {
                list["locks"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|l| l["agent"] == agent.as_str() && l["session"] == label.as_str())
                    .map(|l| json!({"name": l["name"], "expires_at": l["expires_at"]}))
                    .collect()
            })
            .unwrap_or_default();
        (tasks, locks)
    }
}
