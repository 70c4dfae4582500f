//! The demo's crowd: after the lock modes' runs, the nodes start again with
//! the request limits on (their defaults, but for the logins, which the
//! demo's users made from this machine's one address), and the demo's users
//! buy a fresh voucher as honest buyers while `--crowd-bots` bots hammer it
//! from four addresses (`loadtest::crowd`): who gets the units.

use std::time::Duration;

use super::{DemoSettings, Stage};
use crate::loadtest::crowd::{self, Crowd, CrowdReport};
use crate::loadtest::{self, tokens::Login};

/// How many addresses the bots share.
const BOT_ADDRESSES: usize = 4;

/// Over how long the honest buyers' first purchases are spread.
const SPREAD: Duration = Duration::from_secs(1);

/// The crowd at a voucher of a quarter of the users' count, on nodes
/// restarted with `flags` and the limits on.
pub(super) async fn run(
    stage: &mut Stage,
    settings: &DemoSettings,
    flags: &[String],
) -> anyhow::Result<CrowdReport> {
    let mut flags = flags.to_vec();
    flags.extend(crowd::limit_flags());
    stage.nodes.restart_nodes(&flags).await?;
    let target = stage.nodes.url();
    eprintln!(
        "crowd: {} honest buyers and {} bots, the limits on",
        stage.tokens.len(),
        settings.crowd_bots
    );
    let bots = Login::new(
        stage.client.clone(),
        &target,
        stage.redis.clone(),
        stage.keys.clone(),
    )
    .users(stage.tokens.len(), settings.crowd_bots, 32)
    .await?;
    let stock = stage.tokens.len().div_ceil(4);
    let admin = &stage.nodes.spec().admin_token;
    let voucher =
        loadtest::create_voucher(&stage.client, &target, admin, i32::try_from(stock)?).await?;
    crowd::run(&Crowd {
        target,
        voucher,
        stock,
        humans: stage.tokens.clone(),
        bots,
        bot_addresses: BOT_ADDRESSES,
        spread: SPREAD,
    })
    .await
}
