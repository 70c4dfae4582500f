//! `/user/*`: login by phone code, the current user, a user's details, logout.

use actix_web::{web, HttpResponse};
use rand::distr::{Alphanumeric, SampleString};
use serde::Deserialize;

use super::guards::ClientIp;
use super::response::{ok, ok_data};
use super::AppState;
use crate::auth::{CurrentUser, Phone};
use crate::error::Error;
use crate::ids::UserId;
use crate::limits::{Rule, EVERYONE};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/user/code", web::post().to(send_code))
        .route("/user/login", web::post().to(login))
        .route("/user/me", web::get().to(me))
        .route("/user/info/{id}", web::get().to(info))
        .route("/user/logout", web::post().to(logout));
}

#[derive(Deserialize)]
struct CodeQuery {
    phone: String,
}

async fn send_code(
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

#[derive(Deserialize)]
struct LoginForm {
    phone: String,
    code: String,
}

/// A login. Every attempt counts against the phone's wrong codes before
/// its code is looked at, and a right code gives its count back: guesses
/// sent all at once are counted as they come, and guessing one phone's code
/// is bounded whatever the number of addresses it comes from.
async fn login(
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

async fn me(current: CurrentUser) -> HttpResponse {
    ok_data(current.user)
}

/// A user's details (the user page's introduction); `{"success":true}`
/// without data for a user who never filled them in, as hmdp answers. A
/// login is needed, as in hmdp; any user's details may be read (hmdp's page
/// of another user shows them).
async fn info(
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

async fn logout(state: web::Data<AppState>, current: CurrentUser) -> Result<HttpResponse, Error> {
    state.sessions.close(&current.token).await?;
    Ok(ok())
}
