//! `hmdp audit --voucher ID`: reconciles one voucher's sale between Redis
//! (stock, buyers, orders on their way, dead letters) and MySQL (orders,
//! stock), as `loadtest --verify` does after an asynchronous sale drained.

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use clap::Args;
use serde::Serialize;

use hmdp::config::StoreSettings;
use hmdp::id_worker::minted_at;
use hmdp::ids::OrderId;
use hmdp::ids::{UserId, VoucherId};
use hmdp::keys::Keys;
use hmdp::seckill::{DeadLetter, InTransit, RedisSale, SaleState, STALE_AFTER, SWEEP_EVERY};
use hmdp::shards::{slot, Layout, Shard};
use hmdp::store::{Giveback, NewOrder, Store, VoucherAudit};

/// `hmdp audit`.
#[derive(Debug, Clone, Args)]
#[command(after_long_help = CHECKS)]
pub struct AuditSettings {
    /// The seckill voucher to audit.
    #[arg(long)]
    pub voucher: i64,

    /// The stock the sale began with, for the MySQL check of a voucher Redis
    /// holds no sale for (a `sync` voucher) [default: Redis's `initial`].
    #[arg(long)]
    pub initial_stock: Option<i64>,

    /// Also write the audit as a JSON object to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Exit 0 even when a check could not be made (a `sync` voucher, whose
    /// sale Redis never holds). Without it, a check not made is a failure:
    /// an audit that cannot see must not say all is well.
    #[arg(long)]
    pub allow_unchecked: bool,

    /// An order pending (admitted, in the pending orders hash) for longer
    /// than this with no entry in the order stream is counted lost, not on
    /// its way: nothing will write it (a `queue` node that died, a dead
    /// letter).
    #[arg(long, default_value_t = 60)]
    pub pending_within_secs: u64,

    /// Units lent by one shard of a sharded sale and not received by
    /// another for longer than this are stranded: a mover that died leaves
    /// them to the nodes' sweep, which delivers them within 3 s.
    #[arg(long, default_value_t = 3000)]
    pub transit_within_ms: u64,

    /// MySQL, and Redis with the prefix the nodes use.
    #[command(flatten)]
    pub store: StoreSettings,
}

const CHECKS: &str = "\
Checks, each holds / BROKEN / not checked:
  redis-stock               Redis stock + buyers + units in transit between shards =
                            initial stock (the `initial` Redis recorded when it
                            loaded the sale), and stock >= 0; in each shard of a
                            sharded sale, stock + buyers = its initial + units it
                            received - units it lent.
  mysql-stock               MySQL active orders (unpaid, paid, used) + MySQL stock =
                            initial stock, and stock >= 0: a closed order's unit is
                            back in stock.
  redis-mysql               Redis against MySQL, the truth: Redis stock + units in
                            transit + orders on their way (pending, not written) +
                            give-backs owed (closed in MySQL, not yet back in Redis)
                            = MySQL stock; in each shard of a sharded sale, its
                            buyers = the users of the shard with an active order in
                            MySQL or one on its way (give-backs owed aside).
  transit                   A sharded sale's shards are of one load (epoch); each
                            shard's transfer records add up to its units in transit;
                            the units lent and not received (lent - received) are the
                            records not received; no record older than
                            --transit-within-ms (its units stranded).
  buyers                    Redis's buyer set = users with an active order in MySQL
                            + users whose order is on its way (the pending orders
                            hash, the order stream) + users whose closed order's
                            give-back to Redis is still owed. A buyer in none was
                            told success and has no order.
  give-backs                No closed order's give-back to Redis owed for longer
                            than --pending-within-secs (its unit stranded).
  one-active-order-per-user No user holds two active orders of the voucher.
  paid-and-closed           No closed order carries a payment.
  dead-letters              No order of the voucher in the dead-letter stream.
A voucher Redis holds no sale for (a `sync` voucher, a wrong --redis-prefix, or
a Redis restarted empty that nothing has loaded again) gets the MySQL checks
only, and the others count as failed unless --allow-unchecked.

Exit status: 0 when every check holds, 1 when one is broken or could not be
made (the differences, or why not, are listed), 2 when the audit itself failed.";

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Holds,
    Broken,
    NotChecked,
}

/// One check of the audit, with what it compared and every difference.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// The numbers compared, in words.
    pub detail: String,
    /// One line per difference: who and how many.
    pub differences: Vec<String>,
}

impl Check {
    fn judged(name: &'static str, detail: String, differences: Vec<String>) -> Check {
        let status = if differences.is_empty() {
            Status::Holds
        } else {
            Status::Broken
        };
        Check {
            name,
            status,
            detail,
            differences,
        }
    }

    fn not_checked(name: &'static str, why: &str) -> Check {
        Check {
            name,
            status: Status::NotChecked,
            detail: why.to_owned(),
            differences: Vec::new(),
        }
    }
}

/// One shard of the sale as Redis holds it.
#[derive(Debug, Clone, Serialize)]
pub struct ShardRow {
    /// Its hash tag, and the cluster slot the tag names.
    pub tag: &'static str,
    pub slot: u16,
    pub initial: i64,
    pub stock: i64,
    pub buyers: i64,
    pub lent: i64,
    pub received: i64,
}

impl ShardRow {
    /// What the shard should hold, by what it began with and what moved.
    fn expected(&self) -> i64 {
        self.initial + self.received - self.lent
    }
}

/// One voucher's reconciliation.
#[derive(Debug, Clone, Serialize)]
pub struct Audit {
    pub voucher: i64,
    /// The stock the checks balance against, when known.
    pub initial_stock: Option<i64>,
    /// Whether Redis held a sale for the voucher (`queue` / `stream`).
    pub redis_checked: bool,
    /// Active orders written, per MySQL.
    pub orders: i64,
    /// Closed orders (cancelled, or unpaid past their deadline), per MySQL.
    pub closed_orders: i64,
    /// Closed orders whose give-back to Redis is still owed.
    pub givebacks_owed: usize,
    pub mysql_stock: i64,
    pub redis_stock: Option<i64>,
    pub buyers: Option<usize>,
    /// Orders admitted and not written: in the pending orders hash, and of
    /// those (or besides them) still in the order stream.
    pub pending: usize,
    pub in_stream: usize,
    /// Pending orders with no stream entry, older than the bound: lost.
    pub pending_lost: usize,
    /// Units lent by one shard and not yet received by another.
    pub in_transit: Option<i64>,
    /// Each shard of the sale in Redis, by position (one for a one-shard
    /// sale).
    pub shards: Vec<ShardRow>,
    pub checks: Vec<Check>,
    /// Whether a check not made may pass (`--allow-unchecked`).
    pub allow_unchecked: bool,
}

impl Audit {
    /// Whether every check holds (or, with `--allow-unchecked`, was not
    /// made).
    pub fn holds(&self) -> bool {
        self.broken().is_empty() && (self.allow_unchecked || self.unchecked().is_empty())
    }

    /// What fails the audit, one line a check: each broken check, and each
    /// check not made unless a check not made may pass.
    pub fn failures(&self) -> Vec<String> {
        let broken = (self.broken().into_iter()).map(|check| format!("audit: {check} broken"));
        let unchecked = (self.unchecked().into_iter())
            .filter(|_| !self.allow_unchecked)
            .map(|check| format!("audit: {check} could not be checked"));
        broken.chain(unchecked).collect()
    }

    /// The broken checks' names.
    pub fn broken(&self) -> Vec<&'static str> {
        self.named(Status::Broken)
    }

    /// The names of the checks that could not be made.
    pub fn unchecked(&self) -> Vec<&'static str> {
        self.named(Status::NotChecked)
    }

    fn named(&self, status: Status) -> Vec<&'static str> {
        self.checks
            .iter()
            .filter(|check| check.status == status)
            .map(|check| check.name)
            .collect()
    }

    /// `every check holds`, or what is broken and what could not be made.
    pub fn verdict(&self) -> String {
        let (broken, unchecked) = (self.broken(), self.unchecked());
        let mut verdict = Vec::new();
        if !broken.is_empty() {
            verdict.push(format!("BROKEN: {}", broken.join(", ")));
        }
        if !unchecked.is_empty() && !self.allow_unchecked {
            verdict.push(format!(
                "NOT CHECKED: {} (give --allow-unchecked to accept that)",
                unchecked.join(", ")
            ));
        }
        if verdict.is_empty() {
            if unchecked.is_empty() {
                "every check holds".to_owned()
            } else {
                format!(
                    "every check made holds ({} not checked)",
                    unchecked.join(", ")
                )
            }
        } else {
            verdict.join("; ")
        }
    }

    /// 0 when every check holds, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.holds() {
            0
        } else {
            1
        }
    }

    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self).expect("an audit serializes");
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))
    }
}

impl fmt::Display for Audit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let initial = self
            .initial_stock
            .map_or("unknown".to_owned(), |n| n.to_string());
        writeln!(
            f,
            "audit of voucher {} (initial stock {initial})",
            self.voucher
        )?;
        if self.redis_checked {
            writeln!(
                f,
                "  on their way: {} order(s) pending ({} of them lost), {} in the order stream",
                self.pending, self.pending_lost, self.in_stream
            )?;
        } else {
            writeln!(
                f,
                "  Redis not checked: it holds no sale for this voucher (a sync-mode voucher, \
                 or a Redis restarted empty that no purchase or node start has loaded again)"
            )?;
        }
        if self.shards.len() > 1 {
            writeln!(
                f,
                "  {:<18} {:>5} {:>8} {:>7} {:>7} {:>6} {:>8}",
                "shard", "slot", "initial", "stock", "buyers", "lent", "received"
            )?;
            for shard in &self.shards {
                writeln!(
                    f,
                    "  {:<18} {:>5} {:>8} {:>7} {:>7} {:>6} {:>8}{}",
                    shard.tag,
                    shard.slot,
                    shard.initial,
                    shard.stock,
                    shard.buyers,
                    shard.lent,
                    shard.received,
                    if shard.stock + shard.buyers == shard.expected() {
                        ""
                    } else {
                        "  BROKEN"
                    }
                )?;
            }
            let total = |field: fn(&ShardRow) -> i64| self.shards.iter().map(field).sum::<i64>();
            writeln!(
                f,
                "  {:<18} {:>5} {:>8} {:>7} {:>7} {:>6} {:>8}  ({} in transit)",
                format!("total ({})", self.shards.len()),
                "",
                total(|shard| shard.initial),
                total(|shard| shard.stock),
                total(|shard| shard.buyers),
                total(|shard| shard.lent),
                total(|shard| shard.received),
                self.in_transit.unwrap_or(0)
            )?;
        }
        for check in &self.checks {
            let status = match check.status {
                Status::Holds => "holds",
                Status::Broken => "BROKEN",
                Status::NotChecked => "not checked",
            };
            writeln!(f, "  {:<25} {status:<11} {}", check.name, check.detail)?;
            for difference in &check.differences {
                writeln!(f, "  {:<25} {:<11} - {difference}", "", "")?;
            }
        }
        writeln!(f, "verdict: {}", self.verdict())
    }
}

/// What an audit balances against and what it lets pass.
#[derive(Debug, Clone, Copy)]
pub struct AuditOptions {
    /// What the MySQL check balances against instead of Redis's `initial`.
    pub initial_stock: Option<i64>,
    /// A check not made passes (`--allow-unchecked`).
    pub allow_unchecked: bool,
    /// A pending order with no stream entry, older than this, is lost.
    pub pending_within: Duration,
    /// Units in transit between shards longer than this are stranded.
    pub transit_within: Duration,
}

impl AuditOptions {
    /// The strict audit of an asynchronous sale.
    pub fn strict() -> AuditOptions {
        AuditOptions {
            initial_stock: None,
            allow_unchecked: false,
            pending_within: Duration::from_secs(60),
            transit_within: STALE_AFTER + SWEEP_EVERY,
        }
    }
}

/// Audits `voucher_id` in MySQL (`store`) and Redis (`sale_state`).
pub async fn audit(
    store: &Store,
    sale_state: &SaleState,
    voucher_id: VoucherId,
    options: AuditOptions,
) -> anyhow::Result<Audit> {
    let read = Readings::of(store, sale_state, voucher_id).await?;
    let initial = options
        .initial_stock
        .or(read.sale.as_ref().map(|sale| sale.initial));
    let mut audit = Audit {
        voucher: voucher_id.get(),
        initial_stock: initial,
        redis_checked: read.sale.is_some(),
        orders: read.mysql.active_orders,
        closed_orders: read.mysql.closed_orders,
        givebacks_owed: read.owed.len(),
        mysql_stock: read.mysql.stock_left,
        redis_stock: read.sale.as_ref().map(|sale| sale.stock),
        buyers: read.sale.as_ref().map(|sale| sale.buyers.len()),
        pending: read.in_flight.as_ref().map_or(0, |on| on.pending.len()),
        in_stream: read.in_flight.as_ref().map_or(0, |on| on.streamed.len()),
        pending_lost: 0,
        in_transit: read.sale.as_ref().map(|sale| sale.in_transit),
        shards: (read.sale.iter().flat_map(|sale| &sale.shards))
            .map(|shard| ShardRow {
                tag: shard.shard.tag(),
                slot: slot(shard.shard.tag()),
                initial: shard.initial,
                stock: shard.stock,
                buyers: shard.buyers,
                lent: shard.lent,
                received: shard.received,
            })
            .collect(),
        checks: Vec::new(),
        allow_unchecked: options.allow_unchecked,
    };
    let no_sale = "Redis holds no sale for the voucher";
    let mut checks = Vec::new();
    match (&read.sale, &read.in_flight) {
        (Some(sale), Some(in_flight)) => {
            checks.push(redis_stock(sale, &audit.shards));
            checks.push(mysql_stock(&read.mysql, initial));
            let (buyers, lost) = buyers(sale, in_flight, &read, &options);
            audit.pending_lost = lost;
            checks.push(buyers);
            checks.push(redis_against_mysql(sale, &Truth::of(&read, in_flight)));
            checks.push(transit(sale, &in_flight.transfers, options.transit_within));
            checks.extend(mysql_checks(&read, &options));
            checks.push(dead_letters(&in_flight.dead));
        }
        _ => {
            checks.push(Check::not_checked("redis-stock", no_sale));
            checks.push(mysql_stock(&read.mysql, initial));
            checks.push(Check::not_checked("buyers", no_sale));
            checks.push(Check::not_checked("redis-mysql", no_sale));
            checks.push(Check::not_checked("transit", no_sale));
            checks.extend(mysql_checks(&read, &options));
            checks.push(Check::not_checked("dead-letters", no_sale));
        }
    }
    audit.checks = checks;
    Ok(audit)
}

/// What an audit reads of a voucher, in MySQL and in Redis.
struct Readings {
    mysql: VoucherAudit,
    orders_per_user: Vec<(UserId, i64)>,
    owed: Vec<(Giveback, i64)>,
    sale: Option<RedisSale>,
    /// The orders between the stores, read when Redis holds the sale.
    in_flight: Option<InFlight>,
}

/// A sale's orders between admission and MySQL, and its stock in transit.
struct InFlight {
    pending: Vec<NewOrder>,
    streamed: Vec<NewOrder>,
    dead: Vec<DeadLetter>,
    written: BTreeSet<OrderId>,
    given_back: BTreeSet<OrderId>,
    transfers: Vec<InTransit>,
}

impl Readings {
    async fn of(
        store: &Store,
        sale_state: &SaleState,
        voucher_id: VoucherId,
    ) -> anyhow::Result<Readings> {
        let mysql = store
            .audit_voucher(voucher_id)
            .await
            .with_context(|| format!("reading seckill voucher {voucher_id} from MySQL"))?;
        let orders_per_user = store
            .orders_per_user(voucher_id)
            .await
            .context("reading the voucher's orders")?;
        let owed = store
            .givebacks_owed_of(voucher_id)
            .await
            .context("reading the give-backs owed to Redis")?;
        let sale = sale_state
            .read(voucher_id)
            .await
            .context("reading the sale from Redis")?;
        let in_flight = match &sale {
            Some(sale) => Some(InFlight {
                pending: sale_state.pending_orders_of(voucher_id).await?,
                streamed: sale_state.streamed_orders_of(voucher_id).await?,
                dead: sale_state.dead_letters_of(voucher_id).await?,
                written: (store.order_ids_of(voucher_id).await)
                    .context("reading the voucher's order ids")?
                    .into_iter()
                    .collect(),
                given_back: (sale_state.given_back_of(voucher_id).await?)
                    .into_iter()
                    .collect(),
                transfers: match sale.shards.len() {
                    1 => Vec::new(),
                    count => {
                        let layout = Layout::new(count as i64)?;
                        sale_state.transfers_of(voucher_id, layout).await?
                    }
                },
            }),
            None => None,
        };
        Ok(Readings {
            mysql,
            orders_per_user,
            owed,
            sale,
            in_flight,
        })
    }

    /// The users with an order in MySQL.
    fn ordered(&self) -> BTreeSet<UserId> {
        self.orders_per_user.iter().map(|(user, _)| *user).collect()
    }
}

/// Redis's own sums: stock, buyers and units in transit against the
/// initial stock, in the sale and in each shard.
fn redis_stock(sale: &RedisSale, shards: &[ShardRow]) -> Check {
    let buyers = sale.buyers.len() as i64;
    let held = sale.stock + buyers + sale.in_transit;
    let mut differences = Vec::new();
    if held != sale.initial {
        differences.push(format!(
            "stock + buyers + in transit is {held}, {} than the initial stock",
            more_or_fewer(held - sale.initial)
        ));
    }
    if sale.stock < 0 {
        differences.push(format!("stock is negative: {}", sale.stock));
    }
    if sale.in_transit < 0 {
        differences.push(format!(
            "more units received than lent between shards: {}",
            -sale.in_transit
        ));
    }
    for shard in shards.iter().filter(|_| shards.len() > 1) {
        if shard.stock + shard.buyers != shard.expected() || shard.stock < 0 {
            differences.push(format!(
                "shard {}: stock {} + {} buyers, where initial {} + received {} - \
                 lent {} = {}",
                shard.tag,
                shard.stock,
                shard.buyers,
                shard.initial,
                shard.received,
                shard.lent,
                shard.expected()
            ));
        }
    }
    let transit = match sale.in_transit {
        0 => String::new(),
        units => format!(" + {units} in transit"),
    };
    Check::judged(
        "redis-stock",
        format!(
            "stock {} + {buyers} buyers{transit} = {held} (initial {})",
            sale.stock, sale.initial
        ),
        differences,
    )
}

/// Redis's buyers against the users with an order in MySQL or on its way,
/// and the pending orders nothing will write: the check, and how many
/// such orders.
fn buyers(
    sale: &RedisSale,
    in_flight: &InFlight,
    read: &Readings,
    options: &AuditOptions,
) -> (Check, usize) {
    // A pending order is on its way while the stream holds its entry (a
    // consumer will write it, however long MySQL stalls) or while it is
    // young (a `queue` node's writer has it in memory); past the bound with
    // no entry, nothing will write it.
    let lost_before = Utc::now() - options.pending_within;
    let streamed_ids: BTreeSet<_> = in_flight.streamed.iter().map(|order| order.id).collect();
    let (lost, waiting): (Vec<_>, Vec<_>) = in_flight.pending.iter().partition(|order| {
        !streamed_ids.contains(&order.id)
            && minted_at(order.id.get()).is_some_and(|at| at < lost_before)
    });
    let on_the_way: BTreeSet<UserId> = waiting
        .into_iter()
        .chain(&in_flight.streamed)
        .map(|order| order.user_id)
        .collect();
    let returning: BTreeSet<UserId> = read
        .owed
        .iter()
        .map(|(giveback, _)| giveback.user_id)
        .collect();
    let mut buyers = buyers_match(&sale.buyers, &read.ordered(), &on_the_way, &returning);
    if !lost.is_empty() {
        let users: Vec<UserId> = lost.iter().map(|order| order.user_id).collect();
        buyers.status = Status::Broken;
        buyers.differences.push(format!(
            "{} order(s) pending for more than {:?} with no order stream entry \
             (nothing will write them): users {}",
            lost.len(),
            options.pending_within,
            listed(&users)
        ));
    }
    (buyers, lost.len())
}

/// The checks of MySQL alone: one order per user, the paid and closed
/// orders, the give-backs owed.
fn mysql_checks(read: &Readings, options: &AuditOptions) -> [Check; 3] {
    [
        one_order_per_user(&read.orders_per_user),
        paid_and_closed(&read.mysql),
        givebacks(&read.owed, options.pending_within),
    ]
}

/// The voucher's dead letters: each one an order a buyer was told
/// "success" for that MySQL does not have.
fn dead_letters(dead: &[DeadLetter]) -> Check {
    let letters = dead
        .iter()
        .filter_map(|letter| {
            let order = letter.order.as_ref().ok()?;
            Some(format!(
                "order {} of user {}: {} (delivered {} times; dead letter {})",
                order.id, order.user_id, letter.reason, letter.deliveries, letter.id
            ))
        })
        .collect::<Vec<_>>();
    Check::judged(
        "dead-letters",
        format!("{} order(s) of the voucher dead-lettered", letters.len()),
        letters,
    )
}

/// What MySQL and the orders between the stores say Redis should hold.
struct Truth {
    mysql_stock: i64,
    /// Pending orders MySQL has not written.
    on_their_way: Vec<NewOrder>,
    /// Orders in the order streams (written or not).
    streamed: Vec<NewOrder>,
    /// Buyers of closed orders whose units MySQL has back and Redis not yet.
    owed: Vec<UserId>,
    /// Users with an active order in MySQL.
    ordered: BTreeSet<UserId>,
}

impl Truth {
    fn of(read: &Readings, in_flight: &InFlight) -> Truth {
        Truth {
            mysql_stock: read.mysql.stock_left,
            on_their_way: (in_flight.pending.iter())
                .filter(|order| !in_flight.written.contains(&order.id))
                .copied()
                .collect(),
            streamed: in_flight.streamed.clone(),
            owed: (read.owed.iter())
                .filter(|(giveback, _)| !in_flight.given_back.contains(&giveback.order_id))
                .map(|(giveback, _)| giveback.user_id)
                .collect(),
            ordered: read.ordered(),
        }
    }
}

/// Redis against MySQL: the stock in total, the buyers shard by shard.
fn redis_against_mysql(sale: &RedisSale, truth: &Truth) -> Check {
    let on_their_way = truth.on_their_way.len() as i64;
    let owed = truth.owed.len() as i64;
    let held = sale.stock + sale.in_transit + on_their_way + owed;
    let mut differences = Vec::new();
    if held != truth.mysql_stock {
        differences.push(format!(
            "Redis stock {} + {} in transit + {on_their_way} on their way + {owed} give-back(s) \
             owed is {held}, {} than MySQL's stock {}",
            sale.stock,
            sale.in_transit,
            more_or_fewer(held - truth.mysql_stock),
            truth.mysql_stock
        ));
    }
    if sale.shards.len() > 1 {
        let layout = Layout::new(sale.shards.len() as i64).expect("a sale's own shard count");
        let position = |user: &UserId| layout.shard(layout.position_of(*user));
        for shard in &sale.shards {
            // Each order on its way counts in the shard that drew it.
            let mut expected: BTreeSet<UserId> = (truth.ordered.iter())
                .filter(|user| position(user) == shard.shard)
                .copied()
                .collect();
            expected.extend(
                (truth.on_their_way.iter().chain(&truth.streamed))
                    .filter(|order| Shard::of_order(order.id) == shard.shard)
                    .map(|order| order.user_id),
            );
            let returning = (truth.owed.iter())
                .filter(|user| position(user) == shard.shard && !expected.contains(user))
                .count() as i64;
            let least = expected.len() as i64;
            if shard.buyers < least || shard.buyers > least + returning {
                differences.push(format!(
                    "shard {}: {} buyers in Redis, {least} by MySQL and the orders on their way \
                     (+ up to {returning} whose give-back is owed)",
                    shard.shard.tag(),
                    shard.buyers
                ));
            }
        }
    }
    Check::judged(
        "redis-mysql",
        format!(
            "Redis stock {} + {} in transit + {on_their_way} on their way + {owed} owed = {held} \
             (MySQL stock {})",
            sale.stock, sale.in_transit, truth.mysql_stock
        ),
        differences,
    )
}

/// Units between a sharded sale's shards: one load's shards, records that
/// add up, none stranded.
fn transit(sale: &RedisSale, transfers: &[InTransit], within: Duration) -> Check {
    if sale.shards.len() == 1 {
        return Check::judged(
            "transit",
            "a one-shard sale moves no stock".to_owned(),
            Vec::new(),
        );
    }
    let mut differences = Vec::new();
    let epochs: BTreeSet<Option<i64>> = sale.shards.iter().map(|shard| shard.epoch).collect();
    if epochs.len() > 1 {
        differences.push(format!(
            "the shards are of {} different loads (a load that died half-way): {}",
            epochs.len(),
            (sale.shards.iter())
                .map(|shard| match shard.epoch {
                    Some(epoch) => format!("{} epoch {epoch}", shard.shard.tag()),
                    None => format!("{} no epoch", shard.shard.tag()),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let of_this_load = |transfer: &&InTransit, shard: &hmdp::seckill::RedisShard| -> bool {
        transfer.from == shard.shard
            && shard
                .epoch
                .map(|epoch| epoch.to_string())
                .unwrap_or_default()
                == transfer.epoch
    };
    let mut unreceived = 0;
    for shard in &sale.shards {
        let records: Vec<&InTransit> = (transfers.iter())
            .filter(|transfer| of_this_load(transfer, shard))
            .collect();
        let recorded: i64 = records.iter().map(|transfer| transfer.units).sum();
        unreceived += (records.iter())
            .filter(|transfer| !transfer.received)
            .map(|transfer| transfer.units)
            .sum::<i64>();
        if recorded != shard.recorded_in_transit {
            differences.push(format!(
                "shard {}: its transfer records hold {recorded} unit(s), its count {}",
                shard.shard.tag(),
                shard.recorded_in_transit
            ));
        }
    }
    if unreceived != sale.in_transit {
        differences.push(format!(
            "lent - received is {}, the records not received hold {unreceived}",
            sale.in_transit
        ));
    }
    for transfer in transfers.iter().filter(|t| !t.received && t.age > within) {
        differences.push(format!(
            "transfer {} of {} unit(s) from {} to {} in transit for {:.1} s (bound {:?}): \
             stranded",
            transfer.id,
            transfer.units,
            transfer.from.tag(),
            transfer.to.tag(),
            transfer.age.as_secs_f64(),
            within
        ));
    }
    Check::judged(
        "transit",
        format!(
            "{} transfer record(s), {unreceived} unit(s) not received",
            transfers.len()
        ),
        differences,
    )
}

fn mysql_stock(mysql: &VoucherAudit, initial: Option<i64>) -> Check {
    let mut differences = Vec::new();
    if mysql.stock_left < 0 {
        differences.push(format!("stock is negative: {}", mysql.stock_left));
    }
    let sum = mysql.active_orders + mysql.stock_left;
    let detail = format!(
        "{} active orders + stock {} = {sum} ({} closed)",
        mysql.active_orders, mysql.stock_left, mysql.closed_orders
    );
    match initial {
        Some(initial) => {
            if sum != initial {
                differences.push(format!(
                    "active orders + stock is {sum}, {} than the initial stock",
                    more_or_fewer(sum - initial)
                ));
            }
            Check::judged(
                "mysql-stock",
                format!("{detail} (initial {initial})"),
                differences,
            )
        }
        None if differences.is_empty() => Check::not_checked(
            "mysql-stock",
            &format!("{detail}; initial stock unknown (give --initial-stock)"),
        ),
        None => Check::judged("mysql-stock", detail, differences),
    }
}

/// Redis's buyers against MySQL's: `returning` are the buyers of closed
/// orders whose give-back is owed, in Redis's buyers until it arrives.
fn buyers_match(
    buyers: &[UserId],
    ordered: &BTreeSet<UserId>,
    on_the_way: &BTreeSet<UserId>,
    returning: &BTreeSet<UserId>,
) -> Check {
    let buyers: BTreeSet<UserId> = buyers.iter().copied().collect();
    let accounted: BTreeSet<UserId> = ordered
        .union(on_the_way)
        .chain(returning)
        .copied()
        .collect();
    let mut differences = Vec::new();
    let lost: Vec<UserId> = buyers.difference(&accounted).copied().collect();
    if !lost.is_empty() {
        differences.push(format!(
            "{} buyer(s) told success with no order and none on its way: users {}",
            lost.len(),
            listed(&lost)
        ));
    }
    let unadmitted_orders: Vec<UserId> = ordered.difference(&buyers).copied().collect();
    if !unadmitted_orders.is_empty() {
        differences.push(format!(
            "{} user(s) with an order in MySQL who are no buyers in Redis: users {}",
            unadmitted_orders.len(),
            listed(&unadmitted_orders)
        ));
    }
    let unadmitted_pending: Vec<UserId> = on_the_way
        .difference(&buyers)
        .filter(|user| !ordered.contains(user))
        .copied()
        .collect();
    if !unadmitted_pending.is_empty() {
        differences.push(format!(
            "{} user(s) with an order on its way who are no buyers in Redis: users {}",
            unadmitted_pending.len(),
            listed(&unadmitted_pending)
        ));
    }
    let waiting = on_the_way.difference(ordered).count();
    Check::judged(
        "buyers",
        format!(
            "{} buyers = {} with an order + {waiting} with one on its way",
            buyers.len(),
            ordered.len()
        ),
        differences,
    )
}

fn one_order_per_user(orders_per_user: &[(UserId, i64)]) -> Check {
    let twice: Vec<String> = orders_per_user
        .iter()
        .filter(|(_, orders)| *orders > 1)
        .map(|(user, orders)| format!("user {user}: {orders} orders"))
        .collect();
    let detail = format!("{} user(s) hold more than one active order", twice.len());
    Check::judged("one-active-order-per-user", detail, twice)
}

fn paid_and_closed(mysql: &VoucherAudit) -> Check {
    let detail = format!(
        "{} of {} closed order(s) carry a payment",
        mysql.paid_and_closed, mysql.closed_orders
    );
    let differences = if mysql.paid_and_closed > 0 {
        vec![format!(
            "{} order(s) were paid and closed: their buyers paid for nothing",
            mysql.paid_and_closed
        )]
    } else {
        Vec::new()
    };
    Check::judged("paid-and-closed", detail, differences)
}

/// The give-backs owed to Redis, and those owed for longer than `within`:
/// a closer sends an owed give-back within seconds, so an old one is a unit
/// stranded.
fn givebacks(owed: &[(Giveback, i64)], within: std::time::Duration) -> Check {
    let stranded: Vec<String> = owed
        .iter()
        .filter(|(_, age)| *age as u64 > within.as_secs())
        .map(|(giveback, age)| {
            format!(
                "order {} of user {}: owed for {age} s (its unit is stranded)",
                giveback.order_id, giveback.user_id
            )
        })
        .collect();
    let detail = format!("{} give-back(s) to Redis owed", owed.len());
    Check::judged("give-backs", detail, stranded)
}

fn more_or_fewer(by: i64) -> String {
    if by > 0 {
        format!("{by} more")
    } else {
        format!("{} fewer", -by)
    }
}

/// Up to 20 user ids, then how many more.
fn listed(users: &[UserId]) -> String {
    const SHOWN: usize = 20;
    let mut text = users
        .iter()
        .take(SHOWN)
        .map(UserId::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if users.len() > SHOWN {
        let _ = write!(text, " and {} more", users.len() - SHOWN);
    }
    text
}

/// Connects to MySQL and Redis as `settings` say.
pub fn connect(settings: &StoreSettings) -> anyhow::Result<(Store, SaleState)> {
    let store = Store::connect_lazy(&settings.database.url, 2, settings.backend_timeout())?;
    let redis = hmdp::config::connect_redis(&settings.redis.url, settings.backend_timeout())?;
    let keys = Keys::new(settings.redis.prefix.clone());
    Ok((store.clone(), SaleState::new(redis, keys, store)))
}

/// `hmdp audit`: prints the audit, writes its JSON; returns the exit status.
pub async fn run(settings: &AuditSettings) -> anyhow::Result<i32> {
    let (store, sale_state) = connect(&settings.store)?;
    let options = AuditOptions {
        initial_stock: settings.initial_stock,
        allow_unchecked: settings.allow_unchecked,
        pending_within: Duration::from_secs(settings.pending_within_secs),
        transit_within: Duration::from_millis(settings.transit_within_ms),
    };
    let audit = audit(
        &store,
        &sale_state,
        VoucherId::new(settings.voucher),
        options,
    )
    .await?;
    print!("{audit}");
    if let Some(path) = &settings.json {
        audit.write_json(path)?;
    }
    Ok(audit.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(ids: &[u64]) -> BTreeSet<UserId> {
        ids.iter().copied().map(UserId::new).collect()
    }

    #[test]
    fn buyers_are_orders_plus_orders_on_their_way() {
        let buyers: Vec<UserId> = users(&[1, 2, 3]).into_iter().collect();
        let check = buyers_match(&buyers, &users(&[1, 2]), &users(&[3]), &users(&[]));
        assert_eq!(check.status, Status::Holds, "{check:?}");
    }

    #[test]
    fn a_buyer_whose_give_back_is_owed_may_still_be_a_buyer_or_not() {
        let buyers: Vec<UserId> = users(&[1, 2]).into_iter().collect();
        for returning in [users(&[2]), users(&[2, 3])] {
            let check = buyers_match(&buyers, &users(&[1]), &users(&[]), &returning);
            assert_eq!(check.status, Status::Holds, "{check:?}");
        }
    }

    #[test]
    fn each_kind_of_difference_names_its_users() {
        let buyers: Vec<UserId> = users(&[1, 2, 3]).into_iter().collect();
        let check = buyers_match(&buyers, &users(&[1, 4]), &users(&[5]), &users(&[]));
        assert_eq!(check.status, Status::Broken);
        assert_eq!(
            check.differences,
            [
                "2 buyer(s) told success with no order and none on its way: users 2, 3",
                "1 user(s) with an order in MySQL who are no buyers in Redis: users 4",
                "1 user(s) with an order on its way who are no buyers in Redis: users 5",
            ]
        );
    }

    #[test]
    fn a_check_not_made_fails_unless_allowed() {
        let mut audit = Audit {
            voucher: 1,
            initial_stock: Some(5),
            redis_checked: false,
            orders: 0,
            closed_orders: 0,
            givebacks_owed: 0,
            mysql_stock: 5,
            redis_stock: None,
            buyers: None,
            pending: 0,
            in_stream: 0,
            pending_lost: 0,
            in_transit: None,
            shards: Vec::new(),
            checks: vec![
                Check::judged("mysql-stock", String::new(), Vec::new()),
                Check::not_checked("redis-stock", "Redis holds no sale"),
            ],
            allow_unchecked: false,
        };
        assert_eq!(
            audit.failures(),
            ["audit: redis-stock could not be checked"]
        );
        assert_eq!(audit.exit_code(), 1);
        audit.allow_unchecked = true;
        assert!(audit.failures().is_empty());
        assert_eq!(audit.exit_code(), 0);
    }

    #[test]
    fn long_lists_are_cut() {
        let many: Vec<UserId> = (1..=25).map(UserId::new).collect();
        assert!(listed(&many).ends_with("20 and 5 more"));
    }
}
