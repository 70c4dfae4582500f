//! The pieces of the API's OpenAPI contract that the handlers and the
//! types they answer with name: the body of a failure and every `errorCode`,
//! the sets of statuses a route may answer, and the schemas serde's own
//! shapes do not say (a local time, an unsigned 64-bit id). The document
//! itself is put together in `api/openapi.rs`.

use std::collections::BTreeMap;

use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Response, ResponseBuilder};
use utoipa::{IntoResponses, PartialSchema, ToSchema};

use crate::error::Error;

/// `errorCode`: what went wrong, stable across releases (the message is
/// for people and may change).
pub struct ErrorCode;

impl PartialSchema for ErrorCode {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "What went wrong, stable across releases; `errorMsg` says it \
                 in Chinese for people.",
            ))
            .enum_values(Some(Error::codes()))
            .into()
    }
}

impl ToSchema for ErrorCode {}

/// The body of every answer but a success.
pub struct Failure;

impl PartialSchema for Failure {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .property(
                "success",
                ObjectBuilder::new()
                    .schema_type(Type::Boolean)
                    .enum_values(Some([false])),
            )
            .property("errorMsg", ObjectBuilder::new().schema_type(Type::String))
            .property("errorCode", Ref::from_schema_name(ErrorCode::name()))
            .required("success")
            .required("errorMsg")
            .required("errorCode")
            .into()
    }
}

impl ToSchema for Failure {}

/// A failure answered with `status`, its `Failure` body.
fn failure(description: &str) -> RefOr<Response> {
    failure_with(ResponseBuilder::new().description(description))
}

fn failure_with(response: ResponseBuilder) -> RefOr<Response> {
    let body = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name(Failure::name())))
        .build();
    response.content("application/json", body).build().into()
}

/// A response header of `schema_type`.
fn header(schema_type: Type, description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(ObjectBuilder::new().schema_type(schema_type))
        .description(Some(description))
        .build()
}

fn responses<const N: usize>(
    entries: [(&str, RefOr<Response>); N],
) -> BTreeMap<String, RefOr<Response>> {
    (entries.into_iter())
        .map(|(status, response)| (status.to_owned(), response))
        .collect()
}

/// A route that reads ids from its path or its query.
pub struct BadInput;

impl IntoResponses for BadInput {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses([(
            "400",
            failure(
                "`BAD_REQUEST`: an id, a query parameter or a field is malformed or out of range.",
            ),
        )])
    }
}

/// A route that reads a JSON body.
pub struct BadBody;

impl IntoResponses for BadBody {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses([
            (
                "400",
                failure("`BAD_REQUEST`: the body is not the JSON described, or a field is out of range."),
            ),
            (
                "408",
                failure("`REQUEST_TIMEOUT`: the body did not arrive within the body deadline."),
            ),
            (
                "413",
                failure("`PAYLOAD_TOO_LARGE`: the body is over 16 KiB."),
            ),
        ])
    }
}

/// A route with its ids in the path: an empty one leaves a path that
/// matches no route.
pub struct NoRoute;

impl IntoResponses for NoRoute {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses([(
            "404",
            failure("`NOT_FOUND`: an empty path segment leaves a path no route matches."),
        )])
    }
}

/// A logged-in user's route.
pub struct SignedIn;

impl IntoResponses for SignedIn {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses([(
            "401",
            failure("`UNAUTHORIZED`: no `authorization` header, or its session is over."),
        )])
    }
}

/// An admin route.
pub struct AdminOnly;

impl IntoResponses for AdminOnly {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        responses([(
            "403",
            failure("`FORBIDDEN`: no `x-admin-token` header, or not the node's."),
        )])
    }
}

/// A route counted against a request limit (docs/limits.md).
pub struct Limited;

impl IntoResponses for Limited {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let limited = ResponseBuilder::new()
            .description(
                "`RATE_LIMITED`: over one of the request limits; asked again \
                 after `Retry-After` seconds, it is counted again.",
            )
            .header(
                "retry-after",
                header(
                    Type::Integer,
                    "Seconds until the limit lets a request through.",
                ),
            )
            .header(
                "ratelimit",
                header(
                    Type::String,
                    "The limit that refused: its name, what is left, when it resets.",
                ),
            )
            .header(
                "ratelimit-policy",
                header(Type::String, "The limit's quota and window."),
            );
        responses([("429", failure_with(limited))])
    }
}

/// A route that reads or writes MySQL or Redis.
pub struct Backend;

impl IntoResponses for Backend {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let unavailable = ResponseBuilder::new()
            .description(
                "`UNAVAILABLE`: MySQL or Redis did not answer within the \
                 backend timeout; nothing was kept, the request may be sent \
                 again. `OVERLOADED` (purchases only): the node has as many \
                 purchases in flight as it finishes in time.",
            )
            .header(
                "retry-after",
                header(Type::Integer, "With `OVERLOADED`: seconds to wait."),
            );
        responses([
            (
                "500",
                failure("`INTERNAL`: a fault of the node's own, logged with its cause."),
            ),
            ("503", failure_with(unavailable)),
        ])
    }
}

/// A local date and time as hmdp writes them: `2026-12-02T20:00:00`, no
/// zone (MySQL's `TIMESTAMP` in the session's time zone), in the years a
/// voucher's times may take (1971 to 2037).
pub fn local_time() -> Schema {
    local_time_of(Type::String.into())
}

/// [`local_time`], or `null` where there is none (an unpaid order's
/// `payTime`).
pub fn local_time_or_null() -> Schema {
    local_time_of(utoipa::openapi::schema::SchemaType::from_iter([
        Type::String,
        Type::Null,
    ]))
}

fn local_time_of(schema_type: utoipa::openapi::schema::SchemaType) -> Schema {
    ObjectBuilder::new()
        .schema_type(schema_type)
        .pattern(Some(concat!(
            r"^(197[1-9]|19[89][0-9]|20[0-2][0-9]|203[0-7])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
            r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?$",
        )))
        .description(Some("A local date and time, without a zone."))
        .examples(["2026-12-02T20:00:00"])
        .into()
}

/// An unsigned 64-bit integer (`BIGINT UNSIGNED`): 0 to 2^64 - 1, where
/// OpenAPI's `int64` stops at 2^63 - 1.
pub fn unsigned_64() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .minimum(Some(0))
        .maximum(Some(u64::MAX as usize))
        .into()
}
