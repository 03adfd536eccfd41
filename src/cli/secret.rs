//! Reading a secret from the person at the terminal: a prompt that does not
//! echo, or one line of stdin when it is not a terminal (a pipe, a script).
//! Secrets are never taken from flags where another user can see them in the
//! process list.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::bail;

/// One line from a prompt that does not echo, or from stdin when it is not a terminal.
pub fn read_secret(prompt: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    let line = if stdin.is_terminal() {
        eprint!("{prompt}");
        std::io::stderr().flush()?;
        let _echo_off = EchoOff::new();
        let mut line = String::new();
        let read = stdin.lock().read_line(&mut line);
        // The typed newline was not echoed: end the prompt's line before
        // anything else (an `error:` line included) is printed.
        eprintln!();
        read?;
        line
    } else {
        let mut line = String::new();
        stdin.lock().read_line(&mut line)?;
        line
    };
    let secret = line.trim().to_string();
    if secret.is_empty() {
        bail!("no credential given (paste it at the prompt, or pipe it on stdin)");
    }
    Ok(secret)
}

/// Terminal echo off while alive; restored on drop, even on error.
struct EchoOff {
    saved: Option<libc::termios>,
}

impl EchoOff {
    fn new() -> EchoOff {
        // SAFETY: termios calls on fd 0 with a zeroed struct they fill in.
        unsafe {
            let mut term: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut term) != 0 {
                return EchoOff { saved: None };
            }
            let saved = term;
            term.c_lflag &= !libc::ECHO;
            libc::tcsetattr(0, libc::TCSANOW, &term);
            EchoOff { saved: Some(saved) }
        }
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        if let Some(saved) = self.saved {
            // SAFETY: restoring the settings read in `new`.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &saved) };
        }
    }
}

/// A flag whose value can be a secret, the variable that takes it instead,
/// and the flag naming a file that holds it.
struct SecretFlag {
    flag: &'static str,
    env: &'static str,
    file_flag: &'static str,
    /// Whether this value holds a secret (a URL may carry none).
    is_secret: fn(&str) -> bool,
}

const SECRET_FLAGS: [SecretFlag; 4] = [
    SecretFlag {
        flag: "--token",
        env: "BUS_TOKEN",
        file_flag: "--token-file",
        is_secret: |_| true,
    },
    SecretFlag {
        flag: "--dashboard-secret",
        env: "BUS_DASHBOARD_SECRET",
        file_flag: "--dashboard-secret-file",
        is_secret: |_| true,
    },
    SecretFlag {
        flag: "--database-url",
        env: "DATABASE_URL",
        file_flag: "--database-url-file",
        is_secret: url_has_password,
    },
    SecretFlag {
        flag: "--nats-url",
        env: "BUS_NATS_URL",
        file_flag: "--nats-url-file",
        is_secret: url_has_credentials,
    },
];

/// A PostgreSQL URL with a password (`user:password@`, or `password=` in
/// its query).
fn url_has_password(value: &str) -> bool {
    let userinfo = userinfo(value);
    userinfo.is_some_and(|u| u.contains(':'))
        || value
            .split_once('?')
            .is_some_and(|(_, query)| query.split('&').any(|kv| kv.starts_with("password=")))
}

/// A NATS URL (or several, comma-separated) with a user, password or token
/// before `@`.
fn url_has_credentials(value: &str) -> bool {
    value.split(',').any(|url| userinfo(url).is_some())
}

fn userinfo(url: &str) -> Option<&str> {
    let rest = url.trim().split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.rsplit_once('@').map(|(info, _)| info)
}

/// Before the command line is parsed: refuse a secret given as a flag, and
/// put each `--…-file` secret into its variable, where the flag's
/// `env = …` reads it.
///
/// Refused rather than warned about: a flag's value is in the process list
/// and `/proc/PID/cmdline` for every user of the machine for as long as the
/// process runs (a server: months), and a warning on a server's stderr is
/// read by no one. The fix is one edit, and the refusal names it.
///
/// Called in `main` before any thread exists (the variables are set with
/// `set_var`).
pub fn take_secrets_off_argv(args: &[std::ffi::OsString]) -> anyhow::Result<()> {
    let args: Vec<String> = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .take_while(|a| a != "--")
        .collect();
    let value_of = |i: usize, name: &str| -> Option<String> {
        let arg = &args[i];
        if arg == name {
            return args.get(i + 1).cloned();
        }
        arg.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('='))
            .map(str::to_owned)
    };
    for i in 0..args.len() {
        for secret in &SECRET_FLAGS {
            if let Some(value) = value_of(i, secret.flag)
                && (secret.is_secret)(&value)
            {
                bail!(
                    "{flag} on the command line is refused: every user of this machine can read \
                     it in the process list. Put it in the environment ({env}=…) or in a file \
                     only you can read, given with {file_flag} PATH, and run the command again \
                     without {flag}.{url}",
                    flag = secret.flag,
                    env = secret.env,
                    file_flag = secret.file_flag,
                    url = if secret.flag.ends_with("-url") {
                        " A URL without credentials may stay a flag."
                    } else {
                        ""
                    }
                );
            }
            if let Some(path) = value_of(i, secret.file_flag) {
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    anyhow::anyhow!("{} {path}: cannot read it: {e}", secret.file_flag)
                })?;
                // The first line only, as --help says: a trailing comment or a
                // second line never becomes part of the secret.
                let value = text.lines().next().unwrap_or("").trim();
                if value.is_empty() {
                    bail!(
                        "{} {path} is empty: it must hold the {} value on its first line",
                        secret.file_flag,
                        secret.env
                    );
                }
                // SAFETY: called from `main` before the runtime or any other
                // thread starts; nothing reads the environment concurrently.
                unsafe { std::env::set_var(secret.env, value) };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_and_without_credentials() {
        assert!(url_has_password("postgres://u:p@h/db"));
        assert!(url_has_password(
            "postgres://u@h/db?sslmode=require&password=p"
        ));
        assert!(!url_has_password(
            "postgres://postgres@127.0.0.1:5432/postgres"
        ));
        assert!(!url_has_password("postgresql:///bus?host=/run/postgresql"));
        assert!(url_has_credentials("nats://a:4222,nats://u:p@b:4222"));
        assert!(url_has_credentials("nats://s3cr3t@b:4222"));
        assert!(!url_has_credentials("nats://127.0.0.1:4222,nats://b:4222"));
    }
}
