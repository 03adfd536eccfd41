//! `ai-crew-sync recipes [NAME]`: the team's common procedures (who is
//! online, inbox, next task, reserve paths, hand off, ask, announce,
//! stand-up) as short texts a model follows with the bus's tools. They are
//! the Claude Code plugin's slash commands (`plugin/commands/*.md`),
//! compiled in, so every other host (Codex, Cursor, a script) gets the same
//! words.

use anyhow::bail;

/// `(name, file)`: the plugin's commands, in the order `recipes` lists them.
const RECIPES: &[(&str, &str)] = &[
    (
        "who-is-online",
        include_str!("../../plugin/commands/who-is-online.md"),
    ),
    ("inbox", include_str!("../../plugin/commands/inbox.md")),
    (
        "next-task",
        include_str!("../../plugin/commands/next-task.md"),
    ),
    ("reserve", include_str!("../../plugin/commands/reserve.md")),
    (
        "hand-off",
        include_str!("../../plugin/commands/hand-off.md"),
    ),
    ("ask", include_str!("../../plugin/commands/ask.md")),
    (
        "announce",
        include_str!("../../plugin/commands/announce.md"),
    ),
    ("standup", include_str!("../../plugin/commands/standup.md")),
];

/// A command file's front matter (`description`, `argument-hint`) and body.
struct Recipe {
    description: String,
    argument_hint: Option<String>,
    body: String,
}

fn parse(file: &str) -> Recipe {
    let mut description = String::new();
    let mut argument_hint = None;
    let mut body = file;
    if let Some(rest) = file.strip_prefix("---\n")
        && let Some((front, after)) = rest.split_once("\n---\n")
    {
        for line in front.lines() {
            if let Some(value) = line.strip_prefix("description:") {
                description = value.trim().to_string();
            } else if let Some(value) = line.strip_prefix("argument-hint:") {
                argument_hint = Some(value.trim().trim_matches('"').to_string());
            }
        }
        body = after;
    }
    Recipe {
        description,
        argument_hint,
        body: body.trim().to_string(),
    }
}

/// List the recipes, or print one (its `$ARGUMENTS` explained).
pub fn run(name: Option<String>) -> anyhow::Result<()> {
    let Some(name) = name else {
        for (name, file) in RECIPES {
            println!("{name:<14} {}", parse(file).description);
        }
        println!("\n`ai-crew-sync recipes NAME` prints one; give it to the model as it is.");
        return Ok(());
    };
    let Some((_, file)) = RECIPES.iter().find(|(n, _)| *n == name) else {
        let names: Vec<&str> = RECIPES.iter().map(|(n, _)| *n).collect();
        bail!("no recipe named {name:?}; there are: {}", names.join(", "));
    };
    let recipe = parse(file);
    println!("# {name}: {}\n", recipe.description);
    if let Some(hint) = recipe.argument_hint {
        println!("($ARGUMENTS below stands for: {hint})\n");
    }
    println!("{}", recipe.body);
    Ok(())
}

/// The names, for the plugin test.
pub fn names() -> impl Iterator<Item = &'static str> {
    RECIPES.iter().map(|(n, _)| *n)
}
