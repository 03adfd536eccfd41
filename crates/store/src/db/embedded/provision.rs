//! Provisioning the bus role in the embedded cluster: its password, the
//! superuser connection setup runs on, and the statement that hands the bus
//! role everything in its database's `public` schema.

/// A fresh password: 24 random bytes, hex (safe to inline in SQL).
pub(super) fn random_password() -> String {
    let mut bytes = [0u8; 24];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    hex::encode(bytes)
}

/// A superuser connection for setup whose names resolve in `pg_catalog` only.
/// The bus role owns `public` in its database: with the default search path,
/// an operator or function it created there (say `public.<>(oid, regrole)`)
/// would be picked over the catalog's by the setup queries and run as the
/// superuser at the next start.
pub(super) async fn connect_as_superuser(url: &str) -> Result<sqlx::PgConnection, sqlx::Error> {
    use sqlx::ConnectOptions;
    use std::str::FromStr;
    let options = sqlx::postgres::PgConnectOptions::from_str(url)?.options([
        ("search_path", "pg_catalog, pg_temp"),
        // The setup's REVOKEs of roles the bus role does not hold warn on
        // every start; a setup step that fails still errors.
        ("client_min_messages", "error"),
    ]);
    options.connect().await
}

/// Run as the superuser in the bus's database: everything in `public` not
/// yet the bus role's becomes its. Sequences that belong to a column follow
/// their table; array types follow their element type.
pub(super) const TAKE_OWNERSHIP: &str = r#"
DO $take$
DECLARE
    r record;
BEGIN
    IF (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'public')
       NOT IN ('{role}', 'pg_database_owner') THEN
        ALTER SCHEMA public OWNER TO {role};
    END IF;
    FOR r IN
        SELECT c.oid::regclass AS name,
               CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                              WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'f' THEN 'FOREIGN TABLE'
                              ELSE 'TABLE' END AS kind
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
          AND c.relowner <> '{role}'::regrole
          AND NOT EXISTS (SELECT 1 FROM pg_depend d
                          WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                            AND d.deptype IN ('a', 'i'))
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO {role}', r.kind, r.name);
    END LOOP;
    FOR r IN
        SELECT p.oid::regprocedure AS name
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND p.proowner <> '{role}'::regrole
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO {role}', r.name);
    END LOOP;
    FOR r IN
        SELECT t.oid::regtype AS name, t.typtype
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'public' AND t.typowner <> '{role}'::regrole
          AND t.typelem = 0
          AND (t.typtype IN ('d', 'e', 'r', 'm')
               OR (t.typtype = 'c' AND (SELECT relkind FROM pg_class WHERE oid = t.typrelid) = 'c'))
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO {role}',
                       CASE r.typtype WHEN 'd' THEN 'DOMAIN' ELSE 'TYPE' END, r.name);
    END LOOP;
END
$take$
"#;
