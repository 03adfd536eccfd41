//! The command line: `serve`, `migrate`, `doctor`, `quickstart`, the local
//! operator commands, `mcp-config`, the client side (`client`, `context`,
//! `mcp proxy`, `guard`), and `completions` / `man` generated from
//! it. Thin like the tools: parse, call one library function, print. Listings
//! print a table, or JSON with `--json`.

mod admin;
mod args;
mod client;
mod context;
mod conversations;
mod doctor;
mod flags;
mod generate;
mod guard;
mod operator;
mod output;
mod proxy;
mod reach;
pub mod recipes;
mod secret;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{FromArgMatches, Parser, Subcommand, ValueEnum};

use acs_store::db::Database;
use acs_store::db::embedded::EmbeddedPostgres;

#[derive(Parser, Debug)]
#[command(
    name = "ai-crew-sync",
    version,
    about = "A self-hosted coordination bus for teams of AI coding agents (MCP over HTTP).",
    long_about = "A self-hosted coordination bus for teams of AI coding agents.\n\n\
                  Agents connect over MCP (Streamable HTTP, bearer tokens) to `serve`. Without \
                  DATABASE_URL every command uses a private PostgreSQL kept in --data-dir, \
                  started from the system's PostgreSQL server binaries."
)]
pub struct Cli {
    /// PostgreSQL to use. Without it, the embedded cluster in --data-dir is used. With a
    /// password, give it as DATABASE_URL or --database-url-file, not as this flag.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,

    /// Read DATABASE_URL from this file (its first line). A URL with a password is refused
    /// as --database-url: the command line is visible to every user of the machine.
    #[arg(long, global = true, value_name = "PATH")]
    database_url_file: Option<PathBuf>,

    /// Read BUS_TOKEN (an agent token or session credential) from this file; --token is
    /// refused (the command line is visible to every user of the machine).
    #[arg(long, global = true, value_name = "PATH")]
    token_file: Option<PathBuf>,

    /// Read BUS_NATS_URL from this file. A NATS URL with a user, password or token is refused
    /// as --nats-url.
    #[arg(long, global = true, value_name = "PATH")]
    nats_url_file: Option<PathBuf>,

    /// Read BUS_DASHBOARD_SECRET from this file (serve); --dashboard-secret is refused.
    #[arg(long, global = true, value_name = "PATH")]
    dashboard_secret_file: Option<PathBuf>,

    /// Where the embedded PostgreSQL keeps its data [default: $XDG_DATA_HOME/ai-crew-sync].
    #[arg(long, env = "BUS_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,

    /// Log format on stderr (levels from RUST_LOG).
    #[arg(
        long,
        value_enum,
        env = "BUS_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,

    /// Print JSON instead of text, for scripts (client: the tool's answer as it came; doctor:
    /// the checks as [{check, status, verdict, action}]). Only commands with a JSON form
    /// take it.
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
struct MigrateArgs {
    /// List the migrations that would run (version and description) and apply nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the server: MCP at POST /mcp, health at GET /health.
    Serve(serve::ServeArgs),
    /// Apply database migrations, then exit (--dry-run: list them, apply nothing).
    Migrate(MigrateArgs),
    /// Check the database, schema, events, clock, outbox, allowed hosts, the server the profile
    /// or this database names (does it answer?), and with --nats-url the broker and streams.
    Doctor(doctor::DoctorArgs),
    /// Create a team and an agent (reusing existing ones) and keep a token for it in a local
    /// profile pointing at the server running on this database; re-run, it changes nothing
    /// unless --new-token.
    Quickstart(operator::quickstart::QuickstartArgs),
    /// Manage teams.
    #[command(subcommand)]
    Team(operator::team::TeamCommand),
    /// Manage agents of a team.
    #[command(subcommand)]
    Agent(operator::AgentCommand),
    /// Manage people of a team: they sign in to the dashboard (not /mcp) and write from it.
    #[command(subcommand)]
    Person(operator::person::PersonCommand),
    /// Conversation publication: where bodies live, what is in flight.
    #[command(subcommand)]
    Conversations(conversations::ConversationsCommand),
    /// Manage agent tokens.
    #[command(subcommand)]
    Token(operator::TokenCommand),
    /// Outgoing webhooks of a team (generic signed JSON, Slack, Discord).
    #[command(subcommand)]
    Webhook(operator::webhook::WebhookCommand),
    /// Print the MCP client config block for a URL and token.
    McpConfig(operator::McpConfigArgs),
    /// MCP servers on this machine: `mcp proxy`, a stdio server per host conversation.
    #[command(subcommand)]
    Mcp(proxy::McpCommand),
    /// Print the config block for Claude Code, Codex and Cursor that runs `mcp proxy` (no credential in it).
    ProxyConfig(proxy::ProxyConfigArgs),
    /// The team's common procedures (who is online, inbox, next task, hand off, ask, announce,
    /// stand-up) as texts a model follows; the same as the Claude Code plugin's slash commands.
    Recipes {
        /// The recipe to print (omit to list them).
        name: Option<String>,
    },
    /// Administration: `bootstrap` locally, the rest over a server's /admin API.
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// The console client: act as an agent over /mcp (a profile, or BUS_URL and BUS_TOKEN).
    Client(client::ClientArgs),
    /// This machine's side of identity: profiles, .acs.toml, and what applies here (show, verify).
    #[command(subcommand)]
    Context(context::ContextCommand),
    /// A git pre-commit hook refusing a commit that touches paths another window reserved
    /// exclusively (install, uninstall, and the check it runs); ACS_GUARD=off skips it.
    #[command(subcommand)]
    Guard(guard::GuardCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completions(generate::CompletionsArgs),
    /// Print the manual page (roff) on stdout, or write one page per command with --out-dir.
    Man(generate::ManArgs),
}

/// Parse the command line as clap does ([`flags::command`]: each of the root's
/// flags, `--json` included, under the commands that use it; given before a
/// command that does not, refused with clap's own words and exit code).
fn parse() -> Cli {
    let matches = flags::command().get_matches();
    flags::refuse_unused(&matches);
    Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.format(&mut flags::command()).exit())
}

/// A command whose reader goes away (`ai-crew-sync client call … | head`)
/// ends as other Unix tools do, by SIGPIPE, instead of panicking on the
/// next print: Rust ignores SIGPIPE, so `println!` would fail. Not for the
/// servers (`serve`, `mcp proxy`), which handle a closed peer themselves.
fn die_quietly_on_a_closed_pipe() {
    // SAFETY: called before any thread is started; restoring a signal's
    // default disposition has no other effect on this process.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Parse the command line and run it. Errors print on stderr and exit 1.
pub fn main() -> ExitCode {
    if let Err(err) = secret::take_secrets_off_argv(&std::env::args_os().collect::<Vec<_>>()) {
        eprintln!("error: {err:#}");
        return ExitCode::FAILURE;
    }
    let cli = parse();
    if !matches!(cli.command, Command::Serve(_) | Command::Mcp(_)) {
        die_quietly_on_a_closed_pipe();
    }
    // reqwest is built without a TLS provider of its own (no C toolchain for
    // aws-lc); ring serves https URLs of remote servers.
    let _ = rustls::crypto::ring::default_provider().install_default();
    init_logging(cli.log_format, matches!(cli.command, Command::Serve(_)));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: could not start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // Refusals quote the server, which may quote other agents.
            eprintln!("error: {}", output::clean(&format!("{err:#}")));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let json = cli.json;
    let ctx = Context {
        database_url: cli.database_url,
        data_dir: cli
            .data_dir
            .unwrap_or_else(EmbeddedPostgres::default_data_dir),
    };
    match cli.command {
        Command::Serve(args) => serve::run(&ctx, args).await,
        Command::Migrate(args) => {
            let db = ctx.open_database(COMMAND_CONNECTIONS).await?;
            let result = migrate(&db, args.dry_run).await;
            db.close().await;
            result
        }
        Command::Doctor(args) => doctor::run(&ctx, args, json).await,
        Command::Quickstart(args) => operator::quickstart::run(&ctx, args, json).await,
        Command::Team(cmd) => operator::team::run(&ctx, cmd, json).await,
        Command::Agent(cmd) => operator::agent(&ctx, cmd, json).await,
        Command::Person(cmd) => operator::person::run(&ctx, cmd, json).await,
        Command::Conversations(cmd) => conversations::run(&ctx, cmd, json).await,
        Command::Token(cmd) => operator::token(&ctx, cmd, json).await,
        Command::Webhook(cmd) => operator::webhook::run(&ctx, cmd, json).await,
        Command::Admin(cmd) => admin::run(&ctx, cmd, json).await,
        Command::Client(args) => client::run(args, json).await,
        Command::Context(command) => context::run(command, json).await,
        Command::Guard(command) => guard::run(command).await,
        Command::Mcp(command) => proxy::run(command).await,
        Command::ProxyConfig(args) => proxy::config(args),
        Command::Recipes { name } => recipes::run(name),
        Command::Completions(args) => generate::completions(args),
        Command::Man(args) => generate::man(args),
        Command::McpConfig(args) => {
            operator::print_mcp_config(&args.url, &args.token, args.session.as_deref());
            Ok(())
        }
    }
}

/// `migrate [--dry-run]`: what ran (or would run), one migration a line.
async fn migrate(db: &Database, dry_run: bool) -> anyhow::Result<()> {
    let location = &db.location;
    if dry_run {
        let state = acs_store::db::schema::schema_state(&db.pool).await?;
        if let Some(refusal) = state.refusal() {
            anyhow::bail!(refusal);
        }
        if state.pending.is_empty() {
            println!("{}; nothing to apply ({location})", at_version(&state));
        } else {
            println!(
                "{}; `ai-crew-sync migrate` would apply {} migration(s) ({location}), nothing applied now:",
                at_version(&state),
                state.pending.len()
            );
            for m in &state.pending {
                println!("  {:04}  {}", m.version, m.description);
            }
        }
        return Ok(());
    }
    let applied = db.migrate().await?;
    if applied.is_empty() {
        let newest = acs_store::db::migrator()
            .iter()
            .next_back()
            .map(|m| format!("{:04} ({})", m.version, m.description));
        println!(
            "the database schema is already at version {}; nothing applied ({location})",
            newest.unwrap_or_default()
        );
    } else {
        println!("applied {} migration(s) ({location}):", applied.len());
        for m in &applied {
            println!("  {:04}  {}", m.version, m.description);
        }
    }
    Ok(())
}

fn at_version(state: &acs_store::db::schema::SchemaState) -> String {
    match state.version() {
        Some(v) => format!("the database schema is at version {v}"),
        None => "the database has no schema yet".to_owned(),
    }
}

/// Pool size of a one-shot command (a server sizes its own).
pub(crate) const COMMAND_CONNECTIONS: u32 = 4;

/// What every command that touches the database needs.
pub(crate) struct Context {
    database_url: Option<String>,
    data_dir: PathBuf,
}

impl Context {
    pub(crate) async fn open_database(&self, max_connections: u32) -> anyhow::Result<Database> {
        self.say_if_new_cluster(false);
        self.open(max_connections).await
    }

    /// [`Context::open_database`] for `serve`, whose new cluster is its own.
    pub(crate) async fn open_database_to_serve(
        &self,
        max_connections: u32,
    ) -> anyhow::Result<Database> {
        self.say_if_new_cluster(true);
        self.open(max_connections).await
    }

    async fn open(&self, max_connections: u32) -> anyhow::Result<Database> {
        Ok(Database::open(
            self.database_url.as_deref(),
            &self.data_dir,
            max_connections,
        )
        .await?)
    }

    fn uses_database_url(&self) -> bool {
        self.database_url
            .as_deref()
            .is_some_and(|u| !u.trim().is_empty())
    }

    /// Before an embedded cluster is created where there is none: say where,
    /// and that no server uses it, so a command run without the server's
    /// --data-dir or DATABASE_URL does not silently make a second installation.
    fn say_if_new_cluster(&self, serving: bool) {
        if self.uses_database_url() || EmbeddedPostgres::exists_in(&self.data_dir) {
            return;
        }
        let pgdata = self.data_dir.join("pgdata");
        if serving {
            eprintln!(
                "creating a new embedded PostgreSQL cluster in {} for this server (no \
                 DATABASE_URL; --data-dir {})",
                pgdata.display(),
                self.data_dir.display()
            );
        } else {
            eprintln!(
                "creating a new embedded PostgreSQL cluster in {}: no server uses it. If an \
                 `ai-crew-sync serve` is running, it keeps its data elsewhere: run this command \
                 with that server's --data-dir (BUS_DATA_DIR) or DATABASE_URL instead (its \
                 first log line `database: …` names it).",
                pgdata.display()
            );
        }
    }

    /// The flags a command needs to use the same database as this one:
    /// ` --data-dir PATH` for an embedded cluster outside the default place,
    /// else none (a DATABASE_URL is never repeated on a screen: see
    /// [`Context::same_database_note`]).
    pub(crate) fn same_database_flags(&self) -> String {
        if self.uses_database_url() || self.data_dir == EmbeddedPostgres::default_data_dir() {
            return String::new();
        }
        format!(" --data-dir {}", self.data_dir.display())
    }

    /// What a command needs besides [`Context::same_database_flags`]: a
    /// DATABASE_URL is named, never shown.
    pub(crate) fn same_database_note(&self) -> Option<&'static str> {
        self.uses_database_url()
            .then_some("run it with the same DATABASE_URL as this server")
    }

    /// Open, migrate (so a fresh embedded database works for any command), run, close.
    pub(crate) async fn with_database<T>(
        &self,
        work: impl AsyncFnOnce(&sqlx::PgPool) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let db = self.open_database(COMMAND_CONNECTIONS).await?;
        let result = match db.migrate().await {
            Ok(_) => work(&db.pool).await,
            Err(err) => Err(err.into()),
        };
        db.close().await;
        result
    }
}

fn init_logging(format: LogFormat, serving: bool) {
    use tracing_subscriber::EnvFilter;
    let default = if serving {
        "info,sqlx=warn,rmcp=warn"
    } else {
        // rmcp logs its own line for a refused or unreachable server; the
        // command prints the explanation, once.
        "warn,rmcp=off"
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
