//! What `proxy-config` prints: the block that makes a host start `mcp proxy`
//! for each conversation. It never holds a credential; at most the profile's
//! name, passed as `--profile`, which names a file on this machine.
//!
//! - Claude Code: `.mcp.json` at the project root (or `claude mcp add`),
//!   `{"mcpServers": {NAME: {"type": "stdio", "command", "args", "env"}}}`.
//! - Cursor: `.cursor/mcp.json` (or `~/.cursor/mcp.json`), the same
//!   `mcpServers` map without `type`.
//! - Codex: `~/.codex/config.toml` (or `.codex/config.toml` in a trusted
//!   project), a `[mcp_servers.NAME]` table with `command` and `args`.

use serde_json::{Value, json};

/// The server's name in every host's config.
pub const SERVER_NAME: &str = "ai-crew-sync";

/// The command line a host runs.
pub fn proxy_args(profile: Option<&str>) -> Vec<String> {
    let mut args = vec!["mcp".to_string(), "proxy".to_string()];
    if let Some(profile) = profile {
        args.extend(["--profile".to_string(), profile.to_string()]);
    }
    args
}

/// `.mcp.json` for Claude Code.
pub fn claude_code(command: &str, profile: Option<&str>) -> Value {
    json!({"mcpServers": {SERVER_NAME: {
        "type": "stdio",
        "command": command,
        "args": proxy_args(profile),
        "env": {}
    }}})
}

/// `.cursor/mcp.json` for Cursor.
pub fn cursor(command: &str, profile: Option<&str>) -> Value {
    json!({"mcpServers": {SERVER_NAME: {
        "command": command,
        "args": proxy_args(profile),
    }}})
}

/// The `config.toml` table for Codex.
pub fn codex(command: &str, profile: Option<&str>) -> String {
    let args: Vec<String> = proxy_args(profile).iter().map(|a| toml_string(a)).collect();
    format!(
        "[mcp_servers.{SERVER_NAME}]\ncommand = {}\nargs = [{}]\n",
        toml_string(command),
        args.join(", ")
    )
}

/// A TOML basic string (JSON's escapes are valid TOML escapes for these).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string encodes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_block_is_toml_with_the_profile_and_nothing_secret() {
        let block = codex("ai-crew-sync", Some("work"));
        let parsed: toml::Table = toml::from_str(&block).unwrap();
        let server = &parsed["mcp_servers"][SERVER_NAME];
        assert_eq!(server["command"].as_str(), Some("ai-crew-sync"));
        let args: Vec<&str> = server["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args, ["mcp", "proxy", "--profile", "work"]);
    }
}
