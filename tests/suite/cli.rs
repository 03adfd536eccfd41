//! The operator CLI as an operator runs it: the real binary against a real
//! database, reading what it prints.

use std::process::{Command, Output};

use serde_json::Value;

use crate::support::postgres::fresh_database_url;

pub(crate) fn bus(database_url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(args)
        .env("DATABASE_URL", database_url)
        .output()
        .expect("run ai-crew-sync")
}

pub(crate) fn ok_json(database_url: &str, args: &[&str]) -> Value {
    let out = bus(database_url, args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[tokio::test]
async fn operator_commands_create_list_disable_and_revoke() {
    let db = fresh_database_url().await;

    let team = ok_json(
        &db,
        &[
            "team", "create", "--slug", "Acme", "--name", "Acme Web", "--json",
        ],
    );
    assert_eq!(team["slug"], "acme", "slugs are normalised");

    let added = ok_json(
        &db,
        &[
            "agent", "add", "--team", "acme", "--name", "alice", "--json",
        ],
    );
    let token = added["token"]
        .as_str()
        .expect("the minted secret is the JSON field `token`");
    assert!(token.starts_with("acs_") && token.len() == 68, "{token}");

    let issued = ok_json(
        &db,
        &[
            "token", "issue", "--team", "acme", "--agent", "alice", "--label", "laptop", "--json",
        ],
    );
    assert_ne!(issued["token"], added["token"]);

    let listed = ok_json(&db, &["token", "list", "--team", "acme", "--json"]);
    let listed_text = listed.to_string();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert!(
        !listed_text.contains(&token[4..]),
        "a listing never shows a secret"
    );
    assert!(
        listed_text.contains(&token[..12]),
        "it shows the display prefix"
    );

    let revoked = ok_json(
        &db,
        &[
            "token",
            "revoke",
            "--id",
            issued["id"].as_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(revoked["revoked_now"], true);
    let again = ok_json(
        &db,
        &[
            "token",
            "revoke",
            "--id",
            issued["id"].as_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(
        again["revoked_now"], false,
        "revoking twice changes nothing"
    );

    let disabled = ok_json(
        &db,
        &[
            "agent", "disable", "--team", "acme", "--name", "alice", "--json",
        ],
    );
    assert!(disabled["agent"]["disabled_at"].is_string());
    let agents = ok_json(&db, &["agent", "list", "--team", "acme", "--json"]);
    assert_eq!(agents[0]["active_tokens"], 1);
    assert!(agents[0]["disabled_at"].is_string());
    ok_json(
        &db,
        &[
            "agent", "enable", "--team", "acme", "--name", "alice", "--json",
        ],
    );

    let teams = ok_json(&db, &["team", "list", "--json"]);
    assert_eq!(teams[0]["agents"], 1);

    let quota = ok_json(
        &db,
        &[
            "team", "quota", "--team", "acme", "--bytes", "1000", "--json",
        ],
    );
    assert_eq!(quota["attachment_bytes_limit"], 1000);
    let out = bus(&db, &["team", "quota", "--team", "acme", "--bytes=-1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("0 or more"));

    let audit: Vec<String> = {
        let pool = ai_crew_sync::db::connect(&db, 1).await.unwrap();
        sqlx::query_scalar("SELECT action FROM audit_log ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        audit,
        [
            "team.create",
            "agent.add",
            "token.issue",
            "token.issue",
            "token.revoke",
            "agent.disable",
            "agent.enable",
            "team.quota"
        ]
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_what_to_do_and_changes_nothing() {
    let db = fresh_database_url().await;
    ok_json(
        &db,
        &[
            "team", "create", "--slug", "acme", "--name", "Acme", "--json",
        ],
    );

    let out = bus(
        &db,
        &["team", "create", "--slug", "acme", "--name", "Again"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already exists") && err.contains("agent add"),
        "{err}"
    );

    let out = bus(
        &db,
        &["agent", "add", "--team", "acme", "--name", "alice/claude"],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`/` is reserved"));

    let out = bus(&db, &["agent", "add", "--team", "nope", "--name", "alice"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("team list"));

    let teams = ok_json(&db, &["team", "list", "--json"]);
    assert_eq!(teams.as_array().unwrap().len(), 1);
    assert_eq!(
        teams[0]["agents"], 0,
        "no agent was created by the refused commands"
    );
}

/// A refusal's `error:` line ends with a newline, so a shell prompt or the
/// next line of a script never runs onto it (issue 15, item 7): operator
/// commands against the database and the broker, and the console client.
#[tokio::test]
async fn every_error_line_ends_with_a_newline() {
    let db = fresh_database_url().await;
    let failing: [&[&str]; 5] = [
        &["agent", "add", "--team", "nope", "--name", "alice"],
        &["conversations", "status", "--team", "nope"],
        &[
            "token",
            "revoke",
            "--id",
            "00000000-0000-0000-0000-000000000000",
        ],
        &[
            "team",
            "stream",
            "--team",
            "nope",
            "--nats-url",
            "nats://127.0.0.1:1",
        ],
        &[
            "client",
            "--url",
            "http://127.0.0.1:9/mcp",
            "--token",
            "acs_x",
            "whoami",
        ],
    ];
    for args in failing {
        let out = bus(&db, args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("error: ") && err.ends_with('\n'),
            "{args:?}: the error line must end with a newline: {err:?}"
        );
    }
}

/// `mcp-config` prints the direct-HTTP block (for scripts) with the token
/// given and the window label. `quickstart` is tested in `newcomer.rs`.
#[test]
fn mcp_config_prints_the_direct_http_block_for_scripts() {
    let out = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(["mcp-config", "--url", "http://h/mcp", "--session", "win-2"])
        .env("BUS_TOKEN", "acs_x")
        .output()
        .unwrap();
    let block: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        block["mcpServers"]["ai-crew-sync"]["headers"]["X-Crew-Session"],
        "win-2"
    );
    assert_eq!(
        block["mcpServers"]["ai-crew-sync"]["headers"]["Authorization"],
        "Bearer acs_x"
    );
}

/// `--json` is one flag of the whole command line: the same JSON whether it
/// comes after the command, before it or between its words; and a command
/// with no JSON form refuses it before running, as clap refuses an unknown
/// flag (exit 2).
// Breakage: without the refusal in `cli::parse`, `migrate --json` migrates
// and exits 0, and `recipes --json` prints the recipes.
#[tokio::test]
async fn json_is_taken_anywhere_on_the_line_and_refused_where_there_is_no_json_form() {
    let db = fresh_database_url().await;
    ok_json(
        &db,
        &[
            "team", "create", "--slug", "acme", "--name", "Acme", "--json",
        ],
    );
    let after = ok_json(&db, &["team", "list", "--json"]);
    assert_eq!(after[0]["slug"], "acme", "{after}");
    assert_eq!(ok_json(&db, &["--json", "team", "list"]), after);
    assert_eq!(ok_json(&db, &["team", "--json", "list"]), after);

    for args in [
        &["migrate", "--json"][..],
        &["--json", "recipes"],
        &["admin", "logout", "--json"],
        &["completions", "bash", "--json"],
    ] {
        let out = bus(&db, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("unexpected argument '--json' found"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?} ran: {out:?}");
    }
}

/// Every command path under `path` (its `--help` lists subcommands under
/// "Commands:"), `path` included.
fn command_paths(env: &[(&str, &str)], path: Vec<String>, out: &mut Vec<Vec<String>>) {
    let help = help_of(env, &path, "--help");
    out.push(path.clone());
    let mut in_commands = false;
    for line in help.lines() {
        if line.trim_end() == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            let Some(name) = line
                .strip_prefix("  ")
                .and_then(|l| l.split_whitespace().next())
            else {
                break;
            };
            if name != "help" {
                let mut sub = path.clone();
                sub.push(name.to_string());
                command_paths(env, sub, out);
            }
        }
    }
}

fn help_of(env: &[(&str, &str)], path: &[String], flag: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(path)
        .arg(flag)
        .envs(env.iter().copied())
        .output()
        .expect("run ai-crew-sync");
    assert!(out.status.success(), "{path:?} {flag} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
        + String::from_utf8_lossy(&out.stderr).as_ref()
}

#[test]
fn help_never_prints_a_credential_held_in_the_environment() {
    let token = format!("acs_{}", "5ec7e7".repeat(10) + "abcd");
    let admin = format!("acsa_{}", "ad314".repeat(12) + "abcd");
    let env = [
        ("BUS_TOKEN", token.as_str()),
        ("BUS_ADMIN_TOKEN", admin.as_str()),
        ("BUS_ADMIN_URL", "https://ops:adm1n-pa55@bus.example/"),
        ("BUS_NATS_URL", "nats://natsuser:n4ts-pa55@127.0.0.1:4222"),
        ("BUS_NATS_CREDENTIALS", "/home/ops/cr3ds-pa55.creds"),
        (
            "DATABASE_URL",
            "postgres://pguser:pg-pa55@127.0.0.1:5432/bus",
        ),
        ("BUS_URL", "http://bususer:bu5-pa55@127.0.0.1:8787/mcp"),
    ];
    let mut paths = Vec::new();
    command_paths(&env, Vec::new(), &mut paths);
    for wanted in [
        vec!["serve"],
        vec!["client", "send"],
        vec!["mcp-config"],
        vec!["conversations", "migrate"],
        vec!["team", "stream"],
    ] {
        assert!(
            paths.iter().any(|p| p == &wanted),
            "{wanted:?} not among the commands found: {paths:?}"
        );
    }
    for path in &paths {
        for flag in ["--help", "-h"] {
            let help = help_of(&env, path, flag);
            // Every password above holds `pa55`; the tokens are whole secrets.
            for secret in ["pa55", token.as_str(), admin.as_str()] {
                assert!(
                    !help.contains(secret),
                    "`{} {flag}` shows a secret from the environment:\n{help}",
                    path.join(" ")
                );
            }
        }
    }
}

/// Issue 33 item 9: a secret given as a flag is refused before anything
/// runs, naming the variable and the file flag that take it instead; the
/// file flag works; a URL without credentials may stay a flag.
#[test]
fn a_secret_on_the_command_line_is_refused_and_read_from_a_file_instead() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(args)
            .env_remove("BUS_TOKEN")
            .env_remove("DATABASE_URL")
            .env_remove("BUS_NATS_URL")
            .env_remove("BUS_DASHBOARD_SECRET")
            .output()
            .expect("run ai-crew-sync");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (args, env, file_flag) in [
        (
            &[
                "mcp-config",
                "--url",
                "http://h/mcp",
                "--token",
                "acs_s3cret",
            ][..],
            "BUS_TOKEN",
            "--token-file",
        ),
        (
            &["client", "--token=acs_s3cret", "whoami"][..],
            "BUS_TOKEN",
            "--token-file",
        ),
        (
            &["serve", "--dashboard-secret", "s3cret".repeat(8).as_str()][..],
            "BUS_DASHBOARD_SECRET",
            "--dashboard-secret-file",
        ),
        (
            &[
                "migrate",
                "--database-url",
                "postgres://u:s3cret@127.0.0.1:1/db",
            ][..],
            "DATABASE_URL",
            "--database-url-file",
        ),
        (
            &[
                "team",
                "stream",
                "--team",
                "t",
                "--nats-url",
                "nats://u:s3cret@127.0.0.1:1",
            ][..],
            "BUS_NATS_URL",
            "--nats-url-file",
        ),
    ] {
        let (code, _, stderr) = run(args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("refused") && stderr.contains(env) && stderr.contains(file_flag),
            "{args:?}: {stderr}"
        );
        assert!(
            !stderr.contains("s3cret"),
            "the refusal repeats no secret: {stderr}"
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    // The first line is the secret; what follows it is never part of it.
    std::fs::write(
        &file,
        "acs_from_the_file\n# issued 2026-12-05 for the build bot\n",
    )
    .unwrap();
    let (code, stdout, stderr) = run(&[
        "mcp-config",
        "--url",
        "http://h/mcp",
        "--token-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let block: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        block["mcpServers"]["ai-crew-sync"]["headers"]["Authorization"],
        "Bearer acs_from_the_file"
    );
    // No credentials in it: the URL may be a flag (this one answers nothing).
    let (code, _, stderr) = run(&[
        "team",
        "stream",
        "--team",
        "t",
        "--nats-url",
        "nats://127.0.0.1:1",
        "--database-url",
        "postgres://postgres@127.0.0.1:1/none",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        !stderr.contains("on the command line is refused"),
        "{stderr}"
    );
}

/// Issue 36: `context` subcommands listed `--database-url`, `--data-dir` and
/// `--log-format`, and took them to do nothing. A client-side command now
/// neither lists nor takes a flag it does not use, before or after its name;
/// the commands that open the database still take them anywhere on the line.
// Breakage: with the flags `global` again, `context show --data-dir X` runs
// and exits 0.
#[tokio::test]
async fn a_command_refuses_a_flag_it_does_not_use_and_does_not_list_it() {
    let config = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
            .args(args)
            .env("BUS_CONFIG_DIR", config.path())
            .env_remove("DATABASE_URL")
            .env_remove("BUS_TOKEN")
            .output()
            .expect("run ai-crew-sync")
    };
    let secret = config.path().join("secret");
    std::fs::write(&secret, "s3cret-of-sixteen-chars-or-more").unwrap();
    let secret = secret.to_str().unwrap();
    for args in [
        &["context", "show", "--data-dir", "/nowhere"][..],
        &["--data-dir", "/nowhere", "context", "show"],
        &["context", "show", "--database-url", "postgres://u@h/db"],
        &["--log-format", "json", "client", "whoami"],
        &["proxy-config", "--data-dir", "/nowhere"],
        &["mcp", "proxy", "--database-url", "postgres://u@h/db"],
        &[
            "context",
            "hook",
            "--event",
            "status",
            "--dashboard-secret-file",
            secret,
        ],
    ] {
        let out = run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains("unexpected argument '--"),
            "{args:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{args:?} ran: {out:?}");
    }
    for path in [
        &["context", "show"][..],
        &["context", "hook"],
        &["mcp", "proxy"],
        &["client", "whoami"],
    ] {
        let mut args = path.to_vec();
        args.push("--help");
        let help = String::from_utf8_lossy(&run(&args).stdout).into_owned();
        for flag in ["--database-url", "--data-dir", "--dashboard-secret-file"] {
            assert!(
                !help.contains(flag),
                "`{}` lists {flag}:\n{help}",
                path.join(" ")
            );
        }
    }
    // --json is listed only where there is a JSON form.
    for (path, listed) in [
        (&["context", "hook"][..], false),
        (&["mcp", "proxy"], false),
        (&["serve"], false),
        (&["context", "show"], true),
        (&["team", "list"], true),
    ] {
        let mut args = path.to_vec();
        args.push("--help");
        let help = String::from_utf8_lossy(&run(&args).stdout).into_owned();
        assert_eq!(
            help.contains("--json"),
            listed,
            "`{}`:\n{help}",
            path.join(" ")
        );
    }
    // Where the database is used the flags stay, before and after the command.
    let db = fresh_database_url().await;
    let file = config.path().join("db-url");
    std::fs::write(&file, &db).unwrap();
    let file = file.to_str().unwrap();
    for args in [
        &["team", "list", "--database-url-file", file, "--json"][..],
        &[
            "--database-url-file",
            file,
            "--log-format",
            "json",
            "team",
            "list",
            "--json",
        ],
    ] {
        let out = run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
