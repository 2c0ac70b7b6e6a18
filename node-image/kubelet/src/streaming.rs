//! `/exec`, `/attach` and `/portForward`: the client's streaming protocol on the kubelet side,
//! bridged to containerd's streaming server through CRI `Exec`/`Attach`/`PortForward`.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::server::{Body, KubeletServer, text};

/// `/exec/{ns}/{pod}/{container}` or `/attach/…`.
pub async fn exec_or_attach(
    _server: Arc<KubeletServer>,
    _namespace: &str,
    _pod: &str,
    _container: &str,
    _attach: bool,
    _request: Request<Incoming>,
) -> Response<Body> {
    text(StatusCode::NOT_IMPLEMENTED, "not implemented yet")
}

/// `/portForward/{ns}/{pod}`.
pub async fn port_forward(
    _server: Arc<KubeletServer>,
    _namespace: &str,
    _pod: &str,
    _request: Request<Incoming>,
) -> Response<Body> {
    text(StatusCode::NOT_IMPLEMENTED, "not implemented yet")
}
