//! What one buyer was answered to their purchases of one sale, tallied so
//! that their orders in MySQL can be explained: each order must be one they
//! were told, or one an unknown answer may have made; a definite refusal
//! makes none.

use std::collections::{BTreeMap, BTreeSet};

use super::{Call, Event, Failure};

/// One buyer's purchase answers of one sale.
#[derive(Debug, Default, Clone)]
pub struct BuyerAnswers {
    /// The orders they were told, each once.
    pub told: BTreeSet<i64>,
    /// Answers that say nothing (a timeout, a 503, a 429 until the edge
    /// makes it definite): each may have made one order.
    pub unknown: usize,
    /// Definite refusals, by `errorCode`: none of them made an order.
    pub refused: BTreeMap<String, usize>,
}

impl BuyerAnswers {
    /// The purchase answers of `answers` (one sale's), by user id. Every
    /// answer carries its user: `check` refuses a history whose do not.
    pub fn by_user(answers: &[&Event]) -> BTreeMap<i64, BuyerAnswers> {
        let mut by_user: BTreeMap<i64, BuyerAnswers> = BTreeMap::new();
        for event in answers {
            match event {
                Event::Ok {
                    user: Some(user),
                    f: Call::Buy,
                    order,
                    ..
                } => {
                    by_user.entry(*user).or_default().told.insert(*order);
                }
                Event::Unknown(Failure {
                    user: Some(user),
                    f: Call::Buy,
                    ..
                }) => by_user.entry(*user).or_default().unknown += 1,
                Event::Fail(Failure {
                    user: Some(user),
                    f: Call::Buy,
                    error,
                    ..
                }) => {
                    let refused = &mut by_user.entry(*user).or_default().refused;
                    *refused.entry(error.clone()).or_default() += 1;
                }
                _ => {}
            }
        }
        by_user
    }

    /// Of `orders` (the buyer's in MySQL), those no success answer names.
    pub fn untold(&self, orders: &BTreeSet<i64>) -> Vec<i64> {
        orders.difference(&self.told).copied().collect()
    }

    /// What they were answered, in words for a break's line.
    pub fn describe(&self) -> String {
        let refused: Vec<String> = (self.refused.iter())
            .map(|(error, count)| format!("{error} x{count}"))
            .collect();
        format!(
            "told {:?}, {} unknown answer(s), refused [{}]",
            self.told,
            self.unknown,
            refused.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(user: i64, error: &str) -> Failure {
        Failure {
            client: 0,
            user: Some(user),
            voucher: 7,
            f: Call::Buy,
            order: None,
            error: error.to_owned(),
            at_ms: 1,
        }
    }

    #[test]
    fn answers_are_tallied_by_buyer() {
        let events = [
            Event::Ok {
                client: 0,
                user: Some(1),
                voucher: 7,
                f: Call::Buy,
                order: 42,
                node: "n".into(),
                at_ms: 1,
            },
            Event::Fail(failure(1, "ALREADY_ORDERED")),
            Event::Fail(failure(2, "SOLD_OUT")),
            Event::Unknown(failure(2, "TOO_MANY_REQUESTS")),
        ];
        let answers: Vec<&Event> = events.iter().collect();
        let by_user = BuyerAnswers::by_user(&answers);
        assert_eq!(by_user[&1].untold(&[42, 43].into()), vec![43]);
        assert_eq!(by_user[&2].unknown, 1);
        assert_eq!(
            by_user[&2].describe(),
            "told {}, 1 unknown answer(s), refused [SOLD_OUT x1]"
        );
    }
}
