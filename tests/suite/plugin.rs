//! `plugin/`, the Claude Code plugin, checked against Claude Code's plugin
//! layout (the manifest's fields, the hooks schema, the MCP server entry,
//! command files with front matter) and against this binary: every hook
//! command and the MCP server command run, and every tool or argument a
//! command names exists on the bus. `recipes` prints the same texts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn plugin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugin")
}

fn json_file(path: &str) -> Value {
    let path = plugin_dir().join(path);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Run this binary with `args` and `stdin`; (exit code, stdout, stderr).
fn run(args: &[&str], stdin: &str, config: &Path) -> (Option<i32>, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(args)
        .env("BUS_CONFIG_DIR", config)
        .env_remove("CLAUDE_CODE_SESSION_ID")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_manifest_has_the_fields_claude_code_reads() {
    let manifest = json_file(".claude-plugin/plugin.json");
    let name = manifest["name"].as_str().expect("name is required");
    let kebab = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.split('-').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        });
    assert!(kebab, "name must be kebab-case: {name}");
    let version = manifest["version"].as_str().unwrap();
    let parts: Vec<&str> = version.split('.').collect();
    assert!(
        parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "version must be MAJOR.MINOR.PATCH: {version}"
    );
    assert!(
        manifest["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty())
    );
    assert!(manifest["author"]["name"].is_string());
    assert!(
        manifest["keywords"]
            .as_array()
            .unwrap()
            .iter()
            .all(Value::is_string)
    );
    let known = [
        "name",
        "version",
        "description",
        "author",
        "homepage",
        "repository",
        "license",
        "keywords",
        "commands",
        "agents",
        "skills",
        "hooks",
        "mcpServers",
    ];
    for key in manifest.as_object().unwrap().keys() {
        assert!(
            known.contains(&key.as_str()),
            "unknown manifest field {key}"
        );
    }
}

/// The hook events Claude Code fires that this plugin may wire.
const HOOK_EVENTS: &[&str] = &[
    "SessionStart",
    "UserPromptSubmit",
    "Stop",
    "SubagentStop",
    "SessionEnd",
    "PreToolUse",
    "PostToolUse",
    "Notification",
    "PreCompact",
];

#[test]
fn every_hook_is_a_command_this_binary_runs_and_answers_quietly_without_a_window() {
    let hooks = json_file("hooks/hooks.json");
    let events = hooks["hooks"].as_object().expect("a `hooks` object");
    for wanted in [
        "SessionStart",
        "UserPromptSubmit",
        "Stop",
        "SessionEnd",
        "PreToolUse",
    ] {
        assert!(events.contains_key(wanted), "{wanted} is wired");
    }
    let config = tempfile::tempdir().unwrap();
    for (event, groups) in events {
        assert!(
            HOOK_EVENTS.contains(&event.as_str()),
            "unknown event {event}"
        );
        for group in groups.as_array().expect("each event holds a list") {
            for hook in group["hooks"].as_array().expect("each group holds `hooks`") {
                assert_eq!(hook["type"], "command", "{hook}");
                assert!(hook["timeout"].as_u64().is_some_and(|t| t >= 5), "{hook}");
                let command = hook["command"].as_str().unwrap();
                let words: Vec<&str> = command.split_whitespace().collect();
                assert_eq!(words[0], "ai-crew-sync", "{command}");
                // What Claude Code sends, for a conversation no proxy holds.
                let input = format!(
                    r#"{{"session_id":"no-proxy-here","hook_event_name":"{event}","cwd":"/tmp",
                        "tool_name":"Edit","tool_input":{{"file_path":"/tmp/x.rs"}}}}"#
                );
                let (code, stdout, stderr) = run(&words[1..], &input, config.path());
                assert_eq!(code, Some(0), "{command}: {stderr}");
                assert_eq!(stdout, "", "{command}");
            }
        }
    }
}

/// Issue 37: the edit guard runs before exactly the tools that edit a file
/// (Claude Code's matcher: names separated by `|`, each matched whole,
/// https://code.claude.com/docs/en/hooks, its matchers), and nothing
/// else pays for it.
// Breakage: a matcher without NotebookEdit, or `.*`, fails here.
#[test]
fn the_pre_tool_use_hook_runs_before_each_file_edit_and_nothing_else() {
    let hooks = json_file("hooks/hooks.json");
    let groups = hooks["hooks"]["PreToolUse"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{groups:?}");
    let matcher = groups[0]["matcher"].as_str().expect("a matcher");
    let mut matched: Vec<&str> = matcher.split('|').collect();
    matched.sort();
    let mut edits: Vec<&str> = ai_crew_sync::client::hook::pre_tool_use::CLAUDE_CODE_EDITS
        .iter()
        .map(|(tool, _)| *tool)
        .collect();
    edits.sort();
    assert_eq!(matched, edits, "{matcher}");
    assert!(
        matched
            .iter()
            .all(|name| name.chars().all(|c| c.is_ascii_alphanumeric())),
        "exact names, no pattern: {matcher}"
    );
    let hook = &groups[0]["hooks"][0];
    assert_eq!(
        hook["command"],
        "ai-crew-sync context hook --event pre_tool_use"
    );
}

#[test]
fn the_mcp_server_entry_runs_the_stdio_proxy() {
    let mcp = json_file(".mcp.json");
    let server = &mcp["mcpServers"]["ai-crew-sync"];
    assert_eq!(server["command"], "ai-crew-sync");
    let args: Vec<&str> = server["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args, ["mcp", "proxy"]);
    assert!(
        !mcp.to_string().contains("acs_"),
        "no credential in the plugin"
    );
    let config = tempfile::tempdir().unwrap();
    let mut help = args.clone();
    help.push("--help");
    let (code, stdout, _) = run(&help, "", config.path());
    assert_eq!(code, Some(0));
    assert!(stdout.contains("--host-session"), "{stdout}");
}

/// Every snake_case word in backticks that the commands name: tools of the
/// bus (or the proxy's own) and their arguments.
fn named_in_backticks(text: &str) -> BTreeSet<String> {
    let mut words = BTreeSet::new();
    for quoted in text.split('`').skip(1).step_by(2) {
        for word in quoted.split(|c: char| !(c.is_ascii_lowercase() || c == '_')) {
            if word.contains('_') && !word.starts_with('_') && !word.ends_with('_') {
                words.insert(word.to_string());
            }
        }
    }
    words
}

#[test]
fn every_command_has_a_description_and_names_only_tools_and_arguments_that_exist() {
    let mut known: BTreeSet<String> = ["session_status", "configure_session"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for tool in ai_crew_sync::mcp::BusServer::tool_list() {
        known.insert(tool.name.to_string());
        if let Some(Value::Object(properties)) = tool.input_schema.get("properties") {
            known.extend(properties.keys().cloned());
        }
    }
    let dir = plugin_dir().join("commands");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        ai_crew_sync::cli::recipes::names().count(),
        "every command is a recipe"
    );
    let config = tempfile::tempdir().unwrap();
    for path in files {
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let front = text
            .strip_prefix("---\n")
            .and_then(|rest| rest.split_once("\n---\n"))
            .unwrap_or_else(|| panic!("{name}: front matter between --- lines"))
            .0;
        assert!(
            front.lines().any(|l| l
                .strip_prefix("description:")
                .is_some_and(|d| !d.trim().is_empty())),
            "{name}: a description"
        );
        for word in named_in_backticks(&text) {
            assert!(
                known.contains(&word),
                "{name} names `{word}`, which the bus does not have"
            );
        }
        // `recipes NAME` prints the same procedure.
        let (code, stdout, stderr) = run(&["recipes", &name], "", config.path());
        assert_eq!(code, Some(0), "{stderr}");
        let body = text.split_once("\n---\n").unwrap().1.trim();
        assert!(
            stdout.contains(body),
            "recipes {name} prints the command's text"
        );
    }
    let (code, _, stderr) = run(&["recipes", "dance"], "", config.path());
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("no recipe named \"dance\"") && stderr.contains("standup"),
        "{stderr}"
    );
}
