//! The one way a test waits for something to become true: poll a probe
//! until it settles, and fail naming what was awaited when it does not
//! within [`DEADLINE`]. The deadline bounds a hang; it asserts no timing, so
//! it is generous (a loaded two-core machine starts a debug binary slowly).

use std::fmt::Debug;
use std::time::Duration;

use tokio::time::Instant;

/// How long any awaited condition may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// How long between two looks.
const POLL: Duration = Duration::from_millis(20);

/// What a probe answers: settled (with a value) or not yet (with what it saw,
/// for the failure's message).
pub trait Settles {
    type Value;
    fn settled(self) -> Result<Self::Value, Option<String>>;
}

/// `true` once the condition holds.
impl Settles for bool {
    type Value = ();
    fn settled(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

/// `Some` once there is something to take.
impl<T> Settles for Option<T> {
    type Value = T;
    fn settled(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

/// `Ok` once it works; the last error is shown if it never does.
impl<T, E: Debug> Settles for Result<T, E> {
    type Value = T;
    fn settled(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(format!("{e:?}")))
    }
}

/// Poll `probe` until it settles ([`Settles`]) and return its value; panic
/// naming `what` (and the probe's last error, if it gave one) after
/// [`DEADLINE`].
pub async fn eventually<P: Settles>(what: &str, mut probe: impl AsyncFnMut() -> P) -> P::Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let last = match probe().await.settled() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            match last {
                Some(last) => {
                    panic!("timed out after {DEADLINE:?} waiting for {what}; last: {last}")
                }
                None => panic!("timed out after {DEADLINE:?} waiting for {what}"),
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for code outside a runtime (a helper on a plain thread):
/// the same deadline, the probe called between blocking sleeps.
pub fn eventually_blocking<P: Settles>(what: &str, mut probe: impl FnMut() -> P) -> P::Value {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let last = match probe().settled() {
            Ok(value) => return value,
            Err(last) => last,
        };
        if std::time::Instant::now() >= deadline {
            match last {
                Some(last) => {
                    panic!("timed out after {DEADLINE:?} waiting for {what}; last: {last}")
                }
                None => panic!("timed out after {DEADLINE:?} waiting for {what}"),
            }
        }
        std::thread::sleep(POLL);
    }
}
