//! A real small sale to corrupt: two `stream` nodes behind nginx, a storm
//! of purchases recorded as a history (`loadtest --history --verify`: every
//! order written and audited), some buyers paying and some cancelling, every
//! give-back back in Redis, then the nodes stopped (their reconciler would
//! heal what a corruption breaks in MySQL). The sale's order rows and stock
//! are kept aside, so that each corruption starts from the untouched run.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hmdp::config::SeckillMode;
use hmdp::keys::Keys;
use hmdp_lock::LockMode;
use hmdp_test_support::{poll_until, Tables};
use hmdp_tools::history::{self, Call, Event};
use hmdp_tools::loadtest::{self, tokens::Login};
use hmdp_tools::nodes::{node_flags, Nodes, NodesSpec, Sandbox};
use hmdp_tools::payers::{self, Act, Acted, Answered};
use sqlx::MySqlPool;

use crate::common::{self, hmdp, hmdp_report};

/// Users, each firing two purchases at once, at a stock of ten: ten told
/// success, the others refused (sold out, or their second purchase a
/// duplicate).
const USERS: usize = 16;
const STOCK: i64 = 10;

/// A success answer of the run: the buyer and their order.
#[derive(Debug, Clone, Copy)]
pub struct Bought {
    pub user: i64,
    pub order: i64,
}

/// The recorded run. Fields drop in order: the nodes before their database.
pub struct Run {
    /// Stopped, and held only so that they go first.
    _nodes: Nodes,
    pub pool: MySqlPool,
    pub sandbox: Sandbox,
    pub voucher: i64,
    /// The history as the clients saw it.
    pub events: Vec<Event>,
    /// Told success and left unpaid.
    pub unpaid: Vec<Bought>,
    pub paid: Vec<Bought>,
    pub cancelled: Vec<Bought>,
    /// Users told only refusals.
    pub refused: Vec<i64>,
    dir: tempfile::TempDir,
}

impl Run {
    pub async fn record() -> Run {
        let sandbox = common::sandbox().await;
        let spec = NodesSpec::in_sandbox(PathBuf::from(env!("CARGO_BIN_EXE_hmdp")), &sandbox);
        let mut flags = node_flags(LockMode::Reentrant, SeckillMode::Stream, 0);
        flags.push("--db-pool=8".to_owned());
        let mut nodes = Nodes::start(spec.clone(), &flags).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.jsonl");
        let (target, users, stock) = (
            nodes.url(),
            format!("--users={USERS}"),
            format!("--stock={STOCK}"),
        );
        let (_, report) = hmdp_report(
            &sandbox,
            &[
                "loadtest",
                "--target",
                &target,
                "--admin-token",
                &spec.admin_token,
                "--workload=storm",
                &users,
                "--per-user=2",
                &stock,
                "--verify",
                "--history",
                path.to_str().unwrap(),
            ],
        );
        let voucher = report["voucher"].as_i64().unwrap();
        let mut events = history::read(&path).unwrap();

        // The buyers' second half: three pay, two cancel.
        let mut told: Vec<(usize, Bought)> = (events.iter())
            .filter_map(|event| match event {
                Event::Ok {
                    client,
                    user: Some(user),
                    f: Call::Buy,
                    order,
                    ..
                } => Some((
                    *client,
                    Bought {
                        user: *user,
                        order: *order,
                    },
                )),
                _ => None,
            })
            .collect();
        told.sort_by_key(|(_, bought)| bought.order);
        assert_eq!(told.len() as i64, STOCK, "every unit sold once");
        let client = loadtest::http_client(8).unwrap();
        let redis =
            hmdp::config::connect_redis(&sandbox.redis.redis_url, Duration::from_secs(10)).unwrap();
        let tokens = Login::new(
            client.clone(),
            &target,
            redis,
            Keys::new(sandbox.redis.prefix.clone()),
        )
        .users(0, USERS, 8)
        .await
        .unwrap();
        let (mut paid, mut cancelled, mut unpaid) = (Vec::new(), Vec::new(), Vec::new());
        for (index, (user, bought)) in told.iter().enumerate() {
            let act = match index {
                0..3 => Act::Pay,
                3..5 => Act::Cancel,
                _ => {
                    unpaid.push(*bought);
                    continue;
                }
            };
            let answered = payers::send(&client, &target, &tokens[*user], bought.order, act).await;
            assert_eq!(answered, Answered::Done, "{act:?} of {bought:?}");
            let acted = Acted {
                user: *user,
                user_id: bought.user,
                order_id: bought.order,
                act,
                answered,
            };
            events.extend(acted.history(voucher));
            match act {
                Act::Pay => paid.push(*bought),
                _ => cancelled.push(*bought),
            }
        }
        let buyers: Vec<i64> = told.iter().map(|(_, bought)| bought.user).collect();
        let refused: BTreeSet<i64> = (events.iter())
            .filter_map(|event| event.asked_by().and_then(|(_, user, _)| user))
            .filter(|user| !buyers.contains(user))
            .collect();
        let refused: Vec<i64> = refused.into_iter().collect();
        assert!(!refused.is_empty(), "some users were turned away");

        // Every give-back back in Redis: the audit holds.
        let voucher_arg = voucher.to_string();
        poll_until(
            "the sale's audit to hold after the cancels",
            Duration::from_secs(30),
            Duration::from_millis(200),
            || {
                let (code, _) = hmdp(&sandbox, &["audit", "--voucher", &voucher_arg]);
                async move { Ok(code == 0) }
            },
        )
        .await
        .unwrap();
        nodes.kill_node(0).await;
        nodes.kill_node(1).await;

        let pool = sandbox.store(2).unwrap().pool().clone();
        sqlx::query(
            "CREATE TABLE mutation_snapshot AS SELECT * FROM tb_voucher_order WHERE voucher_id = ?",
        )
        .bind(voucher)
        .execute(&pool)
        .await
        .unwrap();
        let run = Run {
            _nodes: nodes,
            pool,
            sandbox,
            voucher,
            events,
            unpaid,
            paid,
            cancelled,
            refused,
            dir,
        };
        run.write_history(&run.events);
        run
    }

    /// The history file `hmdp check` reads.
    pub fn history_path(&self) -> PathBuf {
        self.dir.path().join("history.jsonl")
    }

    pub fn write_history(&self, events: &[Event]) {
        write_history(&self.history_path(), events);
    }

    pub fn tables(&self) -> Tables<'_> {
        Tables::of(&self.pool)
    }

    /// An order id no order has.
    pub async fn fresh_order_id(&self) -> i64 {
        let max: i64 = sqlx::query_scalar("SELECT CAST(MAX(id) AS SIGNED) FROM tb_voucher_order")
            .fetch_one(&self.pool)
            .await
            .unwrap();
        max + 1
    }

    /// The untouched run again: its history, the sale's rows and stock.
    pub async fn restore(&self) {
        self.write_history(&self.events);
        sqlx::query("DELETE FROM tb_voucher_order WHERE voucher_id = ?")
            .bind(self.voucher)
            .execute(&self.pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO tb_voucher_order SELECT * FROM mutation_snapshot")
            .execute(&self.pool)
            .await
            .unwrap();
        // Active orders + stock = the stock the sale began with.
        let active: i64 = sqlx::query_scalar(
            "SELECT CAST(COUNT(*) AS SIGNED) FROM tb_voucher_order WHERE voucher_id = ? AND status <> 4",
        )
        .bind(self.voucher)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        self.tables()
            .set_stock(self.voucher, STOCK - active)
            .await
            .unwrap();
    }

    /// `hmdp check` on the history as it is now, with `extra` arguments.
    pub fn check(&self, extra: &[&str]) -> (i32, String) {
        let path = self.history_path();
        let mut args = vec!["check", "--history", path.to_str().unwrap()];
        args.extend(extra);
        hmdp(&self.sandbox, &args)
    }

    /// `hmdp audit` of the sale.
    pub fn audit(&self) -> (i32, String) {
        let voucher = self.voucher.to_string();
        hmdp(&self.sandbox, &["audit", "--voucher", &voucher])
    }
}

fn write_history(path: &Path, events: &[Event]) {
    history::Recorder::create(path)
        .unwrap()
        .record_all(events)
        .unwrap();
}
