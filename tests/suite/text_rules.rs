//! One rule for text fields (store/text.rs), as a model meets it over MCP:
//! one-line fields (names, keys, titles, topics, labels, tags) refuse control
//! characters, line and paragraph separators and bidirectional formatting
//! characters, and are trimmed and NFC-normalised, lookups included;
//! multi-line fields (bodies, descriptions, values) keep every byte; search
//! finds emoji; `inbox` and `all` cannot become channels; refusals quote the
//! input plainly, never in Rust syntax.

use ai_crew_sync::store::identity::teams;
use serde_json::{Value, json};

use crate::support::{McpClient, TestApp, spawn_app, test_actor};

/// Team `acme` with conversations on; alice in window `w1`, bob shared.
async fn team(app: &TestApp) -> (McpClient, McpClient) {
    app.team("acme").await;
    teams::capability(&app.pool, "acme", Some(true), &test_actor())
        .await
        .unwrap();
    let alice = app.mcp(&app.agent("acme", "alice").await, Some("w1")).await;
    let bob = app.mcp(&app.agent("acme", "bob").await, None).await;
    (alice, bob)
}

/// Every row a refused call could have written, as text.
async fn rows(app: &TestApp) -> Vec<String> {
    let mut all = Vec::new();
    for table in [
        "tasks",
        "task_events",
        "notes",
        "note_revisions",
        "channels",
        "messages",
        "locks",
        "presence",
        "conversations",
        "message_receipts",
    ] {
        let sql = format!("SELECT t::text FROM {table} t ORDER BY 1");
        let mut table_rows: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(&app.pool)
            .await
            .unwrap_or_else(|e| panic!("{table}: {e}"));
        all.append(&mut table_rows);
    }
    all
}

async fn ok(client: &McpClient, tool: &str, args: Value) -> Value {
    client
        .call(tool, args.clone())
        .await
        .unwrap_or_else(|e| panic!("{tool} {args}: {e}"))
}

fn message(refusal: &Value) -> &str {
    refusal["message"]
        .as_str()
        .expect("a refusal has a message")
}

#[tokio::test]
async fn one_line_fields_refuse_breaks_separators_and_bidi_naming_field_rule_and_fix() {
    let app = spawn_app().await;
    let (alice, _bob) = team(&app).await;
    ok(
        &alice,
        "create_task",
        json!({"key": "base", "title": "base"}),
    )
    .await;
    let before = rows(&app).await;

    // (tool, arguments, what the message must say: the field, the character
    // and where, the rule, what to do)
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "create_task",
            json!({"key": "fix", "title": "Fix login\nthen deploy"}),
            vec![
                "task title \"Fix login\\nthen deploy\" holds a line break (U+000A) at character 10",
                "one line of plain text",
                "Nothing was changed",
                "put further lines in `description`",
            ],
        ),
        (
            "set_note",
            json!({"key": "deploy\u{2028}steps", "value": "v"}),
            vec![
                "note key \"deploy<U+2028>steps\" holds a line separator (U+2028) at character 7",
                "bidirectional formatting characters",
                "Nothing was changed",
                "without that character",
            ],
        ),
        (
            "set_note",
            // Shows as `invoice-exe.pdf`: the override turns `fdp.exe` around.
            json!({"key": "invoice-\u{202E}fdp.exe", "value": "v"}),
            vec![
                "note key \"invoice-<U+202E>fdp.exe\" holds a bidirectional formatting \
                 character (U+202E, right-to-left override) at character 9",
            ],
        ),
        (
            "set_note",
            json!({"key": "k", "value": "v", "tags": ["ok", "r\u{200F}tl"]}),
            vec!["tag \"r<U+200F>tl\" holds a bidirectional formatting character (U+200F"],
        ),
        (
            "create_task",
            json!({"key": "a\u{2066}b", "title": "t"}),
            vec!["task key \"a<U+2066>b\" holds a bidirectional formatting character"],
        ),
        (
            "create_channel",
            json!({"name": "ops\u{7}"}),
            vec![
                "channel name \"ops<U+0007>\" is not valid",
                "ASCII letters, digits and `-_.`",
                "for example `backend`",
            ],
        ),
        (
            "create_channel",
            json!({"name": "ops", "topic": "deploys\r\nand rollbacks"}),
            vec!["channel topic \"deploys\\r\\nand rollbacks\" holds a carriage return (U+000D)"],
        ),
        (
            "acquire_lock",
            json!({"name": "deploy\u{2029}prod"}),
            vec!["lock name \"deploy<U+2029>prod\" holds a paragraph separator (U+2029)"],
        ),
        (
            "acquire_lock",
            json!({"name": "deploy", "purpose": "ship\tit"}),
            vec!["lock purpose \"ship\\tit\" holds a tab (U+0009)"],
        ),
        (
            "heartbeat",
            json!({"activity": "reviewing\nthen lunch"}),
            vec!["activity \"reviewing\\nthen lunch\" holds a line break"],
        ),
        (
            "heartbeat",
            json!({"role": "\u{061C}reviewer"}),
            vec!["role label \"<U+061C>reviewer\" holds a bidirectional formatting character"],
        ),
        (
            "create_conversation",
            json!({"title": "Launch\u{2028}plan", "private": true}),
            vec![
                "conversation title \"Launch<U+2028>plan\" holds a line separator",
                "details belong in the first message",
            ],
        ),
        (
            "post_message",
            json!({"channel": "ops", "body": "log", "attachments": [
                {"filename": "trace\u{202D}.log", "content_type": "text/plain", "data_base64": "eA=="}
            ]}),
            vec!["attachment filename \"trace<U+202D>.log\" holds a bidirectional"],
        ),
    ];
    for (tool, args, says) in cases {
        let refusal = alice
            .call(tool, args.clone())
            .await
            .expect_err(&format!("{tool} {args} must be refused"));
        assert_eq!(refusal["error"], "invalid", "{tool} {args}: {refusal}");
        for part in says {
            assert!(
                message(&refusal).contains(part),
                "{tool} {args}: expected `{part}` in: {}",
                message(&refusal)
            );
        }
    }
    assert_eq!(rows(&app).await, before, "a refused call wrote nothing");
}

#[tokio::test]
async fn composed_and_decomposed_spellings_are_one_name_in_writes_and_lookups() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    let decomposed = "cafe\u{301}/menu";
    let composed = "caf\u{e9}/menu";

    let first = ok(
        &alice,
        "set_note",
        json!({"key": decomposed, "value": "v1"}),
    )
    .await;
    assert_eq!(first["key"], composed, "stored in NFC");
    let second = ok(&bob, "set_note", json!({"key": composed, "value": "v2"})).await;
    assert_eq!(
        (&second["created"], &second["revision"]),
        (&json!(false), &json!(2)),
        "the composed spelling is the same note: {second}"
    );
    let got = ok(&bob, "get_note", json!({"key": decomposed})).await;
    assert_eq!((&got["found"], &got["value"]), (&json!(true), &json!("v2")));
    let listed = ok(&bob, "list_notes", json!({})).await;
    assert_eq!(listed["notes"].as_array().unwrap().len(), 1, "{listed}");
    let tagged = ok(
        &alice,
        "set_note",
        json!({"key": composed, "value": "v2", "tags": ["Re\u{301}sume\u{301}", "r\u{e9}sum\u{e9}"]}),
    )
    .await;
    assert_eq!(
        tagged["tags"],
        json!(["r\u{e9}sum\u{e9}"]),
        "one tag, in NFC"
    );
    let by_tag = ok(&bob, "list_notes", json!({"tag": "RE\u{301}SUME\u{301}"})).await;
    assert_eq!(by_tag["notes"].as_array().unwrap().len(), 1, "{by_tag}");

    // Tasks: created decomposed, claimed and completed composed; a second
    // create under the other spelling is the same key.
    ok(
        &alice,
        "create_task",
        json!({"key": "re\u{301}sume\u{301}", "title": "CV"}),
    )
    .await;
    let dup = alice
        .call(
            "create_task",
            json!({"key": "r\u{e9}sum\u{e9}", "title": "again"}),
        )
        .await
        .unwrap_err();
    assert_eq!(dup["error"], "conflict", "{dup}");
    ok(&alice, "claim_task", json!({"key": "r\u{e9}sum\u{e9}"})).await;
    let done = ok(
        &alice,
        "complete_task",
        json!({"key": "re\u{301}sume\u{301}", "result": "sent"}),
    )
    .await;
    assert_eq!(done["key"], "r\u{e9}sum\u{e9}", "{done}");

    // Locks: lower-cased and NFC on both sides.
    ok(
        &alice,
        "acquire_lock",
        json!({"name": "E\u{301}TE\u{301}.md"}),
    )
    .await;
    let held = bob
        .call("acquire_lock", json!({"name": "\u{e9}t\u{e9}.md"}))
        .await
        .unwrap_err();
    assert_eq!(held["error"], "conflict", "one lock: {held}");
    let released = ok(&alice, "release_lock", json!({"name": "\u{c9}T\u{c9}.MD"})).await;
    assert_eq!(released["released"], true, "{released}");
}

#[tokio::test]
async fn one_line_fields_are_trimmed_everywhere_and_the_answer_shows_the_stored_text() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    let note = ok(
        &alice,
        "set_note",
        json!({"key": "  build commands\t", "value": "v", "tags": [" CI "]}),
    )
    .await;
    assert_eq!(
        (&note["key"], &note["tags"]),
        (&json!("build commands"), &json!(["ci"]))
    );
    let got = ok(&bob, "get_note", json!({"key": "build commands"})).await;
    assert_eq!(got["found"], true);

    let task = ok(
        &alice,
        "create_task",
        json!({"key": " ship ", "title": "\n Ship it \n", "description": "  kept  "}),
    )
    .await;
    assert_eq!(
        (&task["key"], &task["title"], &task["description"]),
        (&json!("ship"), &json!("Ship it"), &json!("  kept  ")),
        "{task}"
    );
    let channel = ok(
        &alice,
        "create_channel",
        json!({"name": " Ops ", "topic": "  deploys  "}),
    )
    .await;
    assert_eq!(
        (&channel["channel"]["name"], &channel["channel"]["topic"]),
        (&json!("ops"), &json!("deploys"))
    );
    let lock = ok(
        &alice,
        "acquire_lock",
        json!({"name": " Deploy ", "purpose": " release "}),
    )
    .await;
    assert_eq!(
        (&lock["name"], &lock["purpose"]),
        (&json!("deploy"), &json!("release")),
        "{lock}"
    );
    let beat = ok(
        &alice,
        "heartbeat",
        json!({"activity": "  reviewing  ", "role": " builder "}),
    )
    .await;
    assert_eq!(
        (&beat["activity"], &beat["role"]),
        (&json!("reviewing"), &json!("builder"))
    );
}

#[tokio::test]
async fn multi_line_fields_keep_every_byte_they_were_given() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    // Indentation, tabs, CRLF, separators, bidi text and overrides, a
    // decomposed accent, trailing blank lines: all content.
    let text = "  first line\r\n\tsecond\u{2028}third\u{2029}\n\u{202E}gnirts\u{202C} \
                שלום cafe\u{301} 🚀\n\n";

    ok(&alice, "post_message", json!({"to": "bob", "body": text})).await;
    let read = ok(&bob, "read_messages", json!({"scope": "inbox"})).await;
    assert_eq!(read["messages"][0]["body"], text, "{read}");

    ok(&alice, "set_note", json!({"key": "k", "value": text})).await;
    let note = ok(&bob, "get_note", json!({"key": "k"})).await;
    assert_eq!(note["value"], text);

    ok(
        &alice,
        "create_task",
        json!({"key": "t", "title": "t", "description": text}),
    )
    .await;
    ok(&alice, "claim_task", json!({"key": "t"})).await;
    ok(&alice, "complete_task", json!({"key": "t", "result": text})).await;
    let task = ok(&bob, "get_task", json!({"key": "t"})).await;
    assert_eq!(
        (&task["description"], &task["result"]),
        (&json!(text), &json!(text)),
        "{task}"
    );
}

#[tokio::test]
async fn search_finds_emoji_and_symbols_that_full_text_ignores() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    ok(
        &alice,
        "set_note",
        json!({"key": "release 🚀 checklist", "value": "tag, build, ship"}),
    )
    .await;
    ok(
        &alice,
        "set_note",
        json!({"key": "release notes", "value": "what changed → where"}),
    )
    .await;
    ok(
        &alice,
        "set_note",
        json!({"key": "unrelated", "value": "nothing"}),
    )
    .await;

    let found = |answer: &Value, field: &str| -> Vec<String> {
        let mut keys: Vec<String> = answer[field]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .map(|hit| {
                hit.get("key")
                    .or_else(|| hit.get("body"))
                    .and_then(Value::as_str)
                    .unwrap()
                    .to_string()
            })
            .collect();
        keys.sort();
        keys
    };
    let search = |query: &'static str| {
        let bob = &bob;
        async move { ok(bob, "search_notes", json!({"query": query})).await }
    };
    assert_eq!(
        found(&search("🚀").await, "results"),
        vec!["release 🚀 checklist"]
    );
    assert_eq!(found(&search("→").await, "results"), vec!["release notes"]);
    assert_eq!(
        found(&search("release 🚀").await, "results"),
        vec!["release 🚀 checklist"]
    );
    assert_eq!(
        found(&search("release -🚀").await, "results"),
        vec!["release notes"]
    );
    assert_eq!(
        found(&search("release").await, "results"),
        vec!["release notes", "release 🚀 checklist"],
        "plain words work as before"
    );
    let snippet = search("→").await;
    assert!(
        snippet["results"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("**→**"),
        "{snippet}"
    );

    ok(
        &alice,
        "post_message",
        json!({"channel": "ci", "body": "build is green ✅"}),
    )
    .await;
    ok(
        &alice,
        "post_message",
        json!({"channel": "ci", "body": "build is red"}),
    )
    .await;
    ok(
        &alice,
        "post_message",
        json!({"to": "bob", "body": "lunch? 🍜"}),
    )
    .await;
    let messages = |query: &'static str| {
        let bob = &bob;
        async move { ok(bob, "search_messages", json!({"query": query})).await }
    };
    assert_eq!(
        found(&messages("✅").await, "messages"),
        vec!["build is green ✅"]
    );
    assert_eq!(
        found(&messages("build ✅").await, "messages"),
        vec!["build is green ✅"]
    );
    assert_eq!(
        found(&messages("build -✅").await, "messages"),
        vec!["build is red"]
    );
    assert_eq!(
        found(&messages("🍜").await, "messages"),
        vec!["lunch? 🍜"],
        "a DM to me"
    );
    let carol = app.mcp(&app.agent("acme", "carol").await, None).await;
    let theirs = ok(&carol, "search_messages", json!({"query": "🍜"})).await;
    assert_eq!(
        theirs["messages"],
        json!([]),
        "another's DM stays hidden: {theirs}"
    );
}

#[tokio::test]
async fn inbox_and_all_cannot_become_channels_but_one_made_before_keeps_working() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    let before = rows(&app).await;
    for (tool, args) in [
        ("create_channel", json!({"name": "inbox"})),
        ("create_channel", json!({"name": "#All"})),
        ("post_message", json!({"channel": "inbox", "body": "hi"})),
    ] {
        let refusal = alice.call(tool, args.clone()).await.unwrap_err();
        assert_eq!(refusal["error"], "invalid", "{tool} {args}: {refusal}");
        let said = message(&refusal);
        assert!(said.contains("cannot be a channel name"), "{said}");
        assert!(said.contains("read_messages takes `inbox`"), "{said}");
        assert!(
            said.contains("Nothing was created. Choose another name"),
            "{said}"
        );
    }
    assert_eq!(rows(&app).await, before, "nothing was created");

    // A channel called `inbox` from before the rule: posting finds it, and
    // it is read as `#inbox` while `inbox` stays the direct messages.
    ok(&alice, "create_channel", json!({"name": "legacy"})).await;
    sqlx::query("UPDATE channels SET name = 'inbox' WHERE name = 'legacy'")
        .execute(&app.pool)
        .await
        .unwrap();
    let posted = ok(
        &alice,
        "post_message",
        json!({"channel": "inbox", "body": "to the channel"}),
    )
    .await;
    assert_eq!(posted["channel_created"], false, "{posted}");
    ok(
        &alice,
        "post_message",
        json!({"to": "bob", "body": "to bob"}),
    )
    .await;
    let channel = ok(&bob, "read_messages", json!({"scope": "#inbox"})).await;
    assert_eq!(channel["scope"], "#inbox");
    assert_eq!(
        channel["messages"][0]["body"], "to the channel",
        "{channel}"
    );
    let dms = ok(&bob, "read_messages", json!({"scope": "inbox"})).await;
    let bodies: Vec<&str> = dms["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["body"].as_str().unwrap())
        .collect();
    assert_eq!(bodies, vec!["to bob"], "{dms}");
}

#[tokio::test]
async fn refusals_quote_the_input_plainly_cut_to_forty_characters() {
    let app = spawn_app().await;
    let (alice, _bob) = team(&app).await;
    let cases = [
        (
            "set_note",
            json!({"scope": "s".repeat(100), "key": "k", "value": "v"}),
            "scope",
        ),
        ("list_tasks", json!({"status": "lapsed\n"}), "status"),
        (
            "wait_for_updates",
            json!({"kinds": ["mesages"], "timeout_seconds": 1}),
            "kind",
        ),
        (
            "post_message",
            json!({"to": "bob/Not A Window", "body": "x"}),
            "session label",
        ),
    ];
    for (tool, args, field) in cases {
        let refusal = alice.call(tool, args.clone()).await.unwrap_err();
        let said = message(&refusal);
        assert!(said.contains(field), "{tool}: {said}");
        for rust in ["Some(", "None", "\\u{"] {
            assert!(
                !said.contains(rust),
                "{tool} shows Rust syntax `{rust}`: {said}"
            );
        }
    }
    let long = alice
        .call(
            "set_note",
            json!({"scope": "s".repeat(100), "key": "k", "value": "v"}),
        )
        .await
        .unwrap_err();
    assert!(
        message(&long).starts_with(&format!("scope \"{}…\" is not valid", "s".repeat(40))),
        "{long}"
    );
}

#[tokio::test]
async fn names_stored_before_the_rule_stay_reachable_and_migrate_to_nfc() {
    let app = spawn_app().await;
    let (alice, bob) = team(&app).await;
    // Rows as an older server stored them: a decomposed key, both spellings
    // of another, a key with a right-to-left override.
    for key in ["old", "twin-a", "twin-b", "odd"] {
        ok(&alice, "set_note", json!({"key": key, "value": key})).await;
    }
    ok(
        &alice,
        "create_task",
        json!({"key": "old-task", "title": "t"}),
    )
    .await;
    for (from, to) in [
        ("old", "nai\u{308}ve"),
        ("twin-a", "cafe\u{301}"),
        ("twin-b", "caf\u{e9}"),
        ("odd", "a\u{202E}b"),
    ] {
        sqlx::query("UPDATE notes SET key = $2 WHERE key = $1")
            .bind(from)
            .bind(to)
            .execute(&app.pool)
            .await
            .unwrap();
    }
    sqlx::query("UPDATE tasks SET key = 'pre\u{301}' WHERE key = 'old-task'")
        .execute(&app.pool)
        .await
        .unwrap();

    // Lookups never refuse: the override key is still read and deleted.
    let odd = ok(&bob, "get_note", json!({"key": "a\u{202E}b"})).await;
    assert_eq!(
        (&odd["found"], &odd["value"]),
        (&json!(true), &json!("odd"))
    );
    let gone = ok(&bob, "delete_note", json!({"key": "a\u{202E}b"})).await;
    assert_eq!(gone["deleted"], true);

    // Migration 0019, run again over these rows, brings them to NFC unless
    // the NFC name is taken.
    sqlx::raw_sql(include_str!("../../migrations/0019_names_in_nfc.sql"))
        .execute(&app.pool)
        .await
        .unwrap();
    let naive = ok(&bob, "get_note", json!({"key": "na\u{ef}ve"})).await;
    assert_eq!(
        (&naive["found"], &naive["value"]),
        (&json!(true), &json!("old"))
    );
    let twin = ok(&bob, "get_note", json!({"key": "cafe\u{301}"})).await;
    assert_eq!(twin["value"], "twin-b", "the NFC row is the one found");
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT key FROM notes WHERE key LIKE 'caf%' ORDER BY value")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        keys,
        vec!["cafe\u{301}", "caf\u{e9}"],
        "the colliding row stays as stored, nothing merged"
    );
    let task = ok(&bob, "get_task", json!({"key": "pr\u{e9}"})).await;
    assert_eq!(task["title"], "t", "{task}");
}
