//! Every operation a client issued and how it ended (stub: to be built).

use crate::model::Clock;

#[derive(Clone)]
pub struct History {
    #[allow(dead_code)]
    clock: Clock,
}

impl History {
    pub fn new(clock: Clock) -> History {
        History { clock }
    }
}
