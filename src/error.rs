//! The crate-wide error: every way a request can end other than success, with
//! its HTTP status, stable `errorCode` and hmdp's Chinese message.
//!
//! Infrastructure errors are logged with their whole cause chain and shown to
//! the client only as 503 `UNAVAILABLE` or 500 `INTERNAL`, never in detail
//! (the HTTP side of it is `api/response.rs`).

use hmdp_lock::LockError;

use crate::limits::Limited;

/// A business "no": HTTP 200 with `success:false` (hmdp's front end relies on it).
/// Its `errorCode` is its name in SCREAMING_SNAKE_CASE (`SOLD_OUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
pub enum Rejection {
    PhoneInvalid,
    CodeInvalid,
    CodeTooFrequent,
    VoucherNotFound,
    NotStarted,
    Ended,
    SoldOut,
    DuplicateRequest,
    AlreadyOrdered,
    OrderNotFound,
    ShopNotFound,
    /// The order was cancelled, or closed unpaid at its deadline.
    OrderClosed,
    /// Paid (or used) already: it cannot be cancelled.
    OrderPaid,
    /// Unpaid: it cannot be used.
    OrderNotPaid,
    /// Admitted and not written to MySQL yet: asked again in a moment, it is.
    OrderPending,
}

impl Rejection {
    pub fn code(self) -> &'static str {
        self.into()
    }

    pub fn message(self) -> &'static str {
        match self {
            Rejection::PhoneInvalid => "手机号格式错误！",
            Rejection::CodeInvalid => "验证码错误！",
            Rejection::CodeTooFrequent => "验证码发送过于频繁，请稍后再试！",
            Rejection::VoucherNotFound => "秒杀券不存在！",
            Rejection::NotStarted => "秒杀尚未开始！",
            Rejection::Ended => "秒杀已经结束！",
            Rejection::SoldOut => "库存不足！",
            Rejection::DuplicateRequest => "不允许重复下单！",
            Rejection::AlreadyOrdered => "用户已经购买过一次！",
            Rejection::OrderNotFound => "订单不存在！",
            Rejection::ShopNotFound => "店铺不存在！",
            Rejection::OrderClosed => "订单已关闭！",
            Rejection::OrderPaid => "订单已支付，不能取消！",
            Rejection::OrderNotPaid => "订单尚未支付！",
            Rejection::OrderPending => "订单处理中，请稍后再试！",
        }
    }
}

/// Why a request did not succeed. Its `errorCode` is its kind's name in
/// SCREAMING_SNAKE_CASE (`UNAVAILABLE`), a rejection's own code for
/// [`Error::Rejected`].
#[derive(thiserror::Error, strum::EnumDiscriminants)]
#[strum_discriminants(
    name(ErrorKind),
    derive(strum::IntoStaticStr, strum::VariantArray),
    strum(serialize_all = "SCREAMING_SNAKE_CASE")
)]
pub enum Error {
    #[error("{}", .0.message())]
    Rejected(Rejection),
    /// Malformed request: bad id, bad JSON, missing or invalid field.
    #[error("{0}")]
    BadRequest(String),
    #[error("未登录")]
    Unauthorized,
    #[error("无权限")]
    Forbidden,
    #[error("资源不存在")]
    NotFound,
    /// A known path asked with a method it does not take (its `Allow`
    /// header lists those it does).
    #[error("请求方法不允许")]
    MethodNotAllowed,
    #[error("请求体过大")]
    PayloadTooLarge,
    /// A request with the same `Idempotency-Key` is still being answered.
    #[error("相同的请求正在处理中")]
    IdempotencyKeyInUse,
    /// The `Idempotency-Key` was first sent with another request.
    #[error("幂等键已用于另一个请求")]
    IdempotencyKeyReused,
    /// The request body did not arrive within the body deadline.
    #[error("请求超时")]
    RequestTimeout,
    /// Over one of the request limits (`limits`): answered 429 with
    /// `Retry-After`.
    #[error("操作太频繁，请稍后再试")]
    RateLimited(Limited),
    /// The node has as many purchases in flight as it finishes in time
    /// (`overload`): answered 503 at once, with `Retry-After`.
    #[error("服务繁忙，请稍后再试")]
    Overloaded,
    /// Redis or MySQL unreachable or too slow.
    #[error("服务繁忙，请稍后再试")]
    Unavailable(#[source] anyhow::Error),
    #[error("服务器异常")]
    Internal(#[source] anyhow::Error),
}

impl Error {
    /// A step (or a read it needs) given up on at the end of its time:
    /// MySQL or Redis too slow to answer within `budget`.
    pub fn over_budget(step: &str, budget: std::time::Duration) -> Error {
        Error::Unavailable(anyhow::anyhow!("{step} took longer than {budget:?}"))
    }

    pub fn error_code(&self) -> &'static str {
        match self {
            Error::Rejected(rejection) => rejection.code(),
            other => ErrorKind::from(other).into(),
        }
    }

    /// Every `errorCode` an answer may carry: the rejections' and the other
    /// kinds'.
    pub fn codes() -> impl Iterator<Item = &'static str> {
        use strum::VariantArray;
        let rejections = Rejection::VARIANTS.iter().map(|rejection| rejection.code());
        let others = (ErrorKind::VARIANTS.iter())
            .filter(|kind| **kind != ErrorKind::Rejected)
            .map(|kind| kind.into());
        rejections.chain(others)
    }
}

impl From<crate::ids::InvalidId> for Error {
    fn from(invalid: crate::ids::InvalidId) -> Self {
        Error::BadRequest(invalid.to_string())
    }
}

impl From<Limited> for Error {
    fn from(limited: Limited) -> Self {
        Error::RateLimited(limited)
    }
}

impl From<Rejection> for Error {
    fn from(rejection: Rejection) -> Self {
        Error::Rejected(rejection)
    }
}

/// MySQL errors that mean "unavailable for now, try again", not "broken":
/// too many connections (1040), server shutting down (1053), lock wait
/// timeout (1205), deadlock victim (1213), read-only server (1290), MariaDB's
/// connection killed (1927), MySQL's disconnected for inactivity (4031).
const MYSQL_BUSY_ERRORS: [u16; 7] = [1040, 1053, 1205, MYSQL_DEADLOCK, 1290, 1927, 4031];

/// MySQL's "Deadlock found when trying to get lock": the server rolled the
/// whole transaction back, so running it again from its start is safe.
const MYSQL_DEADLOCK: u16 = 1213;

/// The MySQL server's own error in `error`, with its number, if it is one.
pub fn mysql_error(error: &sqlx::Error) -> Option<&sqlx::mysql::MySqlDatabaseError> {
    match error {
        sqlx::Error::Database(db) => db.try_downcast_ref(),
        _ => None,
    }
}

impl Error {
    /// Whether this is MySQL ending a transaction as a deadlock's victim
    /// (rolled back whole, never committed).
    pub fn is_deadlock(&self) -> bool {
        let Error::Unavailable(cause) = self else {
            return false;
        };
        (cause.downcast_ref().and_then(mysql_error))
            .is_some_and(|mysql| mysql.number() == MYSQL_DEADLOCK)
    }
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        let busy = match &error {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::WorkerCrashed => true,
            error => {
                mysql_error(error).is_some_and(|mysql| MYSQL_BUSY_ERRORS.contains(&mysql.number()))
            }
        };
        if busy {
            Error::Unavailable(error.into())
        } else {
            Error::Internal(error.into())
        }
    }
}

/// The `kind` label of `redis_errors_total` (counted where a request is
/// answered, `api/response.rs`): every kind but `other` is a
/// Redis unavailable for now, not broken. A server that is loading,
/// read-only after a failover, or without its master or its cluster; a
/// Redis Cluster in a failover, which answers MOVED, ASK, TRYAGAIN or
/// CLUSTERDOWN, or has no connection to a slot's new master yet, until its
/// slot map settles; a connection refused, dropped or timed out. The request
/// may be retried, as after a restart.
pub fn redis_error_kind(error: &redis::RedisError) -> &'static str {
    use redis::ServerErrorKind as Server;
    match error.kind() {
        redis::ErrorKind::Server(Server::Moved) => "moved",
        redis::ErrorKind::Server(Server::Ask) => "ask",
        redis::ErrorKind::Server(Server::TryAgain) => "tryagain",
        redis::ErrorKind::Server(Server::ClusterDown) => "clusterdown",
        redis::ErrorKind::Server(Server::BusyLoading) => "loading",
        redis::ErrorKind::Server(Server::ReadOnly) => "readonly",
        redis::ErrorKind::Server(Server::MasterDown) => "masterdown",
        redis::ErrorKind::ClusterConnectionNotFound => "connection",
        _ if error.is_io_error()
            || error.is_timeout()
            || error.is_connection_dropped()
            || error.is_connection_refusal() =>
        {
            "connection"
        }
        _ => "other",
    }
}

impl From<redis::RedisError> for Error {
    fn from(error: redis::RedisError) -> Self {
        if redis_error_kind(&error) != "other" || error.is_unrecoverable_error() {
            Error::Unavailable(error.into())
        } else {
            Error::Internal(error.into())
        }
    }
}

impl From<LockError> for Error {
    fn from(error: LockError) -> Self {
        match error {
            LockError::Redis(redis) => redis.into(),
            unexpected @ LockError::UnexpectedReply(_) => Error::Internal(unexpected.into()),
            // The purchase rolled back; the client may retry.
            lost @ LockError::Lost(_) => Error::Unavailable(lost.into()),
            // Given back before any work: the replicas are behind or gone.
            unreplicated @ LockError::NotReplicated { .. } => {
                Error::Unavailable(unreplicated.into())
            }
        }
    }
}

impl std::fmt::Debug for Error {
    /// Walks the whole `source()` chain so a log line shows every cause.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{self}")?;
        let mut current = std::error::Error::source(self);
        while let Some(cause) = current {
            writeln!(f, "Caused by:\n\t{cause}")?;
            current = cause.source();
        }
        Ok(())
    }
}
