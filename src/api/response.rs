//! hmdp's `Result` body: `{"success":true,"data":...,"total":N}` or
//! `{"success":false,"errorMsg":"...","errorCode":"..."}`, null fields left out.

use actix_web::HttpResponse;
use serde::Serialize;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiResult<T> {
    pub success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_msg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<&'static str>,
}

impl ApiResult<()> {
    pub fn fail(message: String, code: &'static str) -> Self {
        ApiResult {
            success: false,
            error_msg: Some(message),
            data: None,
            total: None,
            error_code: Some(code),
        }
    }
}

/// `{"success":true}`.
pub fn ok() -> HttpResponse {
    HttpResponse::Ok().json(ApiResult::<()> {
        success: true,
        error_msg: None,
        data: None,
        total: None,
        error_code: None,
    })
}

/// `{"success":true,"data":...}`.
pub fn ok_data<T: Serialize>(data: T) -> HttpResponse {
    HttpResponse::Ok().json(ApiResult {
        success: true,
        error_msg: None,
        data: Some(data),
        total: None,
        error_code: None,
    })
}

/// Serializes a 64-bit id as a JSON string: JavaScript numbers lose precision
/// past 2^53, and order ids use all 63 bits.
pub mod id_string {
    use serde::Serializer;

    pub fn serialize<S: Serializer>(id: &i64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(id)
    }
}
