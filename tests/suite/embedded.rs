//! The embedded PostgreSQL as `serve` opens it without `DATABASE_URL`
//! (`Database::open`): the bus's pool is a role that cannot reach the host,
//! and the cluster's files are its server user's alone.

use std::os::unix::fs::PermissionsExt;

use ai_crew_sync::db::embedded::{BUS_ROLE, EMBEDDED_DATABASE, EmbeddedPostgres};
use ai_crew_sync::db::{self, Database};
use ai_crew_sync::store::identity::teams;

use crate::support::globally;

/// The SQLSTATE of a failed statement.
fn sqlstate(result: Result<(), sqlx::Error>) -> String {
    match result {
        Ok(()) => "succeeded".to_string(),
        Err(err) => err
            .as_database_error()
            .and_then(|e| e.code())
            .map_or_else(|| format!("not a database error: {err}"), |c| c.to_string()),
    }
}

#[tokio::test]
async fn the_bus_pool_on_the_embedded_cluster_cannot_read_the_host() {
    let dir = tempfile::Builder::new()
        .prefix("acs-embedded-")
        .tempdir()
        .unwrap();
    let data_dir = dir.path().join("data");

    // A data directory from before: the superuser created the database and
    // ran the migrations, and the cluster's directory lets its group in.
    let old = {
        let data_dir = data_dir.clone();
        tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&data_dir))
            .await
            .unwrap()
            .expect("the embedded cluster starts")
    };
    db::create_database_if_missing(&old.database_url("postgres"), EMBEDDED_DATABASE)
        .await
        .unwrap();
    let superuser = db::connect(&old.database_url(EMBEDDED_DATABASE), 1)
        .await
        .unwrap();
    db::migrator().run(&superuser).await.unwrap();
    superuser.close().await;
    let pgdata = old.pgdata();
    tokio::task::spawn_blocking(move || old.stop())
        .await
        .unwrap()
        .unwrap();
    std::fs::set_permissions(&pgdata, std::fs::Permissions::from_mode(0o750)).unwrap();

    // What `serve` does without DATABASE_URL.
    let database = Database::open(None, &data_dir, 2).await.expect("open");
    database
        .migrate()
        .await
        .expect("migrations run as the bus's role");
    let pool = &database.pool;

    assert_eq!(
        std::fs::metadata(&pgdata).unwrap().permissions().mode() & 0o777,
        0o700,
        "the cluster's files are readable by its server user only"
    );

    let read_file = sqlx::query_scalar::<_, String>("SELECT pg_read_file('/etc/passwd')")
        .fetch_one(pool)
        .await
        .map(|_| ());
    assert_eq!(
        sqlstate(read_file),
        "42501",
        "pg_read_file: permission denied"
    );

    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("CREATE TEMP TABLE host_output (line text)")
        .execute(&mut *conn)
        .await
        .unwrap();
    let program = sqlx::query("COPY host_output FROM PROGRAM 'id'")
        .execute(&mut *conn)
        .await
        .map(|_| ());
    assert_eq!(
        sqlstate(program),
        "42501",
        "COPY FROM PROGRAM: permission denied"
    );
    drop(conn);

    let (user, superuser, createdb, createrole): (String, bool, bool, bool) = sqlx::query_as(
        "SELECT current_user::text, rolsuper, rolcreatedb, rolcreaterole
         FROM pg_roles WHERE rolname = current_user",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(user, BUS_ROLE);
    assert!(!superuser && !createdb && !createrole, "a plain role");
    let host_roles: Vec<String> = sqlx::query_scalar(
        "SELECT r.rolname::text FROM pg_roles r
         WHERE r.rolname IN ('pg_read_server_files', 'pg_write_server_files',
                             'pg_execute_server_program')
           AND pg_has_role(current_user, r.oid, 'MEMBER')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(host_roles.is_empty(), "member of {host_roles:?}");

    // The tables the superuser made before are the role's now: the bus
    // writes to them.
    teams::create(pool, &globally(), "acme", "Acme")
        .await
        .expect("the bus writes to the tables migrated by the superuser before");
    let owners: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT pg_get_userbyid(c.relowner)::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'S')",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(owners, vec![BUS_ROLE.to_string()]);

    database.close().await;
}

/// The setup runs as the superuser in a database whose `public` schema the
/// bus role owns. Whatever the role puts there (here an operator matching
/// the setup's own `oid <> regrole` comparison exactly, which the default
/// search path would prefer to the catalog's) must never run as the
/// superuser at the next start.
#[tokio::test]
async fn objects_the_bus_role_creates_never_run_as_the_superuser_at_the_next_start() {
    let dir = tempfile::Builder::new()
        .prefix("acs-embedded-")
        .tempdir()
        .unwrap();
    let data_dir = dir.path().join("data");
    let database = Database::open(None, &data_dir, 2).await.expect("open");
    database.migrate().await.expect("migrate");
    for sql in [
        "CREATE TABLE public.ran_as (who text)",
        "GRANT INSERT ON public.ran_as TO PUBLIC",
        "CREATE FUNCTION public.trap(oid, regrole) RETURNS boolean LANGUAGE sql
             AS 'INSERT INTO public.ran_as VALUES (current_user) RETURNING $1 <> $2::oid'",
        "CREATE OPERATOR public.<> (LEFTARG = oid, RIGHTARG = regrole, FUNCTION = public.trap)",
    ] {
        sqlx::query(sql)
            .execute(&database.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    database.close().await;

    let database = Database::open(None, &data_dir, 2)
        .await
        .expect("open again");
    let ran_as: Vec<String> = sqlx::query_scalar("SELECT who FROM public.ran_as")
        .fetch_all(&database.pool)
        .await
        .unwrap();
    assert!(
        ran_as.iter().all(|who| who == BUS_ROLE),
        "the setup ran the role's operator as {ran_as:?}"
    );
    database.close().await;
}

/// `stop_immediately` is a crash (sessions cut, no checkpoint) and `restart`
/// recovers: what was committed is there, the same URL works again.
#[tokio::test]
async fn an_immediate_stop_cuts_sessions_and_a_restart_recovers_what_was_committed() {
    let dir = tempfile::Builder::new()
        .prefix("acs-embedded-")
        .tempdir()
        .unwrap();
    let data_dir = dir.path().to_path_buf();
    let cluster = std::sync::Arc::new(
        tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&data_dir))
            .await
            .unwrap()
            .expect("the embedded cluster starts"),
    );
    let url = cluster.database_url("postgres");
    let pool = db::connect(&url, 1).await.unwrap();
    for sql in ["CREATE TABLE kept (n int)", "INSERT INTO kept VALUES (7)"] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }

    let down = cluster.clone();
    tokio::task::spawn_blocking(move || down.stop_immediately())
        .await
        .unwrap()
        .expect("pg_ctl stop -m immediate");
    let cut = sqlx::query_scalar::<_, i32>("SELECT n FROM kept")
        .fetch_one(&pool)
        .await;
    assert!(
        cut.is_err(),
        "a query on a stopped cluster answered: {cut:?}"
    );
    pool.close().await;

    let up = cluster.clone();
    tokio::task::spawn_blocking(move || up.restart())
        .await
        .unwrap()
        .expect("the cluster starts again");
    let pool = db::connect(&url, 1).await.unwrap();
    let n: i32 = sqlx::query_scalar("SELECT n FROM kept")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 7, "a committed row survives the crash");
    pool.close().await;
    let stop = cluster.clone();
    tokio::task::spawn_blocking(move || stop.stop())
        .await
        .unwrap()
        .unwrap();
}

/// Issue 33 item 11: started as root (as the suite runs here), the cluster
/// runs as the dedicated system user `ai-crew-sync-pg` (created when
/// missing), never `nobody`, with no capability (it used to keep
/// `CAP_DAC_READ_SEARCH`, which reads every file on the machine), and still
/// reaches a data directory under a directory only root may enter.
#[tokio::test]
async fn as_root_the_cluster_runs_as_its_own_system_user_without_capabilities() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: the cluster runs as the user who starts it; nothing to check");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("acs-embedded-user-")
        .tempdir()
        .unwrap();
    // The directory above is root's alone, as /root is for the default.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let data_dir = dir.path().join("data");
    let cluster = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&data_dir))
        .await
        .unwrap()
        .expect("the embedded cluster starts");
    let pid = std::fs::read_to_string(cluster.pgdata().join("postmaster.pid")).unwrap();
    let pid = pid.lines().next().unwrap().trim().to_owned();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let expected = {
        let name = std::ffi::CString::new(ai_crew_sync::db::embedded::SERVER_USER).unwrap();
        let pw = unsafe { libc::getpwnam(name.as_ptr()) };
        assert!(!pw.is_null(), "the server user exists");
        unsafe { (*pw).pw_uid }.to_string()
    };
    assert_ne!(expected, "65534", "not nobody");
    assert!(
        field("Uid").iter().all(|uid| *uid == expected),
        "the postmaster runs as {}: {:?}",
        ai_crew_sync::db::embedded::SERVER_USER,
        field("Uid")
    );
    for caps in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(
            field(caps),
            vec!["0000000000000000".to_owned()],
            "{caps}: no capability"
        );
    }
    let pgdata = cluster.pgdata();
    tokio::task::spawn_blocking(move || cluster.stop())
        .await
        .unwrap()
        .unwrap();

    // A cluster an earlier version ran as `nobody`: handed over at the next start.
    let chowned = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&pgdata)
        .status()
        .unwrap();
    assert!(chowned.success());
    let data_dir = dir.path().join("data");
    let cluster = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&data_dir))
        .await
        .unwrap()
        .expect("a cluster left by another user starts");
    let owner =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(pgdata.join("PG_VERSION")).unwrap());
    assert_eq!(
        owner.to_string(),
        expected,
        "its files are the server user's"
    );
    tokio::task::spawn_blocking(move || cluster.stop())
        .await
        .unwrap()
        .unwrap();
}
