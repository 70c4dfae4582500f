//! The writer's vocabulary: what became of each order of a transaction
//! ([`Outcome`], and why one was left for later, [`Deferral`]), how the
//! transaction ended ([`Ended`]), and whose a failed write's fault is
//! ([`Blame`]) — the words every path that writes orders decides with.

use crate::error::mysql_error;
use crate::ids::OrderId;

/// What became of one order of a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Inserted, stock taken, committed.
    Written,
    /// Already in MySQL as this very order: a redelivery.
    AlreadyWritten,
    /// The user already holds another order of the voucher: refused, as
    /// the synchronous purchase refuses `ALREADY_ORDERED`. An admitted
    /// order refused so (Redis forgot its buyer and admitted them twice)
    /// goes to the dead letters: its buyer was told success.
    DuplicateUser,
    /// The order id belongs to another order (the id counter in Redis
    /// started over): it can never be written under this id.
    IdTaken,
    /// Admitted before Redis lost the sale, and its unit (or its buyer's
    /// turn) went to a buyer admitted after the reload, who keeps it: the
    /// order cannot be written without selling a unit twice.
    Resold,
    /// Not written this time, and why; left pending, to be tried again.
    /// Only [`Deferral::NoStockInMysql`] ever ends in the dead letters.
    Deferred(Deferral),
}

impl Outcome {
    /// Left pending for a reason not the order's own: another holder has
    /// the user's lock, the lock could not be asked, or it passed on.
    pub fn waits_on_others(self) -> bool {
        matches!(self, Outcome::Deferred(why) if why != Deferral::NoStockInMysql)
    }

    /// Written in MySQL: the order leaves the pending orders. (An admitted
    /// order refused for its buyer's other order is no such order: its
    /// buyer was told success, and it goes to the dead letters.)
    pub fn settled(self) -> bool {
        matches!(self, Outcome::Written | Outcome::AlreadyWritten)
    }
}

/// Why an order was not written this time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Deferral {
    /// Another holder has the user's lock.
    #[error("the user's lock is busy")]
    LockBusy,
    /// The user's lock could not be asked (Redis unreachable).
    #[error("the user's lock is unavailable")]
    LockUnavailable,
    /// The user's lock passed on while held: a newer holder recorded its
    /// fencing token first.
    #[error("a newer lock holder's fencing token wrote")]
    FencedOut,
    /// The user's lock was found lost before the insert (a lease that ran
    /// out, a renewal that found the key taken).
    #[error("the user's lock was lost while held")]
    LockLost,
    /// The one deferral that is the order's own: Redis admitted a unit
    /// MySQL does not have (Redis and MySQL disagree), which no retry
    /// changes.
    #[error("no stock left in MySQL")]
    NoStockInMysql,
}

/// How one transaction ended.
pub enum Ended {
    Committed(Vec<Outcome>),
    /// Rolled back: a purchase's order id, fresh from the id worker, is
    /// taken already (the worker's counter in Redis started over).
    IdTaken,
    /// Rolled back: these orders' units went to buyers admitted after Redis
    /// lost the sale.
    Resold(Vec<OrderId>),
}

/// Whose failure a failed write is. Only a failure of the order itself
/// repeats whatever the surroundings do, so only such a failure may ever
/// give up on an order its buyer was told they have; every other failure
/// passes once MySQL, Redis or the lock's holder lets it.
#[derive(Debug, PartialEq, Eq)]
pub enum Blame {
    /// The order's own values are refused (a column's type or range, a
    /// constraint): the same statement fails the same way every time.
    Order(String),
    /// Anything else: a lock wait timeout (1205), a deadlock (1213), a
    /// read-only server (1290), a locked table, a full disk, a connection
    /// lost or refused, a statement given up on, a user's lock lost.
    Surroundings,
}

/// MySQL errors about the values of the row written: column cannot be null
/// (1048), out of range (1264), incorrect value (1366), data too long
/// (1406), foreign key (1452), check constraint (3819, MariaDB's 4025).
const ORDER_VALUE_ERRORS: [u16; 7] = [1048, 1264, 1366, 1406, 1452, 3819, 4025];

impl Blame {
    pub fn of(failure: &(dyn std::error::Error + 'static)) -> Blame {
        let refused = std::iter::successors(Some(failure), |cause| cause.source())
            .filter_map(|cause| cause.downcast_ref().and_then(mysql_error))
            .find(|mysql| ORDER_VALUE_ERRORS.contains(&mysql.number()));
        match refused {
            Some(mysql) => Blame::Order(format!("MySQL refused the order: {mysql}")),
            None => Blame::Surroundings,
        }
    }
}
