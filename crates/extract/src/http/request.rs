//! One source's requests: built from the templates, sent under the shared
//! rate limit, classified as transient or permanent, and retried.
//!
//! The rate limit is whatever [`RateGate`] the caller handed in (the
//! ledger's bucket on PostgreSQL, the in-process one on SQLite). A `429` or
//! `503` with `Retry-After` pauses that gate, so every reader of the source
//! waits, not only the one that was told.
//!
//! The URL shown for a request (in logs, errors and record origins) is
//! built from the templates rendered with `***` in place of every `${ENV}`
//! value, so where a secret sits is known, not guessed. Every message that
//! leaves this module has also gone through [`Secrets::redact`], including
//! the client library's own error texts and whatever the server sent back.
//!
//! A JSON body is read to its end, or to `max_page_bytes` (counted after
//! gzip decoding), whichever comes first; a larger page is a permanent
//! error. An NDJSON or CSV body is not read here: it is handed on as a
//! [`BodyStream`] that the page decoder reads as it arrives, under the
//! same limit for the page's total and a bound on one line (ADR 0020).
//! Whether the body arrived whole is the transport's call: a body shorter
//! than its `Content-Length`, a chunked stream that stops before its last
//! chunk, a reset connection or a timeout fails here as transient. Every
//! other failure to read a body that arrived is a failure to *decode* it,
//! whatever layer fails: a gzip stream that is corrupt or ends early inside
//! a complete body, chunked framing that is garbage, a `Content-Encoding`
//! tidemark does not decode (it asks for gzip only). Those are `parse`
//! errors, never retried: the same bytes would come again (see
//! [`BodyFailure`]). Anything the page decoder later refuses (bad JSON,
//! invalid UTF-8) was received complete too, and is a parse error as well.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{
    HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, LINK, RETRY_AFTER,
};
use reqwest::{Client, Response, StatusCode, Url};
use tidemark_core::spec::{Format, HttpSourceSpec, PageLimits, Pagination, HELD_WHOLE_DIVISOR};
use tidemark_core::template::{Template, TemplateContext};
use tidemark_core::{Error, Period, Pipeline, RateGate, RetryPolicy};
use tracing::{debug, warn};

use super::paging::{self, PageRequest};
use super::secrets::Secrets;
use super::stream::{BodyStream, Overrun, StreamLimits};

/// Per-request timeout when the source sets none.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Redirects followed for one request.
const MAX_REDIRECTS: usize = 10;
/// Bytes of an error response's body quoted in the message.
const EXCERPT_BYTES: usize = 300;
/// Preallocation cap for a body whose `Content-Length` is announced: a
/// hostile or broken header must not reserve gigabytes up front.
const MAX_PREALLOCATE: usize = 16 << 20;

/// Builds and sends the requests of one source for one period.
pub(crate) struct Fetcher {
    client: Client,
    /// The rendered `url` (may hold secrets; never shown as is).
    base: Url,
    /// The `url` rendered with `***` for secrets, when that parses as a URL.
    shown_base: Option<Url>,
    /// The rendered `query`, in file order.
    query: Vec<(String, String)>,
    /// The `query` rendered with `***` for secrets.
    shown_query: Vec<(String, String)>,
    /// The rendered `headers`; those read from `${ENV}` are marked sensitive.
    headers: HeaderMap,
    pagination: Pagination,
    secrets: Secrets,
    /// The source's rate limit, when it has one.
    gate: Option<Arc<dyn RateGate>>,
    retry: RetryPolicy,
    /// What one page may hold (`max_page_bytes`, `load.memory_budget`).
    limits: PageLimits,
    /// The source's id, and `pipeline P, period Y, source S` for messages.
    source: String,
    context: String,
}

/// A page's body: read whole (JSON, and any `204`), or as it arrives
/// (NDJSON and CSV).
pub(crate) enum Body {
    Whole(Vec<u8>),
    Streamed(BodyStream),
}

/// A successful (2xx) response.
pub(crate) struct Fetched {
    /// The status (204 means "no records").
    pub(crate) status: StatusCode,
    /// The (decompressed) body.
    pub(crate) body: Body,
    /// The `Content-Type`, when the server sent one.
    pub(crate) content_type: Option<String>,
    /// The `rel="next"` link, resolved against the response URL.
    pub(crate) next_link: Option<Url>,
    /// The response's headers (`expect_count` may read one).
    pub(crate) headers: HeaderMap,
}

impl Fetcher {
    /// Renders the source's templates for `period` and prepares the client,
    /// whose every request passes `gate`. Everything wrong here is a
    /// configuration error naming the key.
    pub(crate) fn new(
        pipeline: &Pipeline,
        spec: &HttpSourceSpec,
        period: &Period,
        gate: Option<Arc<dyn RateGate>>,
    ) -> Result<Fetcher, Error> {
        let r = Renderer {
            pipeline,
            spec,
            ctx: TemplateContext {
                period,
                source_id: &spec.id,
                pipeline: &pipeline.spec.name,
            },
        };
        let url = Template::parse(&spec.url).map_err(|e| r.config("url", e))?;
        let query = r.parse_table("query", &spec.query)?;
        let headers = r.parse_table("headers", &spec.headers)?;
        let secrets = Secrets::from_templates(
            std::iter::once(&url)
                .chain(query.iter().map(|(_, t)| t))
                .chain(headers.iter().map(|(_, t)| t)),
        );
        check_pagination(spec).map_err(|(key, message)| r.config(key, message))?;
        let guard_secrets = headers.iter().any(|(_, t)| t.uses_env());
        let limits = spec.page_limits(pipeline.spec.load.memory_budget_bytes());
        let timeout = r.timeout()?;
        // A streamed page takes as long as loading its records does, so
        // its timeout is the silence allowed between two reads, not a
        // bound on the whole response.
        let client = match limits.streamed {
            true => Client::builder()
                .connect_timeout(timeout)
                .read_timeout(timeout),
            false => Client::builder().timeout(timeout),
        };
        let client = client
            .redirect(redirect_policy(guard_secrets))
            .user_agent(concat!("tidemark/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                Error::source_permanent(format!("cannot set up the HTTP client: {}", chain(&e)))
            })?;
        Ok(Fetcher {
            client,
            base: r.url(&url, &secrets)?,
            shown_base: Url::parse(&url.render_redacted(&r.ctx)).ok(),
            query: r.query(&query)?,
            shown_query: query
                .iter()
                .map(|(name, template)| (name.clone(), template.render_redacted(&r.ctx)))
                .collect(),
            headers: r.headers(&headers)?,
            pagination: spec.pagination.clone(),
            secrets,
            gate,
            retry: pipeline.retry,
            limits,
            source: spec.id.clone(),
            context: format!(
                "pipeline {}, period {period}, source {}",
                pipeline.spec.name, spec.id
            ),
        })
    }

    /// The source's secrets, to redact and seal text built elsewhere.
    pub(crate) fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The pagination style.
    pub(crate) fn pagination(&self) -> &Pagination {
        &self.pagination
    }

    /// The URL that fetches the page `request` names.
    pub(crate) fn url(&self, request: &PageRequest) -> Result<Url, Error> {
        if let PageRequest::LinkHeader { url: Some(sealed) } = request {
            return self.link_url(sealed);
        }
        let params = paging::query_params(&self.pagination, request)
            .into_iter()
            .map(|(name, value)| (name, self.secrets.unseal(&value)));
        Ok(with_query(self.base.clone(), &self.query, params))
    }

    /// The URL of `request` as it may be shown. Built from the redacted
    /// templates; a URL that came from the server (a `Link`), or a base
    /// whose redacted form is no URL (a secret in the host), is the real
    /// one redacted instead.
    pub(crate) fn show(&self, request: &PageRequest) -> Result<String, Error> {
        let shown_base = match (request, &self.shown_base) {
            (PageRequest::LinkHeader { url: Some(_) }, _) | (_, None) => None,
            (_, Some(base)) => Some(base),
        };
        let Some(base) = shown_base else {
            let url = self.url(request)?;
            return Ok(self.secrets.redact(url.as_str()).into_owned());
        };
        let params = paging::query_params(&self.pagination, request)
            .into_iter()
            .map(|(name, value)| (name, self.secrets.show_sealed(&value)));
        let url = with_query(base.clone(), &self.shown_query, params);
        Ok(self.secrets.redact(url.as_str()).into_owned())
    }

    /// A `rel="next"` URL as given by the server, plus any configured query
    /// parameter it does not carry (an API key the server does not echo).
    fn link_url(&self, sealed: &str) -> Result<Url, Error> {
        let mut url = Url::parse(&self.secrets.unseal(sealed)).map_err(|e| {
            Error::source_permanent(format!(
                "invalid next-page link {}: {e}",
                self.secrets.redact(sealed)
            ))
        })?;
        let present: HashSet<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
        let missing: Vec<&(String, String)> = self
            .query
            .iter()
            .filter(|(k, _)| !present.contains(k))
            .collect();
        if !missing.is_empty() {
            url.query_pairs_mut().extend_pairs(missing);
        }
        Ok(url)
    }

    /// One GET of `url`, after waiting for the rate limit. Errors are
    /// classified: connect/timeout/reset/truncated body, 408, 429 and 5xx
    /// are transient (with the server's `Retry-After`), anything else
    /// permanent. A gate that cannot answer (its database is down) fails
    /// the request with that database error, retried like any other.
    /// `page` only places a body that cannot be decoded.
    pub(crate) async fn get(&self, url: &Url, shown: &str, page: u64) -> Result<Fetched, Error> {
        if let Some(gate) = &self.gate {
            gate.acquire().await?;
        }
        debug!(url = %shown, "GET");
        let response = self
            .client
            .get(url.clone())
            .headers(self.headers.clone())
            .send()
            .await
            .map_err(|e| self.transport_error(shown, "request failed", e))?;
        let status = response.status();
        if !status.is_success() {
            let err = self.status_error(shown, response).await;
            self.pause_source(status, &err).await;
            return Err(err);
        }
        let next_link = self.next_link(shown, &response)?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let headers = response.headers().clone();
        if let Some(encoding) = undecoded_encoding(&headers) {
            return Err(self.undecodable(
                shown,
                page,
                &format!(
                    "the body is encoded with Content-Encoding: {encoding}, which tidemark does not \
                     decode (it asks for gzip or no encoding)"
                ),
            ));
        }
        if response
            .content_length()
            .is_some_and(|n| n > self.limits.page)
        {
            return Err(self.body_errors(shown, page).too_large(true));
        }
        let body = if self.limits.streamed && status != StatusCode::NO_CONTENT {
            let errors = self.body_errors(shown, page);
            let limits = StreamLimits {
                page: self.limits.page,
                line: self.limits.held_whole,
            };
            Body::Streamed(BodyStream::start(response, limits, move |overrun| {
                errors.overrun(overrun)
            }))
        } else {
            let read = read_body(response, self.limits.page).await;
            Body::Whole(read.map_err(|e| self.body_errors(shown, page).body_error(e))?)
        };
        Ok(Fetched {
            status,
            body,
            content_type,
            next_link,
            headers,
        })
    }

    /// A `429`/`503` with `Retry-After` is the source speaking to every
    /// client of it: the gate pauses all of this source's readers. Failing
    /// to record the pause (its database is down) leaves the error the
    /// server sent as the one to report; the next request's gate meets the
    /// database error itself.
    async fn pause_source(&self, status: StatusCode, err: &Error) {
        let throttled =
            status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE;
        let (Some(gate), Some(delay), true) = (&self.gate, err.retry_after(), throttled) else {
            return;
        };
        let delay = delay.min(self.retry.max_delay);
        match gate.pause_for(delay).await {
            Ok(()) => debug!(
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "the source asked to wait (Retry-After): every reader of it pauses"
            ),
            Err(e) => warn!(error = %e, "could not pause the other readers of this source"),
        }
    }

    /// What words the failures of page `page`'s body.
    fn body_errors(&self, shown: &str, page: u64) -> BodyErrors {
        BodyErrors {
            shown: shown.to_string(),
            page,
            secrets: self.secrets.clone(),
            limits: self.limits,
            source: self.source.clone(),
            context: self.context.clone(),
        }
    }

    /// A body that arrived but cannot be decoded: a parse error at the
    /// page, never retried.
    fn undecodable(&self, shown: &str, page: u64, what: &str) -> Error {
        self.body_errors(shown, page).undecodable(what)
    }

    fn next_link(&self, shown: &str, response: &Response) -> Result<Option<Url>, Error> {
        let values = response
            .headers()
            .get_all(LINK)
            .into_iter()
            .filter_map(|v| v.to_str().ok());
        let Some(target) = paging::next_link(values) else {
            return Ok(None);
        };
        response.url().join(&target).map(Some).map_err(|e| {
            let target = self.secrets.redact(&target);
            Error::source_permanent(format!(
                "GET {shown}: the rel=\"next\" link {target:?} is not a URL: {e}"
            ))
        })
    }

    async fn status_error(&self, shown: &str, response: Response) -> Error {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| super::retry_after::parse(v, chrono::Utc::now()));
        let redirect = response
            .headers()
            .get(reqwest::header::LOCATION)
            .filter(|_| status.is_redirection())
            .map(|to| {
                let to = String::from_utf8_lossy(to.as_bytes());
                format!(" (redirect to {to} not followed: it leaves the origin and the request carries secret headers)")
            })
            .unwrap_or_default();
        let excerpt = excerpt(response).await;
        let message = format!("GET {shown}: HTTP {status}{redirect}{excerpt}");
        let message = self.secrets.redact(&message).into_owned();
        let transient = status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
            || status.is_server_error();
        Error::Source {
            message,
            transient,
            retry_after: retry_after.filter(|_| transient),
        }
    }

    /// A failure below HTTP (connect, TLS, reset, timeout, body cut short):
    /// transient, except for a request that could not even be built or a
    /// redirect loop.
    fn transport_error(&self, shown: &str, what: &str, err: reqwest::Error) -> Error {
        transport_error(&self.secrets, shown, what, err)
    }

    /// Runs `op` (one request of page `page`, and whatever must succeed with
    /// it) until it succeeds, fails permanently, or `retry.max_attempts`
    /// tries are used up. The last transient error is then returned as
    /// permanent, so the runner does not retry again on top of this.
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        shown: &str,
        page: u64,
        mut op: F,
    ) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let policy = &self.retry;
        let mut attempt = 1;
        loop {
            let err = match op().await {
                Ok(value) => return Ok(value),
                Err(err) if err.is_transient() => err,
                Err(err) => return Err(err),
            };
            if attempt >= policy.max_attempts {
                return Err(Error::source_permanent(format!(
                    "{err} (gave up after {attempt} attempts)"
                )));
            }
            let delay = policy.delay(attempt, err.retry_after(), rand::random::<f64>());
            warn!(
                cause = %err,
                request_attempt = attempt,
                max_attempts = policy.max_attempts,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                url = %shown,
                page,
                "HTTP request failed with a transient error; retrying"
            );
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

/// A failure below HTTP (see [`Fetcher::transport_error`]).
fn transport_error(secrets: &Secrets, shown: &str, what: &str, err: reqwest::Error) -> Error {
    let transient = err.is_timeout()
        || err.is_connect()
        || err.is_request()
        || err.is_body()
        || err.is_decode();
    // The URL is in `shown` already, redacted; the client's copy is not.
    let message = format!("GET {shown}: {what}: {}", chain(&err.without_url()));
    let message = secrets.redact(&message).into_owned();
    if transient {
        Error::source_transient(message)
    } else {
        Error::source_permanent(message)
    }
}

/// Words the failures of one page's body, on the runtime or (for a
/// streamed body) in the task reading it, so it owns what it needs.
struct BodyErrors {
    shown: String,
    page: u64,
    secrets: Secrets,
    limits: PageLimits,
    source: String,
    /// `pipeline P, period Y, source S`.
    context: String,
}

impl BodyErrors {
    fn body_error(&self, err: BodyError) -> Error {
        match err {
            BodyError::Transport(e) => self.transport(e),
            BodyError::TooLarge { announced } => self.too_large(announced),
        }
    }

    /// Why a streamed body stopped early.
    fn overrun(&self, overrun: Overrun) -> Error {
        match overrun {
            Overrun::Transport(e) => self.transport(e),
            Overrun::Page => self.too_large(false),
            Overrun::Line => self.line_too_long(),
        }
    }

    fn transport(&self, e: reqwest::Error) -> Error {
        match BodyFailure::of(&e) {
            BodyFailure::Cut => transport_error(
                &self.secrets,
                &self.shown,
                "reading the response body failed",
                e,
            ),
            BodyFailure::Undecodable => self.undecodable(&format!(
                "the body arrived but cannot be decoded: {}",
                chain(&e.without_url())
            )),
        }
    }

    /// Over `max_page_bytes`: permanent, naming where the limit comes from.
    fn too_large(&self, announced: bool) -> Error {
        let limit = self.limits.page;
        let seen = if announced {
            "its Content-Length announces"
        } else {
            "it goes on past"
        };
        let key = format!("sources.{}.max_page_bytes", self.source);
        let key = match self.limits.page_configured || self.limits.streamed {
            true => key,
            false => format!("{key} (by default load.memory_budget / {HELD_WHOLE_DIVISOR})"),
        };
        let message = format!(
            "GET {}: {}: the page is larger than {key} = {limit} bytes ({}): {seen} that; \
             raise the limit if pages of this source really are this large",
            self.shown,
            self.context,
            tidemark_core::spec::ByteSize::b(limit).to_string_as(true)
        );
        Error::source_permanent(self.secrets.redact(&message).into_owned())
    }

    /// A line of a streamed page longer than one record may be.
    fn line_too_long(&self) -> Error {
        let limit = self.limits.held_whole;
        let message = format!(
            "GET {}: {}: page {} has a line longer than {limit} bytes ({}), the most one record \
             may take (load.memory_budget / {HELD_WHOLE_DIVISOR}, or max_page_bytes when smaller): \
             a record is held whole while it is parsed; raise load.memory_budget if records of \
             this source really are this large",
            self.shown,
            self.context,
            self.page,
            tidemark_core::spec::ByteSize::b(limit).to_string_as(true)
        );
        Error::source_permanent(self.secrets.redact(&message).into_owned())
    }

    /// A body that arrived but cannot be decoded: a parse error at the
    /// page, never retried.
    fn undecodable(&self, what: &str) -> Error {
        Error::Parse {
            location: tidemark_core::Location {
                resource: self.shown.clone(),
                page: Some(self.page),
                record: None,
                line: None,
            },
            message: self.secrets.redact(what).into_owned(),
        }
    }
}

/// Renders one source's templates for one period; every error is a
/// configuration error naming the source's key, and never quotes a value
/// that may hold a secret.
struct Renderer<'a> {
    pipeline: &'a Pipeline,
    spec: &'a HttpSourceSpec,
    ctx: TemplateContext<'a>,
}

impl Renderer<'_> {
    fn config(&self, key: &str, message: impl Into<String>) -> Error {
        Error::config(
            self.pipeline.file_name(),
            format!("sources.{}.{key}", self.spec.id),
            message,
        )
    }

    fn render(&self, key: &str, template: &Template) -> Result<String, Error> {
        template
            .render(&self.ctx)
            .map_err(|e| self.config(key, e.to_string()))
    }

    /// Parses every template of the `query` or `headers` table, in file order.
    fn parse_table<'t>(
        &self,
        table: &str,
        entries: impl IntoIterator<Item = (&'t String, &'t String)>,
    ) -> Result<Vec<(String, Template)>, Error> {
        entries
            .into_iter()
            .map(|(k, v)| {
                Template::parse(v)
                    .map(|t| (k.clone(), t))
                    .map_err(|e| self.config(&format!("{table}.{k}"), e))
            })
            .collect()
    }

    fn url(&self, template: &Template, secrets: &Secrets) -> Result<Url, Error> {
        let rendered = self.render("url", template)?;
        let url = Url::parse(&rendered).map_err(|e| {
            let shown = secrets.redact(&rendered);
            self.config("url", format!("invalid URL {shown}: {e}"))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            let scheme = url.scheme();
            return Err(self.config(
                "url",
                format!("the URL must be http or https, not {scheme:?}"),
            ));
        }
        Ok(url)
    }

    /// The rendered `query`. A parameter the pagination sets itself would
    /// be sent twice, so it is refused.
    fn query(&self, templates: &[(String, Template)]) -> Result<Vec<(String, String)>, Error> {
        let reserved = paging::param_names(&self.spec.pagination);
        templates
            .iter()
            .map(|(name, template)| {
                let key = format!("query.{name}");
                if reserved.contains(&name.as_str()) {
                    let why = format!("`{name}` is set by the pagination; remove it from `query`");
                    return Err(self.config(&key, why));
                }
                Ok((name.clone(), self.render(&key, template)?))
            })
            .collect()
    }

    /// The rendered `headers`, those read from `${ENV}` marked sensitive
    /// (kept out of the client's debug output), plus a default `Accept`.
    fn headers(&self, templates: &[(String, Template)]) -> Result<HeaderMap, Error> {
        let mut headers = HeaderMap::new();
        for (name, template) in templates {
            let key = format!("headers.{name}");
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| self.config(&key, format!("{name:?} is not a valid header name")))?;
            let mut value = HeaderValue::from_str(&self.render(&key, template)?).map_err(|_| {
                self.config(&key, "the value is not a valid header value once templated")
            })?;
            value.set_sensitive(template.uses_env());
            headers.append(header, value);
        }
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, HeaderValue::from_static(accept(self.spec.format)));
        }
        Ok(headers)
    }

    fn timeout(&self) -> Result<Duration, Error> {
        match &self.spec.timeout {
            Some(text) => humantime::parse_duration(text)
                .map_err(|e| self.config("timeout", format!("invalid duration {text:?}: {e}"))),
            None => Ok(DEFAULT_TIMEOUT),
        }
    }
}

/// Pagination settings that only make sense with some formats.
fn check_pagination(spec: &HttpSourceSpec) -> Result<(), (&'static str, String)> {
    match &spec.pagination {
        Pagination::Cursor { .. } if spec.format != Format::Json => Err((
            "pagination",
            "style \"cursor\" reads the next cursor from a JSON body, so it needs format = \"json\"".into(),
        )),
        Pagination::Offset { size: 0, .. } | Pagination::Page { size: Some(0), .. } => {
            Err(("pagination.size", "must be at least 1".into()))
        }
        _ => Ok(()),
    }
}

/// Follows redirects, but not away from the original origin when the
/// request carries secret headers: the client drops `Authorization` on such
/// a hop, but not a custom header such as `X-Api-Key`.
fn redirect_policy(guard_secrets: bool) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        let leaves_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() != attempt.url().origin());
        if guard_secrets && leaves_origin {
            attempt.stop()
        } else {
            attempt.follow()
        }
    })
}

fn accept(format: Format) -> &'static str {
    match format {
        Format::Json => "application/json",
        Format::Ndjson => "application/x-ndjson, application/json;q=0.9, */*;q=0.1",
        Format::Csv => "text/csv, */*;q=0.1",
    }
}

/// `url` with the configured query pairs and then the pagination's added;
/// no `?` when there are none.
fn with_query(
    mut url: Url,
    query: &[(String, String)],
    params: impl Iterator<Item = (String, String)>,
) -> Url {
    let params: Vec<(String, String)> = params.collect();
    if !query.is_empty() || !params.is_empty() {
        url.query_pairs_mut()
            .extend_pairs(query.iter().chain(params.iter()));
    }
    url
}

/// Why a body could not be read.
enum BodyError {
    /// The client failed to read it: cut short by the transport, or not
    /// decodable ([`BodyFailure`] tells which).
    Transport(reqwest::Error),
    /// Over `max_page_bytes`, as announced or as read.
    TooLarge { announced: bool },
}

/// Reads a body to its end, never holding more than `limit` bytes: an
/// announced length over the limit fails before reading, and an endless or
/// decompressing body fails as soon as it passes the limit. The chunks are
/// decoded ones (gzip), so the limit applies to the decompressed size.
async fn read_body(mut response: Response, limit: u64) -> Result<Vec<u8>, BodyError> {
    let announced = response.content_length();
    if announced.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge { announced: true });
    }
    let capacity = announced
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
        .min(MAX_PREALLOCATE);
    let mut body = Vec::with_capacity(capacity);
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Transport)? {
        if (body.len() + chunk.len()) as u64 > limit {
            return Err(BodyError::TooLarge { announced: false });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// What a failed body read means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyFailure {
    /// The transport cut it: the connection closed before the body's
    /// declared end (`Content-Length`, or the last chunk), was reset, or
    /// timed out. Transient: another try may get it whole.
    Cut,
    /// It arrived but a layer cannot decode it: a gzip stream that is
    /// corrupt or ends early inside a complete body, or chunked framing that
    /// is garbage. Permanent: the same bytes would come again.
    Undecodable,
}

impl BodyFailure {
    /// Decided from the error's causes, by type, not by message. A cause
    /// from hyper (the HTTP/1 transport) is garbage framing when its I/O
    /// cause says the data is invalid (a chunk size line that is not one),
    /// and a cut otherwise (end of input before the declared end, a reset,
    /// an incomplete message, a time-out). Without one, a time-out of the
    /// client's is a cut, and any other cause comes from a decoder above
    /// the transport (gzip) that read a body the transport delivered whole.
    fn of(err: &reqwest::Error) -> BodyFailure {
        if err.is_timeout() {
            return BodyFailure::Cut;
        }
        let causes = causes(err);
        let transport = causes
            .iter()
            .position(|c| c.downcast_ref::<hyper::Error>().is_some());
        let Some(at) = transport else {
            return match causes.iter().any(|c| is_timeout(*c)) {
                true => BodyFailure::Cut,
                false => BodyFailure::Undecodable,
            };
        };
        let invalid = causes[at..]
            .iter()
            .find_map(|c| c.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput
                )
            });
        match invalid {
            true => BodyFailure::Undecodable,
            false => BodyFailure::Cut,
        }
    }
}

/// Whether a cause is a timeout (the client's own, below reqwest's
/// outer error, or an I/O one).
fn is_timeout(cause: &(dyn std::error::Error + 'static)) -> bool {
    cause
        .downcast_ref::<reqwest::Error>()
        .is_some_and(reqwest::Error::is_timeout)
        || cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut)
}

/// An error and every cause under it, outermost first. An `io::Error`
/// wrapping another error hides it from `source()` (it reports the inner
/// error's own source), so the wrapped error is taken from `get_ref`.
fn causes<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut current = Some(err);
    while let Some(e) = current {
        out.push(e);
        current = match e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
        if out.len() > 32 {
            break;
        }
    }
    out
}

/// A `Content-Encoding` the client left undecoded: the client decodes gzip
/// (and then removes the header), so any other coding but `identity` is a
/// body tidemark cannot read.
fn undecoded_encoding(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(reqwest::header::CONTENT_ENCODING)?;
    let text = String::from_utf8_lossy(value.as_bytes()).trim().to_string();
    let identity = text
        .split(',')
        .all(|c| c.trim().is_empty() || c.trim().eq_ignore_ascii_case("identity"));
    (!identity).then_some(text)
}

/// `": <the start of the body>"` of an error response, on one line, or
/// nothing when the body is empty or unreadable.
async fn excerpt(mut response: Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(EXCERPT_BYTES)]);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// An error and its causes, `a: b: c`, without the repeats some layers add.
fn chain(err: &reqwest::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut current: Option<&dyn std::error::Error> = Some(err);
    while let Some(e) = current {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}
