//! `transport = "http"`: records from an HTTP API, page by page.
//!
//! The reader holds one page at a time: it fetches a page, hands out its
//! records in batches of at most `load.batch_size` (a batch may span pages
//! or end inside one), and fetches the next page only when the batch needs
//! more records. Memory is one batch plus, for a JSON page, its body (at
//! most a sixteenth of `load.memory_budget`) or, for an NDJSON or CSV page,
//! a few chunks and one line of it: those pages are decoded as they arrive
//! (ADR 0020), however large the page and however long the period.
//!
//! Each batch ends at a checkpoint naming the page in progress by its
//! request (page number, offset, cursor or next URL), the records of it
//! already handed out, and a hash of those records. A resumed attempt
//! fetches that page again, skips the handed-out records and checks their
//! hash: if the page changed meanwhile, skipping would drop the wrong
//! records, so the checkpoint does not fit and the period starts over. It
//! never fetches the pages before it. When a batch ends exactly at the end
//! of a page, the checkpoint already names the next page (or says the
//! source is exhausted), so nothing is fetched twice.
//!
//! A server that ignores the pagination would be paged forever: every
//! request of the period and the hash of every body are remembered, and a
//! page whose body is one already seen, or a cursor or link already
//! followed, fails the period; `max_pages` is the last guard.
//!
//! Requests are retried here, per request, for transient failures (see
//! [`request`]); the runner sees only permanent errors, and every error
//! leaving the reader has its secrets redacted.

mod json_page;
pub(crate) mod limiter;
mod page;
mod paging;
mod request;
mod retry_after;
pub(crate) mod secrets;
mod stream;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_core::spec::{ExpectCount, Format, HttpSourceSpec, Pagination};
use tidemark_core::{Error, Period, Pipeline, RateGate, RawData, RawRecord};
use tracing::{debug, warn};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::file::csv_file::CsvRules;
use crate::{Batch, Checkpoint};
use page::{Decoder, PageInput, Records};
use paging::{Continuation, PageRequest};
use request::{Body, Fetcher};

/// The checkpoint format's version; bump it when its meaning changes.
/// Version 2 added the hash of the records handed out of the page in
/// progress; a checkpoint of another version does not fit, and the period
/// starts over.
const CHECKPOINT_VERSION: u32 = 2;
/// The checkpoint's `kind`, so another transport's checkpoint is refused.
const CHECKPOINT_KIND: &str = "http";
/// Records preallocated per batch (see the file reader).
const PREALLOCATE_RECORDS: usize = 4096;

/// Reads one `transport = "http"` source for one period.
///
/// After an error the reader is fused: every later call returns that error.
pub struct HttpReader {
    source: String,
    state: Option<Box<State>>,
    failed: Option<Error>,
}

impl fmt::Debug for HttpReader {
    /// Names the source and position only: the requests' headers and URL
    /// may hold secrets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("HttpReader");
        d.field("source", &self.source);
        if let Some(state) = &self.state {
            let page = state.page.as_ref().map(|p| p.at.number);
            d.field("page", &page)
                .field("exhausted", &(state.page.is_none() && state.next.is_none()));
        }
        d.field("failed", &self.failed.is_some()).finish()
    }
}

/// What `validate --check-source` shows: the first page of a period.
#[derive(Debug)]
pub struct FirstPage {
    /// The page's URL (secrets redacted) or, for files, the first file.
    pub resource: String,
    /// How many records the page holds.
    pub records: u64,
    /// The first of them, if any.
    pub first: Option<RawRecord>,
}

impl HttpReader {
    /// Prepares the requests of `spec` for `period`, positioned at the first
    /// page or just after `resume`; every request passes `gate` (the
    /// source's rate limit, `None` for none).
    ///
    /// Configuration problems (a URL or header that is invalid once
    /// templated, a pagination that does not fit the format) are config
    /// errors. When `resume` is inside a page, that page is fetched again
    /// here; if it no longer has the records the checkpoint counted, or
    /// the checkpoint is of another kind or pagination style, the error is
    /// [`Error::StaleCheckpoint`] and the caller starts the period over.
    pub async fn open(
        pipeline: &Pipeline,
        spec: &HttpSourceSpec,
        period: &Period,
        resume: Option<&Checkpoint>,
        gate: Option<Arc<dyn RateGate>>,
    ) -> Result<HttpReader, Error> {
        let fetcher = Fetcher::new(pipeline, spec, period, gate)?;
        let mut state = Box::new(State {
            decoder: decoder(pipeline, spec, period)?,
            batch_size: pipeline.spec.load.batch_size,
            max_pages: spec.max_pages,
            source: spec.id.clone(),
            next: Some(PageAt {
                number: 1,
                request: paging::first(&spec.pagination),
            }),
            page: None,
            requested: HashMap::new(),
            bodies: HashMap::new(),
            expect_count: spec.expect_count.clone(),
            total: None,
            fetcher,
        });
        if let Some(resume) = resume {
            let resumed = state.resume(resume).await;
            resumed.map_err(|e| state.fetcher.secrets().redact_error(e))?;
        }
        Ok(HttpReader {
            source: spec.id.clone(),
            state: Some(state),
            failed: None,
        })
    }

    /// The next batch of at most `load.batch_size` records, or `None` once
    /// the last page is read.
    pub async fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let result = match self.state.take() {
            Some(mut state) => {
                let result = state.read_batch().await;
                self.state = Some(state);
                result
            }
            None => Err(Error::source_permanent(format!(
                "source {}: the HTTP reader was interrupted during an earlier read; open it again",
                self.source
            ))),
        };
        match &result {
            Ok(Some(batch)) => {
                debug!(source = %self.source, records = batch.records.len(), "read batch")
            }
            Ok(None) => debug!(source = %self.source, "source exhausted"),
            Err(err) => self.failed = Some(err.clone()),
        }
        result
    }

    /// The total of records the source declared for the period
    /// (`expect_count`), as the latest page read said; `None` when the
    /// source declares none. Final once [`HttpReader::next_batch`] returned
    /// `None`.
    pub fn expected_count(&self) -> Option<u64> {
        self.state.as_ref()?.total.map(|d| d.total)
    }

    /// Fetches the first page of `period` (with the usual retries) and
    /// counts its records, without reading further: a dry run of the
    /// source's URL, headers, format and records pointer. It runs without
    /// a database, so under the in-process rate limit.
    pub async fn first_page(
        pipeline: &Pipeline,
        spec: &HttpSourceSpec,
        period: &Period,
    ) -> Result<FirstPage, Error> {
        let gate = spec
            .rate_limit
            .and_then(|limit| limiter::local_gate(&pipeline.spec.name, &spec.id, limit));
        let reader = HttpReader::open(pipeline, spec, period, None, gate).await?;
        let Some(mut state) = reader.state else {
            return Err(Error::source_permanent("the HTTP reader did not open"));
        };
        let Some(at) = state.next.take() else {
            return Err(Error::source_permanent("the source has no first page"));
        };
        let page = state
            .fetch(at)
            .await
            .map_err(|e| state.fetcher.secrets().redact_error(e))?;
        let resource = page.resource.to_string();
        let (records, first) = run_blocking(move || page.count()).await??;
        Ok(FirstPage {
            resource,
            records,
            first,
        })
    }
}

fn decoder(pipeline: &Pipeline, spec: &HttpSourceSpec, period: &Period) -> Result<Decoder, Error> {
    Ok(match spec.format {
        Format::Json => Decoder::Json {
            pointer: spec.records.clone().unwrap_or_default(),
        },
        Format::Ndjson => Decoder::Ndjson,
        Format::Csv => {
            let delimiter = u8::try_from(spec.delimiter.unwrap_or(',')).map_err(|_| {
                Error::config(
                    pipeline.file_name(),
                    format!("sources.{}.delimiter", spec.id),
                    "must be one ASCII character",
                )
            })?;
            // An empty body is an empty page (an API's "no more"), not a
            // half-written export: a cut body fails in the transport.
            Decoder::Csv(Arc::new(CsvRules::new(pipeline, period, delimiter, true)))
        }
    })
}

/// A page of the period: its 1-based number and its request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PageAt {
    number: u64,
    #[serde(flatten)]
    request: PageRequest,
}

/// The reader's position and tools.
struct State {
    fetcher: Fetcher,
    decoder: Decoder,
    batch_size: usize,
    max_pages: u64,
    source: String,
    /// The page to fetch once `page` is exhausted; `None`: no more pages.
    next: Option<PageAt>,
    /// The page being handed out.
    page: Option<Box<OpenPage>>,
    /// Every request fetched in this attempt, and the page it fetched.
    requested: HashMap<PageRequest, u64>,
    /// The hash of every body fetched in this attempt, and its page.
    bodies: HashMap<u64, u64>,
    /// Where pages declare the period's total, if the source says.
    expect_count: Option<ExpectCount>,
    /// The total the latest page declared (kept in checkpoints, so a
    /// resumed attempt still knows it), and that page's number.
    total: Option<Declared>,
}

/// A total of records declared by a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Declared {
    total: u64,
    page: u64,
}

impl State {
    /// Fills one batch, fetching pages as needed.
    async fn read_batch(&mut self) -> Result<Option<Batch>, Error> {
        let read = self.fill_batch().await;
        read.map_err(|e| self.fetcher.secrets().redact_error(e))
    }

    async fn fill_batch(&mut self) -> Result<Option<Batch>, Error> {
        let mut records = Vec::with_capacity(self.batch_size.min(PREALLOCATE_RECORDS));
        while records.len() < self.batch_size {
            let page = match self.page.take() {
                Some(page) => page,
                None => match self.next.take() {
                    Some(at) => self.fetch(at).await?,
                    None => break,
                },
            };
            let want = self.batch_size - records.len();
            let (page, filled, exhausted) = run_blocking(move || {
                let mut page = page;
                let mut records = records;
                let exhausted = page.fill(&mut records, want);
                if matches!(exhausted, Ok(false)) {
                    // The batch is full and ends inside this page.
                    page.absorb(&records);
                }
                (page, records, exhausted)
            })
            .await?;
            records = filled;
            if exhausted? {
                if let Some(hash) = page.records.streamed_digest() {
                    self.note_body(hash, page.at.number, &page.resource)?;
                }
                self.next = self.after(&page)?;
            } else {
                self.page = Some(page);
            }
        }
        if records.is_empty() {
            return Ok(None);
        }
        Ok(Some(Batch {
            records,
            checkpoint: self.checkpoint(),
        }))
    }

    /// The page after the exhausted `page`, unless its request was already
    /// fetched in this period (a cursor or link going round in a circle).
    fn after(&self, page: &OpenPage) -> Result<Option<PageAt>, Error> {
        let next = page.after(self.fetcher.pagination());
        if let Some(earlier) = next.as_ref().and_then(|n| self.requested.get(&n.request)) {
            return Err(Error::source_permanent(format!(
                "{} page {}: the next page it names is the request of page {earlier} again (the same {}); \
                 the server is paging in a circle, so the period stops here instead of looping",
                page.resource,
                page.at.number,
                paging::style_name(self.fetcher.pagination()),
            )));
        }
        Ok(next)
    }

    /// Fetches and decodes the page `at`, retrying transient failures
    /// (including a body that was cut short), and refuses a page beyond
    /// `max_pages` or one whose body was already seen in this period.
    async fn fetch(&mut self, at: PageAt) -> Result<Box<OpenPage>, Error> {
        if at.number > self.max_pages {
            return Err(Error::source_permanent(format!(
                "source {}: the period has more than max_pages = {} pages (sources.{}.max_pages); \
                 stopping: raise it if the period really has that many",
                self.source, self.max_pages, self.source
            )));
        }
        let fetcher = &self.fetcher;
        let url = fetcher.url(&at.request)?;
        let shown: Arc<str> = Arc::from(fetcher.show(&at.request)?);
        let (url_ref, shown_ref, at_ref, decoder) = (&url, &shown, &at, &self.decoder);
        let expect_count = self.expect_count.as_ref();
        let (decoded, body_hash) = fetcher
            .with_retries(&shown, at.number, || async move {
                let fetched = fetcher.get(url_ref, shown_ref, at_ref.number).await?;
                // A streamed body is hashed as it passes, known at its end.
                let body_hash = match &fetched.body {
                    Body::Whole(bytes) => Some(xxh3_64(bytes)),
                    Body::Streamed(_) => None,
                };
                let input = PageInput {
                    resource: Arc::clone(shown_ref),
                    number: at_ref.number,
                    pagination: fetcher.pagination().clone(),
                    next_link: fetched
                        .next_link
                        .map(|u| fetcher.secrets().seal(u.as_str())),
                    no_content: fetched.status == reqwest::StatusCode::NO_CONTENT,
                    content_type: fetched.content_type,
                    expect_count: expect_count.cloned(),
                    total_header: expect_count
                        .and_then(|e| e.header.as_deref())
                        .and_then(|h| fetched.headers.get(h))
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
                };
                let decoder = decoder.clone();
                let body = fetched.body;
                // Decoding a large page is CPU work: keep it off the runtime.
                let decoded = run_blocking(move || decoder.decode(body, &input)).await?;
                decoded
                    .map(|d| (d, body_hash))
                    .map_err(|e| fetcher.secrets().redact_error(e))
            })
            .await?;
        debug!(page = at.number, url = %shown, "fetched page");
        if let Some(hash) = body_hash {
            self.note_body(hash, at.number, &shown)?;
        }
        self.requested.insert(at.request.clone(), at.number);
        if let Some(total) = decoded.total {
            self.declare(total, at.number, &shown);
        }
        Ok(Box::new(OpenPage {
            at,
            resource: shown,
            records: decoded.records,
            continuation: seal_cursor(decoded.continuation, &self.fetcher),
            consumed: 0,
            peeked: None,
            deferred: None,
            hasher: Xxh3::new(),
            hashed: 0,
        }))
    }

    /// Notes the hash of page `page`'s body, refusing a body already seen
    /// in this period. A whole body is checked before its records are
    /// handed out; a streamed one once it was read to its end (its records
    /// are already in batches then, but the period fails all the same).
    fn note_body(&mut self, hash: u64, page: u64, shown: &str) -> Result<(), Error> {
        let Some(earlier) = self.bodies.insert(hash, page) else {
            return Ok(());
        };
        Err(Error::source_permanent(format!(
            "{shown} page {page}: the response is identical to page {earlier}'s; the server seems to \
             ignore the pagination ({}), so the period stops here instead of looping",
            paging::style_name(self.fetcher.pagination()),
        )))
    }

    /// Notes the total page `page` declares. A total that changed during
    /// the crawl (records added or removed upstream meanwhile) is logged;
    /// the latest page's total is the one the period is held to.
    fn declare(&mut self, total: u64, page: u64, shown: &str) {
        if let Some(earlier) = self.total.filter(|d| d.total != total) {
            warn!(
                url = %shown,
                page,
                earlier = earlier.total,
                earlier_page = earlier.page,
                total,
                "the source's declared total changed during the crawl, from {} (page {}) to {total} (page {page}); \
                 the last page's total is the one the rows read must match",
                earlier.total,
                earlier.page
            );
        }
        self.total = Some(Declared { total, page });
    }

    /// Positions the reader just after `checkpoint`.
    async fn resume(&mut self, checkpoint: &Checkpoint) -> Result<(), Error> {
        let cp = HttpCheckpoint::read(checkpoint, self.fetcher.pagination())?;
        self.total = cp.total;
        let Some(at) = cp.page else {
            debug!("resuming after the last page: nothing left to fetch");
            self.next = None;
            return Ok(());
        };
        debug!(page = at.number, records = cp.records, "resuming");
        if cp.records == 0 {
            self.next = Some(at);
            return Ok(());
        }
        let page = self.fetch(at).await?;
        let skip = cp.records;
        let (page, skipped) = run_blocking(move || {
            let mut page = page;
            let skipped = page.skip(skip);
            (page, skipped)
        })
        .await?;
        skipped?;
        if Some(page.hasher.digest()) != cp.digest {
            return Err(mismatch(format!(
                "page {} ({}) changed since the checkpoint: its first {skip} records are not the ones handed out before",
                page.at.number, page.resource
            )));
        }
        self.next = None;
        self.page = Some(page);
        Ok(())
    }

    /// The position after the records handed out so far.
    fn checkpoint(&self) -> Checkpoint {
        let (page, records, digest) = match (&self.page, &self.next) {
            (Some(page), _) => (Some(&page.at), page.consumed, Some(page.hasher.digest())),
            (None, next) => (next.as_ref(), 0, None),
        };
        let mut cp = serde_json::json!({
            "v": CHECKPOINT_VERSION,
            "kind": CHECKPOINT_KIND,
            "records": records,
        });
        match page {
            Some(at) => cp["page"] = serde_json::to_value(at).unwrap_or_default(),
            None => cp["done"] = Value::Bool(true),
        }
        if let Some(digest) = digest {
            cp["digest"] = Value::String(format!("{digest:016x}"));
        }
        if let Some(total) = self.total {
            cp["total"] = serde_json::to_value(total).unwrap_or_default();
        }
        cp
    }
}

/// A cursor read from a body is sealed before it is kept (and stored in a
/// checkpoint): a server may build it from the request, key included.
fn seal_cursor(continuation: Continuation, fetcher: &Fetcher) -> Continuation {
    match continuation {
        Continuation::Known(Some(PageRequest::Cursor { cursor: Some(c) })) => {
            Continuation::Known(Some(PageRequest::Cursor {
                cursor: Some(fetcher.secrets().seal(&c)),
            }))
        }
        other => other,
    }
}

/// The checkpoint as stored.
#[derive(Debug, Serialize, Deserialize)]
struct HttpCheckpoint {
    v: u32,
    kind: String,
    /// The page in progress, or `None` (with `done: true`) after the last.
    #[serde(default)]
    page: Option<PageAt>,
    /// Records of that page already handed out.
    #[serde(default)]
    records: u64,
    /// Their hash (16 hex digits), when there are any.
    #[serde(default, deserialize_with = "hex_digest")]
    digest: Option<u64>,
    #[serde(default)]
    done: bool,
    /// The total the pages read so far declared (`expect_count`).
    #[serde(default)]
    total: Option<Declared>,
}

fn hex_digest<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| u64::from_str_radix(&t, 16).map_err(serde::de::Error::custom))
        .transpose()
}

impl HttpCheckpoint {
    /// Reads a checkpoint and checks it fits the source as configured now.
    fn read(
        checkpoint: &Checkpoint,
        pagination: &tidemark_core::spec::Pagination,
    ) -> Result<HttpCheckpoint, Error> {
        let version = checkpoint.get("v").and_then(Value::as_u64);
        if version != Some(u64::from(CHECKPOINT_VERSION)) {
            return Err(mismatch(format!(
                "checkpoint version {} is not this build's {CHECKPOINT_VERSION}",
                version.map_or_else(|| "(none)".to_string(), |v| v.to_string())
            )));
        }
        let cp = HttpCheckpoint::deserialize(checkpoint)
            .map_err(|e| mismatch(format!("unreadable checkpoint: {e}")))?;
        if cp.kind != CHECKPOINT_KIND {
            return Err(mismatch(format!(
                "a checkpoint of kind {:?} is not an HTTP source's",
                cp.kind
            )));
        }
        match &cp.page {
            None if !cp.done => Err(mismatch("the checkpoint names no page".into())),
            Some(_) if cp.records > 0 && cp.digest.is_none() => Err(mismatch(
                "the checkpoint does not say which records it handed out".into(),
            )),
            Some(at) if !paging::same_style(pagination, &at.request) => Err(mismatch(format!(
                "it was written with another pagination style than the configured {:?}",
                paging::style_name(pagination)
            ))),
            _ => Ok(cp),
        }
    }
}

fn mismatch(why: String) -> Error {
    Error::StaleCheckpoint(format!("checkpoint does not match the HTTP source: {why}"))
}

/// A fetched page being handed out.
struct OpenPage {
    at: PageAt,
    resource: Arc<str>,
    records: Records,
    continuation: Continuation,
    /// Records handed out (or skipped on resume).
    consumed: u64,
    /// A record read ahead to learn whether the page is exhausted.
    peeked: Option<RawRecord>,
    /// An error met while reading ahead: returned by the next `fill`, so
    /// the full batch before it is still committed.
    deferred: Option<Error>,
    /// The hash of the first `hashed` records handed out: what a
    /// checkpoint inside this page names them by.
    hasher: Xxh3,
    hashed: u64,
}

impl OpenPage {
    /// Moves up to `want` records into `out`. `Ok(true)` when the page is
    /// exhausted: then the checkpoint can name the next page rather than
    /// this one, and a resume does not fetch this page again.
    fn fill(&mut self, out: &mut Vec<RawRecord>, want: usize) -> Result<bool, Error> {
        if let Some(err) = self.deferred.take() {
            return Err(err);
        }
        for _ in 0..want {
            match self.take()? {
                Some(record) => out.push(record),
                None => return Ok(true),
            }
        }
        match self.records.next_record(self.at.number) {
            Ok(None) => Ok(true),
            Ok(Some(record)) => {
                self.peeked = Some(record);
                Ok(false)
            }
            Err(err) => {
                self.deferred = Some(err);
                Ok(false)
            }
        }
    }

    fn take(&mut self) -> Result<Option<RawRecord>, Error> {
        let record = match self.peeked.take() {
            Some(record) => Some(record),
            None => self.records.next_record(self.at.number)?,
        };
        if record.is_some() {
            self.consumed += 1;
        }
        Ok(record)
    }

    /// Skips the `n` records a checkpoint says were handed out already,
    /// hashing them as [`absorb`](OpenPage::absorb) did.
    fn skip(&mut self, n: u64) -> Result<(), Error> {
        for _ in 0..n {
            let Some(record) = self.take()? else {
                return Err(mismatch(format!(
                    "page {} ({}) now has {} records, but the checkpoint is after record {n}",
                    self.at.number, self.resource, self.consumed
                )));
            };
            absorb_record(&mut self.hasher, &record);
        }
        self.hashed = self.consumed;
        Ok(())
    }

    /// Hashes the records of this page handed out since the last call:
    /// the end of `batch`. Called only when a batch ends inside the page,
    /// so a page read within one batch is never hashed.
    fn absorb(&mut self, batch: &[RawRecord]) {
        let new = usize::try_from(self.consumed - self.hashed).unwrap_or(usize::MAX);
        for record in &batch[batch.len().saturating_sub(new)..] {
            absorb_record(&mut self.hasher, record);
        }
        self.hashed = self.consumed;
    }

    /// Counts the remaining records, keeping the first.
    fn count(mut self: Box<Self>) -> Result<(u64, Option<RawRecord>), Error> {
        let first = self.take()?;
        while self.take()?.is_some() {}
        Ok((self.consumed, first))
    }

    /// The page after this exhausted one.
    fn after(&self, pagination: &Pagination) -> Option<PageAt> {
        let request = match &self.continuation {
            Continuation::Known(next) => next.clone(),
            Continuation::ByCount => {
                self.warn_if_capped(pagination);
                paging::after_count(pagination, &self.at.request, self.consumed)
            }
        };
        request.map(|request| PageAt {
            number: self.at.number + 1,
            request,
        })
    }
}

impl OpenPage {
    /// A first page shorter than `size` ends the period; that is right for
    /// a small period, but a server that caps its page size below `size`
    /// looks the same and its later pages would never be read. There is no
    /// telling the two apart from one page, so the operator is told.
    fn warn_if_capped(&self, pagination: &Pagination) {
        let Pagination::Page {
            size: Some(size), ..
        } = pagination
        else {
            return;
        };
        if self.at.number == 1 && self.consumed > 0 && self.consumed < *size {
            warn!(
                page = 1,
                size = *size,
                records = self.consumed,
                url = %self.resource,
                "the first page has {} records, fewer than pagination.size = {size}: it is read as the last page; \
                 if the server caps its page size below {size}, set size to that cap, or later records are never read",
                self.consumed
            );
        }
    }
}

/// Feeds one record into a page's hash: its content, not its text (a JSON
/// record is hashed as serialized), so the hash is the same whenever the
/// page hands out the same records.
fn absorb_record(hasher: &mut Xxh3, record: &RawRecord) {
    match &record.data {
        RawData::Json(value) => {
            let text = serde_json::to_vec(value).unwrap_or_default();
            hasher.update(&text);
        }
        RawData::Csv { row, .. } => {
            for field in row {
                hasher.update(&(field.len() as u64).to_le_bytes());
                hasher.update(field.as_bytes());
            }
        }
        RawData::Malformed { raw, .. } => hasher.update(raw.as_bytes()),
    }
    hasher.update(b"\n");
}

/// Runs CPU-bound work on tokio's blocking pool, inside the caller's span.
async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(work))
        .await
        .map_err(|e| Error::source_permanent(format!("page decoding task failed: {e}")))
}
