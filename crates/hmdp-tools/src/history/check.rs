//! `hmdp check`: a history judged against MySQL. For each sale the history
//! names (the checks' names are in [`names`]):
//!
//! - `success-written`: every success answer to a purchase is an order of
//!   that sale in MySQL under the id the buyer was told, unless an allowed
//!   loss explains it: a fault of its kind within the writers' lag after
//!   the answer (a Redis restart without persistence, a `queue` node
//!   killed; `everysec`: within [`EVERYSEC_BOUND`]);
//! - `success-buyer`: MySQL files that order under the buyer told it;
//! - `told-twice`: no buyer told success for two orders of a sale that are
//!   both active;
//! - `buyer-orders`: each buyer's orders in MySQL are exactly those their
//!   answers explain: the orders they were told, and one for each unknown
//!   answer at most; a definite refusal (`SOLD_OUT`, `ENDED`, ...) made
//!   none;
//! - `stock-balance`, `stock-nonnegative`, `one-order-per-user`,
//!   `paid-and-closed`: MySQL's own invariants (a closed order is no unit
//!   sold: active orders + stock = the stock the sale began with);
//! - `sold-out`: a `SOLD_OUT` answer said no unit was left; the stock MySQL
//!   still holds must be explained by units that came back after it (orders
//!   closed no earlier than the writers' lag before the last `SOLD_OUT`: a
//!   give-back reaches Redis after its close), orders lost as allowed, or
//!   purchases whose answer was lost and that left no order (a dead
//!   letter's unit); any more is a unit lost;
//! - `payments`, `cancels`: each answered as MySQL holds it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;

use hmdp::config::DatabaseSettings;
use hmdp::ids::VoucherId;
use hmdp::store::{OrderState, Store, VoucherAudit};

use super::buyers::BuyerAnswers;
use super::loss::{allowed_loss, Fault, Loss, EVERYSEC_BOUND};
use super::rows::OrderRow;
use super::verdict::names::*;
use super::{read, Call, Event, Failure, Verdict};

/// How long an order answered success may take to reach MySQL, and a
/// closed order's unit to reach Redis again, by default: the writers'
/// batches and retries under a soak's load take seconds, not tens of them.
pub const DEFAULT_WRITERS_LAG: Duration = Duration::from_secs(10);

/// `hmdp check`.
#[derive(Debug, Clone, Args)]
pub struct CheckSettings {
    /// The history to check (JSON lines, as `loadtest --history` and
    /// `soak --history` write them).
    #[arg(long)]
    pub history: PathBuf,

    /// Losses the run's configuration allows (docs/guarantees.md); each is
    /// counted, and only a loss a fault of that kind explains passes.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub allow_loss: Vec<Loss>,

    /// The writers' lag, in milliseconds: an allowed loss covers only
    /// orders answered at most this long before a fault of its kind, and a
    /// unit closed at most this long before a `SOLD_OUT` answer may not
    /// have been back in Redis when it was given.
    #[arg(long, default_value_t = DEFAULT_WRITERS_LAG.as_millis() as u64)]
    pub writers_lag_ms: u64,

    /// MySQL, the truth the history is checked against.
    #[command(flatten)]
    pub database: DatabaseSettings,
}

/// Checks `events` against MySQL (`store`), allowing the losses `allowed`
/// for orders answered within `writers_lag` before a fault of their kind.
pub async fn check(
    store: &Store,
    events: &[Event],
    allowed: &[Loss],
    writers_lag: Duration,
) -> anyhow::Result<Verdict> {
    let unnamed = (events.iter())
        .filter(|event| matches!(event.asked_by(), Some((_, None, _))))
        .count();
    if unnamed > 0 {
        bail!(
            "{unnamed} request(s) and answer(s) of the history name no user id: it was \
             written before histories recorded their buyers, and a buyer's orders cannot \
             be checked without them; record the run again"
        );
    }
    let mut verdict = Verdict::new();
    let mut sales: BTreeMap<i64, i64> = BTreeMap::new();
    let mut buyers = BTreeSet::new();
    for event in events {
        match event {
            Event::Sale { voucher, stock, .. } => {
                sales.insert(*voucher, *stock);
            }
            Event::Invoke { .. } => verdict.requests += 1,
            Event::Ok { .. } => verdict.ok += 1,
            Event::Fail(_) => verdict.failed += 1,
            Event::Unknown(_) => verdict.unknown += 1,
            Event::Fault { .. } => {}
        }
        if let Some((_, Some(user), _)) = event.asked_by() {
            buyers.insert(user);
        }
    }
    verdict.sales = sales.len();
    verdict.buyers = buyers.len();
    let faults = Fault::all(events);
    for (&voucher, &initial) in &sales {
        let answers: Vec<&Event> = (events.iter())
            .filter(|event| !matches!(event, Event::Invoke { .. }))
            .filter(|event| matches!(event.asked_by(), Some((_, _, v)) if v == voucher))
            .collect();
        let sale = Sale {
            voucher,
            initial,
            rows: OrderRow::of_voucher(store.pool(), voucher).await?,
            mysql: store.audit_voucher(VoucherId::new(voucher)).await?,
            by_user: BuyerAnswers::by_user(&answers),
            answers,
        };
        verdict.orders += sale.mysql.active_orders;
        verdict.closed += sale.mysql.closed_orders;
        let lost_as_allowed = sale
            .successes(store, &mut verdict, &faults, allowed, writers_lag)
            .await?;
        sale.told_twice(&mut verdict);
        let unanswered = sale.buyer_orders(&mut verdict);
        sale.mysql_invariants(&mut verdict);
        sale.sold_out(&mut verdict, lost_as_allowed + unanswered, writers_lag);
        sale.acts(&mut verdict);
    }
    Ok(verdict)
}

/// One sale of the history: its answers and what MySQL holds of it.
struct Sale<'a> {
    voucher: i64,
    initial: i64,
    rows: BTreeMap<i64, OrderRow>,
    mysql: VoucherAudit,
    answers: Vec<&'a Event>,
    by_user: BTreeMap<i64, BuyerAnswers>,
}

impl Sale<'_> {
    /// `success-written` and `success-buyer`: each success answer to a
    /// purchase against MySQL. Returns how many were lost as allowed.
    async fn successes(
        &self,
        store: &Store,
        verdict: &mut Verdict,
        faults: &[Fault<'_>],
        allowed: &[Loss],
        writers_lag: Duration,
    ) -> anyhow::Result<i64> {
        let voucher = self.voucher;
        let mut lost_as_allowed = 0;
        for event in &self.answers {
            let Event::Ok {
                client,
                user: Some(user),
                f: Call::Buy,
                order,
                node,
                at_ms,
                ..
            } = event
            else {
                continue;
            };
            verdict.told += 1;
            let told = format!("order {order} told to user {user} (client #{client}) by {node}");
            if let Some(row) = self.rows.get(order) {
                if row.user != *user {
                    verdict.broke(
                        SUCCESS_BUYER,
                        format!(
                            "voucher {voucher}: {told} is user {}'s order in MySQL",
                            row.user
                        ),
                    );
                }
                continue;
            }
            if let Some((other, owner)) =
                OrderRow::voucher_and_user_of(store.pool(), *order).await?
            {
                verdict.broke(
                    SUCCESS_WRITTEN,
                    format!(
                        "voucher {voucher}: {told} is an order of voucher {other} (user \
                         {owner}) in MySQL"
                    ),
                );
                continue;
            }
            match allowed_loss(*at_ms, node, faults, allowed, writers_lag) {
                Some(loss) => {
                    *verdict.lost_allowed.entry(loss.name()).or_default() += 1;
                    lost_as_allowed += 1;
                }
                None => verdict.broke(
                    SUCCESS_WRITTEN,
                    format!(
                        "voucher {voucher}: {told} is not in MySQL{}",
                        match allowed.is_empty() {
                            true => String::new(),
                            false => format!(
                                " (no allowed fault within {} ms after the answer)",
                                writers_lag.as_millis()
                            ),
                        }
                    ),
                ),
            }
        }
        Ok(lost_as_allowed)
    }

    /// `told-twice`: a buyer told success for two orders both active.
    fn told_twice(&self, verdict: &mut Verdict) {
        for (user, answers) in &self.by_user {
            let active: Vec<i64> = (answers.told.iter())
                .filter(|order| self.rows.get(order).is_some_and(OrderRow::active))
                .copied()
                .collect();
            if active.len() > 1 {
                verdict.broke(
                    TOLD_TWICE,
                    format!(
                        "voucher {}: user {user} told success for active orders {active:?}",
                        self.voucher
                    ),
                );
            }
        }
    }

    /// `buyer-orders`: each buyer's orders are those they were told, and at
    /// most one for each unknown answer. Returns the unknown answers that
    /// left no order (each a unit that may sit in a dead letter).
    fn buyer_orders(&self, verdict: &mut Verdict) -> i64 {
        let mut orders_of: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
        for (id, row) in &self.rows {
            orders_of.entry(row.user).or_default().insert(*id);
        }
        let none = BuyerAnswers::default();
        let mut unanswered = 0;
        for (user, answers) in &self.by_user {
            if !orders_of.contains_key(user) {
                unanswered += answers.unknown as i64;
            }
        }
        for (user, orders) in &orders_of {
            let answers = self.by_user.get(user).unwrap_or(&none);
            let untold = answers.untold(orders);
            unanswered += answers.unknown.saturating_sub(untold.len()) as i64;
            if untold.len() <= answers.unknown {
                continue;
            }
            let asked = match self.by_user.contains_key(user) {
                true => answers.describe(),
                false => "no purchase of theirs in the history".to_owned(),
            };
            verdict.broke(
                BUYER_ORDERS,
                format!(
                    "voucher {}: user {user} holds {} order(s) no answer explains: orders \
                     {untold:?} in MySQL; {asked}",
                    self.voucher,
                    untold.len() - answers.unknown,
                ),
            );
        }
        unanswered
    }

    /// MySQL's own invariants of the sale.
    fn mysql_invariants(&self, verdict: &mut Verdict) {
        let (voucher, initial, mysql) = (self.voucher, self.initial, &self.mysql);
        if mysql.active_orders + mysql.stock_left != initial {
            verdict.broke(
                STOCK_BALANCE,
                format!(
                    "voucher {voucher}: active orders + stock = {} + {} != initial stock \
                     {initial} ({} closed order(s) not counted)",
                    mysql.active_orders, mysql.stock_left, mysql.closed_orders
                ),
            );
        }
        if mysql.stock_left < 0 {
            verdict.broke(
                STOCK_NONNEGATIVE,
                format!("voucher {voucher}: stock is {}", mysql.stock_left),
            );
        }
        if mysql.duplicate_users > 0 {
            verdict.broke(
                ONE_ORDER_PER_USER,
                format!(
                    "voucher {voucher}: {} user(s) hold more than one active order ({} extra)",
                    mysql.duplicate_users, mysql.extra_orders
                ),
            );
        }
        if mysql.paid_and_closed > 0 {
            verdict.broke(
                PAID_AND_CLOSED,
                format!(
                    "voucher {voucher}: {} closed order(s) carry a payment",
                    mysql.paid_and_closed
                ),
            );
        }
    }

    /// `sold-out`: the stock left after the last `SOLD_OUT` answer, against
    /// what explains it: units closed after it (or within the writers' lag
    /// before: their give-back may not have reached Redis yet) and units
    /// taken by purchases that left no order (`unexplained_elsewhere`: lost
    /// as allowed, or answered unknown).
    fn sold_out(&self, verdict: &mut Verdict, unexplained_elsewhere: i64, writers_lag: Duration) {
        let last_sold_out = (self.answers.iter())
            .filter_map(|event| match event {
                Event::Fail(Failure {
                    f: Call::Buy,
                    error,
                    at_ms,
                    ..
                }) if error == "SOLD_OUT" => Some(*at_ms),
                _ => None,
            })
            .max();
        let Some(at_ms) = last_sold_out else {
            return;
        };
        // A `TIMESTAMP` is to the second: a close in the answer's second
        // counts as after it.
        let since = at_ms - writers_lag.as_millis() as i64 - 1000;
        let given_back = (self.rows.values())
            .filter(|row| !row.active() && row.updated_ms >= since)
            .count() as i64;
        let left = self.mysql.stock_left;
        let lost = left - given_back - unexplained_elsewhere;
        if lost > 0 {
            verdict.broke(
                SOLD_OUT,
                format!(
                    "voucher {}: buyers were told SOLD_OUT (the last at {at_ms}), yet MySQL \
                     holds {left} unit(s) in stock: {given_back} given back since, \
                     {unexplained_elsewhere} taken by purchases lost as allowed or answered \
                     unknown: {lost} unit(s) lost",
                    self.voucher
                ),
            );
        }
    }

    /// `payments` and `cancels`: each answered success (or a payment
    /// refused as closed) against its order's status in MySQL.
    fn acts(&self, verdict: &mut Verdict) {
        for event in &self.answers {
            let (f, order, answer) = match event {
                Event::Ok { f, order, .. } => (*f, *order, None),
                Event::Fail(Failure {
                    f,
                    order: Some(order),
                    error,
                    ..
                }) => (*f, *order, Some(error.as_str())),
                _ => continue,
            };
            let state = self.rows.get(&order).and_then(OrderRow::state);
            let (check, holds) = match (f, answer) {
                (Call::Buy, _) => continue,
                (Call::Pay, None) => {
                    verdict.paid += 1;
                    let paid = matches!(state, Some(OrderState::Paid | OrderState::Used));
                    (PAYMENTS, paid)
                }
                (Call::Cancel, None) => {
                    verdict.cancelled += 1;
                    (CANCELS, state == Some(OrderState::Closed))
                }
                (Call::Pay, Some("ORDER_CLOSED")) => (PAYMENTS, state == Some(OrderState::Closed)),
                (_, Some(_)) => continue,
            };
            if !holds {
                verdict.broke(
                    check,
                    format!(
                        "voucher {}: order {order}: {f:?} answered {}, status in MySQL {:?}",
                        self.voucher,
                        answer.unwrap_or("success"),
                        state.map(OrderState::label)
                    ),
                );
            }
        }
    }
}

/// `hmdp check`: prints the verdict; returns the exit status (0 when every
/// check holds, 1 otherwise).
pub async fn run(settings: &CheckSettings) -> anyhow::Result<i32> {
    let events = read(&settings.history)?;
    let store = Store::connect_lazy(&settings.database.url, 2, Duration::from_secs(10))?;
    let lag = Duration::from_millis(settings.writers_lag_ms);
    let verdict = (check(&store, &events, &settings.allow_loss, lag).await)
        .with_context(|| format!("checking {}", settings.history.display()))?;
    if settings.allow_loss.contains(&Loss::Everysec) {
        println!(
            "everysec losses allowed within {} ms of a Redis restart",
            EVERYSEC_BOUND.min(lag).as_millis()
        );
    }
    print!("{}", verdict.report());
    Ok(if verdict.holds() { 0 } else { 1 })
}
