//! `hmdp demo --payers`: each run's orders after the sale. The buyers told
//! success pay, cancel or let their orders time out; once every unpaid order
//! is closed, a second wave of the users without a unit buys the units that
//! came back; then the stock must still balance, no user may hold two
//! active orders and nobody may have paid for a closed order. The orders'
//! states are sampled throughout, for the picture.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use hmdp::config::SeckillMode;
use hmdp::ids::VoucherId;
use hmdp::seckill::SaleState;
use hmdp::store::{OrderState, Store, VoucherAudit};
use serde::Serialize;
use tokio::sync::watch;

use super::DRAIN_DEADLINE;
use crate::audit::{self, AuditOptions};
use crate::loadtest::{self, Drain, Plan, Told};
use crate::payers::{self, Act, Answered};

/// `--payers`: a share of the buyers, `70%` or `70`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percent(u8);

impl FromStr for Percent {
    type Err = String;

    fn from_str(text: &str) -> Result<Percent, String> {
        let digits = text.trim();
        let digits = digits.strip_suffix('%').unwrap_or(digits);
        match digits.trim().parse::<u8>() {
            Ok(percent) if percent <= 100 => Ok(Percent(percent)),
            _ => Err(format!("{text:?} is not a share from 0% to 100%")),
        }
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0)
    }
}

/// How the buyers told success split: `pay` pay, `cancel` cancel, the
/// others do nothing until their orders time out.
#[derive(Debug, PartialEq, Eq)]
struct Shares {
    pay: usize,
    cancel: usize,
}

/// `payers` of `orders` (rounded) pay; a tenth of the rest cancel, at least
/// one when any are left, so that both ways back to the sale show.
fn shares(orders: usize, payers: Percent) -> Shares {
    let pay = (orders * usize::from(payers.0) + 50) / 100;
    let rest = orders - pay;
    let cancel = if rest == 0 { 0 } else { (rest / 10).max(1) };
    Shares { pay, cancel }
}

/// Orders of one voucher by status, as MySQL holds them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(super) struct States {
    pub(super) unpaid: i64,
    pub(super) paid: i64,
    pub(super) used: i64,
    pub(super) closed: i64,
}

impl States {
    async fn of(store: &Store, voucher: VoucherId) -> Result<States, sqlx::Error> {
        let rows = store.orders_of_voucher_by_status(voucher).await?;
        let mut states = States::default();
        for (status, n) in rows {
            match OrderState::from_status(status) {
                Some(OrderState::Unpaid) => states.unpaid += n,
                Some(OrderState::Paid) => states.paid += n,
                Some(OrderState::Used) => states.used += n,
                Some(OrderState::Closed) => states.closed += n,
                // Refunds are hmdp's schema; this API writes none.
                _ => {}
            }
        }
        Ok(states)
    }
}

/// The states at one moment of the after-sale phase.
#[derive(Debug, Clone, Copy, Serialize)]
pub(super) struct Sample {
    /// Milliseconds since the buyers began to act.
    pub(super) at_ms: u64,
    #[serde(flatten)]
    pub(super) states: States,
}

/// What one run's after-sale phase did and left.
#[derive(Debug, Clone, Serialize)]
pub(super) struct AfterSale {
    /// Payments answered with the paid order.
    pub(super) paid: usize,
    /// Cancels answered with the closed order.
    pub(super) cancelled: usize,
    /// Orders closed unpaid at their deadline (and payments that came too
    /// late: the order was closed first).
    pub(super) timed_out: i64,
    /// Units that came back to the sale: every order closed before the
    /// second wave.
    pub(super) returned: i64,
    /// Users who got a returned unit in the second wave (and paid it).
    pub(super) second_wave: usize,
    /// Users who tried: everybody who had not paid for a unit.
    pub(super) second_wave_buyers: usize,
    /// Milliseconds since the buyers began to act when the second wave
    /// began.
    pub(super) second_wave_at_ms: u64,
    /// The states once the second wave is over.
    pub(super) end: States,
    pub(super) initial_stock: i64,
    pub(super) audit: VoucherAudit,
    /// Broken invariants and promises, in words; empty when all held.
    pub(super) violations: Vec<String>,
    pub(super) samples: Vec<Sample>,
}

impl AfterSale {
    /// Whether the after-sale invariants held: the stock balanced, no user
    /// holds two active orders, nobody paid for a closed order, every
    /// unpaid order closed and the returned units sold again.
    pub(super) fn held(&self) -> bool {
        self.violations.is_empty() && self.audit.duplicate_users == 0
    }
}

/// One run's sale as the after-sale phase reaches it.
pub(super) struct Sale<'a> {
    pub(super) client: &'a reqwest::Client,
    /// nginx.
    pub(super) target: &'a str,
    /// Every user's token; `Told::user` indexes it.
    pub(super) tokens: &'a [String],
    pub(super) voucher: VoucherId,
    pub(super) seckill: SeckillMode,
    pub(super) store: &'a Store,
    pub(super) sales: &'a SaleState,
    pub(super) initial_stock: i64,
    /// False for the setups expected to let a user buy twice.
    pub(super) one_order_per_user: bool,
    pub(super) per_user: usize,
    pub(super) concurrency: usize,
    pub(super) pay_timeout: Duration,
}

/// How often the states are sampled for the picture.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Past its deadline an unpaid order is closed within the closer's second
/// or so; this is the bound after which one still open is a violation.
const CLOSE_GRACE: Duration = Duration::from_secs(15);
/// Every node forgets that the voucher sold out within 5 s of a unit coming
/// back; past this the second wave gives up on units still unsold.
const SECOND_WAVE_FOR: Duration = Duration::from_secs(20);
/// The pause between the second wave's rounds: its buyers try again while
/// the nodes' memories of the sell-out fade.
const ROUND_PAUSE: Duration = Duration::from_millis(500);
/// The after-sale phase of `sale`, whose first wave told `told`.
pub(super) async fn run(
    sale: &Sale<'_>,
    told: &[Told],
    payers: Percent,
) -> anyhow::Result<AfterSale> {
    let started = Instant::now();
    let (stop, stopped) = watch::channel(false);
    // The sampler goes first, so that its first sample is taken before the
    // buyers' first request: the chart starts with every order unpaid.
    let (samples, outcome) =
        tokio::join!(sample(sale.store, sale.voucher, started, stopped), async {
            let outcome = act_and_resell(sale, told, payers, started).await;
            let _ = stop.send(true);
            outcome
        },);
    let mut outcome = outcome?;
    outcome.samples = samples?;
    Ok(outcome)
}

/// Samples the states every `SAMPLE_EVERY` until `stop` says the phase is
/// over, then once more.
async fn sample(
    store: &Store,
    voucher: VoucherId,
    started: Instant,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<Vec<Sample>> {
    let mut samples = Vec::new();
    loop {
        let over = *stop.borrow_and_update();
        samples.push(Sample {
            at_ms: started.elapsed().as_millis() as u64,
            states: States::of(store, voucher).await?,
        });
        if over {
            return Ok(samples);
        }
        tokio::select! {
            _ = stop.changed() => {}
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

async fn act_and_resell(
    sale: &Sale<'_>,
    told: &[Told],
    payers: Percent,
    started: Instant,
) -> anyhow::Result<AfterSale> {
    // An order told twice (a resent purchase replayed) is acted on once.
    let orders = distinct(told.iter().map(|told| (told.user, told.order_id)));
    let Shares { pay, cancel } = shares(orders.len(), payers);
    eprintln!(
        "after the sale: {pay} of {} buyers pay, {cancel} cancel, {} let their orders time out",
        orders.len(),
        orders.len() - pay - cancel
    );
    let (paid_users, cancelled) = tokio::join!(
        act(sale, &orders[..pay], Act::Pay),
        act(sale, &orders[pay..pay + cancel], Act::Cancel),
    );
    let paid_users = paid_users?;
    let cancelled = cancelled?.len();
    let mut violations = Vec::new();
    let closed = wait_for_closes(sale, started, &mut violations).await?;

    let second_wave_at = started.elapsed();
    let buyers: Vec<usize> = (0..sale.tokens.len())
        .filter(|user| !paid_users.contains(user))
        .collect();
    let second_wave_buyers = buyers.len();
    eprintln!("second wave: {second_wave_buyers} users buy the {closed} units that came back");
    let second_wave = resell(sale, buyers, started + second_wave_at, &mut violations).await?;

    let audit = sale.store.audit_voucher(sale.voucher).await?;
    violations.extend(audit.violations(sale.initial_stock, sale.one_order_per_user));
    if sale.one_order_per_user {
        violations.extend(reconciled(sale).await?);
    }
    Ok(AfterSale {
        paid: paid_users.len(),
        cancelled,
        timed_out: closed - cancelled as i64,
        returned: closed,
        second_wave,
        second_wave_buyers,
        second_wave_at_ms: second_wave_at.as_millis() as u64,
        end: States::of(sale.store, sale.voucher).await?,
        initial_stock: sale.initial_stock,
        audit,
        violations,
        samples: Vec::new(),
    })
}

/// `(user, order)` pairs, each once.
fn distinct(orders: impl Iterator<Item = (usize, i64)>) -> Vec<(usize, i64)> {
    orders.collect::<BTreeSet<_>>().into_iter().collect()
}

/// The second wave waits for every order left unpaid to be closed: the
/// orders closed by then, whether cancelled or timed out.
async fn wait_for_closes(
    sale: &Sale<'_>,
    started: Instant,
    violations: &mut Vec<String>,
) -> anyhow::Result<i64> {
    let deadline = sale.pay_timeout + CLOSE_GRACE;
    loop {
        let states = States::of(sale.store, sale.voucher).await?;
        if states.unpaid == 0 {
            return Ok(states.closed);
        }
        if started.elapsed() >= deadline {
            violations.push(format!(
                "{} unpaid orders still open {} s after the buyers acted (pay timeout {} s)",
                states.unpaid,
                deadline.as_secs(),
                sale.pay_timeout.as_secs()
            ));
            return Ok(states.closed);
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
}

/// `buyers` try round after round, from `began`, until the units that came
/// back are sold or `SECOND_WAVE_FOR` is over; how many got one.
async fn resell(
    sale: &Sale<'_>,
    mut buyers: Vec<usize>,
    began: Instant,
    violations: &mut Vec<String>,
) -> anyhow::Result<usize> {
    let mut second_wave = 0;
    let mut stock_left = sale.store.audit_voucher(sale.voucher).await?.stock_left;
    while stock_left > 0 && !buyers.is_empty() {
        let got = second_wave_round(sale, &buyers).await?;
        second_wave += got.len();
        buyers.retain(|user| !got.contains(user));
        stock_left = sale.store.audit_voucher(sale.voucher).await?.stock_left;
        if began.elapsed() >= SECOND_WAVE_FOR {
            break;
        }
        if stock_left > 0 {
            tokio::time::sleep(ROUND_PAUSE).await;
        }
    }
    if stock_left > 0 && !buyers.is_empty() {
        violations.push(format!(
            "{stock_left} returned units still unsold {} s into the second wave, \
             with {} buyers still trying",
            SECOND_WAVE_FOR.as_secs(),
            buyers.len()
        ));
    }
    Ok(second_wave)
}

/// `hmdp audit` of the sale once its orders are written: Redis against
/// MySQL, printed as the command prints it; what it finds broken. A `sync`
/// sale has no Redis side to check.
async fn reconciled(sale: &Sale<'_>) -> anyhow::Result<Vec<String>> {
    if sale.seckill != SeckillMode::Sync {
        loadtest::drain(sale.sales, sale.voucher, DRAIN_DEADLINE).await?;
    }
    let options = AuditOptions {
        initial_stock: Some(sale.initial_stock),
        allow_unchecked: sale.seckill == SeckillMode::Sync,
        ..AuditOptions::strict()
    };
    let audit = audit::audit(sale.store, sale.sales, sale.voucher, options).await?;
    eprintln!(
        "hmdp audit --voucher {} ({}):\n{audit}",
        sale.voucher, sale.seckill
    );
    Ok(audit
        .broken()
        .into_iter()
        .map(|check| format!("hmdp audit: {check} broken"))
        .collect())
}

/// One round of the second wave: `buyers` fire their purchases as the first
/// wave did; whoever gets a unit pays for it at once, so that it stays sold
/// (unpaid, it would time out and come back again). Returns who got one.
async fn second_wave_round(sale: &Sale<'_>, buyers: &[usize]) -> anyhow::Result<Vec<usize>> {
    let plan = Plan {
        target: sale.target.to_owned(),
        voucher: sale.voucher.get(),
        tokens: buyers
            .iter()
            .map(|&user| sale.tokens[user].clone())
            .collect(),
        per_user: sale.per_user,
        concurrency: sale.concurrency,
        addresses: 1,
        // Rounds are short and many: one line per wave says enough.
        progress: indicatif::ProgressBar::hidden(),
    };
    let measured = loadtest::run(&plan).await?;
    if sale.seckill != SeckillMode::Sync {
        if let Drain::Stuck(pending) =
            loadtest::drain(sale.sales, sale.voucher, DRAIN_DEADLINE).await?
        {
            anyhow::bail!(
                "{pending} second-wave orders not written {} s after the round",
                DRAIN_DEADLINE.as_secs()
            );
        }
    }
    let orders = distinct((measured.told.iter()).map(|told| (buyers[told.user], told.order_id)));
    act(sale, &orders, Act::Pay).await
}

/// `what` on every `(user, order)` at once (up to the concurrency); returns
/// the users whose request was answered with success. An answer that never
/// came fails the run.
async fn act(sale: &Sale<'_>, orders: &[(usize, i64)], what: Act) -> anyhow::Result<Vec<usize>> {
    let answers: Vec<anyhow::Result<Option<usize>>> = stream::iter(orders.iter())
        .map(|&(user, order)| async move {
            let token = &sale.tokens[user];
            match payers::send(sale.client, sale.target, token, order, what).await {
                Answered::Done => Ok(Some(user)),
                Answered::Refused(code) => {
                    tracing::debug!(%order, ?what, %code, "refused");
                    Ok(None)
                }
                Answered::Unknown => anyhow::bail!("{what:?} of order {order}: no answer"),
            }
        })
        .buffer_unordered(sale.concurrency.max(1))
        .collect()
        .await;
    answers.into_iter().filter_map(Result::transpose).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_reads_with_or_without_its_percent_sign() {
        assert_eq!("70%".parse(), Ok(Percent(70)));
        assert_eq!(" 70 ".parse(), Ok(Percent(70)));
        assert_eq!("0".parse(), Ok(Percent(0)));
        assert_eq!("100%".parse(), Ok(Percent(100)));
        assert!("101%".parse::<Percent>().is_err());
        assert!("-1".parse::<Percent>().is_err());
        assert!("half".parse::<Percent>().is_err());
        assert_eq!(Percent(70).to_string(), "70%");
    }

    #[test]
    fn some_pay_a_tenth_of_the_rest_cancel_and_at_least_one_does() {
        assert_eq!(shares(100, Percent(70)), Shares { pay: 70, cancel: 3 });
        assert_eq!(
            shares(500, Percent(70)),
            Shares {
                pay: 350,
                cancel: 15
            }
        );
        assert_eq!(shares(20, Percent(90)), Shares { pay: 18, cancel: 1 });
        assert_eq!(shares(20, Percent(100)), Shares { pay: 20, cancel: 0 });
        assert_eq!(shares(0, Percent(70)), Shares { pay: 0, cancel: 0 });
    }
}
