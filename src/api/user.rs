//! `/user/*`: login by phone code, the current user, a user's details, logout.

use actix_web::{web, HttpResponse};
use rand::distr::{Alphanumeric, SampleString};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

use super::guards::ClientIp;
use super::response::{ok, ok_data, ApiResult};
use super::AppState;
use crate::auth::{CurrentUser, Phone};
use crate::contract::{Backend, BadBody, BadInput, Limited, NoRoute, SignedIn};
use crate::error::Error;
use crate::ids::UserId;
use crate::limits::{Rule, EVERYONE};
use crate::store::{User, UserInfo};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/user/code").route(web::post().to(send_code)))
        .service(web::resource("/user/login").route(web::post().to(login)))
        .service(web::resource("/user/me").route(web::get().to(me)))
        .service(web::resource("/user/info/{id}").route(web::get().to(info)))
        .service(web::resource("/user/logout").route(web::post().to(logout)));
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct CodeQuery {
    /// A mainland China mobile number, 11 digits.
    #[param(example = "13800138000")]
    phone: String,
}

/// Issues a 6-digit login code for the phone, kept in Redis for two
/// minutes (there is no SMS gateway); one phone may ask once per
/// `--code-interval-secs`.
#[utoipa::path(
    post,
    path = "/user/code",
    tag = "user",
    params(CodeQuery),
    responses(
        (status = 200, description = "Sent, or `PHONE_INVALID`, `CODE_TOO_FREQUENT`.", body = ApiResult<utoipa::TupleUnit>),
        BadInput,
        Limited,
        Backend,
    ),
)]
pub(super) async fn send_code(
    state: web::Data<AppState>,
    client: ClientIp,
    query: web::Query<CodeQuery>,
) -> Result<HttpResponse, Error> {
    let phone = Phone::parse(&query.phone)?;
    (state.limits)
        .take(&[(Rule::CodeByIp, &client), (Rule::CodeByAll, &EVERYONE)])
        .await?;
    state.sessions.issue_code(&phone).await?;
    tracing::debug!("login code issued");
    Ok(ok())
}

#[derive(Deserialize, ToSchema)]
pub(super) struct LoginForm {
    /// The phone the code was sent to.
    #[schema(example = "13800138000")]
    phone: String,
    /// The code `/user/code` sent.
    code: String,
}

/// A login. Every attempt counts against the phone's wrong codes before
/// its code is looked at, and a right code gives its count back: guesses
/// sent all at once are counted as they come, and guessing one phone's code
/// is bounded whatever the number of addresses it comes from.
#[utoipa::path(
    post,
    path = "/user/login",
    tag = "user",
    request_body = LoginForm,
    responses(
        (status = 200, description = "The session token, or `PHONE_INVALID`, `CODE_INVALID`.", body = ApiResult<String>),
        BadBody,
        Limited,
        Backend,
    ),
)]
pub(super) async fn login(
    state: web::Data<AppState>,
    client: ClientIp,
    form: web::Json<LoginForm>,
) -> Result<HttpResponse, Error> {
    let phone = Phone::parse(&form.phone)?;
    let limits = &state.limits;
    limits
        .take(&[
            (Rule::LoginByIp, &client),
            (Rule::WrongCodesByPhone, &phone),
            (Rule::LoginByAll, &EVERYONE),
        ])
        .await?;
    state.sessions.check_code(&phone, &form.code).await?;
    limits.give_back(Rule::WrongCodesByPhone, &phone).await;
    let nick_name = format!("user_{}", Alphanumeric.sample_string(&mut rand::rng(), 10));
    let user = state
        .store
        .find_or_create_user(phone.as_str(), &nick_name)
        .await?;
    let token = state.sessions.open(&user).await?;
    Ok(ok_data(token))
}

/// The logged-in user.
#[utoipa::path(
    get,
    path = "/user/me",
    tag = "user",
    security(("session" = [])),
    responses(
        (status = 200, description = "The user.", body = ApiResult<User>),
        SignedIn,
        Backend,
    ),
)]
pub(super) async fn me(current: CurrentUser) -> HttpResponse {
    ok_data(current.user)
}

/// A user's details (the user page's introduction); `{"success":true}`
/// without data for a user who never filled them in, as hmdp answers. A
/// login is needed, as in hmdp; any user's details may be read (hmdp's page
/// of another user shows them).
#[utoipa::path(
    get,
    path = "/user/info/{id}",
    tag = "user",
    params(("id" = String, Path, description = "The user's id.", pattern = "^[1-9][0-9]{0,18}$")),
    security(("session" = [])),
    responses(
        (status = 200, description = "The details, or no `data`.", body = ApiResult<UserInfo>),
        BadInput,
        NoRoute,
        SignedIn,
        Backend,
    ),
)]
pub(super) async fn info(
    state: web::Data<AppState>,
    _: CurrentUser,
    id: web::Path<String>,
) -> Result<HttpResponse, Error> {
    let id: UserId = id.parse()?;
    Ok(match state.store.user_info(id).await? {
        Some(info) => ok_data(info),
        None => ok(),
    })
}

/// Ends the session.
#[utoipa::path(
    post,
    path = "/user/logout",
    tag = "user",
    security(("session" = [])),
    responses(
        (status = 200, description = "Logged out.", body = ApiResult<utoipa::TupleUnit>),
        SignedIn,
        Backend,
    ),
)]
pub(super) async fn logout(
    state: web::Data<AppState>,
    current: CurrentUser,
) -> Result<HttpResponse, Error> {
    state.sessions.close(&current.token).await?;
    Ok(ok())
}
