//! A person's writes from the dashboard: `POST /dashboard/write/{action}`,
//! a form (`application/x-www-form-urlencoded`) the page's own forms send.
//!
//! Before anything is read or written, in this order: a request slot; the
//! request must come from this server's own page ([`super::same_origin`]:
//! `Sec-Fetch-Site`, else a foreign `Origin` is refused); the cookie's
//! sign-in is re-checked (a revoked person is refused at once); only a
//! person writes (agents and admins look); the principal's allowance
//! ([`super::rate_limited`]); the form within [`WRITE_FORM_MAX_BYTES`]; and
//! its `csrf` field must be the sign-in's write token
//! ([`session::CookieKey::write_token`], compared in constant time), on top
//! of the cookie's `SameSite=Strict`. Then one call of
//! `store::operations::dashboard::person`, with the person's identity (the
//! write fence runs), audited with the person's name. A write that went
//! through answers 303 back to `/dashboard`; a refusal answers its status
//! with a page saying why, as text.

use std::collections::HashMap;

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use uuid::Uuid;

use super::{Shared, page, session};
use acs_store::auth::Identity;
use acs_store::error::BusError;
use acs_store::store::operations::dashboard::{self as store, person};
use acs_store::store::tasks::NewTask;

/// The largest write form read: a message body at its limit, URL-encoded
/// (each byte at most three), and the other fields.
pub const WRITE_FORM_MAX_BYTES: usize = 3 * acs_wire::limits::BODY_MAX_BYTES + 64 * 1024;

/// The actions a person's forms post to.
pub const ACTIONS: &[&str] = &[
    "post",
    "task-create",
    "task-priority",
    "task-cancel",
    "conversation-join",
    "ack",
];

/// A refusal, as a page that says why (as text) and links back.
fn refused(status: StatusCode, message: &str) -> Response {
    (status, Html(page::write_refused(message))).into_response()
}

fn from_bus(err: &BusError) -> Response {
    let status = StatusCode::from_u16(err.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    refused(status, &err.to_string())
}

/// `POST /dashboard/write/{action}`.
pub async fn write(
    State(state): State<Shared>,
    Path(action): Path<String>,
    headers: HeaderMap,
    request: Request,
) -> Response {
    let Some(_slot) = state.app.limits.enter() else {
        return crate::http::too_many_in_flight(&state.app.limits);
    };
    if !super::same_origin(&headers) {
        return refused(
            StatusCode::FORBIDDEN,
            "this write came from another site's page (its Origin or Sec-Fetch-Site is not this \
             dashboard's), so it was refused and nothing was changed. Write from /dashboard on \
             this server.",
        );
    }
    if !ACTIONS.contains(&action.as_str()) {
        return refused(
            StatusCode::NOT_FOUND,
            &format!(
                "no dashboard write `{}`; the writes are {}. Nothing was changed.",
                action,
                ACTIONS.join(", ")
            ),
        );
    }
    let Some(sign_in) = session::cookie_value(&headers).and_then(|v| state.key.open(v)) else {
        return refused(
            StatusCode::UNAUTHORIZED,
            "not signed in to the dashboard (no sign-in cookie, or it expired): nothing was \
             changed. Open /dashboard and sign in with your person credential.",
        );
    };
    let viewer = match store::recheck(&state.app.pool, sign_in).await {
        Ok(viewer) => viewer,
        Err(BusError::Db(err)) => return crate::http::bus_error_response(&BusError::Db(err)),
        Err(err) => return from_bus(&err),
    };
    let Some(me) = viewer.person() else {
        return refused(
            StatusCode::FORBIDDEN,
            &format!(
                "signed in as {} `{}`: only a person of the team writes from the dashboard; \
                 agents write over /mcp, admins manage over /admin. Nothing was changed.",
                viewer.kind, viewer.name
            ),
        );
    };
    if let Some(refusal) = super::rate_limited(&state, &viewer) {
        return refusal;
    }
    let form = match read_form(&state, request).await {
        Ok(form) => form,
        Err(refusal) => return refusal,
    };
    let token = form.get("csrf").map(String::as_str).unwrap_or_default();
    if !state.key.write_token_matches(sign_in.session_id, token) {
        return refused(
            StatusCode::FORBIDDEN,
            "this write did not carry this sign-in's write token (the page's forms carry it; a \
             page from before a new sign-in, or another site, does not), so nothing was changed. \
             Reload /dashboard and write again.",
        );
    }
    match act(&state, &me, &action, &form).await {
        Ok(()) => (StatusCode::SEE_OTHER, [(header::LOCATION, "/dashboard")]).into_response(),
        Err(err) => from_bus(&err),
    }
}

/// A form field, trimmed; `None` when absent or blank.
fn field<'a>(form: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    form.get(name).map(|v| v.trim()).filter(|v| !v.is_empty())
}

fn required<'a>(
    form: &'a HashMap<String, String>,
    name: &str,
    what: &str,
) -> Result<&'a str, BusError> {
    field(form, name).ok_or_else(|| {
        BusError::invalid(format!("fill in {what} (`{name}`). Nothing was changed."))
    })
}

/// The write itself: one call of the store, with the person's identity.
async fn act(
    state: &Shared,
    me: &Identity,
    action: &str,
    form: &HashMap<String, String>,
) -> Result<(), BusError> {
    let bus = &state.bus;
    match action {
        "post" => {
            let reply_to = field(form, "reply_to")
                .map(|raw| {
                    raw.parse::<Uuid>().map_err(|_| {
                        BusError::invalid(
                            "reply_to is not a message id (a UUID); answer from the question's \
                             own form. Nothing was sent.",
                        )
                    })
                })
                .transpose()?;
            let post = person::PersonPost {
                channel: field(form, "channel").map(str::to_string),
                to: field(form, "to").map(str::to_string),
                // The body as typed: only its emptiness is judged by trimming.
                body: form.get("body").cloned().unwrap_or_default(),
                announce: field(form, "announce").is_some(),
                reply_to,
            };
            person::post(bus, me, post).await.map(drop)
        }
        "task-create" => {
            let new = NewTask {
                key: required(form, "key", "the task's key")?.to_string(),
                title: required(form, "title", "the task's title")?.to_string(),
                description: field(form, "description").map(str::to_string),
                priority: field(form, "priority").map(str::to_string),
                ..Default::default()
            };
            person::create_task(bus, me, new).await.map(drop)
        }
        "task-priority" => {
            let key = required(form, "key", "the task's key")?;
            let priority = required(form, "priority", "the priority (low, normal, high, urgent)")?;
            person::set_task_priority(bus, me, key, priority)
                .await
                .map(drop)
        }
        "task-cancel" => {
            let key = required(form, "key", "the task's key")?;
            let reason = required(form, "reason", "why it is cancelled")?;
            person::cancel_task(bus, me, key, reason).await.map(drop)
        }
        "conversation-join" => {
            let id = required(form, "conversation_id", "the conversation's id")?;
            let id = id.parse::<Uuid>().map_err(|_| {
                BusError::invalid(
                    "conversation_id is not a conversation id (a UUID); join from the \
                     invitation's own form. Nothing was changed.",
                )
            })?;
            person::join(bus, me, id).await
        }
        "ack" => {
            let id = required(form, "message_id", "the message's id")?;
            let id = id.parse::<Uuid>().map_err(|_| {
                BusError::invalid(
                    "message_id is not a message id (a UUID). Nothing was acknowledged.",
                )
            })?;
            person::ack(bus, me, id).await.map(drop)
        }
        _ => unreachable!("checked against ACTIONS"),
    }
}

/// The write form, read within [`WRITE_FORM_MAX_BYTES`] and the server's
/// buffered-bytes budget; each field once (a repeated one keeps its first).
async fn read_form(state: &Shared, request: Request) -> Result<HashMap<String, String>, Response> {
    let words = super::FormWords {
        what: "the write",
        unchanged: "; nothing was changed",
        how: "Write from the forms of /dashboard.",
        too_large: format!(
            "the write is larger than {WRITE_FORM_MAX_BYTES} bytes (a message body is at most {} \
             bytes); nothing was changed. Shorten it, or split it into several messages.",
            acs_wire::limits::BODY_MAX_BYTES
        ),
        late: "the write did not arrive in time; nothing was changed. Write again.",
    };
    let bytes = super::form_bytes(&state.app.limits, request, WRITE_FORM_MAX_BYTES, words)
        .await
        .map_err(|refusal| refusal.answer(refused))?;
    let mut form = HashMap::new();
    for (name, value) in url::form_urlencoded::parse(&bytes) {
        form.entry(name.into_owned())
            .or_insert_with(|| value.into_owned());
    }
    Ok(form)
}
