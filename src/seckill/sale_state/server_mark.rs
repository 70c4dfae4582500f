//! What tells one Redis server from another, and a server from itself
//! restarted or replaced by its promoted replica.

/// A Redis server as `INFO` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMark {
    /// Drawn at every start of the process.
    pub run_id: String,
    /// Drawn at every start, and when a replica is promoted.
    pub replid: String,
    /// How far its replication stream has come: never back, on one
    /// replication id.
    pub offset: u64,
}

impl ServerMark {
    /// Why `self` is not the server `before` was, if it is not: a restart,
    /// a failover, or a history that went back.
    pub fn changed_from(&self, before: &ServerMark) -> Option<&'static str> {
        if self.run_id != before.run_id {
            Some("restarted or replaced")
        } else if self.replid != before.replid {
            Some("promoted")
        } else if self.offset < before.offset {
            Some("went back")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ServerMark;

    #[test]
    fn a_server_is_changed_by_a_new_run_a_new_history_or_one_that_went_back() {
        let mark = |run_id: &str, replid: &str, offset| ServerMark {
            run_id: run_id.into(),
            replid: replid.into(),
            offset,
        };
        let before = mark("a", "r", 10);
        assert_eq!(mark("a", "r", 12).changed_from(&before), None);
        assert_eq!(
            mark("b", "r", 12).changed_from(&before),
            Some("restarted or replaced")
        );
        assert_eq!(mark("a", "s", 12).changed_from(&before), Some("promoted"));
        assert_eq!(mark("a", "r", 9).changed_from(&before), Some("went back"));
    }
}
