//! Replaying a dead letter (`hmdp dead-letters replay`): its order written
//! as a consumer writes one, under its user's lock, in the batch's own
//! transaction. Written, or found written already, the dead letter and the
//! pending order go; any other answer leaves the dead letter listed and
//! says why. Idempotent on the order id, like every write of the stream:
//! replaying twice, or replaying while a consumer still holds the entry,
//! writes the order once.

use std::fmt;

use crate::seckill::writer::{Deferral, OrderWriter, Outcome};
use crate::seckill::DeadLetter;
use crate::store::NewOrder;

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// Written now; the dead letter is removed.
    Written(NewOrder),
    /// Already in MySQL as this very order; the dead letter is removed.
    AlreadyWritten(NewOrder),
    /// Not written, and it cannot be as it stands: why. The dead letter
    /// stays listed.
    Refused(String),
}

impl Replay {
    /// Whether the dead letter is settled (and gone).
    pub fn settled(&self) -> bool {
        !matches!(self, Replay::Refused(_))
    }
}

impl fmt::Display for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replay::Written(order) => write!(
                f,
                "written: order {} of user {}, voucher {}; dead letter removed",
                order.id, order.user_id, order.voucher_id
            ),
            Replay::AlreadyWritten(order) => write!(
                f,
                "already written: order {} is in MySQL; dead letter removed",
                order.id
            ),
            Replay::Refused(why) => write!(f, "not written, left listed: {why}"),
        }
    }
}

/// Replays `letter`. `Err` when the order could not be tried now (MySQL or
/// Redis failing, the user's lock busy): nothing changed, try again.
pub async fn replay(writer: &OrderWriter, letter: &DeadLetter) -> anyhow::Result<Replay> {
    let order = match &letter.order {
        Ok(order) => *order,
        Err(why) => return Ok(Replay::Refused(format!("malformed entry: {why}"))),
    };
    let sale_state = writer.sale_state();
    let outcomes = writer
        .write_under_locks(&[order], async |outcomes: &[Outcome]| {
            if matches!(outcomes[0], Outcome::Written | Outcome::AlreadyWritten) {
                sale_state.remove_dead_letter(&letter.id, order.id).await?;
            }
            Ok(())
        })
        .await?;
    Ok(match outcomes[0] {
        Outcome::Written => Replay::Written(order),
        Outcome::AlreadyWritten => Replay::AlreadyWritten(order),
        Outcome::DuplicateUser => Replay::Refused(format!(
            "user {} already holds another order of voucher {}",
            order.user_id, order.voucher_id
        )),
        Outcome::IdTaken => Replay::Refused(format!(
            "order id {} belongs to another order in MySQL",
            order.id
        )),
        Outcome::Resold => Replay::Refused(
            "its unit or its buyer's turn went to a buyer admitted after Redis lost the sale"
                .to_owned(),
        ),
        Outcome::Deferred(why @ Deferral::NoStockInMysql) => {
            Replay::Refused(format!("voucher {}: {why}", order.voucher_id))
        }
        Outcome::Deferred(why) => anyhow::bail!("order {} not written now: {why}", order.id),
    })
}
