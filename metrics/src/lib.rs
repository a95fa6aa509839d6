//! stampfs's metrics: a Prometheus registry per server, served over HTTP.
//!
//! A server (the master, a chunkserver) started with `--metrics-listen ADDR` builds a
//! [`Registry`] (the `prometheus-client` crate's) with its own metrics, and [`serve`]s
//! it: `GET /metrics` answers the OpenMetrics text exposition, `GET /` the server's
//! status page ([`Exporter::with_page`]) or a line naming the metrics; anything else
//! is a 404 and any method but `GET` a 405. Before each
//! scrape the server's `refresh` hook copies values kept elsewhere (counters of the
//! operation log, of the fencing gate) into the registry. The HTTP side is hyper's
//! HTTP/1 server; a connection serves its requests one at a time and is dropped after
//! [`IDLE`] without one.
//!
//! [`Requests`] is the family every server has: requests served and their latency, by
//! operation. With a [`Token`] (`--metrics-token-file`, see [`auth`]) every request
//! must present it, or gets `401`.

pub mod auth;
pub use auth::Token;
pub use prometheus_client;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
pub use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a metrics connection may sit without a request.
pub const IDLE: Duration = Duration::from_secs(30);

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Everything that can go wrong serving metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot listen for metrics on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the metrics address to {path}: {source}")]
    AddrFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics token file {path}: {reason}")]
    TokenFile { path: String, reason: String },
}

impl Error {
    /// What failed, and the I/O error under it (for a server's own error type).
    pub fn into_parts(self) -> (String, std::io::Error) {
        match self {
            Error::Listen { addr, source } => (format!("listen for metrics on {addr}"), source),
            Error::AddrFile { path, source } => (format!("write {path}"), source),
            Error::TokenFile { path, reason } => (
                format!("read the metrics token file {path}"),
                std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
            ),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The operation a request was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Op {
    pub op: &'static str,
}

/// Requests served and their latency, by operation.
#[derive(Clone, Debug)]
pub struct Requests {
    count: Family<Op, Counter>,
    seconds: Family<Op, Histogram>,
}

impl Requests {
    /// Registers the family as `requests` and `request_seconds` in `registry`.
    pub fn register(registry: &mut Registry) -> Requests {
        let count = Family::<Op, Counter>::default();
        let seconds = Family::<Op, Histogram>::new_with_constructor(|| {
            // 50 µs to about 1.6 s.
            Histogram::new(exponential_buckets(0.00005, 2.0, 16))
        });
        registry.register("requests", "Requests served, by operation", count.clone());
        registry.register(
            "request_seconds",
            "How long requests took to serve, by operation",
            seconds.clone(),
        );
        Requests { count, seconds }
    }

    /// One request of `op`, counted but not timed (a stream, whose length is not a
    /// latency).
    pub fn count(&self, op: &'static str) {
        self.count.get_or_create(&Op { op }).inc();
    }

    /// One request of `op` that took `took`.
    pub fn observe(&self, op: &'static str, took: Duration) {
        let key = Op { op };
        self.count.get_or_create(&key).inc();
        self.seconds.get_or_create(&key).observe(took.as_secs_f64());
    }
}

/// What a metrics server serves.
pub struct Exporter {
    registry: Mutex<Registry>,
    /// Copies values kept elsewhere into the registry, before each scrape.
    refresh: Box<dyn Fn() + Send + Sync>,
    /// The server's name, for the page at `/`.
    name: String,
    /// The HTML page at `/` (a status page), if the server has one.
    page: Option<Box<dyn Fn() -> String + Send + Sync>>,
}

impl Exporter {
    pub fn new(name: &str, registry: Registry, refresh: impl Fn() + Send + Sync + 'static) -> Self {
        Exporter {
            registry: Mutex::new(registry),
            refresh: Box::new(refresh),
            name: name.to_string(),
            page: None,
        }
    }

    /// Serves `page()` (HTML) at `/` instead of the line naming the metrics.
    pub fn with_page(mut self, page: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.page = Some(Box::new(page));
        self
    }

    /// The exposition, freshly refreshed.
    pub fn render(&self) -> String {
        (self.refresh)();
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &registry) {
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        out
    }

    fn respond(&self, req: &Request<Incoming>, token: Option<&Token>) -> Response<Full<Bytes>> {
        let presented = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if token.is_some_and(|t| !t.admits(presented)) {
            let mut resp = Response::new(Full::new(Bytes::from_static(
                b"credentials needed: the token of --metrics-token-file, as \
                  `Authorization: Bearer TOKEN` or as the password of basic authentication\n",
            )));
            *resp.status_mut() = StatusCode::UNAUTHORIZED;
            resp.headers_mut().insert(
                hyper::header::WWW_AUTHENTICATE,
                hyper::header::HeaderValue::from_static(
                    "Basic realm=\"stampfs metrics\", charset=\"UTF-8\"",
                ),
            );
            return resp;
        }
        let (status, content_type, body) = match (req.method(), req.uri().path()) {
            (&Method::GET, "/metrics") => (StatusCode::OK, CONTENT_TYPE, self.render()),
            (&Method::GET, "/") => match &self.page {
                Some(page) => (StatusCode::OK, "text/html; charset=utf-8", page()),
                None => (
                    StatusCode::OK,
                    "text/plain; charset=utf-8",
                    format!(
                        "stampfs {}: metrics at /metrics (Prometheus / OpenMetrics text)\n",
                        self.name
                    ),
                ),
            },
            (&Method::GET, _) => (
                StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                "not found: the metrics are at /metrics\n".to_string(),
            ),
            _ => (
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain; charset=utf-8",
                "only GET\n".to_string(),
            ),
        };
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
            resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        resp
    }
}

/// Binds `addr` for metrics and writes the bound address to `addr_file` (written
/// whole, then renamed into place), so that `127.0.0.1:0` can be found.
pub async fn bind(addr: &str, addr_file: &Path) -> Result<tokio::net::TcpListener> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen {
            addr: addr.to_string(),
            source,
        })?;
    let bound: SocketAddr = listener.local_addr().map_err(|source| Error::Listen {
        addr: addr.to_string(),
        source,
    })?;
    let tmp = addr_file.with_extension("tmp");
    std::fs::write(&tmp, format!("{bound}\n"))
        .and_then(|()| std::fs::rename(&tmp, addr_file))
        .map_err(|source| Error::AddrFile {
            path: addr_file.display().to_string(),
            source,
        })?;
    Ok(listener)
}

/// Serves `exporter` on `listener` until the task is dropped; with `token`, only to
/// requests that present it.
pub async fn serve(
    listener: tokio::net::TcpListener,
    exporter: Arc<Exporter>,
    token: Option<Token>,
) {
    let token = token.map(Arc::new);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let exporter = exporter.clone();
        let token = token.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let resp = exporter.respond(&req, token.as_deref());
                async move { Ok::<_, std::convert::Infallible>(resp) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .header_read_timeout(IDLE)
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "metrics connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `METHOD PATH` with the extra header lines `headers` to the server at `addr`
    /// (as the addr file holds it): the whole answer.
    async fn http(addr: &str, method: &str, path: &str, headers: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr.trim())
            .await
            .expect("connect");
        s.write_all(
            format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("send");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    }

    #[test]
    fn requests_are_counted_and_timed_by_operation() {
        let mut registry = Registry::with_prefix("stampfs_test");
        let r = Requests::register(&mut registry);
        r.observe("mkdir", Duration::from_micros(300));
        r.observe("mkdir", Duration::from_millis(2));
        r.observe("stat", Duration::from_micros(80));
        let e = Exporter::new("test", registry, || {});
        let text = e.render();
        assert!(
            text.contains("stampfs_test_requests_total{op=\"mkdir\"} 2"),
            "{text}"
        );
        assert!(text.contains("stampfs_test_requests_total{op=\"stat\"} 1"));
        assert!(text.contains("stampfs_test_request_seconds_count{op=\"mkdir\"} 2"));
        assert!(text.trim_end().ends_with("# EOF"));
    }

    #[tokio::test]
    async fn the_exposition_is_served_over_http_and_other_paths_are_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("metrics-addr");
        let listener = bind("127.0.0.1:0", &file).await.expect("bind");
        let addr = std::fs::read_to_string(&file).expect("addr file");
        let mut registry = Registry::with_prefix("stampfs_test");
        let r = Requests::register(&mut registry);
        let refreshed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = refreshed.clone();
        let exporter = Arc::new(Exporter::new("test", registry, move || {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }));
        r.observe("list", Duration::from_micros(10));
        let server = tokio::spawn(serve(listener, exporter, None));
        let get = |path: &'static str, method: &'static str| http(&addr, method, path, "");
        let metrics = get("/metrics", "GET").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains(CONTENT_TYPE), "{metrics}");
        assert!(metrics.contains("stampfs_test_requests_total{op=\"list\"} 1"));
        assert_eq!(refreshed.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert!(get("/", "GET").await.starts_with("HTTP/1.1 200"));
        assert!(get("/nope", "GET").await.starts_with("HTTP/1.1 404"));
        assert!(get("/metrics", "POST").await.starts_with("HTTP/1.1 405"));
        // Garbage gets an error answer or a closed connection, and the server goes on.
        {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr.trim())
                .await
                .expect("connect");
            s.write_all(b"\x00\x01garbage\r\n\r\n").await.expect("send");
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out).await;
        }
        assert!(get("/metrics", "GET").await.starts_with("HTTP/1.1 200"));
        server.abort();
    }

    #[tokio::test]
    async fn with_a_token_only_requests_that_present_it_are_answered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("metrics-addr");
        let listener = bind("127.0.0.1:0", &file).await.expect("bind");
        let addr = std::fs::read_to_string(&file).expect("addr file");
        let registry = Registry::with_prefix("stampfs_test");
        let exporter = Arc::new(Exporter::new("test", registry, || {}));
        let token = Token::new("a-token-of-the-operator").expect("token");
        let server = tokio::spawn(serve(listener, exporter, Some(token)));
        let get = |auth: &'static str| http(&addr, "GET", "/metrics", auth);
        let refused = get("").await;
        assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
        assert!(
            refused
                .to_ascii_lowercase()
                .contains("www-authenticate: basic"),
            "{refused}"
        );
        assert!(
            !refused.contains("# EOF"),
            "nothing of the metrics: {refused}"
        );
        let wrong = get("Authorization: Bearer a-token-of-the-operatoR\r\n").await;
        assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
        let ok = get("Authorization: Bearer a-token-of-the-operator\r\n").await;
        assert!(
            ok.starts_with("HTTP/1.1 200") && ok.contains("# EOF"),
            "{ok}"
        );
        server.abort();
    }
}
