//! A crash and a recovery on purpose, for fault-injection tests (the chaos
//! run's PostgreSQL restart, `tests/suite/embedded.rs`): the cluster stopped
//! as a crash would stop it, then started again on the same socket.

use super::{EmbeddedError, EmbeddedPostgres, command_error};

impl EmbeddedPostgres {
    /// Stop the cluster at once, as a crash would (`pg_ctl stop -m
    /// immediate`): no checkpoint, every session cut mid-transaction, and
    /// the next start recovers from the WAL. For fault-injection tests;
    /// [`EmbeddedPostgres::restart`] brings it back.
    pub fn stop_immediately(&self) -> Result<(), EmbeddedError> {
        let _lock = self.lock()?;
        let pgdata = self.pgdata().to_string_lossy().into_owned();
        let out = self.run_pg("pg_ctl", &["stop", "-D", &pgdata, "-m", "immediate", "-w"])?;
        if !out.status.success() && self.is_running()? {
            return Err(command_error("pg_ctl stop -m immediate", &out));
        }
        Ok(())
    }

    /// Start the cluster again on the same socket after
    /// [`EmbeddedPostgres::stop_immediately`]; a no-op while it runs.
    pub fn restart(&self) -> Result<(), EmbeddedError> {
        let _lock = self.lock()?;
        if !self.is_running()? {
            self.pg_ctl_start()?;
        }
        Ok(())
    }
}
