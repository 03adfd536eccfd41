//! `ai-crew-sync completions SHELL` and `ai-crew-sync man`: shell completion
//! scripts and roff manual pages, generated from the same clap definitions
//! that parse the command line, so they never drift from `--help`.
//!
//! Neither touches a database or the network. `completions` prints one
//! script on stdout. `man` prints the page of the top command (its
//! SUBCOMMANDS section lists every command) on stdout; `man --out-dir DIR`
//! writes one page per command instead (`ai-crew-sync.1`,
//! `ai-crew-sync-serve.1`, `ai-crew-sync-team-create.1`, ...) and prints
//! the paths it wrote.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use clap_complete::Shell;

/// The name completions are registered under: what the user types.
const BIN: &str = "ai-crew-sync";

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write one page per command (ai-crew-sync.1, ai-crew-sync-serve.1, ...) into this
    /// directory instead of printing the top page on stdout.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

/// Print the completion script for `args.shell`.
pub fn completions(args: CompletionsArgs) -> anyhow::Result<()> {
    let mut command = super::flags::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, BIN, &mut script);
    write_stdout(&script)
}

/// Print the top page, or write every page into `--out-dir`.
pub fn man(args: ManArgs) -> anyhow::Result<()> {
    match args.out_dir {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(super::flags::command().disable_help_subcommand(true))
                .render(&mut page)?;
            write_stdout(&page)
        }
        Some(dir) => {
            write_pages(&dir).map_err(|e| {
                anyhow::anyhow!(
                    "could not write the manual pages into {}: {e}. Give --out-dir a directory \
                     you can write to (it is created if missing).",
                    dir.display()
                )
            })?;
            Ok(())
        }
    }
}

/// Every page, as `clap_mangen::generate_to` writes them, keeping the paths.
fn write_pages(dir: &Path) -> std::io::Result<()> {
    fn walk(command: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub.clone(), dir, written)?;
        }
        written.push(clap_mangen::Man::new(command).generate_to(dir)?);
        Ok(())
    }
    std::fs::create_dir_all(dir)?;
    let mut command = super::flags::command().disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    walk(command, dir, &mut written)?;
    written.sort();
    let mut out = std::io::stdout().lock();
    for path in written {
        writeln!(out, "{}", path.display())?;
    }
    Ok(())
}

/// A closed pipe (`ai-crew-sync man | head`) is not an error worth a message.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}
