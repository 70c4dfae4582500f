//! Every Redis key the service writes, in hmdp's layout, behind one optional
//! prefix so that deployments and test runs sharing a Redis stay apart.

use crate::ids::UserId;

/// Builds Redis keys.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Self {
        Keys {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `login:code:{phone}`: the login code sent to a phone (TTL 2 min).
    pub fn login_code(&self, phone: &str) -> String {
        format!("{}login:code:{phone}", self.prefix)
    }

    /// `login:code:limit:{phone}`: present while the phone may not ask for
    /// another code.
    pub fn login_code_limit(&self, phone: &str) -> String {
        format!("{}login:code:limit:{phone}", self.prefix)
    }

    /// `login:code:fail:{phone}`: wrong guesses of the current code.
    pub fn login_code_failures(&self, phone: &str) -> String {
        format!("{}login:code:fail:{phone}", self.prefix)
    }

    /// `login:token:{token}`: the session hash (TTL 30 min, refreshed).
    pub fn login_token(&self, token: &str) -> String {
        format!("{}login:token:{token}", self.prefix)
    }

    /// `lock:order:{userId}`: the per-user purchase lock.
    pub fn order_lock(&self, user_id: UserId) -> String {
        format!("{}lock:order:{user_id}", self.prefix)
    }

    /// `icr:order:{yyyy:MM:dd}`: the id worker's per-day counter.
    pub fn id_counter(&self, business: &str, day: &str) -> String {
        format!("{}icr:{business}:{day}", self.prefix)
    }
}
