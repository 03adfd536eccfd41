//! `doctor`'s server checks: the servers this machine's settings name (the
//! profile in use, and the address the last `serve` on this database
//! recorded) and whether each answers `GET /health`. A profile pointing at
//! one server while this database's server listens at another is the sign
//! of a second installation, and is said.

use sqlx::PgPool;

use super::super::context::BusArgs;
use super::super::reach;
use super::{Check, NOTHING_TO_DO, Status, check};

/// The `profile` and `server` lines.
pub(super) async fn server_checks(profile: Option<String>, pool: Option<&PgPool>) -> Vec<Check> {
    let mut checks = Vec::new();
    let bus = BusArgs {
        url: None,
        token: None,
        profile,
    };
    // The profile's URL, when a profile applies here.
    let from_profile = match bus.resolve() {
        Ok(resolved) => resolved
            .profile
            .map(|p| (p.value, resolved.url.value, resolved.url.from)),
        Err(err) => {
            checks.push(check(
                "profile",
                Status::Warn,
                format!("the local profiles cannot be read: {err:#}"),
                "fix what it says (`ai-crew-sync context show` reads the same)",
            ));
            None
        }
    };
    let recorded = match pool {
        Some(pool) => reach::recorded_mcp_url(pool).await.ok().flatten(),
        None => None,
    };
    if let Some((name, url, _)) = &from_profile {
        checks.push(match reach::answers(url).await {
            Ok(()) => {
                let elsewhere = recorded
                    .as_ref()
                    .filter(|r| reach::base_of(r) != reach::base_of(url));
                match elsewhere {
                    None => check(
                        "profile",
                        Status::Ok,
                        format!("profile {name} points at {url}, which answers"),
                        NOTHING_TO_DO,
                    ),
                    Some(recorded) => check(
                        "profile",
                        Status::Warn,
                        format!(
                            "profile {name} points at {url}, which answers, but the server on \
                             this database last listened at {recorded}: two installations?"
                        ),
                        "run doctor with the --data-dir or DATABASE_URL of the server the \
                         profile uses, or point the profile at this one (`quickstart --profile \
                         NAME --url URL`)",
                    ),
                }
            }
            Err(why) => check(
                "profile",
                Status::Fail,
                format!("profile {name} points at {url}: {why}"),
                "start that server (`ai-crew-sync serve`), or point the profile at the running \
                 one (`ai-crew-sync quickstart --profile NAME --url URL`, or `context profile \
                 add` again)",
            ),
        });
    }
    match recorded {
        Some(url) => {
            let named_by_profile = from_profile
                .as_ref()
                .is_some_and(|(_, p, _)| reach::base_of(p) == reach::base_of(&url));
            if !named_by_profile {
                checks.push(match reach::answers(&url).await {
                    Ok(()) => check(
                        "server",
                        Status::Ok,
                        format!("the server on this database listens at {url} and answers"),
                        NOTHING_TO_DO,
                    ),
                    Err(why) => check(
                        "server",
                        Status::Warn,
                        format!("the server on this database last listened at {url}: {why}"),
                        "start it with `ai-crew-sync serve` (same --data-dir or DATABASE_URL)",
                    ),
                });
            }
        }
        None if from_profile.is_none() => checks.push(check(
            "server",
            Status::Skip,
            "no profile applies here and no server has recorded its address on this database",
            "start `ai-crew-sync serve`, then `ai-crew-sync quickstart --team T --agent A` \
             writes a profile pointing at it",
        )),
        None => {}
    }
    checks
}
