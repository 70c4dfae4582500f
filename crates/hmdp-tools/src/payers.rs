//! Buyers after the sale, over HTTP as a client would: each buyer told an
//! order pays it, cancels it, or leaves it unpaid to time out, chosen by
//! shares; and what each was answered. Pay and cancel are idempotent, so a
//! request whose answer was lost (a node killed, a 502 from nginx) is sent
//! again; an order still on its way to MySQL (`ORDER_PENDING`) is asked
//! again until it is written.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

use crate::history::{self, Call, Event, Failure};
use crate::loadtest::Told;

/// What a buyer does with their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Pay,
    Cancel,
    /// Left unpaid: the nodes close it at its deadline.
    Leave,
}

impl Act {
    /// The act of the `index`-th of `buyers`: the first `pay_percent` of
    /// them pay, the next `cancel_percent` cancel, the rest leave it.
    pub fn of(index: usize, buyers: usize, pay_percent: u8, cancel_percent: u8) -> Act {
        let slot = (index * 100 / buyers.max(1)) as u8;
        if slot < pay_percent {
            Act::Pay
        } else if slot < pay_percent.saturating_add(cancel_percent) {
            Act::Cancel
        } else {
            Act::Leave
        }
    }
}

/// What a pay or cancel was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// Success: paid, or cancelled.
    Done,
    /// Refused with this `errorCode` (`ORDER_CLOSED`: closed before).
    Refused(String),
    /// No answer that says (the cluster kept failing): judged by nothing.
    Unknown,
}

/// One buyer's act and its answer.
#[derive(Debug, Clone)]
pub struct Acted {
    pub user: usize,
    /// The buyer's user id, as MySQL files their order.
    pub user_id: i64,
    pub order_id: i64,
    pub act: Act,
    pub answered: Answered,
}

impl Acted {
    /// The request and its answer, as `hmdp check` reads them; none for an
    /// order left to time out.
    pub fn history(&self, voucher: i64) -> Vec<Event> {
        let f = match self.act {
            Act::Pay => Call::Pay,
            Act::Cancel => Call::Cancel,
            Act::Leave => return Vec::new(),
        };
        let (client, user, order) = (self.user, Some(self.user_id), Some(self.order_id));
        let at_ms = history::unix_ms(Instant::now());
        let failure = |error: String| Failure {
            client,
            user,
            voucher,
            f,
            order,
            error,
            at_ms,
        };
        let answer = match &self.answered {
            Answered::Done => Event::Ok {
                client,
                user,
                voucher,
                f,
                order: self.order_id,
                node: "-".to_owned(),
                at_ms,
            },
            Answered::Refused(error) => Event::failed(true, failure(error.clone())),
            Answered::Unknown => Event::failed(false, failure("no answer".to_owned())),
        };
        let invoke = Event::Invoke {
            client,
            user,
            voucher,
            f,
            order,
            at_ms,
        };
        vec![invoke, answer]
    }
}

/// How long an order still on its way to MySQL is asked again.
const PENDING_FOR: Duration = Duration::from_secs(60);
/// Sends of a request whose answer did not come.
const SENDS: usize = 10;
const PAUSE: Duration = Duration::from_millis(200);

/// Every buyer in `told` acts on their order at `target`, `concurrency` at
/// a time; the buyers who leave their order send nothing.
pub async fn act_all(
    client: &reqwest::Client,
    target: &str,
    tokens: &[String],
    told: &[Told],
    (pay_percent, cancel_percent): (u8, u8),
    concurrency: usize,
) -> Vec<Acted> {
    // Each act owns what it sends: the stream of them is `Send` as a whole.
    let buyers = told.len();
    let acts = told.iter().enumerate().map(|(index, told)| {
        let act = Act::of(index, buyers, pay_percent, cancel_percent);
        let (client, target) = (client.clone(), target.to_owned());
        let (token, user, order_id) = (tokens[told.user].clone(), told.user, told.order_id);
        let user_id = told.user_id;
        async move {
            let answered = send(&client, &target, &token, order_id, act).await;
            Acted {
                user,
                user_id,
                order_id,
                act,
                answered,
            }
        }
    });
    let acts: Vec<_> = acts.collect();
    futures::stream::iter(acts)
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// Sends one buyer's `act` on their order (a payment in every pay type in
/// turn, by order id: 1 balance, 2 Alipay, 3 WeChat), again while the
/// order is not written yet or the answer was lost — both are safe to
/// repeat: a paid order is answered as it is, and so is a cancelled one.
/// Leaving an order sends nothing.
pub async fn send(
    client: &reqwest::Client,
    target: &str,
    token: &str,
    order_id: i64,
    act: Act,
) -> Answered {
    let base = target.trim_end_matches('/');
    let (url, body) = match act {
        Act::Leave => return Answered::Done,
        Act::Pay => (
            format!("{base}/voucher-order/{order_id}/pay"),
            Some(json!({"payType": order_id.rem_euclid(3) + 1})),
        ),
        Act::Cancel => (format!("{base}/voucher-order/{order_id}/cancel"), None),
    };
    let pending_until = Instant::now() + PENDING_FOR;
    let mut sends = 0;
    while sends < SENDS {
        let mut request = client.post(&url).header("authorization", token);
        if let Some(body) = &body {
            request = request.json(body);
        }
        let body: Option<Value> = match request.send().await {
            Ok(response) => response.json().await.ok(),
            Err(_) => None,
        };
        match body {
            Some(body) if body["success"] == true => return Answered::Done,
            Some(body)
                if body["errorCode"] == "ORDER_PENDING" && Instant::now() < pending_until => {}
            Some(body) if body["errorCode"].is_string() && body["errorCode"] != "UNAVAILABLE" => {
                return Answered::Refused(body["errorCode"].as_str().unwrap_or("?").to_owned())
            }
            _ => sends += 1,
        }
        tokio::time::sleep(PAUSE).await;
    }
    Answered::Unknown
}

#[cfg(test)]
mod tests {
    use super::Act;

    #[test]
    fn shares_split_the_buyers() {
        for (buyers, split) in [(200, (140, 20, 40)), (50, (35, 5, 10)), (7, (5, 1, 1))] {
            let acts: Vec<Act> = (0..buyers).map(|i| Act::of(i, buyers, 70, 10)).collect();
            let count = |act| acts.iter().filter(|a| **a == act).count();
            assert_eq!(
                (count(Act::Pay), count(Act::Cancel), count(Act::Leave)),
                split
            );
        }
    }
}
