//! The embedded default: a private PostgreSQL cluster in the bus's data directory.
//!
//! With no `DATABASE_URL`, every command that needs the database uses one
//! cluster under `--data-dir`, started from the system's server binaries:
//!
//! ```text
//! <data-dir>/pgdata/        the cluster (initdb on first use, reused afterwards)
//! <data-dir>/pgrun/         its Unix socket, its log, and who owns the process
//! <data-dir>/embedded.lock  held briefly while starting, adopting or stopping
//! ```
//!
//! The cluster listens on a Unix socket only (`listen_addresses = ''`), in a
//! directory only its owner can reach, so trust authentication reaches no one
//! else. The first process that finds it stopped starts it and owns it; later
//! processes connect as guests. Every process using the cluster registers
//! itself, so an owner that finishes first hands the cluster over instead of
//! stopping it under the others' feet; an owner that died is replaced by the
//! next process to arrive.
//!
//! PostgreSQL refuses to run as root. When we are root, every server binary
//! runs as the dedicated system user [`SERVER_USER`] (`ai-crew-sync-pg`,
//! created with `useradd --system` when missing; never `nobody`) through
//! `setpriv`, with no capability: each directory above the data directory
//! that its mode does not let that user search (`/root` for the default)
//! gets one ACL entry letting that user alone through. Since other
//! processes of that user could reach the socket, such a cluster gets a
//! superuser password (kept in `<data-dir>/pgpass`, readable by root only)
//! instead of trust authentication.
//!
//! The bus itself never connects as the superuser. [`EmbeddedPostgres::provision_bus_role`]
//! (run by [`crate::db::Database::open`] on every start, under the lock, so
//! it also converts a data directory from before) makes the role
//! `ai_crew_sync`: no superuser, no CREATEDB or CREATEROLE, in none of the
//! roles that read or run things on the host (`pg_read_server_files`,
//! `pg_write_server_files`, `pg_execute_server_program`), owner of the bus's
//! database, its `public` schema and everything in it. The bus's pool and
//! its migrations connect as that role ([`EmbeddedPostgres::bus_url`]), so
//! whatever SQL reaches the pool cannot read `/etc/passwd` or start a
//! program. The superuser is for setup and tests only
//! ([`EmbeddedPostgres::database_url`]). Run as root, the role has its own
//! random password (`<data-dir>/bus.pgpass`, root only), like the superuser.
//!
//! The cluster's directory is made mode 0700 on every start and checked
//! afterwards: a filesystem that ignores the change stops the start, since
//! the files would be readable by others.
//!
//! What this does not do: tune the cluster, upgrade it across major
//! versions, or serve anything but this bus.
//!
//! The bus role's password, its superuser setup connection and the ownership
//! statement are in `provision.rs`.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use thiserror::Error;

mod crash;
mod host;
mod provision;
pub use host::SERVER_USER;
use host::{
    check_socket_path, chown, chown_tree, command_error, find_bin_dir, grant_search, output_text,
    pid_alive, read_pid, unprivileged_user, which, write_pid, write_private,
};
use provision::{TAKE_OWNERSHIP, connect_as_superuser, random_password};

/// The database the bus keeps its tables in, inside the embedded cluster.
pub const EMBEDDED_DATABASE: &str = "ai_crew_sync";
/// The role the bus connects as: owns [`EMBEDDED_DATABASE`], nothing more.
pub const BUS_ROLE: &str = "ai_crew_sync";
const SUPERUSER: &str = "postgres";
/// Predefined roles that reach the host's files or programs; the bus's role
/// is never a member.
const HOST_ROLES: &[&str] = &[
    "pg_read_server_files",
    "pg_write_server_files",
    "pg_execute_server_program",
];
const PORT: u16 = 5432;

#[derive(Debug, Error)]
pub enum EmbeddedError {
    #[error(
        "no PostgreSQL server binaries (initdb and pg_ctl) {searched}. Install them (Debian/Ubuntu: \
         `sudo apt-get install postgresql`; Fedora: `sudo dnf install postgresql-server`; macOS: \
         `brew install postgresql`); from a source checkout, `scripts/run` installs them itself when \
         run as root on Debian/Ubuntu and then starts the server. Or set DATABASE_URL to a \
         PostgreSQL you run yourself"
    )]
    NoBinaries {
        /// Where they were looked for, and how to point elsewhere.
        searched: String,
    },
    #[error(
        "running as root, the embedded PostgreSQL must run as an unprivileged user through `setpriv` \
         (util-linux), which was not found on PATH. Install util-linux (Debian/Ubuntu: \
         `apt-get install util-linux`; from a source checkout, `scripts/run` installs it), run as a \
         normal user, or set DATABASE_URL"
    )]
    NoSetpriv,
    #[error("the embedded PostgreSQL data directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error(
        "could not set up the bus's own role `{BUS_ROLE}` in the embedded PostgreSQL ({step}): \
         {source}. Check the cluster's log in <data-dir>/pgrun/postgres.log, or set DATABASE_URL"
    )]
    Provision {
        step: &'static str,
        #[source]
        source: sqlx::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedError + '_ {
    move |source| EmbeddedError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The embedded cluster of a data directory as [`EmbeddedPostgres::inspect`] found it.
#[derive(Clone, Debug)]
pub struct EmbeddedStatus {
    pub data_dir: PathBuf,
    /// A cluster exists there (`initdb` has run).
    pub initialized: bool,
    pub running: bool,
    /// The process recorded as the one that stops it, and whether it is alive.
    pub owner: Option<(u32, bool)>,
    /// Live processes registered as using it.
    pub users: Vec<u32>,
}

/// The unprivileged user the server binaries run as when we are root.
#[derive(Clone, Debug)]
struct RunAs {
    uid: u32,
    gid: u32,
}

/// A running embedded cluster, as seen by one process.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    data_dir: PathBuf,
    bin_dir: PathBuf,
    run_as: Option<RunAs>,
}

impl EmbeddedPostgres {
    /// `$XDG_DATA_HOME/ai-crew-sync`, else `~/.local/share/ai-crew-sync`.
    pub fn default_data_dir() -> PathBuf {
        if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
            return PathBuf::from(xdg).join("ai-crew-sync");
        }
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        home.join(".local/share/ai-crew-sync")
    }

    /// Whether a cluster exists in `data_dir` (`initdb` has run there), read
    /// without touching anything: a command says so before it creates one.
    pub fn exists_in(data_dir: &Path) -> bool {
        data_dir.join("pgdata").join("PG_VERSION").exists()
    }

    /// Start the cluster in `data_dir` (creating it on first use), or join the
    /// one already running there.
    pub fn start(data_dir: &Path) -> Result<Self, EmbeddedError> {
        let (bin_dir, run_as) = server_binaries()?;
        fs::create_dir_all(data_dir).map_err(io_err(data_dir))?;
        let data_dir = data_dir.canonicalize().map_err(io_err(data_dir))?;
        check_socket_path(&data_dir)?;
        let this = EmbeddedPostgres {
            data_dir,
            bin_dir,
            run_as,
        };
        let _lock = this.lock()?;
        this.prepare_dirs()?;
        if !this.pgdata().join("PG_VERSION").exists() {
            this.initdb()?;
        }
        let me = std::process::id();
        if this.is_running()? {
            let owner = read_pid(&this.owner_file());
            if owner.is_none_or(|pid| !pid_alive(pid)) {
                // The process that started it is gone: whoever arrives next owns it,
                // so someone is left to stop it.
                write_pid(&this.owner_file(), me)?;
            }
        } else {
            this.pg_ctl_start()?;
            write_pid(&this.owner_file(), me)?;
        }
        // Every user of the cluster registers, so an owner that finishes first
        // hands the cluster to whoever is still using it instead of stopping
        // it under them (a server, or a long command such as a migration).
        write_pid(&this.servers_dir().join(me.to_string()), me)?;
        Ok(this)
    }

    /// What the cluster in `data_dir` is doing, read without creating,
    /// starting or adopting anything (`doctor`).
    pub fn inspect(data_dir: &Path) -> Result<EmbeddedStatus, EmbeddedError> {
        let (bin_dir, run_as) = server_binaries()?;
        let data_dir = data_dir
            .canonicalize()
            .unwrap_or_else(|_| data_dir.to_path_buf());
        let this = EmbeddedPostgres {
            data_dir,
            bin_dir,
            run_as,
        };
        let initialized = this.pgdata().join("PG_VERSION").exists();
        let running = initialized && this.is_running()?;
        let owner = read_pid(&this.owner_file()).map(|pid| (pid, pid_alive(pid)));
        // Read only: stale registrations are left for the next start to clear.
        let mut users: Vec<u32> = fs::read_dir(this.servers_dir())
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
            .filter(|pid| pid_alive(*pid))
            .collect();
        users.sort_unstable();
        Ok(EmbeddedStatus {
            data_dir: this.data_dir.clone(),
            initialized,
            running,
            owner,
            users,
        })
    }

    /// The root of the bus's data (the cluster lives in `pgdata/` under it).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// Where the cluster's files live.
    pub fn pgdata(&self) -> PathBuf {
        self.data_dir.join("pgdata")
    }

    fn rundir(&self) -> PathBuf {
        self.data_dir.join("pgrun")
    }

    fn owner_file(&self) -> PathBuf {
        self.rundir().join("owner.pid")
    }

    fn servers_dir(&self) -> PathBuf {
        self.rundir().join("servers")
    }

    /// The superuser's connection URL for `database` over the private socket:
    /// for setting the cluster up and for tests, never for the bus's pool
    /// (that is [`EmbeddedPostgres::bus_url`]).
    pub fn database_url(&self, database: &str) -> String {
        self.url(SUPERUSER, &self.password_file(), database)
    }

    /// The bus's connection URL: [`BUS_ROLE`] on [`EMBEDDED_DATABASE`]. Valid
    /// once [`EmbeddedPostgres::provision_bus_role`] has run.
    pub fn bus_url(&self) -> String {
        self.url(BUS_ROLE, &self.bus_password_file(), EMBEDDED_DATABASE)
    }

    /// `role`'s URL for `database` over the private socket, with the
    /// password kept in `password_file` when there is one (run as root).
    fn url(&self, role: &str, password_file: &Path, database: &str) -> String {
        let credentials = match fs::read_to_string(password_file) {
            Ok(password) => format!("{role}:{}", password.trim()),
            Err(_) => role.to_string(),
        };
        format!(
            "postgres://{credentials}@localhost:{PORT}/{database}?host={}",
            self.rundir().display()
        )
    }

    fn bus_password_file(&self) -> PathBuf {
        self.data_dir.join("bus.pgpass")
    }

    /// Make (or correct) the bus's role and database, as the superuser over
    /// a one-off connection: idempotent, so it also converts a data
    /// directory whose tables the superuser created. Holds the start lock,
    /// so two processes starting at once do not race on the catalog.
    pub async fn provision_bus_role(&self) -> Result<(), EmbeddedError> {
        use sqlx::Connection;
        let data_dir = self.data_dir.clone();
        let _lock = tokio::task::spawn_blocking(move || lock_at(&data_dir))
            .await
            .expect("taking the lock does not panic")?;
        let password = match &self.run_as {
            // Trust authentication on a socket only this user reaches.
            None => None,
            Some(_) => Some(match fs::read_to_string(self.bus_password_file()) {
                Ok(password) => password.trim().to_string(),
                Err(_) => {
                    let password = random_password();
                    write_private(&self.bus_password_file(), &password)?;
                    password
                }
            }),
        };
        let fail = |step| move |source| EmbeddedError::Provision { step, source };

        let mut admin = connect_as_superuser(&self.database_url("postgres"))
            .await
            .map_err(fail("connecting as the superuser"))?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)")
                .bind(BUS_ROLE)
                .fetch_one(&mut admin)
                .await
                .map_err(fail("looking for the role"))?;
        if !exists {
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {BUS_ROLE} LOGIN")))
                .execute(&mut admin)
                .await
                .map_err(fail("creating the role"))?;
        }
        // Every start, so a role edited by hand is put back.
        let password_clause = match &password {
            // Hex only: safe to inline (ALTER ROLE takes no parameters).
            Some(password) => format!("PASSWORD '{password}'"),
            None => "PASSWORD NULL".to_string(),
        };
        let statements = [
            format!(
                "ALTER ROLE {BUS_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION \
                 NOBYPASSRLS {password_clause}"
            ),
            format!("REVOKE {} FROM {BUS_ROLE}", HOST_ROLES.join(", ")),
        ];
        for sql in statements {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut admin)
                .await
                .map_err(fail("restricting the role"))?;
        }
        let database_exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(EMBEDDED_DATABASE)
                .fetch_one(&mut admin)
                .await
                .map_err(fail("looking for the database"))?;
        let sql = if database_exists {
            format!("ALTER DATABASE {EMBEDDED_DATABASE} OWNER TO {BUS_ROLE}")
        } else {
            format!("CREATE DATABASE {EMBEDDED_DATABASE} OWNER {BUS_ROLE}")
        };
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .map_err(fail("giving the role its database"))?;
        let _ = admin.close().await;

        // A database the superuser migrated (before this role existed) holds
        // tables, functions and types the role could not alter or, without
        // grants, even read: they become the role's. REASSIGN OWNED cannot do
        // this, the bootstrap superuser's objects include the catalog.
        let mut bus_db = connect_as_superuser(&self.database_url(EMBEDDED_DATABASE))
            .await
            .map_err(fail("connecting to the bus's database as the superuser"))?;
        sqlx::query(sqlx::AssertSqlSafe(
            TAKE_OWNERSHIP.replace("{role}", BUS_ROLE),
        ))
        .execute(&mut bus_db)
        .await
        .map_err(fail("handing the bus's tables to the role"))?;
        let _ = bus_db.close().await;
        Ok(())
    }

    /// Whether this process started (or adopted) the cluster and must stop it.
    pub fn is_owner(&self) -> bool {
        read_pid(&self.owner_file()) == Some(std::process::id())
    }

    /// Leave the cluster: the owner stops it, unless a live server is using it,
    /// in which case that server becomes the owner. A guest only deregisters.
    pub fn stop(&self) -> Result<(), EmbeddedError> {
        let _lock = self.lock()?;
        let me = std::process::id();
        let _ = fs::remove_file(self.servers_dir().join(me.to_string()));
        if read_pid(&self.owner_file()) != Some(me) {
            return Ok(());
        }
        if let Some(heir) = self.live_servers().into_iter().find(|pid| *pid != me) {
            write_pid(&self.owner_file(), heir)?;
            return Ok(());
        }
        let out = self.run_pg(
            "pg_ctl",
            &[
                "stop",
                "-D",
                &self.pgdata().to_string_lossy(),
                "-m",
                "fast",
                "-w",
                "-t",
                "60",
            ],
        )?;
        if !out.status.success() && self.is_running()? {
            return Err(command_error("pg_ctl stop", &out));
        }
        let _ = fs::remove_file(self.owner_file());
        Ok(())
    }

    fn live_servers(&self) -> Vec<u32> {
        let Ok(entries) = fs::read_dir(self.servers_dir()) else {
            return Vec::new();
        };
        let mut pids = Vec::new();
        for entry in entries.flatten() {
            match entry.file_name().to_string_lossy().parse::<u32>() {
                Ok(pid) if pid_alive(pid) => pids.push(pid),
                _ => {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        pids
    }

    fn lock(&self) -> Result<File, EmbeddedError> {
        lock_at(&self.data_dir)
    }

    fn prepare_dirs(&self) -> Result<(), EmbeddedError> {
        for dir in [self.pgdata(), self.rundir(), self.servers_dir()] {
            fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        }
        // initdb insists on 0700 (or 0750) for the cluster; 0700 keeps the
        // data from every other user, the server's group included. The
        // socket directory stays private so trust authentication reaches
        // only its owner (and root).
        if let Some(user) = &self.run_as {
            grant_search(&self.data_dir, user)?;
        }
        for dir in [self.pgdata(), self.rundir()] {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(io_err(&dir))?;
            if let Some(user) = &self.run_as {
                // A cluster an earlier version ran as `postgres` or `nobody`
                // becomes the server user's, files and all.
                let owner =
                    std::os::unix::fs::MetadataExt::uid(&fs::metadata(&dir).map_err(io_err(&dir))?);
                if owner != user.uid {
                    chown_tree(&dir, user)?;
                }
                chown(&dir, user)?;
            }
            let mode = fs::metadata(&dir)
                .map_err(io_err(&dir))?
                .permissions()
                .mode()
                & 0o777;
            if mode != 0o700 {
                return Err(EmbeddedError::Command {
                    command: "embedded PostgreSQL".into(),
                    detail: format!(
                        "{} has mode {mode:o} after it was set to 700 (the filesystem does not \
                         keep permissions?), so other users could read the database. Put \
                         --data-dir (BUS_DATA_DIR) on a filesystem with Unix permissions, or set \
                         DATABASE_URL.",
                        dir.display()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Create the cluster. Run by a normal user, the socket directory is that
    /// user's alone, so trust authentication reaches nobody else. Run as root,
    /// the server runs as another user whose other processes could reach the
    /// socket, so the superuser gets a random password kept in a root-only
    /// file (`<data-dir>/pgpass`).
    fn initdb(&self) -> Result<(), EmbeddedError> {
        let pgdata = self.pgdata().to_string_lossy().into_owned();
        let mut args: Vec<String> = [
            "-D",
            &pgdata,
            "-U",
            SUPERUSER,
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-instructions",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let pwfile = self.rundir().join("initdb.pw");
        let password = match &self.run_as {
            None => {
                args.push("--auth=trust".into());
                None
            }
            Some(user) => {
                let password = random_password();
                // initdb runs as the server's user and must read the file.
                write_private(&pwfile, &password)?;
                chown(&pwfile, user)?;
                args.push("--auth=scram-sha-256".into());
                args.push(format!("--pwfile={}", pwfile.display()));
                Some(password)
            }
        };
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.run_pg("initdb", &refs);
        let _ = fs::remove_file(&pwfile);
        let out = out?;
        if !out.status.success() {
            return Err(command_error("initdb", &out));
        }
        if let Some(password) = password {
            write_private(&self.password_file(), &password)?;
        }
        Ok(())
    }

    fn password_file(&self) -> PathBuf {
        self.data_dir.join("pgpass")
    }

    fn is_running(&self) -> Result<bool, EmbeddedError> {
        let out = self.run_pg(
            "pg_ctl",
            &["status", "-D", &self.pgdata().to_string_lossy()],
        )?;
        // 0: running; 3: not running; 4: no readable data directory.
        Ok(out.status.code() == Some(0))
    }

    fn pg_ctl_start(&self) -> Result<(), EmbeddedError> {
        let rundir = self.rundir();
        let options = format!(
            "-c listen_addresses='' -c unix_socket_directories='{}' -p {PORT} -c max_connections=200",
            rundir.display()
        );
        let log = rundir.join("postgres.log");
        let out = self.run_pg(
            "pg_ctl",
            &[
                "start",
                "-D",
                &self.pgdata().to_string_lossy(),
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                "60",
                "-o",
                &options,
            ],
        )?;
        if !out.status.success() {
            let tail = fs::read_to_string(&log)
                .map(|s| s.lines().rev().take(5).collect::<Vec<_>>().join(" | "))
                .unwrap_or_default();
            return Err(EmbeddedError::Command {
                command: "pg_ctl start".into(),
                detail: format!("{} (log {}: {tail})", output_text(&out), log.display()),
            });
        }
        Ok(())
    }

    /// Run one server binary, as the unprivileged user when we are root.
    fn run_pg(&self, program: &str, args: &[&str]) -> Result<Output, EmbeddedError> {
        let binary = self.bin_dir.join(program);
        let mut command = match &self.run_as {
            None => Command::new(&binary),
            Some(user) => {
                // No capability kept: the uid change drops them all, and
                // the directories above the data are opened to this user
                // alone by `grant_search` instead.
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .arg("--clear-groups")
                    .arg("--inh-caps=-all")
                    .arg("--")
                    .arg(&binary);
                c
            }
        };
        command
            .args(args)
            .current_dir(&self.data_dir)
            .stdin(std::process::Stdio::null());
        command.output().map_err(|e| EmbeddedError::Command {
            command: format!("{} {}", binary.display(), args.join(" ")),
            detail: e.to_string(),
        })
    }
}

/// The server binaries' directory, and the unprivileged user they run as
/// when we are root (through `setpriv`, which must then be on PATH).
fn server_binaries() -> Result<(PathBuf, Option<RunAs>), EmbeddedError> {
    let bin_dir = find_bin_dir()?;
    let run_as = if unsafe { libc::geteuid() } == 0 {
        if which("setpriv").is_none() {
            return Err(EmbeddedError::NoSetpriv);
        }
        Some(unprivileged_user()?)
    } else {
        None
    };
    Ok((bin_dir, run_as))
}

/// The start lock of the cluster in `data_dir`, held until the file is dropped.
fn lock_at(data_dir: &Path) -> Result<File, EmbeddedError> {
    let path = data_dir.join("embedded.lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    // Blocks until any other process finishes starting or stopping; the
    // kernel releases it if that process dies.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(io_err(&path)(std::io::Error::last_os_error()));
    }
    Ok(file)
}
