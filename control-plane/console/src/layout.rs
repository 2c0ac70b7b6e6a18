//! The page shell every console page shares (header, navigation, sign-out, the connection
//! banner), the error page, and small pieces of markup (status badges, form fields with their
//! message beside them, times).

use std::collections::HashMap;

use axum::response::{Html, IntoResponse, Response};
use http::StatusCode;
use maud::{DOCTYPE, Markup, html};

use crate::session::Session;

/// Which section of the navigation a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// Clusters (an account's).
    Clusters,
    /// Accounts (the operator's).
    Accounts,
    /// Signing in.
    SignIn,
}

/// A whole page.
pub fn page(session: Option<&Session>, section: Section, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Flotilla" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/console.js" defer {}
            }
            body {
                div #connection-banner .banner role="status" hidden {
                    "Connection to the service lost — reconnecting…"
                }
                header.top {
                    a.brand href="/console/" { "Flotilla" }
                    nav aria-label="Main" {
                        @if let Some(session) = session {
                            @if session.is_operator() {
                                a href="/console/accounts" aria-current=[(section == Section::Accounts).then_some("page")] { "Accounts" }
                            } @else {
                                a href="/console/clusters" aria-current=[(section == Section::Clusters).then_some("page")] { "Clusters" }
                            }
                        }
                    }
                    @if let Some(session) = session {
                        span.muted {
                            @match &session.account {
                                Some(account) => { "Account " strong { (account) } }
                                None => { "Operator" }
                            }
                        }
                        form method="post" action="/console/sign-out" {
                            (csrf_field(session))
                            button.secondary type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The hidden field carrying the session's CSRF token.
pub fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// An error page: one readable line, never a stack trace or raw JSON.
pub fn error_page(session: Option<&Session>, status: StatusCode, message: &str) -> Response {
    let title = match status {
        StatusCode::NOT_FOUND => "Not found",
        StatusCode::FORBIDDEN => "Not allowed",
        _ => "Something went wrong",
    };
    let body = html! {
        h1 { (title) }
        p.error role="alert" { (message) }
        p { a href="/console/" { "Back to the console" } }
    };
    (
        status,
        Html(page(session, Section::Clusters, title, body).into_string()),
    )
        .into_response()
}

/// A status word coloured by its meaning.
pub fn status(text: &str) -> Markup {
    html! { span class=(format!("status status-{text}")) { (text) } }
}

/// A labelled text input with its message (when the last submission was refused for it).
pub fn text_field(name: &str, label: &str, hint: &str, value: &str, error: Option<&str>) -> Markup {
    let error_id = format!("{name}-error");
    html! {
        label for=(name) {
            (label)
            @if !hint.is_empty() { span.hint { (hint) } }
            input #(name) name=(name) value=(value)
                aria-invalid=[error.map(|_| "true")]
                aria-describedby=[error.map(|_| error_id.as_str())];
            @if let Some(error) = error { span.error id=(error_id) role="alert" { (error) } }
        }
    }
}

/// A checkbox with its label.
pub fn check_field(name: &str, label: &str, checked: bool) -> Markup {
    html! {
        label.check for=(name) {
            input #(name) type="checkbox" name=(name) value="on" checked[checked];
            (label)
        }
    }
}

/// An RFC 3339 time as `2026-12-06 03:40 UTC` (the text as given when unreadable).
pub fn time(text: &str) -> Markup {
    let shown = chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| {
            t.with_timezone(&chrono::Utc)
                .format("%Y-%m-%d %H:%M UTC")
                .to_string()
        })
        .unwrap_or_else(|_| text.to_string());
    html! { time datetime=(text) { (shown) } }
}

/// How many rows a page of a long list (clusters, pods) shows.
pub(crate) const PAGE_SIZE: usize = 50;

/// Which page of a list, from `?page=N` (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listing {
    /// Keeps the clusters whose name or a tag contains it.
    pub filter: String,
    /// 1-based.
    pub page: usize,
}

impl Listing {
    pub(crate) fn from_query(query: &HashMap<String, String>) -> Self {
        Listing {
            filter: query.get("q").cloned().unwrap_or_default(),
            page: query
                .get("page")
                .and_then(|p| p.parse().ok())
                .filter(|p| *p >= 1)
                .unwrap_or(1),
        }
    }

    /// The query string of page `page` of this listing.
    pub(crate) fn query(&self, page: usize) -> String {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("q", &self.filter)
            .append_pair("page", &page.to_string())
            .finish()
    }
}

/// "Showing 51–100 of 1000" with the links to the pages around.
pub(crate) fn pager(base: &str, listing: &Listing, shown: usize, total: usize) -> Markup {
    let first = (listing.page - 1) * PAGE_SIZE;
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    html! {
        nav.actions aria-label="Pages" {
            span.muted {
                @if shown == 0 { "None shown" } @else { "Showing " (first + 1) "–" (first + shown) }
                " of " (total)
            }
            @if listing.page > 1 { a href=(format!("{base}?{}", listing.query(listing.page - 1))) rel="prev" { "Previous" } }
            @if listing.page < pages { a href=(format!("{base}?{}", listing.query(listing.page + 1))) rel="next" { "Next" } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_read_from_the_query_and_linked_both_ways() {
        let query: HashMap<String, String> = [
            ("q".to_string(), "team=a b".to_string()),
            ("page".to_string(), "2".to_string()),
        ]
        .into();
        let listing = Listing::from_query(&query);
        assert_eq!(listing.page, 2);
        assert_eq!(listing.query(3), "q=team%3Da+b&page=3");
        let html = pager("/console/clusters", &listing, PAGE_SIZE, 3 * PAGE_SIZE).into_string();
        assert!(html.contains("Showing 51–100 of 150"), "{html}");
        assert!(html.contains("page=1") && html.contains("page=3"), "{html}");
        let bad: HashMap<String, String> = [("page".to_string(), "0".to_string())].into();
        assert_eq!(Listing::from_query(&bad).page, 1);
    }
}
