//! What every request passes before a handler sees it: the checks that keep
//! a web page the user visits, or a name that rebinds to loopback, from
//! driving a server bound to the user's own machine.
//!
//! - `Host` must name the bound address (or `localhost`) when the server is
//!   bound to loopback: a DNS-rebinding page reaches 127.0.0.1 under its own
//!   host name, which this refuses.
//! - A request carrying an `Origin` other than the server's own is refused:
//!   browsers send `Origin` on cross-site POSTs (and on every `fetch`), so a
//!   page cannot use the server even through a "simple" request that skips
//!   CORS preflight.
//! - A POST must say `Content-Type: application/json`: the one type a page
//!   can send without a preflight the server would answer with no CORS
//!   headers is `text/plain` (or a form), never JSON.
//! - With `--api-key`, every route but `/health` needs
//!   `Authorization: Bearer KEY`.
//! - A `Content-Length` over the body limit is refused before the body is
//!   read.
//!
//! Every refusal is OpenAI's JSON error with the status that names it.
use super::routes::{ApiError, AppState};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::Arc;

/// What the guard checks against.
pub struct Guard {
    /// The address the listener got (its port is the one `Host` must carry).
    pub local: SocketAddr,
    /// `--host` as given (a name like `localhost` is also the server's own).
    pub host_arg: String,
    /// `--api-key`.
    pub api_key: Option<String>,
}

impl Guard {
    /// The `Host` values this server answers to, or `None` when it is bound
    /// beyond loopback (any name may then reach it; the API key is the
    /// defence there).
    fn own_hosts(&self) -> Option<Vec<String>> {
        if !self.local.ip().is_loopback() {
            return None;
        }
        let port = self.local.port();
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "[::1]".to_string(), self.host_arg.clone()];
        if self.local.is_ipv4() {
            names.push(self.local.ip().to_string());
        }
        Some(names.into_iter().flat_map(|n| [format!("{n}:{port}"), n]).collect())
    }

    /// The first rule `headers` break, as the error to answer with.
    pub fn check(&self, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
        let forbidden = |msg: String| ApiError::new(StatusCode::FORBIDDEN, msg, "invalid_request_error");
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        if let Some(own) = self.own_hosts() {
            if !own.iter().any(|o| o.eq_ignore_ascii_case(host)) {
                return Err(forbidden(format!("Host {host:?} is not this server's address (a loopback server answers only to its own; DNS rebinding guard)")));
            }
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            if !origin.eq_ignore_ascii_case(&format!("http://{host}")) {
                return Err(forbidden(format!("cross-origin request from {origin:?} refused (web pages may not use this server)")));
            }
        }
        if path != "/health" {
            if let Some(key) = &self.api_key {
                let given = headers.get(header::AUTHORIZATION).and_then(|h| h.to_str().ok()).and_then(|h| h.strip_prefix("Bearer "));
                if !given.is_some_and(|g| same(g.as_bytes(), key.as_bytes())) {
                    return Err(ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong API key (Authorization: Bearer KEY, as given to --api-key)", "invalid_request_error").code("invalid_api_key"));
                }
            }
        }
        let length = headers.get(header::CONTENT_LENGTH).and_then(|h| h.to_str().ok()).and_then(|h| h.parse::<u64>().ok());
        if length.is_some_and(|n| n > super::routes::BODY_LIMIT as u64) {
            // Refused before a byte of it is read (a body without a length
            // is cut at the limit by the handlers' extractor, same error).
            let msg = format!("request body over the limit of {} bytes", super::routes::BODY_LIMIT);
            return Err(ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, msg, "invalid_request_error"));
        }
        if method == Method::POST {
            let ty = headers.get(header::CONTENT_TYPE).and_then(|h| h.to_str().ok()).unwrap_or("");
            let essence = ty.split(';').next().unwrap_or("").trim();
            if !essence.eq_ignore_ascii_case("application/json") {
                return Err(ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("Content-Type {ty:?}: POST bodies must be application/json"), "invalid_request_error"));
            }
        }
        Ok(())
    }
}

/// Compares in time independent of where the first difference is.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The middleware: [`Guard::check`], then the handler.
pub async fn guard(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    match s.guard.check(req.method(), req.uri().path(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn guard(key: Option<&str>) -> Guard {
        Guard { local: "127.0.0.1:8080".parse().unwrap(), host_arg: "127.0.0.1".into(), api_key: key.map(String::from) }
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn status(g: &Guard, method: Method, path: &str, pairs: &[(header::HeaderName, &str)]) -> u16 {
        g.check(&method, path, &headers(pairs)).map_or_else(|e| e.status().as_u16(), |()| 200)
    }

    const JSON: (header::HeaderName, &str) = (header::CONTENT_TYPE, "application/json");

    #[test]
    fn loopback_answers_only_to_its_own_host_names() {
        let g = guard(None);
        for host in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST:8080", "[::1]:8080", "localhost"] {
            assert_eq!(status(&g, Method::GET, "/v1/models", &[(header::HOST, host)]), 200, "{host}");
        }
        for host in ["evil.example:8080", "127.0.0.1:9999", "", "127.0.0.1.evil.example:8080"] {
            assert_eq!(status(&g, Method::GET, "/v1/models", &[(header::HOST, host)]), 403, "{host}");
        }
        let open = Guard { local: "0.0.0.0:8080".parse().unwrap(), host_arg: "0.0.0.0".into(), api_key: None };
        assert_eq!(status(&open, Method::GET, "/v1/models", &[(header::HOST, "any.example")]), 200);
    }

    #[test]
    fn foreign_origins_and_non_json_posts_are_refused() {
        let g = guard(None);
        let host = (header::HOST, "127.0.0.1:8080");
        assert_eq!(status(&g, Method::POST, "/v1/chat/completions", &[host.clone(), JSON]), 200);
        assert_eq!(status(&g, Method::POST, "/v1/chat/completions", &[host.clone(), (header::CONTENT_TYPE, "application/json; charset=utf-8")]), 200);
        assert_eq!(status(&g, Method::POST, "/v1/chat/completions", &[host.clone(), (header::ORIGIN, "http://127.0.0.1:8080"), JSON]), 200);
        assert_eq!(status(&g, Method::POST, "/v1/chat/completions", &[host.clone(), (header::ORIGIN, "https://evil.example"), JSON]), 403);
        assert_eq!(status(&g, Method::POST, "/v1/adapters/x", &[host.clone(), (header::ORIGIN, "null"), JSON]), 403);
        assert_eq!(status(&g, Method::POST, "/v1/adapters/x", &[host.clone(), (header::CONTENT_TYPE, "text/plain")]), 415);
        assert_eq!(status(&g, Method::POST, "/v1/adapters/x", &[host.clone()]), 415);
        assert_eq!(status(&g, Method::DELETE, "/v1/adapters/x", &[host]), 200);
    }

    #[test]
    fn the_api_key_guards_every_route_but_health() {
        let g = guard(Some("s3cret"));
        let host = (header::HOST, "127.0.0.1:8080");
        assert_eq!(status(&g, Method::GET, "/health", &[host.clone()]), 200);
        assert_eq!(status(&g, Method::GET, "/v1/models", &[host.clone()]), 401);
        assert_eq!(status(&g, Method::GET, "/v1/models", &[host.clone(), (header::AUTHORIZATION, "Bearer s3cre")]), 401);
        assert_eq!(status(&g, Method::GET, "/v1/models", &[host.clone(), (header::AUTHORIZATION, "Basic s3cret")]), 401);
        assert_eq!(status(&g, Method::GET, "/v1/models", &[host, (header::AUTHORIZATION, "Bearer s3cret")]), 200);
    }
}
