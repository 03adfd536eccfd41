//! The run's fixture: team `chaos` with conversations on, its agents and
//! tokens (operator CLI), one window per client, conversations every window
//! is seated in (some synchronous on PostgreSQL, some outbox on the team's
//! JetStream streams), and channels.

use anyhow::{Context as _, bail};
use serde_json::{Value, json};
use uuid::Uuid;

use super::mcp::Window;
use super::{Agent, Conversation, Fixture, Mode, Seat};
use crate::Profile;
use crate::history::Outcome;
use crate::model::Target;

const TEAM: &str = "chaos";
const AGENTS: usize = 6;
const SYNC_CONVERSATIONS: usize = 3;
const OUTBOX_CONVERSATIONS: usize = 3;
const CHANNELS: usize = 2;

pub async fn prepare(target: &Target, profile: &Profile) -> anyhow::Result<Fixture> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    operator(
        target,
        &["team", "create", "--slug", TEAM, "--name", "Chaos"],
    )
    .await?;
    team(target, "capability", &["--conversations", "on"]).await?;
    let mut agents = Vec::new();
    for k in 0..AGENTS {
        let name = format!("a{k}");
        let out = operator(
            target,
            &["agent", "add", "--team", TEAM, "--name", &name, "--json"],
        )
        .await?;
        let issued: Value = serde_json::from_str(&out)
            .with_context(|| format!("`agent add --json` printed {out:?}"))?;
        let token = issued["token"]
            .as_str()
            .context("`agent add --json` printed no token")?
            .to_string();
        agents.push(Agent { name, token });
    }
    let seats: Vec<Seat> = (0..profile.clients.max(2))
        .map(|i| {
            let agent = i % AGENTS;
            let label = format!("w{i}");
            Seat {
                agent,
                address: format!("{}/{label}", agents[agent].name),
                label,
            }
        })
        .collect();
    let windows: Vec<Window> = seats
        .iter()
        .map(|s| Window::new(&target.replicas, &agents[s.agent].token, &s.label))
        .collect::<anyhow::Result<_>>()?;

    let pool = sqlx::PgPool::connect(&target.database_url)
        .await
        .context("connecting to the bus's database")?;
    let team_id: Uuid = sqlx::query_scalar("SELECT id FROM teams WHERE slug = $1")
        .bind(TEAM)
        .fetch_one(&pool)
        .await?;

    let mut conversations = Vec::new();
    for k in 0..SYNC_CONVERSATIONS {
        let id = conversation(&windows, &seats, &format!("sync {k}")).await?;
        conversations.push(Conversation {
            id,
            mode: Mode::Sync,
        });
    }
    // Every node, so setup rides out a node the schedule has not touched
    // yet being slow; the streams are R3, placed by the cluster.
    let nats = &target.nats_urls.join(",");
    team(target, "stream", &["--nats-url", nats, "--replicas", "3"]).await?;
    team(
        target,
        "capability",
        &["--backend", "jetstream", "--nats-url", nats],
    )
    .await?;
    for k in 0..OUTBOX_CONVERSATIONS {
        let id = conversation(&windows, &seats, &format!("outbox {k}")).await?;
        conversations.push(Conversation {
            id,
            mode: Mode::Outbox,
        });
    }
    for c in &conversations {
        let (backend, publication): (String, String) =
            sqlx::query_as("SELECT backend, publication FROM conversations WHERE id = $1")
                .bind(c.id)
                .fetch_one(&pool)
                .await?;
        let expected = match c.mode {
            Mode::Sync => ("postgres", "sync"),
            Mode::Outbox => ("jetstream", "outbox"),
        };
        if (backend.as_str(), publication.as_str()) != expected {
            bail!(
                "conversation {} is {backend}/{publication}, not {}/{}",
                c.id,
                expected.0,
                expected.1
            );
        }
    }
    let channels: Vec<String> = (0..CHANNELS).map(|k| format!("chaos-{k}")).collect();
    for name in &channels {
        expect_ok(
            windows[0]
                .call(0, "create_channel", json!({"name": name}))
                .await,
            "create_channel",
        )?;
    }
    pool.close().await;
    Ok(Fixture {
        team_id,
        agents,
        seats,
        conversations,
        channels,
        lease_secs: crate::model::TASK_LEASE_SECS,
    })
}

/// Window 0 creates a private conversation inviting every other window;
/// each joins. Its id.
async fn conversation(windows: &[Window], seats: &[Seat], title: &str) -> anyhow::Result<Uuid> {
    let invite: Vec<&str> = seats[1..].iter().map(|s| s.address.as_str()).collect();
    let created = expect_ok(
        windows[0]
            .call(
                0,
                "create_conversation",
                json!({"title": title, "private": true, "invite": invite}),
            )
            .await,
        "create_conversation",
    )?;
    let id = created["id"]
        .as_str()
        .or(created["conversation_id"].as_str())
        .or(created["conversation"]["id"].as_str())
        .with_context(|| format!("create_conversation answered no id: {created}"))?
        .parse()?;
    for window in &windows[1..] {
        expect_ok(
            window
                .call(0, "join_conversation", json!({"conversation_id": id}))
                .await,
            "join_conversation",
        )?;
    }
    Ok(id)
}

fn expect_ok(outcome: Outcome, what: &str) -> anyhow::Result<Value> {
    match outcome {
        Outcome::Ok { result } => Ok(result),
        other => bail!("setting up the chaos team: {what} did not succeed: {other:?}"),
    }
}

/// `team COMMAND --team chaos FLAGS…`.
async fn team(target: &Target, command: &str, flags: &[&str]) -> anyhow::Result<String> {
    let mut args = vec!["team", command, "--team", TEAM];
    args.extend_from_slice(flags);
    operator(target, &args).await
}

/// Run an operator command against the bus's database: its stdout.
async fn operator(target: &Target, args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::process::Command::new(&target.binary)
        .args(args)
        .env("DATABASE_URL", &target.database_url)
        .output()
        .await
        .with_context(|| format!("running {} {}", target.binary.display(), args.join(" ")))?;
    if !output.status.success() {
        bail!(
            "`ai-crew-sync {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
