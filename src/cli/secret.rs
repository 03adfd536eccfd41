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
