//! Shell completions and manual pages, as a user installs them: the real
//! binary prints a script for each shell and a roff page, and every command
//! `ai-crew-sync --help` lists is in each of them. No database is needed.

use std::collections::BTreeSet;
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .args(args)
        // Neither command may need (or print) a database.
        .env(
            "DATABASE_URL",
            "postgres://bus:s3cret-do-not-print@db.invalid/bus",
        )
        .output()
        .expect("run ai-crew-sync")
}

fn stdout_of(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The commands `--help` lists under "Commands:" (without `help`), checked
/// against the ones every release has, so a parsing slip cannot pass empty.
fn commands() -> Vec<String> {
    let help = stdout_of(&["--help"]);
    let listed: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect();
    for expected in [
        "serve",
        "migrate",
        "quickstart",
        "team",
        "agent",
        "conversations",
        "token",
        "mcp-config",
        "admin",
        "client",
        "completions",
        "man",
    ] {
        assert!(
            listed.iter().any(|c| c == expected),
            "`{expected}` not among the commands --help lists: {listed:?}"
        );
    }
    listed
}

/// Whole words of a script: runs of letters, digits and `-`.
fn words(text: &str) -> BTreeSet<&str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn completions_for_each_shell_name_every_command() {
    let commands = commands();
    for (shell, marker) in [
        ("bash", "complete -F _ai__crew__sync"),
        ("zsh", "#compdef ai-crew-sync"),
        ("fish", "complete -c ai-crew-sync"),
    ] {
        let script = stdout_of(&["completions", shell]);
        assert!(
            script.contains(marker),
            "{shell}: no `{marker}` in {script}"
        );
        let words = words(&script);
        for command in &commands {
            assert!(
                words.contains(command.as_str()),
                "the {shell} completions do not offer `{command}`"
            );
        }
        // Subcommands of subcommands complete too.
        for nested in ["create", "bootstrap", "issue"] {
            assert!(words.contains(nested), "{shell}: no `{nested}`");
        }
        assert!(!script.contains("s3cret"), "{shell}: an env value leaked");
    }
}

#[test]
fn an_unknown_shell_is_refused_with_the_ones_there_are() {
    let out = run(&["completions", "tcsh"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tcsh") && err.contains("bash") && err.contains("zsh"),
        "{err}"
    );
}

#[test]
fn the_man_page_lists_every_command_and_the_environment() {
    let page = stdout_of(&["man"]);
    assert!(page.contains(".TH ai-crew-sync 1"), "{page}");
    assert!(page.contains(".SH SUBCOMMANDS"), "{page}");
    for command in commands() {
        // roff escapes `-` as `\-`.
        let entry = format!("ai-crew-sync-{command}(1)").replace('-', "\\-");
        assert!(page.contains(&entry), "no `{entry}` in the man page");
    }
    // The environment a user sets is named, never its value.
    assert!(page.contains("\\fBDATABASE_URL\\fR"), "{page}");
    assert!(
        !page.contains("s3cret"),
        "an env value leaked into the page"
    );
    assert!(
        !page.contains("ai\\-crew\\-sync\\-help(1)"),
        "no page exists for `help`; the top page must not point at one"
    );
}

#[test]
fn man_out_dir_writes_one_page_per_command() {
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("man1");
    let printed = stdout_of(&["man", "--out-dir", out_dir.to_str().unwrap()]);
    let mut on_disk: Vec<String> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let listed: Vec<String> = printed
        .lines()
        .map(|l| {
            std::path::Path::new(l)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(listed, on_disk, "it prints every page it wrote");

    let mut expected: Vec<String> = commands()
        .iter()
        .map(|c| format!("ai-crew-sync-{c}.1"))
        .collect();
    expected.extend(
        [
            "ai-crew-sync.1",
            "ai-crew-sync-team-create.1",
            "ai-crew-sync-token-issue.1",
            "ai-crew-sync-admin-bootstrap.1",
        ]
        .map(str::to_owned),
    );
    for page in expected {
        let text = std::fs::read_to_string(out_dir.join(&page))
            .unwrap_or_else(|e| panic!("{page} not written: {e} (wrote {on_disk:?})"));
        let name = page.trim_end_matches(".1");
        assert!(
            text.contains(&format!(".TH {name} 1")),
            "{page} is not the page of {name}: {text}"
        );
    }
    assert!(
        !on_disk.iter().any(|p| p.contains("-help")),
        "no page for `help`: {on_disk:?}"
    );
}

/// `ai-crew-sync recipes | head -1`: a reader that goes away ends the command
/// as it ends other Unix tools (SIGPIPE), never with a panic and its
/// backtrace on the terminal.
// Breakage: without `die_quietly_on_a_closed_pipe()` in cli::main the
// command panics with "failed printing to stdout: Broken pipe".
#[test]
fn a_reader_that_goes_away_ends_the_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ai-crew-sync"))
        .arg("recipes")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ai-crew-sync recipes");
    // Close the reading end before the command prints anything.
    drop(child.stdout.take());
    let out = child
        .wait_with_output()
        .expect("wait for ai-crew-sync recipes");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}
