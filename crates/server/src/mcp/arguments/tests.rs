//! The schema walk against hand-written schemas: each shape and refusal.

use serde_json::json;

use super::*;

/// A schema as schemars writes them for the bus's argument structs.
fn schema() -> Map<String, Value> {
    json!({
        "$defs": {"FileArg": {
            "additionalProperties": false,
            "properties": {
                "filename": {"type": "string"},
                "data_base64": {"type": "string"}
            },
            "required": ["filename", "data_base64"],
            "type": "object"
        }},
        "additionalProperties": false,
        "properties": {
            "key": {"description": "The task's key.", "type": "string"},
            "lease_seconds": {
                "description": "Lease length in seconds, 30..86400 (default 900).",
                "format": "int64", "type": ["integer", "null"]
            },
            "timeout_seconds": {"format": "uint64", "minimum": 0, "type": ["integer", "null"]},
            "hours": {"format": "int32", "type": ["integer", "null"]},
            "message_id": {"format": "uuid", "type": ["string", "null"]},
            "depends_on": {"items": {"type": "string"}, "type": ["array", "null"]},
            "announce": {"default": false, "type": "boolean"},
            "attachments": {"items": {"$ref": "#/$defs/FileArg"}, "type": "array"},
            "metadata": {"description": "Anything."}
        },
        "required": ["key"],
        "type": "object"
    })
    .as_object()
    .unwrap()
    .clone()
}

fn refusal(arguments: Value) -> String {
    check("claim_task", &schema(), arguments.as_object()).expect_err("refused")
}

fn assert_no_rust(message: &str) {
    for rust in [
        "Some(",
        "None",
        "i64",
        "u64",
        "i32",
        "invalid type",
        "expected",
        "struct",
        "Option",
        "Vec<",
        "String",
    ] {
        assert!(!message.contains(rust), "`{rust}` in: {message}");
    }
}

#[test]
fn fitting_arguments_pass() {
    let args = json!({
        "key": "k", "lease_seconds": null, "timeout_seconds": 5, "hours": -3,
        "message_id": "0190c4f2-7c1e-7a3b-9f00-1234567890ab", "depends_on": ["a"],
        "announce": true, "attachments": [{"filename": "f", "data_base64": ""}],
        "metadata": {"deep": [1, {"x": null}]}
    });
    assert_eq!(check("claim_task", &schema(), args.as_object()), Ok(()));
}

#[test]
fn a_string_for_an_integer_names_the_argument_what_it_got_and_what_it_takes() {
    let message = refusal(json!({"key": "k", "lease_seconds": "5"}));
    assert!(
        message.contains(
            "`lease_seconds` got the string \"5\"; it takes an integer, or null (the same as \
             leaving it out). Its description: Lease length in seconds, 30..86400 (default \
             900)."
        ),
        "{message}"
    );
    assert!(message.starts_with("claim_task was not run"), "{message}");
    assert!(
        message.contains("claim_task takes key (required); optional: announce, "),
        "{message}"
    );
    assert_no_rust(&message);
}

#[test]
fn out_of_range_numbers_are_named_with_the_range() {
    let message = refusal(json!({"key": "k", "timeout_seconds": -1}));
    assert!(
        message.contains(
            "`timeout_seconds` got -1, which is out of range: it takes an integer of 0 or more"
        ),
        "{message}"
    );
    let message = refusal(json!({"key": "k", "hours": 3_000_000_000u64}));
    assert!(
        message.contains("an integer from -2147483648 to 2147483647"),
        "{message}"
    );
    let message = refusal(json!({"key": "k", "lease_seconds": 9_223_372_036_854_775_808u64}));
    assert!(message.contains("out of range"), "{message}");
    let message = refusal(json!({"key": "k", "lease_seconds": 5.0}));
    assert!(
        message.contains("`lease_seconds` got 5.0; it takes an integer"),
        "{message}"
    );
    assert_no_rust(&message);
}

#[test]
fn unknown_and_missing_arguments_are_named() {
    let message = refusal(json!({"lease_secnds": 60}));
    assert!(
        message.contains(
            "`key` is missing; it is required: a string. Its description: The task's key."
        ),
        "{message}"
    );
    assert!(
        message.contains(
            "`lease_secnds` is not an argument claim_task takes. Did you mean `lease_seconds`?"
        ),
        "{message}"
    );
    assert_no_rust(&message);
}

#[test]
fn entries_of_lists_and_nested_objects_are_named_by_their_path() {
    let message = refusal(json!({
        "key": "k",
        "depends_on": ["a", 7],
        "attachments": [{"filename": "f", "data_base64": "", "size": 3}, {"filename": 1}],
        "message_id": "not-a-uuid",
        "announce": null
    }));
    for expected in [
        "`depends_on[1]` got 7; it takes a string.",
        "`attachments[0].size` is not a field of `attachments[0]`.",
        "`attachments[1].filename` got 1; it takes a string.",
        "`attachments[1].data_base64` is missing",
        "`message_id` got the string \"not-a-uuid\", which is not a UUID",
        "`announce` got null; it takes true or false (leave it out for the default, false).",
    ] {
        assert!(message.contains(expected), "{expected} not in: {message}");
    }
    assert_no_rust(&message);
}

#[test]
fn a_tool_without_arguments_says_so() {
    let schema = json!({"additionalProperties": false, "type": "object"});
    let message = check(
        "whoami",
        schema.as_object().unwrap(),
        json!({"pad": 1}).as_object(),
    )
    .unwrap_err();
    assert!(
        message.contains("`pad` is not an argument whoami takes."),
        "{message}"
    );
    assert!(message.contains("whoami takes no arguments."), "{message}");
    let open = json!({"properties": {}, "type": "object"});
    assert_eq!(
        check(
            "status",
            open.as_object().unwrap(),
            json!({"x": 1}).as_object()
        ),
        Ok(())
    );
}

#[test]
fn many_problems_are_capped() {
    let mut args = json!({"key": "k"});
    for i in 0..20 {
        args[format!("extra{i}")] = json!(i);
    }
    let message = refusal(args);
    assert!(message.contains("(12 more not named here.)"), "{message}");
}

#[test]
fn edit_distance_counts_edits() {
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "ab"), 2);
    assert_eq!(
        closest("Lease_Seconds", &["lease_seconds", "key"]),
        Some("lease_seconds")
    );
    assert_eq!(closest("zzz", &["lease_seconds", "key"]), None);
    assert_eq!(
        closest("depends", &["depends_on", "description"]),
        Some("depends_on")
    );
    assert_eq!(
        closest("desc", &["depends_on", "description"]),
        Some("description")
    );
}
