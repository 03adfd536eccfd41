//! `guard install` / `guard uninstall` and the check the hook runs: a real
//! git repository in a temporary directory, real `git commit`s running the
//! installed hook (the built binary), against a real server.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::hooks::proxy_window;
use crate::support::proxy::Proxy;
use crate::support::{TestApp, spawn_app};

const BIN: &str = env!("CARGO_BIN_EXE_ai-crew-sync");

/// One person's machine with one repository: a config directory of its own
/// (profiles, recorded windows) and a git work tree.
struct Machine {
    config: tempfile::TempDir,
    /// Holds the repository (`repo/`) and whatever sits beside it.
    dir: tempfile::TempDir,
}

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Run {
    fn ok(self) -> Run {
        assert_eq!(self.code, Some(0), "{self:?}");
        self
    }
}

impl Machine {
    /// A repository with one commit, its git configuration its own.
    async fn new() -> Machine {
        let machine = Machine {
            config: tempfile::tempdir().unwrap(),
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::create_dir(machine.repo()).unwrap();
        machine.git(&["init", "-q", "-b", "main"], &[]).await.ok();
        machine
            .git(&["config", "user.name", "Alice"], &[])
            .await
            .ok();
        machine
            .git(&["config", "user.email", "alice@example.com"], &[])
            .await
            .ok();
        machine.write("README.md", "hello\n");
        machine.git(&["add", "README.md"], &[]).await.ok();
        machine
            .git(&["commit", "-q", "-m", "first"], &[])
            .await
            .ok();
        machine
    }

    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }

    fn write(&self, path: &str, text: &str) {
        let path = self.repo().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Run `program ARGS` in `dir` as this machine: its config directory,
    /// no one else's git configuration, none of the bus's variables but
    /// `env`. On a blocking thread: the server under test shares this
    /// runtime, and the hook git runs talks to it.
    async fn run_in(&self, dir: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(dir)
            .env("BUS_CONFIG_DIR", self.config.path())
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", self.dir.path())
            .env_remove("BUS_URL")
            .env_remove("BUS_TOKEN")
            .env_remove("BUS_PROFILE")
            .env_remove("CLAUDE_CODE_SESSION_ID")
            .env_remove("ACS_GUARD")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::null());
        let what = format!("{program} {args:?}");
        tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let out: Output = command
                .output()
                .unwrap_or_else(|e| panic!("run {what}: {e}"));
            Run {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                took: started.elapsed(),
            }
        })
        .await
        .unwrap()
    }

    async fn git(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        self.run_in(&self.repo(), "git", args, env).await
    }

    /// The built binary, in the repository.
    async fn acs(&self, args: &[&str]) -> Run {
        self.run_in(&self.repo(), BIN, args, &[]).await
    }

    /// Stage `path` with new text and commit it, the hook running.
    async fn commit(&self, path: &str, env: &[(&str, &str)]) -> Run {
        self.write(path, &format!("changed at {:?}\n", Instant::now()));
        self.git(&["add", path], &[]).await.ok();
        self.git(&["commit", "-q", "-m", &format!("change {path}")], env)
            .await
    }

    async fn commits(&self) -> usize {
        self.git(&["rev-list", "--count", "HEAD"], &[])
            .await
            .ok()
            .stdout
            .trim()
            .parse()
            .unwrap()
    }

    fn hook(&self) -> PathBuf {
        self.repo().join(".git/hooks/pre-commit")
    }

    /// A profile for `agent` of team acme at `app`, and `.acs.toml` naming
    /// it and project billing in the repository.
    async fn profile(&self, app: &TestApp, agent: &str, token: &str) {
        let url = app.url("/mcp");
        let config = self.config.path().to_path_buf();
        let agent = agent.to_string();
        let token = format!("{token}\n");
        let out = tokio::task::spawn_blocking(move || {
            use std::io::Write;
            let mut child = Command::new(BIN)
                .args(["context", "profile", "add", "--name", "acme", "--url", &url])
                .args(["--team", "acme", "--agent", &agent])
                .env("BUS_CONFIG_DIR", &config)
                .env_remove("BUS_TOKEN")
                .env_remove("BUS_PROFILE")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(token.as_bytes())
                .unwrap();
            child.wait_with_output().unwrap()
        })
        .await
        .unwrap();
        assert!(out.status.success(), "{out:?}");
        self.write(".acs.toml", "profile = \"acme\"\nproject = \"billing\"\n");
        self.write(".git/info/exclude", ".acs.toml\n");
    }
}

/// Install twice is one marker block; a pre-commit hook already there that
/// is not a shell script of its own (here a symlink to the team's script)
/// is kept, runs first, and its refusal still refuses; uninstall puts it
/// back.
// Breakage: without the marker check, a second install moves the guard's
// own hook to pre-commit.before-acs-guard and the count of blocks is off.
#[tokio::test]
async fn install_twice_is_one_block_and_uninstall_puts_the_hook_that_was_there_back() {
    let machine = Machine::new().await;
    let lint = "#!/bin/sh\n# the team's lint\necho lint ran >> \"$(git rev-parse --git-dir)/lint.log\"\n\
                if [ -e NO_COMMIT ]; then echo 'lint: NO_COMMIT is here' >&2; exit 3; fi\n";
    let script = machine.repo().join(".git/team-lint.sh");
    std::fs::write(&script, lint).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&script, machine.hook()).unwrap();

    let first = machine.acs(&["guard", "install"]).await.ok();
    assert!(first.stdout.contains("kept as"), "{first:?}");
    let again = machine.acs(&["guard", "install"]).await.ok();
    assert!(again.stdout.contains("already installed"), "{again:?}");
    let hook = std::fs::read_to_string(machine.hook()).unwrap();
    assert_eq!(
        hook.matches("# >>> ai-crew-sync guard >>>").count(),
        1,
        "{hook}"
    );
    let kept = machine
        .repo()
        .join(".git/hooks/pre-commit.before-acs-guard");
    assert_eq!(std::fs::read_to_string(&kept).unwrap(), lint);

    // The kept hook runs first (no profile here: the guard lets it through,
    // saying so), and its refusal refuses the commit.
    let through = machine.commit("src/a.rs", &[]).await.ok();
    assert!(
        through
            .stderr
            .contains("not checked against path reservations"),
        "{through:?}"
    );
    let log = machine.repo().join(".git/lint.log");
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "lint ran\n");
    machine.write("NO_COMMIT", "");
    let before = machine.commits().await;
    let refused = machine.commit("src/a.rs", &[]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("NO_COMMIT is here"), "{refused:?}");
    assert_eq!(machine.commits().await, before);
    std::fs::remove_file(machine.repo().join("NO_COMMIT")).unwrap();

    let removed = machine.acs(&["guard", "uninstall"]).await.ok();
    assert!(removed.stdout.contains("is back"), "{removed:?}");
    assert_eq!(std::fs::read_to_string(machine.hook()).unwrap(), lint);
    assert!(!kept.exists());
    let mode = std::fs::metadata(machine.hook())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "the hook stays executable");
    let none = machine.acs(&["guard", "uninstall"]).await.ok();
    assert!(none.stdout.contains("not installed"), "{none:?}");

    // Without a hook before, uninstall leaves none.
    std::fs::remove_file(machine.hook()).unwrap();
    machine.acs(&["guard", "install"]).await.ok();
    assert!(machine.hook().exists());
    machine.acs(&["guard", "uninstall"]).await.ok();
    assert!(!machine.hook().exists());

    // Lines someone added after the guard's part stay.
    machine.acs(&["guard", "install"]).await.ok();
    let mut hook = std::fs::read_to_string(machine.hook()).unwrap();
    hook.push_str("echo added by hand\n");
    std::fs::write(machine.hook(), hook).unwrap();
    machine.acs(&["guard", "uninstall"]).await.ok();
    let left = std::fs::read_to_string(machine.hook()).unwrap();
    assert!(!left.contains("ai-crew-sync guard"), "{left}");
    assert!(left.ends_with("echo added by hand\n"), "{left}");
}

/// A pre-commit hook that is a shell script (husky 4's dispatch on
/// `basename "$0"`, or any `#!/bin/bash` script) keeps its name: the guard's
/// lines go in right after its `#!` line, both run (the guard's refusal and
/// the script's), and uninstall gives back the file byte for byte, mode
/// included.
// Breakage: chaining renames the script, and one that picks its work by
// the name it runs as finds none.
#[tokio::test]
async fn a_shell_script_hook_keeps_its_name_and_uninstall_gives_it_back_byte_for_byte() {
    use std::os::unix::fs::PermissionsExt;
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app
        .mcp(&app.agent("acme", "bob").await, Some("bob-1"))
        .await;
    bob.call("heartbeat", json!({"project": "billing"}))
        .await
        .unwrap();
    let machine = Machine::new().await;
    machine.profile(&app, "alice", &alice).await;
    // Runs its work only under its own name, as husky 4's hooks do; a CRLF
    // line and no newline at the end, to be given back as they are.
    let script = "#!/usr/bin/env bash\n# the team's lint\r\n[ \"$(basename \"$0\")\" = pre-commit ] || exit 0\n\
                  echo \"lint ran as $(basename \"$0\")\" >> \"$(git rev-parse --git-dir)/lint.log\"\n\
                  if [ -e NO_COMMIT ]; then echo 'lint: NO_COMMIT is here' >&2; exit 3; fi";
    std::fs::write(machine.hook(), script).unwrap();
    std::fs::set_permissions(machine.hook(), std::fs::Permissions::from_mode(0o750)).unwrap();

    let installed = machine.acs(&["guard", "install"]).await.ok();
    assert!(installed.stdout.contains("keeps its name"), "{installed:?}");
    let hook = std::fs::read_to_string(machine.hook()).unwrap();
    assert!(
        hook.starts_with("#!/usr/bin/env bash\n# >>> ai-crew-sync guard >>>\n"),
        "{hook}"
    );
    assert!(
        hook.ends_with(&script["#!/usr/bin/env bash\n".len()..]),
        "{hook}"
    );
    let again = machine.acs(&["guard", "install"]).await.ok();
    assert!(again.stdout.contains("already installed"), "{again:?}");
    let hooks = machine.repo().join(".git/hooks");
    assert!(!hooks.join("pre-commit.before-acs-guard").exists());

    // Both run: the script under its own name, and the guard.
    machine.commit("src/a.rs", &[]).await.ok();
    let log = machine.repo().join(".git/lint.log");
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "lint ran as pre-commit\n"
    );
    machine.write("NO_COMMIT", "");
    let refused = machine.commit("src/a.rs", &[]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("NO_COMMIT is here"), "{refused:?}");
    std::fs::remove_file(machine.repo().join("NO_COMMIT")).unwrap();
    machine.git(&["reset", "-q"], &[]).await.ok();
    bob.call(
        "reserve_paths",
        json!({"paths": ["src/api/**"], "exclusive": true, "ttl_seconds": 600}),
    )
    .await
    .unwrap();
    let guarded = machine.commit("src/api/x.rs", &[]).await;
    assert_eq!(guarded.code, Some(1), "{guarded:?}");
    assert!(guarded.stderr.contains("bob/bob-1"), "{guarded:?}");

    let removed = machine.acs(&["guard", "uninstall"]).await.ok();
    assert!(removed.stdout.contains("as it was"), "{removed:?}");
    assert_eq!(std::fs::read_to_string(machine.hook()).unwrap(), script);
    let mode = std::fs::metadata(machine.hook())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);
}

/// The hook goes where git runs hooks: `core.hooksPath` when set, and a
/// linked worktree's repository's hooks.
#[tokio::test]
async fn install_follows_core_hooks_path_and_linked_worktrees() {
    let machine = Machine::new().await;
    let linked = machine.dir.path().join("linked");
    machine
        .git(&["worktree", "add", "-q", linked.to_str().unwrap()], &[])
        .await
        .ok();
    let installed = machine
        .run_in(&linked, BIN, &["guard", "install"], &[])
        .await
        .ok();
    assert!(
        installed
            .stdout
            .contains(&machine.hook().display().to_string())
            || machine.hook().exists(),
        "{installed:?}"
    );
    assert!(machine.hook().exists(), "{installed:?}");
    machine.acs(&["guard", "uninstall"]).await.ok();

    machine
        .git(&["config", "core.hooksPath", "team-hooks"], &[])
        .await
        .ok();
    let subdir = machine.repo().join("src");
    std::fs::create_dir_all(&subdir).unwrap();
    machine
        .acs(&["guard", "install", "--repo", subdir.to_str().unwrap()])
        .await
        .ok();
    let hook = machine.repo().join("team-hooks/pre-commit");
    assert!(
        std::fs::read_to_string(&hook)
            .unwrap()
            .contains("guard check")
    );
    assert!(!machine.hook().exists());
    // A directory outside any work tree is refused with what to give.
    let outside = tempfile::tempdir().unwrap();
    let refused = machine
        .run_in(outside.path(), BIN, &["guard", "install"], &[])
        .await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(refused.stderr.contains("--repo"), "{refused:?}");
}

/// Issue 37 item 2: a commit touching a path another window holds
/// exclusively is refused, naming the path, the holder, the reservation,
/// its reason and how to proceed; an unreserved path, a released one,
/// `ACS_GUARD=off` and a bus that is down all let it through.
// Breakage: a guard that ignores the answer's `exclusive` lets the first
// commit through; one that blocks on an outage fails the last.
#[tokio::test]
async fn a_commit_touching_another_windows_reservation_is_refused_until_released() {
    let mut app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app
        .mcp(&app.agent("acme", "bob").await, Some("bob-1"))
        .await;
    bob.call("heartbeat", json!({"project": "billing"}))
        .await
        .unwrap();
    let machine = Machine::new().await;
    machine.profile(&app, "alice", &alice).await;
    machine.acs(&["guard", "install"]).await.ok();
    let reserve = json!({"paths": ["src/api/**"], "exclusive": true, "ttl_seconds": 600,
                         "reason": "reworking the API"});
    bob.call("reserve_paths", reserve.clone()).await.unwrap();

    let before = machine.commits().await;
    let refused = machine.commit("src/api/x.rs", &[]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    for said in [
        "src/api/x.rs",
        "bob/bob-1",
        "src/api/**",
        "reworking the API",
        "ACS_GUARD=off",
        "release",
    ] {
        assert!(refused.stderr.contains(said), "no {said:?}: {refused:?}");
    }
    assert_eq!(machine.commits().await, before, "nothing was committed");

    // An unreserved path goes through; so does `git commit PATH`, whose
    // temporary index leaves out the reserved path still staged.
    machine.write("src/lib.rs", "pub fn f() {}\n");
    machine.git(&["add", "src/lib.rs"], &[]).await.ok();
    machine
        .git(&["commit", "-q", "-m", "lib only", "src/lib.rs"], &[])
        .await
        .ok();
    assert_eq!(machine.commits().await, before + 1);

    // A rename out of the reserved tree touches it too.
    machine
        .git(&["commit", "-q", "-m", "x"], &[("ACS_GUARD", "off")])
        .await
        .ok();
    machine
        .git(&["mv", "src/api/x.rs", "src/x.rs"], &[])
        .await
        .ok();
    let renamed = machine.git(&["commit", "-q", "-m", "move x"], &[]).await;
    assert_eq!(renamed.code, Some(1), "{renamed:?}");
    assert!(renamed.stderr.contains("src/api/x.rs"), "{renamed:?}");

    // Released: the same commit goes through.
    bob.call("release_paths", json!({})).await.unwrap();
    machine
        .git(&["commit", "-q", "-m", "move x"], &[])
        .await
        .ok();

    // ACS_GUARD=off: through, whatever is held.
    bob.call("reserve_paths", reserve).await.unwrap();
    let bypassed = machine
        .commit("src/api/y.rs", &[("ACS_GUARD", "off")])
        .await
        .ok();
    assert!(bypassed.stderr.contains("ACS_GUARD=off"), "{bypassed:?}");

    // Past one call's 200 paths: the reserved path, staged last, is in
    // the second batch and still found.
    for i in 0..250 {
        machine.write(&format!("gen/{i:03}.rs"), "// generated\n");
    }
    machine.git(&["add", "gen"], &[]).await.ok();
    let many = machine.commit("src/api/z.rs", &[]).await;
    assert_eq!(many.code, Some(1), "{many:?}");
    assert!(many.stderr.contains("src/api/z.rs"), "{many:?}");
    assert!(!many.stderr.contains("gen/"), "{many:?}");

    // The bus down: through, with one line on stderr, within seconds.
    app.begin_shutdown();
    app.served().await.unwrap();
    let down = machine.commit("src/api/y.rs", &[]).await.ok();
    assert_eq!(down.stderr.trim().lines().count(), 1, "{down:?}");
    assert!(
        down.stderr
            .contains("not checked against path reservations"),
        "{down:?}"
    );
    assert!(down.took < Duration::from_secs(10), "{down:?}");
}

/// A commit from an agent's Claude Code conversation is checked as that
/// conversation's window: its own reservation does not refuse it. Without
/// the conversation's id the profile's shared window checks, and the same
/// agent's window is another window to it. A bus that accepts and never
/// answers lets the commit through within seconds.
#[tokio::test]
async fn the_conversations_own_reservation_never_refuses_its_commit() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let machine = Machine::new().await;
    machine.profile(&app, "alice", &alice).await;
    machine.acs(&["guard", "install"]).await.ok();
    let (mut state, window) =
        proxy_window(&app, &alice, "cc-alice", "cc-one", machine.config.path()).await;
    window
        .call("heartbeat", json!({"project": "billing"}))
        .await
        .unwrap();
    window
        .call(
            "reserve_paths",
            json!({"paths": ["docs/**"], "exclusive": true, "ttl_seconds": 600,
                   "reason": "rewriting the guide"}),
        )
        .await
        .unwrap();

    let from_the_conversation = [("CLAUDE_CODE_SESSION_ID", "cc-alice")];
    machine
        .commit("docs/guide.md", &from_the_conversation)
        .await
        .ok();

    let from_a_terminal = machine.commit("docs/guide.md", &[]).await;
    assert_eq!(from_a_terminal.code, Some(1), "{from_a_terminal:?}");
    assert!(
        from_a_terminal.stderr.contains("alice/cc-one"),
        "{from_a_terminal:?}"
    );
    machine.git(&["reset", "-q"], &[]).await.ok();

    let silent = Proxy::start(app.addr).await;
    silent.black_hole();
    state.url = format!("http://{}/mcp", silent.addr());
    state.save(machine.config.path()).unwrap();
    let hung = machine
        .commit("docs/guide.md", &from_the_conversation)
        .await
        .ok();
    assert!(hung.stderr.contains("did not answer"), "{hung:?}");
    assert!(hung.took < Duration::from_secs(15), "{hung:?}");
}

/// Husky 9 runs the team's hook by the name it is run as (`basename
/// "$0"`) from `.husky/_`, a directory it writes again on each install:
/// `guard install` there is refused, naming `.husky/pre-commit` as the place
/// for the check, and husky's pre-commit still refuses as before.
// Breakage: chaining there renames husky's hook to
// pre-commit.before-acs-guard, husky finds no `.husky/pre-commit.before-acs-guard`
// and exits 0: the team's checks silently stop running.
#[tokio::test]
async fn guard_install_under_husky_is_refused_and_husky_still_runs() {
    use std::os::unix::fs::PermissionsExt;
    let machine = Machine::new().await;
    // husky 9's layout (its `h`, cut down as husky 9.1 writes it).
    machine.write(
        ".husky/_/h",
        "#!/usr/bin/env sh\nn=$(basename \"$0\")\ns=$(dirname \"$(dirname \"$0\")\")/$n\n\
         [ ! -f \"$s\" ] && exit 0\n[ \"${HUSKY-}\" = \"0\" ] && exit 0\nsh -e \"$s\" \"$@\"\n\
         c=$?\n[ $c != 0 ] && echo \"husky - $n script failed (code $c)\"\nexit $c\n",
    );
    machine.write(
        ".husky/_/pre-commit",
        "#!/usr/bin/env sh\n. \"$(dirname \"$0\")/h\"\n",
    );
    machine.write(".husky/pre-commit", "echo 'lint: refused' >&2\nexit 1\n");
    for f in [".husky/_/h", ".husky/_/pre-commit"] {
        std::fs::set_permissions(
            machine.repo().join(f),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }
    machine
        .git(&["config", "core.hooksPath", ".husky/_"], &[])
        .await
        .ok();
    let before = machine.commit("src/a.rs", &[]).await;
    assert_eq!(
        before.code,
        Some(1),
        "husky refuses before install: {before:?}"
    );
    let husky_hook = std::fs::read(machine.repo().join(".husky/_/pre-commit")).unwrap();
    let refused = machine.acs(&["guard", "install"]).await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains(".husky/pre-commit")
            && refused.stderr.contains("ai-crew-sync guard check"),
        "{refused:?}"
    );
    assert_eq!(
        std::fs::read(machine.repo().join(".husky/_/pre-commit")).unwrap(),
        husky_hook
    );
    let after = machine.commit("src/a.rs", &[]).await;
    assert_eq!(
        after.code,
        Some(1),
        "husky's pre-commit no longer runs: {after:?}"
    );
    assert!(after.stderr.contains("lint: refused"), "{after:?}");
}

/// A staged file whose name holds a control character (a tab) inside a
/// directory another window holds exclusively is checked like any other:
/// `src/api/**` covers it, and the commit is refused.
// Breakage: leaving such names out of the check commits into src/api/**.
#[tokio::test]
async fn a_reserved_directorys_file_with_a_tab_in_its_name_is_refused() {
    let app = spawn_app().await;
    app.team("acme").await;
    let alice = app.agent("acme", "alice").await;
    let bob = app
        .mcp(&app.agent("acme", "bob").await, Some("bob-1"))
        .await;
    bob.call("heartbeat", json!({"project": "billing"}))
        .await
        .unwrap();
    let machine = Machine::new().await;
    machine.profile(&app, "alice", &alice).await;
    machine.acs(&["guard", "install"]).await.ok();
    bob.call(
        "reserve_paths",
        json!({"paths": ["src/api/**"], "exclusive": true, "ttl_seconds": 600}),
    )
    .await
    .unwrap();
    let refused = machine.commit("src/api/x.rs", &[]).await;
    assert_eq!(refused.code, Some(1), "baseline: {refused:?}");
    machine.git(&["reset", "-q"], &[]).await.ok();
    let odd = machine.commit("src/api/a\tb.rs", &[]).await;
    assert_eq!(odd.code, Some(1), "committed into src/api/**: {odd:?}");
}
