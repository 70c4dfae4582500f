//! Sold out everywhere at once: a node that sees a sale sell out tells the
//! others over Redis pub/sub, and each marks it sold out in memory, so that
//! the storm after the last unit is refused from memory on every node, not
//! only on the one that saw it. A unit given back (an order cancelled or
//! closed unpaid) is news too: the nodes forget the sale sold out.
//!
//! News is a shortcut, never the truth: a message lost (Redis restarting,
//! a node reconnecting) leaves each node to learn from MySQL, as without
//! it, within the catalog's re-read bound; a sold-out that arrives after a
//! unit came back keeps that unit off sale for that bound at most.

use std::sync::Weak;
use std::time::Duration;

use futures::StreamExt;

use super::Seckill;
use crate::ids::VoucherId;
use crate::keys::Keys;
use crate::metrics;
use crate::redis_handle::RedisConnection;

/// How long a subscriber that lost its connection waits before it
/// connects again.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// What a node tells the others of a sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum News {
    SoldOut(VoucherId),
    /// A unit came back on sale.
    Returned(VoucherId),
}

impl News {
    fn label(self) -> &'static str {
        match self {
            News::SoldOut(_) => "sold-out",
            News::Returned(_) => "returned",
        }
    }

    fn message(self) -> String {
        match self {
            News::SoldOut(voucher) | News::Returned(voucher) => {
                format!("{} {voucher}", self.label())
            }
        }
    }

    fn parse(message: &str) -> Option<News> {
        let (label, voucher) = message.split_once(' ')?;
        let voucher: VoucherId = voucher.parse().ok()?;
        match label {
            "sold-out" => Some(News::SoldOut(voucher)),
            "returned" => Some(News::Returned(voucher)),
            _ => None,
        }
    }
}

/// The node's side of the news: telling it, and (once listening) hearing it.
#[derive(Clone)]
pub(super) struct SaleNews {
    redis: RedisConnection,
    channel: String,
}

impl SaleNews {
    pub fn new(redis: RedisConnection, keys: &Keys) -> SaleNews {
        SaleNews {
            redis,
            channel: keys.sale_news(),
        }
    }

    /// Tells every node, in a task of its own: the purchase that saw it
    /// answers without waiting, and a lost message costs only the shortcut.
    pub fn tell(&self, news: News) {
        let mut redis = self.redis.clone();
        let channel = self.channel.clone();
        tokio::spawn(async move {
            let told: redis::RedisResult<()> = redis::cmd("PUBLISH")
                .arg(&channel)
                .arg(news.message())
                .query_async(&mut redis)
                .await;
            if let Err(error) = told {
                tracing::debug!(%error, ?news, "sale news not told; the nodes learn it from MySQL");
            }
        });
    }

    /// Hears the news for as long as `seckill` lives, from the Redis at
    /// `urls` (a Redis Cluster's nodes: classic pub/sub reaches every node
    /// of a cluster, so any one of them will do), connecting again after a
    /// loss.
    pub fn listen(&self, urls: Vec<String>, seckill: Weak<Seckill>) {
        let channel = self.channel.clone();
        tokio::spawn(async move {
            for url in urls.iter().cycle() {
                if let Err(error) = hear(url, &channel, &seckill).await {
                    tracing::debug!(%error, "sale news subscription lost; connecting again");
                }
                if seckill.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(RECONNECT_AFTER).await;
            }
        });
    }
}

/// One subscription, until its connection ends or the node does.
async fn hear(url: &str, channel: &str, seckill: &Weak<Seckill>) -> redis::RedisResult<()> {
    let mut subscription = redis::Client::open(url)?.get_async_pubsub().await?;
    subscription.subscribe(channel).await?;
    let mut messages = subscription.on_message();
    while let Some(message) = messages.next().await {
        let Some(seckill) = seckill.upgrade() else {
            return Ok(());
        };
        let payload: String = message.get_payload()?;
        let Some(news) = News::parse(&payload) else {
            tracing::warn!(payload, "sale news not understood");
            continue;
        };
        metrics::SALE_NEWS_HEARD
            .with_label_values(&[news.label()])
            .inc();
        seckill.heard(news);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn news_reads_back_as_it_was_told() {
        for news in [
            News::SoldOut(VoucherId::new(7)),
            News::Returned(VoucherId::new(123456789)),
        ] {
            assert_eq!(News::parse(&news.message()), Some(news));
        }
        assert_eq!(News::parse("gone 7"), None);
        assert_eq!(News::parse("sold-out x"), None);
    }
}
