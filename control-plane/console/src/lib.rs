//! Flotilla's web console at `/console/` on the service's own port: server-rendered pages
//! (maud) with a little JavaScript for live updates, assets compiled into the binary. It is a
//! client of the management API and the tenant APIs (through the router in memory, with the
//! signed-in user's key and the browser's address), never of storage.
//!
//! Signing in exchanges an API key (or the operator token) for a sealed session cookie; every
//! form carries the session's CSRF token.

mod accounts;
mod clusters;
mod layout;
mod live;
mod metrics;
mod nodepools;
pub mod session;
mod upstream;
mod workloads;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use http::request::Parts;
use http::{Extensions, StatusCode};
use maud::{Markup, html};

use crate::layout::{Section, error_page, page, text_field};
use crate::session::{Sealer, Session};
use crate::upstream::Upstream;

/// Which facts of the browser's connection (its address, set by the server as a request
/// extension) an upstream call carries. Only those: the router's own extensions (matched
/// path parameters) must not leak into the inner request.
pub type ConnectionFacts = fn(&Extensions) -> Extensions;

/// The console: what it calls, which connection facts it passes on, and how it seals
/// sessions.
pub struct Console {
    upstream: Router,
    connection_facts: ConnectionFacts,
    sealer: Sealer,
}

/// Shared state of the console's handlers.
type Shared = State<Arc<Console>>;

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

impl Console {
    /// A console calling `upstream` (the management and tenant APIs' router, without the
    /// console) with what `connection_facts` keeps of each browser request's extensions,
    /// sealing sessions with `session_key` (the same on every replica).
    pub fn new(
        upstream: Router,
        connection_facts: ConnectionFacts,
        session_key: &[u8; 32],
    ) -> Arc<Self> {
        Arc::new(Console {
            upstream,
            connection_facts,
            sealer: Sealer::new(session_key),
        })
    }

    /// The routes under `/console`.
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/console", get(|| async { Redirect::to("/console/") }))
            .route("/console/", get(home))
            .route("/console/assets/console.css", get(stylesheet))
            .route("/console/assets/console.js", get(script))
            .route("/console/sign-in", get(sign_in_form).post(sign_in))
            .route("/console/sign-out", post(sign_out))
            .merge(clusters::routes())
            .merge(nodepools::routes())
            .merge(workloads::routes())
            .merge(accounts::routes())
            .merge(metrics::routes())
            .merge(live::routes())
            .with_state(self.clone())
    }
}

/// A signed-in request: the session and the browser's connection facts (its address), which
/// every upstream call carries.
pub struct Signed {
    /// The session.
    pub session: Session,
    connection: Extensions,
    console: Arc<Console>,
}

impl Signed {
    /// The upstream caller acting as this user.
    pub fn upstream(&self) -> Upstream<'_> {
        Upstream::new(
            &self.console.upstream,
            &self.session.api_key,
            &self.connection,
        )
    }

    /// An error page for this user.
    pub fn error(&self, status: StatusCode, message: &str) -> Response {
        error_page(Some(&self.session), status, message)
    }

    /// The page for an upstream failure: its status and its one-line message.
    pub fn failed(&self, err: &upstream::UpstreamError) -> Response {
        self.error(err.status, &err.message)
    }

    /// The 403 page for a form whose CSRF token is not this session's; `None` when it is.
    pub fn refuse_forged(&self, form: &HashMap<String, String>) -> Option<Response> {
        match form.get("csrf") {
            Some(token) if self.session.csrf_matches(token) => None,
            _ => Some(self.error(
                StatusCode::FORBIDDEN,
                "This form did not come from this console session (its CSRF token is missing or wrong); reload the page and try again.",
            )),
        }
    }
}

impl FromRequestParts<Arc<Console>> for Signed {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Arc<Console>,
    ) -> Result<Self, Self::Rejection> {
        let session = session::cookie_value(&parts.headers)
            .and_then(|cookie| console.sealer.open(cookie, now()));
        match session {
            Some(session) => Ok(Signed {
                session,
                connection: (console.connection_facts)(&parts.extensions),
                console: console.clone(),
            }),
            None => {
                // Back to where they were going once signed in (a path of the console only).
                let next = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str())
                    .filter(|p| p.starts_with("/console/") && !p.starts_with("/console/live/"))
                    .unwrap_or("/console/");
                let target: String = form_urlencoded::Serializer::new(String::new())
                    .append_pair("next", next)
                    .finish();
                Err(Redirect::to(&format!("/console/sign-in?{target}")).into_response())
            }
        }
    }
}

async fn home(signed: Signed) -> Response {
    if signed.session.is_operator() {
        Redirect::to("/console/accounts").into_response()
    } else {
        Redirect::to("/console/clusters").into_response()
    }
}

async fn stylesheet() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../assets/console.css"),
    )
}

async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../assets/console.js"),
    )
}

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (http::header::CONTENT_TYPE, content_type),
            (http::header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        text,
    )
        .into_response()
}

fn sign_in_page(next: &str, key_error: Option<&str>) -> Markup {
    let body = html! {
        h1 { "Sign in" }
        p { "Use an account's API key (the one in " code { "flotilla.json" } " or from "
            code { "flotilla account new-key" } "), or the operator token to manage accounts." }
        form.stacked method="post" action="/console/sign-in" {
            input type="hidden" name="next" value=(next);
            (text_field("api_key", "API key", "", "", key_error))
            div.actions { button type="submit" { "Sign in" } }
        }
    };
    page(None, Section::SignIn, "Sign in", body)
}

async fn sign_in_form(Query(query): Query<HashMap<String, String>>) -> Response {
    let next = query.get("next").map_or("/console/", String::as_str);
    Html(sign_in_page(next, None).into_string()).into_response()
}

/// The browser's connection facts (its address) without a session.
pub struct Connection(Extensions);

impl FromRequestParts<Arc<Console>> for Connection {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Arc<Console>,
    ) -> Result<Self, Self::Rejection> {
        Ok(Connection((console.connection_facts)(&parts.extensions)))
    }
}

/// Exchanges an API key for a session: the management API says who it is.
async fn sign_in(
    State(console): Shared,
    Connection(connection): Connection,
    axum::Form(form): axum::Form<HashMap<String, String>>,
) -> Response {
    let key = form.get("api_key").map(|k| k.trim()).unwrap_or_default();
    let next = form
        .get("next")
        .map(String::as_str)
        .filter(|n| n.starts_with("/console/") && !n.starts_with("//"))
        .unwrap_or("/console/");
    if key.is_empty() {
        let page = sign_in_page(next, Some("Enter an API key."));
        return (StatusCode::UNPROCESSABLE_ENTITY, Html(page.into_string())).into_response();
    }
    let identity = Upstream::new(&console.upstream, key, &connection)
        .get("/v1/identity")
        .await;
    let account = match identity {
        Ok(identity) if identity["operator"] == true => None,
        Ok(identity) => identity["accountId"].as_str().map(str::to_string),
        Err(err) if err.status == StatusCode::UNAUTHORIZED => {
            let page = sign_in_page(next, Some("That API key is not valid."));
            return (StatusCode::UNAUTHORIZED, Html(page.into_string())).into_response();
        }
        Err(err) => return error_page(None, err.status, &err.message),
    };
    let session = Session::new(key.to_string(), account, now());
    (
        StatusCode::SEE_OTHER,
        [
            (http::header::LOCATION, next.to_string()),
            (
                http::header::SET_COOKIE,
                session::set_cookie(&console.sealer.seal(&session)),
            ),
        ],
    )
        .into_response()
}

async fn sign_out(
    signed: Signed,
    axum::Form(form): axum::Form<HashMap<String, String>>,
) -> Response {
    if let Some(refused) = signed.refuse_forged(&form) {
        return refused;
    }
    (
        StatusCode::SEE_OTHER,
        [
            (http::header::LOCATION, "/console/sign-in".to_string()),
            (http::header::SET_COOKIE, session::clear_cookie()),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = "<script>alert(1)</script>";

    /// Every page piece shows what users and clusters say as text, never as markup.
    #[test]
    fn every_template_escapes_what_it_is_given() {
        let session = Session::new("k".into(), Some("acme".into()), 0);
        let pool = serde_json::json!({"name": SCRIPT, "status": "DEGRADED", "instanceTypes": [SCRIPT],
            "health": {"issues": [{"code": "Ec2SubnetNotFound", "message": SCRIPT}]},
            "scalingConfig": {"minSize": 1, "maxSize": 2, "desiredSize": 1}});
        let pod = serde_json::json!({"metadata": {"namespace": "default", "name": SCRIPT},
            "status": {"phase": SCRIPT}, "spec": {"nodeName": SCRIPT}});
        let cluster = serde_json::json!({"name": "prod", "status": "FAILED", "statusReason": SCRIPT,
            "tags": {"team": SCRIPT}, "health": {"issues": [{"code": "X", "message": SCRIPT}]}});
        let rendered = [
            nodepools::pool_row(&session, "prod", &pool).into_string(),
            workloads::pod_row(&pod).into_string(),
            clusters::overview_facts(&cluster).into_string(),
            page(
                Some(&session),
                layout::Section::Clusters,
                SCRIPT,
                html! { (SCRIPT) },
            )
            .into_string(),
        ];
        for html in &rendered {
            assert!(!html.contains("<script>alert"), "{html}");
        }
        assert!(rendered[0].contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }
}
