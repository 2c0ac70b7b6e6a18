//! The in-memory transport of a tenant's control loops: a kube-rs client whose requests go
//! straight to the router of this process (no TLS, no socket), with an identity only code in
//! this process can give.

use std::convert::Infallible;

use axum::Router;
use flotilla_apiserver::authn::{InProcessIdentity, UserInfo};
use http::{Request, Response, Uri};
use tower::ServiceExt;

/// A kube client for cluster `id`, acting as `user`, served by `router` in this process.
pub fn client(router: Router, id: &str, user: UserInfo) -> kube::Client {
    let prefix = format!("/clusters/{id}");
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let (router, prefix, user) = (router.clone(), prefix.clone(), user.clone());
        async move {
            let (mut parts, body) = request.into_parts();
            let path_and_query = parts
                .uri
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            parts.uri = format!("{prefix}{path_and_query}")
                .parse::<Uri>()
                .unwrap_or_else(|_| Uri::from_static("/"));
            parts.extensions.insert(InProcessIdentity(user));
            let request = Request::from_parts(parts, axum::body::Body::new(body));
            let response = router
                .oneshot(request)
                .await
                .unwrap_or_else(|never: Infallible| match never {});
            Ok::<Response<axum::body::Body>, Infallible>(response)
        }
    });
    kube::Client::new(service, "default")
}
