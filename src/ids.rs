//! Typed ids of hmdp's rows: a user's, a shop's, a voucher's and an order's
//! id cannot be swapped for one another by accident, and each is parsed
//! once, where it enters (a path, a session, a row).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize, Serializer};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;

/// `tb_user.id`. In JSON a number, as hmdp's front end reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type, Serialize)]
#[sqlx(transparent)]
#[serde(transparent)]
pub struct UserId(u64);

/// `tb_shop.id`. In JSON a number, as hmdp's front end reads it: shop ids
/// are small (hmdp's own run to 14), and the pages put them in URLs as they
/// are. Read back from JSON too: the shop cache keeps shops as JSON.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type, Serialize, Deserialize,
)]
#[sqlx(transparent)]
#[serde(transparent)]
pub struct ShopId(u64);

/// `tb_voucher.id`. In JSON a string: JavaScript numbers lose precision
/// past 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type)]
#[sqlx(transparent)]
pub struct VoucherId(i64);

/// `tb_voucher_order.id`, from the Redis id worker (`sync`) or the admission
/// script (`queue`, `stream`), one layout. In JSON a string: order ids use
/// all 63 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, sqlx::Type)]
#[sqlx(transparent)]
pub struct OrderId(i64);

/// A path id that is not a positive decimal number within range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("无效的id: {0}")]
pub struct InvalidId(String);

/// Parses a positive decimal id within `i64`: digits only, no sign, no
/// spaces, no exponent.
pub fn positive_id(raw: &str) -> Result<i64, InvalidId> {
    match raw.parse::<i64>() {
        Ok(id) if id > 0 && raw.bytes().all(|b| b.is_ascii_digit()) => Ok(id),
        _ => Err(InvalidId(raw.to_owned())),
    }
}

macro_rules! id_type {
    ($name:ident, $raw:ty) => {
        impl $name {
            pub const fn new(raw: $raw) -> Self {
                $name(raw)
            }

            pub const fn get(self) -> $raw {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

id_type!(UserId, u64);
id_type!(ShopId, u64);
id_type!(VoucherId, i64);
id_type!(OrderId, i64);

/// Voucher and order ids come in as path segments and go out as strings.
macro_rules! string_id {
    ($name:ident) => {
        impl FromStr for $name {
            type Err = InvalidId;

            fn from_str(raw: &str) -> Result<Self, InvalidId> {
                positive_id(raw).map($name)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(&self.0)
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(ID_PATTERN))
                    .description(Some(concat!(
                        stringify!($name),
                        ": a positive 64-bit number, as a string"
                    )))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

/// A path or string id: a positive decimal number within `i64`.
pub const ID_PATTERN: &str = "^[1-9][0-9]{0,18}$";

string_id!(VoucherId);
string_id!(OrderId);

/// User and shop ids come in as path segments (`/user/info/{id}`,
/// `/shop/{id}`) and go out as numbers.
macro_rules! number_id {
    ($name:ident) => {
        impl FromStr for $name {
            type Err = InvalidId;

            fn from_str(raw: &str) -> Result<Self, InvalidId> {
                positive_id(raw).map(|id| $name(id.unsigned_abs()))
            }
        }

        impl utoipa::PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1))
                    .description(Some(concat!(stringify!($name), ": a positive number")))
                    .into()
            }
        }

        impl utoipa::ToSchema for $name {}
    };
}

number_id!(UserId);
number_id!(ShopId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_ids_must_be_positive_decimal_i64() {
        assert_eq!("42".parse::<VoucherId>().unwrap(), VoucherId::new(42));
        assert_eq!(
            "9223372036854775807".parse::<OrderId>().unwrap(),
            OrderId::new(i64::MAX)
        );
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            "abc",
            "1e3",
            "9223372036854775808",
            " 1",
        ] {
            assert!(bad.parse::<VoucherId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn voucher_and_order_ids_are_json_strings_user_and_shop_ids_numbers() {
        let json = serde_json::json!({
            "voucher": VoucherId::new(10),
            "order": OrderId::new(665_762_232_012_898_305),
            "user": UserId::new(7),
            "shop": ShopId::new(3),
        });
        assert_eq!(
            json.to_string(),
            r#"{"order":"665762232012898305","shop":3,"user":7,"voucher":"10"}"#
        );
        assert_eq!("3".parse::<ShopId>().unwrap(), ShopId::new(3));
        assert!("0".parse::<UserId>().is_err());
    }
}
