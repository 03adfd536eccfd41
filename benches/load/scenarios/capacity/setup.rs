//! The capacity scenario's population, made directly in SQL as a fleet's
//! operator would have made it beforehand: 100 teams with conversations on,
//! agents `a{i}` (agent `i` in team `cap{i % 100}`) with a token each,
//! conversations of up to [`GROUP`] agents of a team, and open tasks.

use ai_crew_sync::auth;
use anyhow::{Context as _, Result};
use sqlx::PgPool;
use uuid::Uuid;

/// Teams the agents are spread over.
pub const TEAMS: usize = 100;
/// Agents per conversation (a team's agents `k`, `k+1`, … in fours).
pub const GROUP: usize = 4;

/// One simulated agent: what its host knows.
pub struct Agent {
    pub index: usize,
    pub token: String,
    /// Its group's conversation (it is seated there as window `main`).
    pub conversation: Uuid,
}

/// The population made so far; [`Population::grow`] adds agents.
pub struct Population {
    teams: Vec<Uuid>,
    agents: Vec<Uuid>,
    /// One per (team, group), made with the group's first agent.
    conversations: std::collections::HashMap<(usize, usize), Uuid>,
}

impl Population {
    /// The 100 teams, conversations on; no agents yet.
    pub async fn teams(pool: &PgPool) -> Result<Population> {
        let ids: Vec<Uuid> = (0..TEAMS).map(|_| Uuid::new_v4()).collect();
        let slugs: Vec<String> = (0..TEAMS).map(|t| format!("cap{t}")).collect();
        sqlx::query(
            "INSERT INTO teams (id, slug, name)
             SELECT id, slug, slug FROM unnest($1::uuid[], $2::text[]) AS t (id, slug)",
        )
        .bind(&ids)
        .bind(&slugs)
        .execute(pool)
        .await
        .context("creating the capacity teams")?;
        sqlx::query("UPDATE teams SET conversations_enabled = true WHERE id = ANY($1)")
            .bind(&ids)
            .execute(pool)
            .await
            .context("turning conversations on for the capacity teams")?;
        Ok(Population {
            teams: ids,
            agents: Vec::new(),
            conversations: Default::default(),
        })
    }

    /// Agents up to `count` (agent, token, conversation seat), returned.
    pub async fn grow(&mut self, pool: &PgPool, count: usize) -> Result<Vec<Agent>> {
        let from = self.agents.len();
        let mut tx = pool.begin().await?;
        let (mut ids, mut teams, mut names) = (Vec::new(), Vec::new(), Vec::new());
        let (mut hashes, mut prefixes, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
        for i in from..count {
            ids.push(Uuid::new_v4());
            teams.push(self.teams[i % TEAMS]);
            names.push(format!("a{i}"));
            let secret = auth::new_agent_token();
            hashes.push(secret.sha256.to_vec());
            prefixes.push(secret.display_prefix);
            tokens.push(secret.plaintext);
        }
        sqlx::query(
            "INSERT INTO agents (id, team_id, name)
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[])",
        )
        .bind(&ids)
        .bind(&teams)
        .bind(&names)
        .execute(&mut *tx)
        .await
        .context("creating the capacity agents")?;
        sqlx::query(
            "INSERT INTO agent_tokens (id, team_id, agent_id, token_sha256, display_prefix, label)
             SELECT gen_random_uuid(), t, a, h, p, 'capacity'
             FROM unnest($1::uuid[], $2::uuid[], $3::bytea[], $4::text[]) AS x (t, a, h, p)",
        )
        .bind(&teams)
        .bind(&ids)
        .bind(&hashes)
        .bind(&prefixes)
        .execute(&mut *tx)
        .await
        .context("issuing the capacity agents' tokens")?;
        let mut made = Vec::with_capacity(count - from);
        for (n, token) in tokens.into_iter().enumerate() {
            let index = from + n;
            let (team, group) = (index % TEAMS, index / TEAMS / GROUP);
            let conversation = match self.conversations.get(&(team, group)) {
                Some(id) => *id,
                None => {
                    let id = Uuid::new_v4();
                    sqlx::query(
                        "INSERT INTO conversations
                             (id, team_id, title, visibility, created_by, created_session)
                         VALUES ($1, $2, 'capacity group', 'private', $3, 'main')",
                    )
                    .bind(id)
                    .bind(teams[n])
                    .bind(ids[n])
                    .execute(&mut *tx)
                    .await
                    .context("creating a capacity conversation")?;
                    self.conversations.insert((team, group), id);
                    id
                }
            };
            sqlx::query(
                "INSERT INTO conversation_members
                     (id, team_id, conversation_id, agent_id, session, role, state,
                      history_from_seq, joined_at)
                 VALUES (gen_random_uuid(), $1, $2, $3, 'main', 'participant', 'active', 1, now())",
            )
            .bind(teams[n])
            .bind(conversation)
            .bind(ids[n])
            .execute(&mut *tx)
            .await
            .context("seating a capacity agent")?;
            made.push(Agent {
                index,
                token,
                conversation,
            });
        }
        tx.commit().await?;
        self.agents.extend(ids);
        Ok(made)
    }

    /// At least `per_team` open tasks in every team, made by its first agent.
    pub async fn queue_tasks(&self, pool: &PgPool, per_team: i64) -> Result<()> {
        sqlx::query(
            "INSERT INTO tasks (id, team_id, key, title, created_by, created_session)
             SELECT gen_random_uuid(), a.team_id, 'cap-' || gen_random_uuid(), 'capacity task', a.id, ''
             FROM agents a
             CROSS JOIN LATERAL (
                 SELECT greatest($2 - (SELECT count(*) FROM tasks t
                                       WHERE t.team_id = a.team_id AND t.status = 'open'), 0) AS missing
             ) m
             CROSS JOIN LATERAL generate_series(1, m.missing) AS g
             WHERE a.id = ANY($1)",
        )
        .bind(&self.agents[..TEAMS.min(self.agents.len())])
        .bind(per_team)
        .execute(pool)
        .await
        .context("queueing the capacity teams' tasks")?;
        Ok(())
    }
}
