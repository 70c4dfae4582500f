//! `tb_voucher_order`: the purchase transaction's statements, one per step
//! for a whole batch of orders (a shared commit's, a stream consumer's),
//! those as long as their batch sent as text. The order's life after the
//! sale is `order_life.rs`.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Display;

use chrono::NaiveDateTime;
use futures::TryStreamExt;
use serde::Serialize;
use sqlx::mysql::{MySqlQueryResult, MySqlRow};
use sqlx::Either;
use sqlx::{AssertSqlSafe, FromRow, MySqlConnection, RawSql, Row};

use super::order_life::active_order;
use super::sale_fence::SaleFence;
use crate::ids::{OrderId, UserId, VoucherId};

/// An order to insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromRow)]
pub struct NewOrder {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    /// Its admission's number in its shard's sequence (lua/seckill.lua),
    /// which the transaction writing it records in the sale's fence
    /// (`tb_seckill_voucher.sale_fence`); 0 for a synchronous purchase,
    /// which no Redis admitted, and for a row read back from MySQL.
    #[sqlx(default)]
    pub sequence: u64,
    /// The digest of the Idempotency-Key of the synchronous purchase that
    /// placed it ([`IdempotencyKey::digest`](crate::idempotency::IdempotencyKey::digest)),
    /// written with it: what answers the key when Redis lost its answer.
    #[sqlx(default)]
    pub idempotency: Option<u64>,
}

impl NewOrder {
    /// An order no Redis admission numbered: a synchronous purchase's.
    pub fn unsequenced(id: OrderId, user_id: UserId, voucher_id: VoucherId) -> NewOrder {
        NewOrder {
            id,
            user_id,
            voucher_id,
            sequence: 0,
            idempotency: None,
        }
    }

    /// Whether `other` is this order: the same id, buyer and voucher,
    /// however each was numbered.
    pub fn is_same_order(&self, other: &NewOrder) -> bool {
        (self.id, self.user_id, self.voucher_id) == (other.id, other.user_id, other.voucher_id)
    }
}

/// An order as `GET /voucher-order/{id}` shows it (hmdp's `VoucherOrder`).
#[derive(Debug, Clone, Serialize, FromRow, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VoucherOrder {
    pub id: OrderId,
    pub user_id: UserId,
    pub voucher_id: VoucherId,
    /// 1 balance, 2 Alipay, 3 WeChat.
    pub pay_type: u8,
    /// 1 unpaid, 2 paid, 3 used, 4 closed (cancelled or past its deadline),
    /// 5 refunding, 6 refunded.
    pub status: u8,
    #[schema(schema_with = crate::contract::local_time)]
    pub create_time: NaiveDateTime,
    #[schema(schema_with = crate::contract::local_time_or_null)]
    pub pay_time: Option<NaiveDateTime>,
    #[schema(schema_with = crate::contract::local_time_or_null)]
    pub use_time: Option<NaiveDateTime>,
    #[schema(schema_with = crate::contract::local_time_or_null)]
    pub refund_time: Option<NaiveDateTime>,
    #[schema(schema_with = crate::contract::local_time)]
    pub update_time: NaiveDateTime,
}

/// Takes `units` of stock at once if at least that many are left; `false`
/// (and nothing taken) otherwise: a transaction's orders of one voucher in
/// one statement. The guard (hmdp's optimistic lock, `stock > 0` for one
/// unit) is what prevents oversell, whatever the per-user lock does.
pub async fn take_stock_units(
    conn: &mut MySqlConnection,
    voucher_id: VoucherId,
    units: u32,
    fence: &SaleFence,
) -> Result<bool, sqlx::Error> {
    let taken = batch_sql(take_stock(voucher_id, units, fence))
        .execute(conn)
        .await?;
    Ok(taken.rows_affected() == 1)
}

/// The `UPDATE` of [`take_stock_units`], its integers written in: the
/// stock taken and the sale's fence raised to the orders' admissions, in
/// the row every write of the voucher's orders locks anyway.
fn take_stock(voucher_id: VoucherId, units: u32, fence: &SaleFence) -> String {
    format!(
        "UPDATE tb_seckill_voucher SET stock = stock - {units}{} \
         WHERE voucher_id = {voucher_id} AND stock >= {units}",
        fence.raise_clause()
    )
}

/// The voucher's stock left, its row held until the transaction ends: read
/// when [`take_stock_units`] found fewer units than orders, so that exactly
/// as many orders as units left are written.
pub async fn stock_left(
    conn: &mut MySqlConnection,
    voucher_id: VoucherId,
) -> Result<u32, sqlx::Error> {
    let left: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(stock AS SIGNED) FROM tb_seckill_voucher WHERE voucher_id = ? FOR UPDATE",
    )
    .bind(voucher_id)
    .fetch_optional(conn)
    .await?;
    Ok(left.map_or(0, |left| u32::try_from(left).unwrap_or(0)))
}

/// Deletes orders `ids` that this transaction inserted and will not write
/// after all (no unit left for them).
pub async fn delete_orders(conn: &mut MySqlConnection, ids: &[OrderId]) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    let ids = listed(ids);
    batch_sql(format!("DELETE FROM tb_voucher_order WHERE id IN ({ids})"))
        .execute(conn)
        .await
        .map(drop)
}

/// What the order transaction looks up before it writes, every statement
/// in one round trip: the orders among `ids` written already
/// (idempotency) and, per voucher, the users among `users` who already hold
/// an active order of it (unpaid, paid or used: a closed order gave the
/// buyer's turn back), the per-user count of the purchase.
#[derive(Debug, Default)]
pub struct Lookup {
    pub ids: Vec<OrderId>,
    pub users: BTreeMap<VoucherId, Vec<UserId>>,
}

/// What a [`Lookup`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// The orders among the ids looked up that exist, as they were written:
    /// a consumer compares them with what it was asked to write, which
    /// tells a redelivered order from an order id reused for another order.
    pub written: Vec<NewOrder>,
    /// The users looked up who hold an active order, with its voucher.
    pub holders: HashSet<(UserId, VoucherId)>,
}

impl Lookup {
    /// Runs the lookup on `conn`, after `opening` (a statement without rows,
    /// such as `BEGIN`) in the same round trip.
    pub(super) async fn run(
        &self,
        conn: &mut MySqlConnection,
        opening: Option<&str>,
    ) -> Result<Found, sqlx::Error> {
        let ids = (!self.ids.is_empty()).then(|| {
            format!(
                "SELECT id, user_id, CAST(voucher_id AS SIGNED) AS voucher_id \
                 FROM tb_voucher_order WHERE id IN ({})",
                listed(&self.ids)
            )
        });
        let users = (self.users.iter()).filter(|(_, users)| !users.is_empty());
        let holders = users.clone().map(|(voucher_id, users)| {
            format!(
                concat!(
                    "SELECT DISTINCT user_id FROM tb_voucher_order WHERE voucher_id = {} AND ",
                    active_order!(),
                    " AND user_id IN ({})"
                ),
                voucher_id,
                listed(users)
            )
        });
        let statements: Vec<String> = (opening.map(str::to_owned).into_iter())
            .chain(ids.clone())
            .chain(holders)
            .collect();
        if statements.is_empty() {
            return Ok(Found::default());
        }
        let sets = result_sets(conn, statements.join("; ")).await?;
        if sets.len() != statements.len() {
            return Err(sqlx::Error::Protocol(format!(
                "{} result sets for {} statements",
                sets.len(),
                statements.len()
            )));
        }
        let mut sets = sets.into_iter().skip(usize::from(opening.is_some()));
        let mut found = Found::default();
        if ids.is_some() {
            let rows = sets.next().expect("a result set per statement");
            found.written = rows
                .iter()
                .map(NewOrder::from_row)
                .collect::<Result<_, _>>()?;
        }
        for ((voucher_id, _), rows) in users.zip(sets) {
            for row in rows {
                found
                    .holders
                    .insert((row.try_get::<UserId, _>(0)?, *voucher_id));
            }
        }
        Ok(found)
    }
}

/// Runs `lookup` in a transaction begun already (one whose fences went
/// first); [`Tx::begin_looking_up`](super::Tx::begin_looking_up) begins one
/// with it.
pub async fn look_up(conn: &mut MySqlConnection, lookup: &Lookup) -> Result<Found, sqlx::Error> {
    lookup.run(conn, None).await
}

/// The rows of each statement of `sql` (several, sent as text in one round
/// trip), a result set per statement, rows or not.
async fn result_sets(
    conn: &mut MySqlConnection,
    sql: String,
) -> Result<Vec<Vec<MySqlRow>>, sqlx::Error> {
    let mut sets = Vec::new();
    let mut rows = Vec::new();
    let mut results = batch_sql(sql).fetch_many(conn);
    // A statement's rows, then its end (an OK or EOF packet).
    while let Some(result) = results.try_next().await? {
        match result {
            Either::Left(_) => sets.push(std::mem::take(&mut rows)),
            Either::Right(row) => rows.push(row),
        }
    }
    Ok(sets)
}

/// Inserts `orders` and takes their units of stock, in one round trip: the
/// multi-row `INSERT`, then for each voucher, in voucher order, the
/// `UPDATE` of [`take_stock_units`]: the stock rows are locked last, in
/// one order for every transaction. The vouchers whose units were NOT
/// taken (fewer left than orders), with their orders' count; the orders
/// stay inserted and the rest of the stock taken. An `INSERT` MySQL
/// refuses runs none of the `UPDATE`s.
pub async fn insert_orders_taking_stock(
    conn: &mut MySqlConnection,
    orders: &[NewOrder],
) -> Result<Vec<(VoucherId, u32)>, sqlx::Error> {
    if orders.is_empty() {
        return Ok(Vec::new());
    }
    let mut units: BTreeMap<VoucherId, u32> = BTreeMap::new();
    for order in orders {
        *units.entry(order.voucher_id).or_default() += 1;
    }
    let rows = listed(orders.iter().map(|order| {
        let digest = order
            .idempotency
            .map_or("NULL".to_owned(), |key| key.to_string());
        format!(
            "({}, {}, {}, {digest})",
            order.id, order.user_id, order.voucher_id
        )
    }));
    let mut sql = format!(
        "INSERT INTO tb_voucher_order (id, user_id, voucher_id, idempotency_key_digest) \
         VALUES {rows}"
    );
    for (voucher, units) in &units {
        let of_voucher = orders.iter().filter(|order| order.voucher_id == *voucher);
        sql += "; ";
        sql += &take_stock(*voucher, *units, &SaleFence::of_orders(of_voucher));
    }
    let results: Vec<MySqlQueryResult> = batch_sql(sql).execute_many(conn).try_collect().await?;
    // The first result is the `INSERT`'s, one per `UPDATE` follows.
    if results.len() != units.len() + 1 {
        return Err(sqlx::Error::Protocol(format!(
            "{} results for an INSERT and {} UPDATEs",
            results.len(),
            units.len()
        )));
    }
    Ok(units
        .into_iter()
        .zip(&results[1..])
        .filter(|(_, taken)| taken.rows_affected() != 1)
        .map(|(units, _)| units)
        .collect())
}

/// A statement whose length follows its batch's, sent as text (`COM_QUERY`)
/// with its values — integers only — written in, never prepared. Prepared,
/// each batch size would be a statement of its own in the connection's
/// statement cache; once the cache is full every new size evicts one, and
/// sqlx sends that statement's close, a packet MySQL does not answer, right
/// before the next one. Without `TCP_NODELAY` (sqlx sets none) that next
/// packet waits for MySQL's delayed ACK: 40 to 200 ms a transaction, on a
/// node that has seen enough batch sizes (measured: a synchronous sale fell
/// from about 5,000 to 1,600 orders/s after five sales of 8,000 orders).
fn batch_sql(sql: String) -> RawSql {
    sqlx::raw_sql(AssertSqlSafe(sql))
}

/// `values` separated by commas (ids print as their number).
fn listed<T: Display>(values: impl IntoIterator<Item = T>) -> String {
    values
        .into_iter()
        .map(|value| value.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
