//! Accounts, the operator's pages: the list, creating an account (its first API key shown
//! once), issuing another key, rotating (a new key, every other one revoked), and deleting an
//! account without clusters.

use std::collections::HashMap;

use axum::Router;
use axum::extract::Path;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use http::{Method, StatusCode};
use maud::{Markup, html};

use crate::layout::{Section, csrf_field, page, text_field, time};
use crate::session::Session;
use crate::upstream::segment;
use crate::{Console, Signed};

pub(crate) fn routes() -> Router<std::sync::Arc<Console>> {
    Router::new()
        .route("/console/accounts", get(list).post(create))
        .route("/console/accounts/{id}/keys", post(new_key))
        .route("/console/accounts/{id}/delete", post(delete))
}

/// A key shown once, with what it is for.
struct ShownKey<'a> {
    account: &'a str,
    key: &'a str,
}

/// A refusal and where it belongs: beside the new account's id, or above the list.
#[derive(Clone, Copy)]
enum Refusal<'a> {
    Id(&'a str),
    List(&'a str),
}

fn list_body(
    session: &Session,
    accounts: &[serde_json::Value],
    shown: Option<ShownKey<'_>>,
    refusal: Option<Refusal<'_>>,
    typed: &str,
) -> Markup {
    let id_error = match refusal {
        Some(Refusal::Id(message)) => Some(message),
        _ => None,
    };
    html! {
        h1 { "Accounts" }
        @if let Some(Refusal::List(message)) = refusal { p.error role="alert" { (message) } }
        @if let Some(shown) = shown {
            div.notice role="status" {
                "API key of " strong { (shown.account) } " (shown this once; keep it now): "
                code #new-api-key { (shown.key) }
            }
        }
        div.scroll {
            table {
                thead { tr { th scope="col" { "Account" } th scope="col" { "Created" } th scope="col" { "Keys" } th scope="col" { "Delete" } } }
                tbody #accounts {
                    @for account in accounts {
                        @let id = account["id"].as_str().unwrap_or_default();
                        tr id=(format!("account-{id}")) {
                            td { (id) }
                            td { (time(account["createdAt"].as_str().unwrap_or_default())) }
                            td {
                                div.actions {
                                    form method="post" action=(format!("/console/accounts/{}/keys", segment(id))) {
                                        (csrf_field(session))
                                        button.secondary type="submit" aria-label=(format!("New API key for {id}")) { "New API key" }
                                    }
                                    form method="post" action=(format!("/console/accounts/{}/keys", segment(id))) data-ask=(format!("Rotate {id}'s keys? Every other key of {id} stops working now.")) {
                                        (csrf_field(session))
                                        input type="hidden" name="rotate" value="true";
                                        button.secondary.rotate type="submit" aria-label=(format!("Rotate the API keys of {id}")) { "Rotate keys" }
                                    }
                                }
                            }
                            td {
                                form method="post" action=(format!("/console/accounts/{}/delete", segment(id))) data-ask=(format!("Delete account {id}? Its API keys stop working.")) {
                                    (csrf_field(session))
                                    button.danger type="submit" aria-label=(format!("Delete {id}")) { "Delete" }
                                }
                            }
                        }
                    }
                    @if accounts.is_empty() { tr { td colspan="4" .muted { "No accounts." } } }
                }
            }
        }
        h2 { "Create an account" }
        form.stacked method="post" action="/console/accounts" {
            (csrf_field(session))
            (text_field("id", "Account id", "a DNS label", typed, id_error))
            div.actions { button type="submit" { "Create account" } }
        }
    }
}

async fn render(
    signed: &Signed,
    shown: Option<ShownKey<'_>>,
    refusal: Option<Refusal<'_>>,
    typed: &str,
) -> Response {
    if !signed.session.is_operator() {
        return signed.error(StatusCode::FORBIDDEN, "Only the operator manages accounts.");
    }
    let accounts = match signed.upstream().get("/v1/accounts").await {
        Ok(answer) => answer["accounts"].as_array().cloned().unwrap_or_default(),
        Err(err) => return signed.failed(&err),
    };
    let body = list_body(&signed.session, &accounts, shown, refusal, typed);
    let status = if refusal.is_some() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    (
        status,
        Html(page(Some(&signed.session), Section::Accounts, "Accounts", body).into_string()),
    )
        .into_response()
}

async fn list(signed: Signed) -> Response {
    render(&signed, None, None, "").await
}

async fn create(
    signed: Signed,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    let id = fields.get("id").map_or("", |v| v.trim());
    match signed
        .upstream()
        .call(
            Method::POST,
            "/v1/accounts",
            Some(&serde_json::json!({"id": id})),
        )
        .await
    {
        Ok(issued) => {
            let key = issued["apiKey"].as_str().unwrap_or_default();
            render(&signed, Some(ShownKey { account: id, key }), None, "").await
        }
        Err(err) if err.status.is_client_error() => {
            render(&signed, None, Some(Refusal::Id(&err.message)), id).await
        }
        Err(err) => signed.failed(&err),
    }
}

async fn new_key(
    signed: Signed,
    Path(id): Path<String>,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    match signed
        .upstream()
        .call(
            Method::POST,
            &format!(
                "/v1/accounts/{}/apikeys{}",
                segment(&id),
                if fields.get("rotate").is_some_and(|r| r == "true") {
                    "?rotate=true"
                } else {
                    ""
                }
            ),
            None,
        )
        .await
    {
        Ok(issued) => {
            let key = issued["apiKey"].as_str().unwrap_or_default();
            render(&signed, Some(ShownKey { account: &id, key }), None, "").await
        }
        Err(err) => signed.failed(&err),
    }
}

async fn delete(
    signed: Signed,
    Path(id): Path<String>,
    axum::Form(fields): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&fields) {
        return refused;
    }
    match signed
        .upstream()
        .call(
            Method::DELETE,
            &format!("/v1/accounts/{}", segment(&id)),
            None,
        )
        .await
    {
        Ok(_) => render(&signed, None, None, "").await,
        Err(err) if err.status.is_client_error() => {
            render(&signed, None, Some(Refusal::List(&err.message)), "").await
        }
        Err(err) => signed.failed(&err),
    }
}
