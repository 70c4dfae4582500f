//! Settling a batch of delivered entries: the dead letters first, then the
//! per-user locks of every remaining order (taken at once: on the shared
//! Redis connection their commands leave together), ONE transaction for
//! the lot, the acknowledgement, and the locks' release. A batch is a trace
//! of its own, linked to the admission of each entry that carries one.
//!
//! Every step is safe to repeat, which is what makes a redelivery harmless:
//! an order id already in `tb_voucher_order` is not written again, so an
//! entry whose commit succeeded but whose `XACK` never happened (the node
//! died in between, or the reply was lost) is found written the next time
//! and only acknowledged.

use tracing::Span;

use super::entry::Entry;
use super::group::OrderStream;
use crate::error::Error;
use crate::metrics;
use crate::seckill::writer::{Blame, Deferral, OrderWriter, Outcome};
use crate::store::NewOrder;
use crate::telemetry::traces;

/// The `outcome` label of `hmdp_stream_orders_total`.
fn label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Written => "written",
        Outcome::AlreadyWritten => "already_written",
        Outcome::DuplicateUser => "duplicate_user",
        Outcome::IdTaken => "id_taken",
        Outcome::Resold => "resold",
        Outcome::Deferred(_) => "deferred",
    }
}

/// Every `outcome` label, for the metrics' zero series.
pub(super) const OUTCOMES: &[&str] = &[
    "written",
    "already_written",
    "duplicate_user",
    "id_taken",
    "resold",
    "deferred",
];

/// Why an entry went to the dead letters: the `reason` label of
/// `hmdp_stream_dead_letters_total`.
pub(super) const DEAD_LETTER_REASONS: &[&str] = &[
    "malformed",
    "max_deliveries",
    "id_taken",
    "resold",
    "duplicate_user",
    "queue",
];

/// The span of a batch settling `entries`: in the logs, inside the
/// consumer's; exported, the root of a trace that links to each entry's
/// admission.
pub(super) fn span(entries: &[Entry]) -> Span {
    let span = tracing::info_span!("stream_batch", entries = entries.len());
    traces::start_trace(&span);
    traces::link(&span, entries.iter().filter_map(Entry::traceparent));
    span
}

/// Settles `entries`: dead-letters the malformed ones, writes the others in
/// one transaction and acknowledges what it settled; an entry delivered
/// more than `max_deliveries` times gets a last attempt of its own first.
/// Returns the entries left pending for a reason not their own (a lock
/// busy or lost), to be claimed again later. `Err` when the transaction or
/// the acknowledgement failed: the entries concerned stay pending.
pub(super) async fn settle(
    writer: &OrderWriter,
    stream: &OrderStream,
    entries: Vec<Entry>,
    max_deliveries: usize,
) -> anyhow::Result<Vec<Entry>> {
    let mut orders = Vec::with_capacity(entries.len());
    let mut last_chances = Vec::new();
    for entry in entries {
        match entry.order() {
            Ok(order) if entry.deliveries > max_deliveries => last_chances.push((entry, order)),
            Ok(order) => orders.push((entry, order)),
            Err(why) => dead_letter(stream, &entry, "malformed", &why).await?,
        }
    }
    let mut waiting = Vec::new();
    if !orders.is_empty() {
        let outcomes = settle_orders(writer, stream, &orders).await?;
        for ((entry, _), outcome) in orders.into_iter().zip(outcomes) {
            if outcome.waits_on_others() {
                waiting.push(entry);
            }
        }
    }
    for (entry, order) in last_chances {
        last_chance(writer, stream, entry, order, max_deliveries).await?;
    }
    Ok(waiting)
}

/// One more attempt, alone, at an entry delivered more than
/// `max_deliveries` times: a batch that keeps failing may fail for one
/// order's sake, and alone that order cannot hold up the others. The dead
/// letters take it only when the failure is its own ([`Blame::Order`]);
/// any other failure keeps it pending, for as long as it lasts.
async fn last_chance(
    writer: &OrderWriter,
    stream: &OrderStream,
    entry: Entry,
    order: NewOrder,
    max_deliveries: usize,
) -> anyhow::Result<()> {
    let deliveries = entry.deliveries;
    let alone = [(entry, order)];
    let why = match settle_orders(writer, stream, &alone).await {
        Ok(outcomes) => match outcomes[0] {
            Outcome::Deferred(why @ Deferral::NoStockInMysql) => why.to_string(),
            // Settled, dead-lettered for its id, or waiting on others.
            _ => return Ok(()),
        },
        Err(failed) => match Blame::of(&failed) {
            Blame::Order(why) => why,
            Blame::Surroundings => return Err(failed.into()),
        },
    };
    let reason = format!(
        "delivered {deliveries} times without being written (limit {max_deliveries}): {why}"
    );
    dead_letter(stream, &alone[0].0, "max_deliveries", &reason).await
}

/// Writes `orders` in one transaction under their users' locks,
/// acknowledges what it settled, and says what became of each.
async fn settle_orders(
    writer: &OrderWriter,
    stream: &OrderStream,
    orders: &[(Entry, NewOrder)],
) -> Result<Vec<Outcome>, Error> {
    let new: Vec<NewOrder> = orders.iter().map(|(_, order)| *order).collect();
    let outcomes = writer
        .write_under_locks(&new, async |outcomes: &[Outcome]| {
            (acknowledge(stream, orders, outcomes).await).map_err(Error::Internal)
        })
        .await?;
    let written = outcomes.iter().filter(|o| **o == Outcome::Written).count();
    if written > 0 {
        metrics::STREAM_BATCH_ORDERS.observe(written as f64);
    }
    for ((entry, order), outcome) in orders.iter().zip(&outcomes) {
        report(entry, order, *outcome);
    }
    Ok(outcomes)
}

/// After the commit: acknowledges the settled entries (one `MULTI`) and
/// moves the orders whose id another order took to the dead letters.
async fn acknowledge(
    stream: &OrderStream,
    orders: &[(Entry, NewOrder)],
    outcomes: &[Outcome],
) -> anyhow::Result<()> {
    let mut entries = Vec::new();
    let mut settled = Vec::new();
    for ((entry, order), outcome) in orders.iter().zip(outcomes) {
        match outcome {
            outcome if outcome.settled() => {
                entries.push(entry);
                settled.push(*order);
            }
            Outcome::IdTaken => {
                let reason = format!("order id {} belongs to another order", order.id);
                dead_letter(stream, entry, "id_taken", &reason).await?;
            }
            Outcome::Resold => {
                let reason = "admitted before Redis lost the sale; its unit or its buyer's \
                              turn went to a buyer admitted after the reload";
                dead_letter(stream, entry, "resold", reason).await?;
            }
            Outcome::DuplicateUser => {
                let reason = format!(
                    "user {} holds another active order of voucher {}: Redis forgot the \
                     buyer and admitted them again",
                    order.user_id, order.voucher_id
                );
                dead_letter(stream, entry, "duplicate_user", &reason).await?;
            }
            _ => {}
        }
    }
    stream.acknowledge(&entries, &settled).await?;
    Ok(())
}

async fn dead_letter(
    stream: &OrderStream,
    entry: &Entry,
    label: &'static str,
    reason: &str,
) -> anyhow::Result<()> {
    stream.dead_letter(entry, reason).await?;
    metrics::STREAM_DEAD_LETTERS
        .with_label_values(&[label])
        .inc();
    tracing::error!(
        entry = %entry.id,
        deliveries = entry.deliveries,
        reason,
        "order stream entry moved to the dead letters"
    );
    Ok(())
}

/// Counts and logs what became of one order of a committed batch.
fn report(entry: &Entry, order: &NewOrder, outcome: Outcome) {
    metrics::STREAM_ORDERS
        .with_label_values(&[label(outcome)])
        .inc();
    let order_id = order.id;
    match outcome {
        // The last three are dead-lettered, and logged there.
        Outcome::Written | Outcome::IdTaken | Outcome::Resold | Outcome::DuplicateUser => {}
        Outcome::AlreadyWritten => tracing::info!(
            %order_id, entry = %entry.id,
            "order already written (a redelivery): acknowledged, not written again"
        ),
        Outcome::Deferred(reason) => tracing::warn!(
            %order_id, entry = %entry.id, deliveries = entry.deliveries, %reason,
            "order not written; left pending to be claimed and tried again"
        ),
    }
}
