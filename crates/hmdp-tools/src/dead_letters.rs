//! `hmdp dead-letters list|replay`: the order stream's dead letters shown
//! with why each was given up on, and replayed into MySQL as a consumer
//! writes an order (under the user's lock, idempotent on the order id).

use std::time::Duration;

use clap::{Args, Subcommand};

use hmdp::after_sale::{PayDeadlines, DEFAULT_PAY_TIMEOUT};
use hmdp::config::{LockSettings, StoreSettings};
use hmdp::seckill::stream::{replay, Replay};
use hmdp::seckill::{DeadLetter, OrderSource, Seckill};

/// `hmdp dead-letters`.
#[derive(Debug, Clone, Args)]
pub struct DeadLettersSettings {
    #[command(subcommand)]
    pub action: Action,

    /// MySQL, and Redis with the prefix the nodes use.
    #[command(flatten)]
    pub store: StoreSettings,

    /// The lock the nodes take around a user's purchase (the same mode and
    /// lease), taken around each replayed order too.
    #[command(flatten)]
    pub lock: LockSettings,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Action {
    /// Every dead letter, oldest first: its id, its order (or why its
    /// fields make none), its deliveries and why it was given up on.
    List,
    /// Write dead letters' orders to MySQL. A letter whose order is written
    /// (now or before) is removed; one whose order cannot be written (a
    /// malformed entry, the user holding another order of the voucher,
    /// no stock left in MySQL, an id taken) says why and stays listed.
    ///
    /// Exit status: 0 when every letter named was settled, 1 when one was
    /// left listed, 2 when a replay could not be tried (MySQL or Redis
    /// failing, the user's lock busy: run it again).
    Replay {
        /// The dead letters' ids, as `list` shows them.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        ids: Vec<String>,
        /// Every dead letter.
        #[arg(long)]
        all: bool,
    },
}

/// One line for a dead letter.
fn describe(letter: &DeadLetter) -> String {
    let order = match &letter.order {
        Ok(order) => format!(
            "order {} of user {}, voucher {}",
            order.id, order.user_id, order.voucher_id
        ),
        Err(why) => format!("malformed ({why}): {}", letter.fields.join(" ")),
    };
    format!(
        "{}  {order}  delivered {} time(s)  reason: {}",
        letter.id, letter.deliveries, letter.reason
    )
}

/// `hmdp dead-letters`: prints what it did; returns the exit status.
pub async fn run(settings: &DeadLettersSettings) -> anyhow::Result<i32> {
    let (store, sale_state) = crate::audit::connect(&settings.store)?;
    match &settings.action {
        Action::List => {
            let letters = sale_state.dead_letters().await?;
            for letter in &letters {
                println!("{}", describe(letter));
            }
            println!("{} dead letter(s)", letters.len());
            Ok(0)
        }
        Action::Replay { ids, all } => {
            let letters = if *all {
                sale_state.dead_letters().await?
            } else {
                let mut letters = Vec::with_capacity(ids.len());
                for id in ids {
                    match sale_state.dead_letter(id).await? {
                        Some(letter) => letters.push(letter),
                        None => anyhow::bail!("no dead letter {id} (replayed already?)"),
                    }
                }
                letters
            };
            let url = &settings.store.redis.url;
            let redis = hmdp::config::connect_redis(url, settings.store.backend_timeout())?;
            let lock = hmdp::startup::build_lock(&settings.lock, redis.clone(), url)?;
            let keys = hmdp::keys::Keys::new(settings.store.redis.prefix.clone());
            // A replayed order's due time: the nodes' sweep closes it at
            // their own deadline should it be shorter.
            let deadlines = PayDeadlines::new(redis.clone(), &keys, DEFAULT_PAY_TIMEOUT);
            let writer = Seckill::new(store, lock, redis, keys, deadlines, Duration::ZERO)
                .writer()
                .for_orders_from(OrderSource::Stream);
            let mut settled = 0;
            for letter in &letters {
                let replayed: Replay = replay(&writer, letter).await.map_err(|error| {
                    error.context(format!("replaying dead letter {}", letter.id))
                })?;
                println!("{}  {replayed}", letter.id);
                settled += usize::from(replayed.settled());
            }
            println!(
                "{} dead letter(s) tried: {settled} settled, {} left listed; {} dead letter(s) in all",
                letters.len(),
                letters.len() - settled,
                sale_state.dead_letters().await?.len()
            );
            Ok(if settled == letters.len() { 0 } else { 1 })
        }
    }
}
