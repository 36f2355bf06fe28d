//! `transport = "file"`: records from the files a path glob matches.
//!
//! The path template is rendered for the period, resolved against the
//! pipeline file's folder and expanded as a glob. Matches are read in path
//! order. A checkpoint names a position (file index, file path, records
//! consumed in it) and the identity of the content consumed up to it: an
//! xxh3 hash over the raw bytes of the earlier files and of the current
//! file up to the end of its last consumed record. A resumed attempt reads
//! that content again (it must anyway, to skip the records) and compares
//! the hash, so a file regenerated between a crash and the resume is
//! noticed and the period starts over, instead of skipping N records of
//! different content. The hash works on FIFOs and same-size rewrites, where
//! size and modification time would not.
//!
//! CSV and NDJSON files are streamed: the reader holds one batch and one
//! decoder buffer, however large the file. A `json` file is one document, so
//! it is parsed whole, one file at a time; its records are then handed out
//! in batches like the others.
//!
//! All file I/O is blocking and runs on tokio's blocking pool, so a slow
//! disk or a FIFO that waits for its writer never stalls other periods.

mod consumed;
pub(crate) mod csv_file;
pub(crate) mod json_file;
pub(crate) mod ndjson_file;
#[cfg(test)]
mod tests;

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_core::spec::{FileSourceSpec, Format, MissingPolicy};
use tidemark_core::template::{Template, TemplateContext};
use tidemark_core::{Error, Period, Pipeline, RawRecord};
use tracing::debug;
use xxhash_rust::xxh3::Xxh3;

use crate::{Batch, Checkpoint};
use csv_file::{CsvCursor, CsvRules};
use json_file::JsonCursor;
use ndjson_file::NdjsonCursor;

/// The checkpoint format's version; bump it when its meaning changes.
/// Version 2 added the identity of the consumed content; a checkpoint of
/// another version does not fit, and the period starts over.
const CHECKPOINT_VERSION: u32 = 2;
/// The checkpoint's `kind`, so another transport's checkpoint is refused.
const CHECKPOINT_KIND: &str = "file";
/// Records preallocated per batch: enough to avoid regrowth for common
/// sizes without reserving a huge `batch_size` up front.
const PREALLOCATE_RECORDS: usize = 4096;

/// Reads the files of one `transport = "file"` source for one period.
///
/// After an error the reader is fused: every later call returns that error,
/// so a caller cannot skip past a bad record by accident.
pub struct FileReader {
    source: String,
    state: Option<Box<State>>,
    failed: Option<Error>,
    /// The first batch, read by [`FileReader::open`] in the same hand-over
    /// to the blocking pool (regular files only: a FIFO's first batch may
    /// wait for its writer, which opening must not).
    first: Option<BatchRead>,
}

/// What one read of a batch answered.
type BatchRead = Result<Option<Batch>, Error>;

impl fmt::Debug for FileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("FileReader");
        d.field("source", &self.source);
        if let Some(state) = &self.state {
            d.field("files", &state.files.len())
                .field("file_index", &state.index);
        }
        d.field("failed", &self.failed.is_some()).finish()
    }
}

impl FileReader {
    /// Matches the source's files for `period` and positions the reader at
    /// the start, or just after `resume`.
    ///
    /// Fails with a permanent source error when nothing matches and
    /// `missing = "error"`, and with [`Error::StaleCheckpoint`] when `resume` does
    /// not fit the files now matched (the caller then starts the period
    /// over).
    pub async fn open(
        pipeline: &Pipeline,
        spec: &FileSourceSpec,
        period: &Period,
        resume: Option<&Checkpoint>,
    ) -> Result<FileReader, Error> {
        let decoder = Decoder::from_spec(pipeline, spec, period)?;
        let pattern = FilePattern::render(pipeline, spec, period)?;
        let (source, missing) = (spec.id.clone(), spec.missing);
        let batch_size = pipeline.spec.load.batch_size;
        let resume = resume.cloned();
        // One hand-over to the blocking pool for all of opening: a small
        // period's whole read is two (ADR 0007, section 7).
        let state = run_blocking(move || -> Result<(Box<State>, Option<BatchRead>), Error> {
            let files = pattern.expand()?;
            let shown = &pattern.shown;
            debug!(source = %source, pattern = %shown, files = files.len(), "matched files");
            if files.is_empty() && missing == MissingPolicy::Error {
                return Err(Error::source_permanent(format!("no file matches {shown}")));
            }
            let mut state = Box::new(State {
                files,
                decoder,
                batch_size,
                index: 0,
                cursor: None,
                consumed: Xxh3::new(),
                file_had_records: false,
                closed: None,
            });
            state.check_headers()?;
            if let Some(resume) = resume {
                let position = Position::from_checkpoint(&resume, &state.files)?;
                debug!(source = %source, file_index = position.file_index, records = position.records, "resuming");
                state.seek(&position)?;
            }
            // A small period's whole read is then one hand-over, not two:
            // each costs two thread wake-ups (ADR 0022).
            let first = state
                .files
                .iter()
                .all(|f| f.regular)
                .then(|| state.read_batch());
            Ok((state, first))
        })
        .await??;
        let (state, first) = state;
        Ok(FileReader {
            source: spec.id.clone(),
            state: Some(state),
            failed: None,
            first,
        })
    }

    /// The next batch of at most `load.batch_size` records, or `None` once
    /// every file is exhausted. A batch may span several files.
    pub async fn next_batch(&mut self) -> Result<Option<Batch>, Error> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let result = self.read_batch().await;
        match &result {
            Ok(Some(batch)) => {
                debug!(source = %self.source, records = batch.records.len(), "read batch")
            }
            Ok(None) => debug!(source = %self.source, "source exhausted"),
            Err(err) => self.failed = Some(err.clone()),
        }
        result
    }

    async fn read_batch(&mut self) -> Result<Option<Batch>, Error> {
        if let Some(first) = self.first.take() {
            return first;
        }
        if self.state.as_ref().is_some_and(|s| s.exhausted()) {
            return Ok(None); // known without another hand-over
        }
        let Some(state) = self.state.take() else {
            return Err(Error::source_permanent(format!(
                "source {}: the file reader was interrupted during an earlier read; open it again",
                self.source
            )));
        };
        let (state, result) = with_state(state, State::read_batch).await?;
        self.state = Some(state);
        result
    }
}

/// Runs `work` on the reader state on the blocking pool and hands the state
/// back with the work's result. The outer error means the task died and
/// took the state with it.
async fn with_state<T: Send + 'static>(
    mut state: Box<State>,
    work: impl FnOnce(&mut State) -> Result<T, Error> + Send + 'static,
) -> Result<(Box<State>, Result<T, Error>), Error> {
    run_blocking(move || {
        let result = work(&mut state);
        (state, result)
    })
    .await
}

/// Runs blocking work on tokio's blocking pool, inside the caller's span so
/// its log lines keep the run's context.
async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(work))
        .await
        .map_err(|e| Error::source_permanent(format!("file reading task failed: {e}")))
}

/// The rendered path glob: the pattern to expand and a copy safe to show
/// (environment values redacted).
struct FilePattern {
    pattern: String,
    shown: String,
    /// The one path the pattern names when it has no wildcard (a daily
    /// file's path, say): looked at directly, without listing a folder per
    /// component of the path as a glob does (ADR 0022: three `statx` per
    /// period of a backfill).
    literal: Option<PathBuf>,
}

impl FilePattern {
    /// Renders `spec.path` for `period` and anchors a relative result at the
    /// pipeline file's folder. That folder is escaped, so glob characters in
    /// its name (`exports[old]`) are taken literally.
    fn render(
        pipeline: &Pipeline,
        spec: &FileSourceSpec,
        period: &Period,
    ) -> Result<FilePattern, Error> {
        let key = format!("sources.{}.path", spec.id);
        let config = |message: String| Error::config(pipeline.file_name(), &key, message);
        let template = Template::parse(&spec.path).map_err(&config)?;
        let ctx = TemplateContext {
            period,
            source_id: &spec.id,
            pipeline: &pipeline.spec.name,
        };
        let rendered = template.render(&ctx).map_err(|e| config(e.to_string()))?;
        let redacted = template.render_redacted(&ctx);
        let literal = (!rendered.contains(['*', '?', '[']))
            .then(|| {
                if Path::new(&rendered).is_absolute() {
                    PathBuf::from(&rendered)
                } else {
                    pipeline.base_dir.join(&rendered)
                }
            })
            .filter(|path| is_plain(path));
        let (pattern, shown) = if Path::new(&rendered).is_absolute() {
            (rendered, redacted)
        } else {
            let base = pipeline.base_dir.to_string_lossy();
            let escaped = glob::Pattern::escape(&base);
            (join(&escaped, &rendered), join(&base, &redacted))
        };
        glob::Pattern::new(&pattern)
            .map_err(|e| config(format!("invalid file pattern {shown}: {e}")))?;
        Ok(FilePattern {
            pattern,
            shown,
            literal,
        })
    }

    /// The matching regular files and FIFOs, sorted by path. Directories
    /// and dangling links are skipped: they cannot hold records.
    fn expand(&self) -> Result<Vec<SourceFile>, Error> {
        if let Some(path) = &self.literal {
            return Ok(readable(path.clone()).into_iter().collect());
        }
        let options = glob::MatchOptions {
            case_sensitive: true,
            require_literal_separator: true,
            require_literal_leading_dot: true,
        };
        let paths = glob::glob_with(&self.pattern, options).map_err(|e| {
            Error::source_permanent(format!("invalid file pattern {}: {e}", self.shown))
        })?;
        let mut files = Vec::new();
        for entry in paths {
            let path = entry
                .map_err(|e| io_error("cannot list", &e.path().display().to_string(), e.error()))?;
            files.extend(readable(path));
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }
}

/// Whether a glob of `path` would name it exactly as it is written: no
/// `.` or `..` component, no doubled separator. A file's name is part of
/// a period's checkpoint, so a path the glob would have spelled otherwise
/// keeps going through the glob.
fn is_plain(path: &Path) -> bool {
    use std::path::Component;
    let normal = path
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    normal && path.components().collect::<PathBuf>().as_os_str() == path.as_os_str()
}

/// `path` as a file to read, if it is one (see [`is_readable_kind`]).
fn readable(path: PathBuf) -> Option<SourceFile> {
    match std::fs::metadata(&path) {
        Ok(meta) if is_readable_kind(&meta.file_type()) => {
            Some(SourceFile::new(path, meta.is_file()))
        }
        Ok(_) => {
            debug!(path = %path.display(), "skipping: not a regular file or FIFO");
            None
        }
        Err(err) => {
            debug!(path = %path.display(), error = %err, "skipping: cannot stat");
            None
        }
    }
}

fn join(base: &str, rest: &str) -> String {
    Path::new(base).join(rest).to_string_lossy().into_owned()
}

/// Regular files and FIFOs only. A FIFO is never sized or seeked: tests and
/// operators use one to feed a run slowly.
fn is_readable_kind(kind: &std::fs::FileType) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        kind.is_file() || kind.is_fifo()
    }
    #[cfg(not(unix))]
    {
        kind.is_file()
    }
}

/// Whether `path` is a regular file (not a FIFO), which can be read twice.
fn is_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// One matched file and its name as shown in origins, errors and checkpoints.
#[derive(Debug)]
struct SourceFile {
    path: PathBuf,
    name: Arc<str>,
    /// A regular file (not a FIFO): reading it never waits for a writer.
    regular: bool,
}

impl SourceFile {
    fn new(path: PathBuf, regular: bool) -> SourceFile {
        let name = Arc::from(path.display().to_string());
        SourceFile {
            path,
            name,
            regular,
        }
    }

    fn open(&self) -> Result<File, Error> {
        debug!(file = %self.name, "opening file");
        File::open(&self.path).map_err(|e| io_error("cannot open", &self.name, &e))
    }
}

/// How the source's files are decoded.
#[derive(Debug, Clone)]
enum Decoder {
    Csv(Arc<CsvRules>),
    Ndjson,
    Json { pointer: String },
}

impl Decoder {
    fn from_spec(
        pipeline: &Pipeline,
        spec: &FileSourceSpec,
        period: &Period,
    ) -> Result<Decoder, Error> {
        Ok(match spec.format {
            Format::Csv => {
                let delimiter = u8::try_from(spec.delimiter.unwrap_or(',')).map_err(|_| {
                    Error::config(
                        pipeline.file_name(),
                        format!("sources.{}.delimiter", spec.id),
                        "must be one ASCII character",
                    )
                })?;
                let empty_ok = spec.missing == MissingPolicy::Empty;
                Decoder::Csv(Arc::new(CsvRules::new(
                    pipeline, period, delimiter, empty_ok,
                )))
            }
            Format::Ndjson => Decoder::Ndjson,
            Format::Json => Decoder::Json {
                pointer: spec.records.clone().unwrap_or_default(),
            },
        })
    }
}

/// An open file being decoded. Each cursor continues the hash of the
/// content consumed before its file, and hands it back at the end.
enum Cursor {
    Csv(Box<CsvCursor>),
    Ndjson(Box<NdjsonCursor>),
    /// A JSON file is consumed whole when it is opened: its hash covers it.
    Json(JsonCursor, Box<Xxh3>),
}

impl Cursor {
    fn open(file: &SourceFile, decoder: &Decoder, consumed: Xxh3) -> Result<Cursor, Error> {
        let handle = file.open()?;
        let name = Arc::clone(&file.name);
        Ok(match decoder {
            Decoder::Csv(rules) => Cursor::Csv(Box::new(CsvCursor::open(
                handle,
                name,
                Arc::clone(rules),
                consumed,
            )?)),
            Decoder::Ndjson => Cursor::Ndjson(Box::new(NdjsonCursor::new(handle, name, consumed))),
            Decoder::Json { pointer } => {
                let (cursor, hasher) = JsonCursor::open(handle, name, pointer, consumed)?;
                Cursor::Json(cursor, Box::new(hasher))
            }
        })
    }

    /// The file's next record; its `origin.record` is also the number of
    /// records consumed from this file so far.
    fn next_record(&mut self) -> Result<Option<RawRecord>, Error> {
        match self {
            Cursor::Csv(c) => c.next_record(),
            Cursor::Ndjson(c) => c.next_record(),
            Cursor::Json(c, _) => c.next_record(),
        }
    }

    /// The identity of everything consumed through the last record read.
    fn digest(&self) -> u64 {
        match self {
            Cursor::Csv(c) => c.digest(),
            Cursor::Ndjson(c) => c.digest(),
            Cursor::Json(_, hasher) => hasher.digest(),
        }
    }

    /// The hash over everything consumed, this whole file included.
    fn into_hasher(self) -> Xxh3 {
        match self {
            Cursor::Csv(c) => c.into_hasher(),
            Cursor::Ndjson(c) => c.into_hasher(),
            Cursor::Json(_, hasher) => *hasher,
        }
    }
}

/// Everything the blocking side needs; moved onto the blocking pool for
/// each read and back.
struct State {
    files: Vec<SourceFile>,
    decoder: Decoder,
    batch_size: usize,
    /// Index of the file being read (`files.len()` once all are done).
    index: usize,
    /// The open file, `None` before it is opened or after it is exhausted.
    cursor: Option<Cursor>,
    /// The hash of every file before `index`, whole.
    consumed: Xxh3,
    /// Whether the open file has handed out a record.
    file_had_records: bool,
    /// The last file that ended after handing out records, and the
    /// identity of the content through its last record: what a checkpoint
    /// after that record names once the file is closed.
    closed: Option<(usize, u64)>,
}

impl State {
    /// Every file was read to its end: the next batch is `None`.
    fn exhausted(&self) -> bool {
        self.index >= self.files.len()
    }

    /// Reads the header of every regular CSV file before any record is
    /// handed out, so a column missing from the third file of a glob
    /// (source drift) fails the period before the first file's rows are
    /// written. A FIFO cannot be read twice: its header is checked when it
    /// is opened for its records, like an HTTP page's.
    fn check_headers(&mut self) -> Result<(), Error> {
        let Decoder::Csv(rules) = &self.decoder else {
            return Ok(());
        };
        // A single file's header is checked when it is opened for its
        // records, before the first of them is handed out: opening it twice
        // cost a small period as much as its parsing (building a CSV
        // parser is most of a 5-row file's CPU).
        if self.files.len() < 2 {
            return Ok(());
        }
        for file in &self.files {
            if is_regular(&file.path) {
                CsvCursor::open(
                    file.open()?,
                    Arc::clone(&file.name),
                    Arc::clone(rules),
                    Xxh3::new(),
                )?;
            }
        }
        Ok(())
    }

    /// Fills one batch. Stops as soon as it is full, so the next file is not
    /// opened (and a FIFO's writer not waited for) before it is needed.
    fn read_batch(&mut self) -> Result<Option<Batch>, Error> {
        let mut records = Vec::with_capacity(self.batch_size.min(PREALLOCATE_RECORDS));
        let mut last = None;
        while records.len() < self.batch_size {
            let Some(record) = self.next_record()? else {
                break;
            };
            last = Some((self.index, record.origin.record));
            records.push(record);
        }
        Ok(last.map(|(file_index, records_in_file)| {
            let position = Position {
                file_index,
                records: records_in_file,
                consumed: self.digest(file_index),
            };
            Batch {
                records,
                checkpoint: position.to_checkpoint(&self.files),
            }
        }))
    }

    /// The identity of the content through the last record read, which
    /// came from file `file_index`.
    fn digest(&self, file_index: usize) -> u64 {
        match (&self.cursor, self.closed) {
            (Some(cursor), _) if self.index == file_index => cursor.digest(),
            (_, Some((closed, digest))) if closed == file_index => digest,
            _ => self.consumed.digest(),
        }
    }

    /// The next record of the current file, moving on to the next file at
    /// the end of each.
    fn next_record(&mut self) -> Result<Option<RawRecord>, Error> {
        loop {
            if self.cursor.is_none() {
                let Some(file) = self.files.get(self.index) else {
                    return Ok(None);
                };
                let consumed = self.consumed.clone();
                self.cursor = Some(Cursor::open(file, &self.decoder, consumed)?);
            }
            let Some(cursor) = self.cursor.as_mut() else {
                return Ok(None);
            };
            if let Some(record) = cursor.next_record()? {
                self.file_had_records = true;
                return Ok(Some(record));
            }
            self.close_file();
        }
    }

    /// Ends the current file: its hash joins the consumed content.
    fn close_file(&mut self) {
        if let Some(cursor) = self.cursor.take() {
            if self.file_had_records {
                self.closed = Some((self.index, cursor.digest()));
            }
            self.consumed = cursor.into_hasher();
        }
        self.file_had_records = false;
        self.index += 1;
    }

    /// Positions the reader after `position`'s records by reading the
    /// content before it again: the earlier files whole, then the records
    /// of the current one. That works on FIFOs, and proves the content is
    /// the one the checkpoint was written after.
    fn seek(&mut self, position: &Position) -> Result<(), Error> {
        let Some(file) = self.files.get(position.file_index) else {
            return Err(checkpoint_mismatch(format!(
                "there is no file #{}",
                position.file_index
            )));
        };
        for earlier in &self.files[..position.file_index] {
            hash_whole(earlier, &mut self.consumed)?;
        }
        let mut cursor = Cursor::open(file, &self.decoder, self.consumed.clone())?;
        for skipped in 0..position.records {
            if cursor.next_record()?.is_none() {
                return Err(checkpoint_mismatch(format!(
                    "{} now has {skipped} records, but the checkpoint is after record {}",
                    file.name, position.records
                )));
            }
        }
        if cursor.digest() != position.consumed {
            return Err(checkpoint_mismatch(format!(
                "the content before the checkpoint (the files before {} and its first {} records) is not what was read before: a file changed since",
                file.name, position.records
            )));
        }
        self.index = position.file_index;
        self.cursor = Some(cursor);
        self.file_had_records = position.records > 0;
        Ok(())
    }
}

/// Feeds a whole file's bytes into `hasher`, as a cursor reading it to its
/// end would.
fn hash_whole(file: &SourceFile, hasher: &mut Xxh3) -> Result<(), Error> {
    let mut handle = file.open()?;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match io::Read::read(&mut handle, &mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_error("cannot read", &file.name, &e)),
        }
    }
}

/// A position in the source: `records` records of file `file_index` have
/// been consumed, and `consumed` is the hash of the content up to there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    file_index: usize,
    records: u64,
    consumed: u64,
}

/// The checkpoint as stored: versioned, naming the file as well as its
/// index so that a changed file list is noticed, and the identity of the
/// content consumed (16 hex digits) so that changed content is too.
#[derive(Debug, Serialize, Deserialize)]
struct FileCheckpoint {
    v: u32,
    kind: String,
    file_index: usize,
    file: String,
    records: u64,
    consumed: String,
}

impl Position {
    fn to_checkpoint(self, files: &[SourceFile]) -> Checkpoint {
        let file = files
            .get(self.file_index)
            .map(|f| f.name.to_string())
            .unwrap_or_default();
        serde_json::json!({
            "v": CHECKPOINT_VERSION,
            "kind": CHECKPOINT_KIND,
            "file_index": self.file_index,
            "file": file,
            "records": self.records,
            "consumed": format!("{:016x}", self.consumed),
        })
    }

    /// Reads a checkpoint and checks it against the files matched now.
    fn from_checkpoint(checkpoint: &Checkpoint, files: &[SourceFile]) -> Result<Position, Error> {
        let version = checkpoint.get("v").and_then(Value::as_u64);
        if version != Some(u64::from(CHECKPOINT_VERSION)) {
            return Err(checkpoint_mismatch(format!(
                "checkpoint version {} is not this build's {CHECKPOINT_VERSION}",
                version.map_or_else(|| "(none)".to_string(), |v| v.to_string())
            )));
        }
        let cp = FileCheckpoint::deserialize(checkpoint)
            .map_err(|e| checkpoint_mismatch(format!("unreadable checkpoint {checkpoint}: {e}")))?;
        let consumed = u64::from_str_radix(&cp.consumed, 16).map_err(|e| {
            checkpoint_mismatch(format!(
                "unreadable content identity {:?}: {e}",
                cp.consumed
            ))
        })?;
        if cp.kind != CHECKPOINT_KIND {
            return Err(checkpoint_mismatch(format!(
                "a checkpoint of kind {:?} is not a file source's",
                cp.kind
            )));
        }
        match files.get(cp.file_index) {
            None => Err(checkpoint_mismatch(format!(
                "the checkpoint is in file #{} ({}), but only {} files match now",
                cp.file_index,
                cp.file,
                files.len()
            ))),
            Some(file) if *file.name != *cp.file => Err(checkpoint_mismatch(format!(
                "file #{} is {}, but the checkpoint is in {}",
                cp.file_index, file.name, cp.file
            ))),
            Some(_) => Ok(Position {
                file_index: cp.file_index,
                records: cp.records,
                consumed,
            }),
        }
    }
}

fn checkpoint_mismatch(why: String) -> Error {
    Error::StaleCheckpoint(format!(
        "checkpoint does not match the source's files: {why}"
    ))
}

/// An I/O error on `resource`. Only errors that another try may not meet
/// again (interrupted, timed out, a network file system's dropped
/// connection) are transient; a missing or unreadable file is permanent.
fn io_error(action: &str, resource: &str, err: &io::Error) -> Error {
    let message = format!("{action} {resource}: {err}");
    if is_transient(err.kind()) {
        Error::source_transient(message)
    } else {
        Error::source_permanent(message)
    }
}

fn is_transient(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::Interrupted
            | io::ErrorKind::TimedOut
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::NotConnected
    )
}

/// A decoding error at `record`/`line` of `resource`.
fn parse_error(resource: &str, record: Option<u64>, line: Option<u64>, message: String) -> Error {
    Error::Parse {
        location: tidemark_core::Location {
            resource: resource.to_string(),
            page: None,
            record,
            line,
        },
        message,
    }
}

/// Bytes as text for a message: valid UTF-8 as it is (control characters
/// escaped), every invalid byte as `\xNN`, cut after 120 bytes.
pub(crate) fn show_bytes(bytes: &[u8]) -> String {
    const MAX: usize = 120;
    let shown = &bytes[..bytes.len().min(MAX)];
    let mut out = String::from("\"");
    for chunk in shown.utf8_chunks() {
        out.extend(chunk.valid().chars().flat_map(char::escape_debug));
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02X}"));
        }
    }
    out.push('"');
    if bytes.len() > MAX {
        out.push('…');
    }
    out
}

/// What a JSON value is, for messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Strips a UTF-8 byte order mark, which some exporters write.
pub(crate) fn strip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
}
