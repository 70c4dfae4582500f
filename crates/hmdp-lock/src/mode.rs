//! The lock modes, one per stage of the course the crate reproduces: from no
//! lock at all to a quorum over independent Redis servers.

/// Which lock [`LockBuilder`](crate::LockBuilder) makes. With the `clap` feature it is a
/// `clap::ValueEnum`, so a command line can take it as it is (`--lock
/// redis-lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum LockMode {
    /// No lock at all: duplicates appear even on one node.
    #[cfg(feature = "teaching")]
    #[cfg_attr(feature = "clap", value(name = "none"))]
    NoLock,
    /// A per-key mutex inside this process (Java's `synchronized(key.intern())`).
    #[cfg(feature = "teaching")]
    Local,
    /// Lock v1: `SET NX PX`, release = `DEL` (deletes whoever holds it).
    #[cfg(feature = "teaching")]
    RedisNaive,
    /// Lock v2: release = `GET`, compare, then `DEL` (two commands).
    #[cfg(feature = "teaching")]
    RedisOwner,
    /// Lock v3: release = one Lua compare-and-delete.
    RedisLua,
    /// Redisson-style reentrant hash lock with pub/sub waiting and a watchdog.
    Reentrant,
    /// All-or-nothing over independent Redis nodes (Redisson's `MultiLock`).
    Multi,
    /// Majority quorum over independent Redis nodes (RedLock).
    Redlock,
}

impl LockMode {
    /// Every mode built in, from the weakest to the strongest.
    pub const ALL: &'static [LockMode] = &[
        #[cfg(feature = "teaching")]
        LockMode::NoLock,
        #[cfg(feature = "teaching")]
        LockMode::Local,
        #[cfg(feature = "teaching")]
        LockMode::RedisNaive,
        #[cfg(feature = "teaching")]
        LockMode::RedisOwner,
        LockMode::RedisLua,
        LockMode::Reentrant,
        LockMode::Multi,
        LockMode::Redlock,
    ];

    /// The mode's name on a command line and in metrics labels.
    ///
    /// ```
    /// assert_eq!(hmdp_lock::LockMode::RedisLua.as_str(), "redis-lua");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            #[cfg(feature = "teaching")]
            LockMode::NoLock => "none",
            #[cfg(feature = "teaching")]
            LockMode::Local => "local",
            #[cfg(feature = "teaching")]
            LockMode::RedisNaive => "redis-naive",
            #[cfg(feature = "teaching")]
            LockMode::RedisOwner => "redis-owner",
            LockMode::RedisLua => "redis-lua",
            LockMode::Reentrant => "reentrant",
            LockMode::Multi => "multi",
            LockMode::Redlock => "redlock",
        }
    }

    /// Whether the mode's locks run out on a lease: every mode kept in
    /// Redis (not `none` and `local`).
    pub fn leased(self) -> bool {
        self.uses_main_redis() || matches!(self, LockMode::Multi | LockMode::Redlock)
    }

    /// Whether the mode keeps its lock on the one Redis the connection goes
    /// to (replicated or not): not `none` and `local` (no Redis), nor
    /// `multi` and `redlock` (independent servers of their own).
    pub fn uses_main_redis(self) -> bool {
        match self {
            LockMode::RedisLua | LockMode::Reentrant => true,
            #[cfg(feature = "teaching")]
            LockMode::RedisNaive | LockMode::RedisOwner => true,
            #[cfg(feature = "teaching")]
            LockMode::NoLock | LockMode::Local => false,
            LockMode::Multi | LockMode::Redlock => false,
        }
    }
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use crate::mode::LockMode;

    #[cfg(feature = "clap")]
    #[test]
    fn command_line_names_are_the_display_names() {
        use clap::ValueEnum;
        for &mode in LockMode::ALL {
            let value = mode.to_possible_value().expect("no skipped variants");
            assert_eq!(value.get_name(), mode.as_str());
        }
        assert_eq!(LockMode::value_variants(), LockMode::ALL);
    }

    #[test]
    fn names_are_kebab_case() {
        assert_eq!(LockMode::RedisLua.to_string(), "redis-lua");
    }
}
