//! CSV files (and HTTP pages) with a header row, streamed one row at a time.
//!
//! What a CSV document must keep, and what breaking it means:
//!
//! - It has a header row that decodes as UTF-8 and names no column that
//!   `[fields]` reads twice (which of the two would be meant?). A file with
//!   no header at all (0 bytes: a half-written export) is an error unless
//!   the source reads an empty file as no records ([`CsvRules::allow_empty`]).
//! - It does not end inside a quoted field. The csv crate ends such a record
//!   silently at the end of the input, so one stray quote would swallow every
//!   later line into one field. The cursor keeps the raw bytes of the record
//!   being read (see [`Consumed`]) and, when a record reaches the end of the
//!   input, asks the csv parser itself whether the record was closed: parsed
//!   once more with a line terminator appended, a closed record is the same,
//!   while an open quote takes the terminator into its field. The error
//!   names the line where the quote opened.
//! - Its last row is not cut: a row with fewer fields than the header that
//!   ends the input without a line terminator is a cut file.
//!
//! - Its header names every column that `[fields]` reads (a field without
//!   `value`; its column is `from` or the field name). A column missing
//!   from the header is source drift (renamed or removed upstream), a
//!   [`Error::SourceDrift`] of class `contract`, raised when the header is
//!   read and before any record: read on, the column would become NULL
//!   over good data. A field with a `default` is no exception: a default
//!   stands in for an empty cell, not for a column that is gone. The one
//!   exception is schema evolution: a field the period's exports may lack
//!   (`fields.NAME.added` covering the period, or a field new to the
//!   period by its ledger row, see `tidemark_core::fingerprint`) may be
//!   absent from the header; it then loads as NULL or its default, and the
//!   run logs that once per file.
//!
//! Those break the document: the period fails. A row with another number of
//! fields than the header, or with invalid UTF-8, breaks only itself: it is
//! handed on as a [`RawData::Malformed`] record with its raw text, and the
//! run counts it against `max_rejects` like any invalid row.

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use csv::{ByteRecord, StringRecord};
use csv_core::ReadFieldResult;
use tidemark_core::{Error, Origin, Period, Pipeline, RawData, RawRecord, Selector};
use xxhash_rust::xxh3::Xxh3;

use super::consumed::Consumed;
use super::{io_error, parse_error, show_bytes};

/// How a source's CSV is read.
#[derive(Debug, Clone)]
pub(crate) struct CsvRules {
    /// The field delimiter.
    pub(crate) delimiter: u8,
    /// The columns `[fields]` reads: the header must name each of them
    /// exactly once.
    pub(crate) columns: Vec<CsvColumn>,
    /// Whether an input without a header row (0 bytes) is an empty source
    /// rather than an error.
    pub(crate) allow_empty: bool,
}

impl CsvRules {
    /// The rules for a source of `pipeline` read for `period`.
    pub(crate) fn new(
        pipeline: &Pipeline,
        period: &Period,
        delimiter: u8,
        allow_empty: bool,
    ) -> CsvRules {
        let columns = pipeline
            .spec
            .fields
            .iter()
            .filter(|(_, field)| field.value.is_none())
            .map(|(name, field)| {
                let from = field.from.as_deref().unwrap_or(name);
                CsvColumn {
                    column: Selector::parse(from).csv_column().to_string(),
                    field: name.clone(),
                    may_lack: pipeline.may_lack(name, period),
                }
            })
            .collect();
        CsvRules {
            delimiter,
            columns,
            allow_empty,
        }
    }
}

/// A column `[fields]` reads, and the field that reads it.
#[derive(Debug, Clone)]
pub(crate) struct CsvColumn {
    /// The header's name for it.
    pub(crate) column: String,
    /// The `[fields]` entry.
    pub(crate) field: String,
    /// The period's exports may lack the column (schema evolution): its
    /// absence is not drift.
    pub(crate) may_lack: bool,
}

/// An open CSV file (or any other reader, such as an HTTP page's body).
/// Every row shares the header record, so a row costs one allocation, not
/// one per cell.
pub(crate) struct CsvCursor<R = File> {
    reader: csv::Reader<Consumed<R>>,
    rules: Arc<CsvRules>,
    headers: Arc<StringRecord>,
    resource: Arc<str>,
    /// Rows read so far.
    record: u64,
    /// The previous row's size, to allocate the next one in one go.
    last_len: (usize, usize),
    /// Where the record read last (or the header) starts: byte offset and
    /// the parser's line there.
    start: (u64, u64),
    /// The byte offset just after that record.
    end: u64,
    /// The end of the input was reached (and checked).
    done: bool,
}

impl<R: Read> CsvCursor<R> {
    /// Opens the reader and reads the header row. `hasher` holds the
    /// content consumed before this input; the cursor continues it.
    pub(crate) fn open(
        input: R,
        resource: Arc<str>,
        rules: Arc<CsvRules>,
        hasher: Xxh3,
    ) -> Result<CsvCursor<R>, Error> {
        let reader = csv::ReaderBuilder::new()
            .delimiter(rules.delimiter)
            .has_headers(false)
            .flexible(true)
            .from_reader(Consumed::new(input, hasher));
        let mut cursor = CsvCursor {
            reader,
            rules,
            headers: Arc::new(StringRecord::new()),
            resource,
            record: 0,
            last_len: (0, 0),
            start: (0, 1),
            end: 0,
            done: false,
        };
        let mut header = ByteRecord::new();
        if !cursor.read(&mut header)? {
            cursor.done = true;
            if cursor.rules.allow_empty {
                return Ok(cursor);
            }
            return Err(cursor.error(
                None,
                1,
                "the file is empty: there is no header row (a half-written export?); \
                 set missing = \"empty\" to read an empty file as no records"
                    .into(),
            ));
        }
        cursor.check_closed()?;
        cursor.headers = Arc::new(cursor.header_names(header)?);
        cursor.check_duplicate_columns()?;
        cursor.check_missing_columns()?;
        Ok(cursor)
    }

    /// The next row, or `None` at the end of the input.
    pub(crate) fn next_record(&mut self) -> Result<Option<RawRecord>, Error> {
        if self.done {
            return Ok(None);
        }
        let (bytes, fields) = self.last_len;
        let mut row = ByteRecord::with_capacity(bytes, fields);
        if !self.read(&mut row)? {
            self.done = true;
            return Ok(None);
        }
        self.check_closed()?;
        self.record += 1;
        self.last_len = (row.as_slice().len(), row.len());
        let origin = Origin {
            resource: Arc::clone(&self.resource),
            page: None,
            record: self.record,
            line: Some(self.line()),
        };
        self.decode(row, origin).map(Some)
    }

    /// The hash of everything consumed up to the end of the last row.
    pub(crate) fn digest(&self) -> u64 {
        self.reader.get_ref().digest_through(self.end)
    }

    /// The hasher over the whole input (call at its end).
    pub(crate) fn into_hasher(self) -> Xxh3 {
        self.reader.into_inner().into_hasher()
    }

    /// Reads one record and notes where it lies.
    fn read(&mut self, record: &mut ByteRecord) -> Result<bool, Error> {
        let found = self
            .reader
            .read_byte_record(record)
            .map_err(|e| csv_error(&self.resource, self.record + 1, e))?;
        if found {
            // read_byte_record always sets the record's position.
            self.start = record
                .position()
                .map_or((self.end, self.start.1), |p| (p.byte(), p.line()));
            self.end = self.reader.position().byte();
            self.reader.get_mut().release(self.start.0);
        }
        Ok(found)
    }

    /// The record's text, from its start to the start of the next one.
    fn raw(&self) -> &[u8] {
        self.reader.get_ref().slice(self.start.0, self.end)
    }

    /// Whether the record read last ends the input (nothing follows it).
    fn at_end(&self) -> bool {
        self.reader.get_ref().at_end(self.end)
    }

    /// The line the record read last starts on. The parser's position is
    /// where it began looking, which may be before blank lines or the `\n`
    /// of a CRLF.
    fn line(&self) -> u64 {
        let lead = self
            .raw()
            .iter()
            .take_while(|b| matches!(b, b'\n' | b'\r'))
            .filter(|&&b| b == b'\n')
            .count();
        self.start.1 + lead as u64
    }

    /// A record that reaches the end of the input must not end inside a
    /// quoted field (see the module documentation).
    fn check_closed(&self) -> Result<(), Error> {
        if !self.at_end() {
            return Ok(());
        }
        let raw = self.reader.get_ref().since(self.start.0);
        let Some(quote) = open_quote(raw, self.rules.delimiter) else {
            return Ok(());
        };
        let newlines = raw[..quote].iter().filter(|&&b| b == b'\n').count();
        let line = self.start.1 + newlines as u64;
        let record = (self.record > 0 || !self.headers.is_empty()).then_some(self.record + 1);
        Err(self.error(
            record,
            line,
            format!(
                "unterminated quoted field: the quote opened on line {line} is never closed, \
                 so the input ends inside it and every later line would be read into one field"
            ),
        ))
    }

    /// A good row, or a malformed one the run can reject.
    fn decode(&self, row: ByteRecord, origin: Origin) -> Result<RawRecord, Error> {
        let expected = self.headers.len();
        if row.len() != expected {
            if row.len() < expected && self.at_end() && !ends_with_terminator(self.raw()) {
                return Err(self.error(
                    Some(self.record),
                    self.line(),
                    format!(
                        "the file is cut: its last line has {} of the header's {expected} fields and no line end",
                        row.len()
                    ),
                ));
            }
            let why = format!(
                "malformed row: {} fields where the header has {expected}",
                row.len()
            );
            return Ok(self.malformed(why, origin));
        }
        match StringRecord::from_byte_record(row) {
            Ok(row) => Ok(RawRecord {
                data: RawData::Csv {
                    headers: Arc::clone(&self.headers),
                    row,
                },
                origin,
            }),
            Err(err) => {
                let field = err.utf8_error().field();
                let record = err.into_byte_record();
                let column = self.headers.get(field).unwrap_or("");
                let why = format!(
                    "invalid UTF-8 in column `{column}`: {}",
                    show_bytes(record.get(field).unwrap_or_default())
                );
                Ok(self.malformed(why, origin))
            }
        }
    }

    fn malformed(&self, why: String, origin: Origin) -> RawRecord {
        let raw = trim_terminators(self.raw());
        let error = parse_error(&self.resource, Some(origin.record), origin.line, why);
        RawRecord::malformed(String::from_utf8_lossy(raw).into_owned(), error, origin)
    }

    fn header_names(&self, header: ByteRecord) -> Result<StringRecord, Error> {
        StringRecord::from_byte_record(header).map_err(|err| {
            let field = err.utf8_error().field();
            let bytes = err.into_byte_record();
            self.error(
                None,
                self.line(),
                format!(
                    "invalid UTF-8 in the header, column {} of {}: {}",
                    field + 1,
                    bytes.len(),
                    show_bytes(bytes.get(field).unwrap_or_default())
                ),
            )
        })
    }

    /// Source drift: every column `[fields]` reads must be in the header
    /// (see the module documentation).
    fn check_missing_columns(&self) -> Result<(), Error> {
        let (allowed, missing): (Vec<&CsvColumn>, Vec<&CsvColumn>) = self
            .rules
            .columns
            .iter()
            .filter(|c| !self.headers.iter().any(|h| h == c.column))
            .partition(|c| c.may_lack);
        if !allowed.is_empty() {
            let fields: Vec<&str> = allowed.iter().map(|c| c.field.as_str()).collect();
            tracing::info!(
                resource = %self.resource,
                fields = %fields.join(","),
                "the header has no column for {}: an export older than the field (schema evolution); \
                 it loads as NULL or its default",
                fields.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
            );
        }
        if missing.is_empty() {
            return Ok(());
        }
        let named: Vec<String> = missing
            .iter()
            .map(|c| match c.field == c.column {
                true => format!("`{}`", c.column),
                false => format!("`{}` (fields.{}.from)", c.column, c.field),
            })
            .collect();
        let found: Vec<String> = self.headers.iter().map(|h| format!("{h:?}")).collect();
        let (noun, them) = match missing.len() {
            1 => ("column", "it was"),
            _ => ("columns", "they were"),
        };
        Err(Error::SourceDrift {
            location: tidemark_core::Location {
                resource: self.resource.to_string(),
                page: None,
                record: None,
                line: Some(self.line()),
            },
            message: format!(
                "source drift: the header lacks the {noun} {} that [fields] reads; the header is {}. \
                 If {them} renamed upstream, point `from` at the new name; if the field was added \
                 after this export was made, declare it with `added` (README \"When the source \
                 changes\"); nothing of this period is written",
                named.join(", "),
                found.join(", ")
            ),
        })
    }

    fn check_duplicate_columns(&self) -> Result<(), Error> {
        for CsvColumn { column, .. } in &self.rules.columns {
            let at: Vec<String> = self
                .headers
                .iter()
                .enumerate()
                .filter(|(_, h)| *h == column.as_str())
                .map(|(i, _)| (i + 1).to_string())
                .collect();
            if at.len() > 1 {
                return Err(self.error(
                    None,
                    self.line(),
                    format!(
                        "the header names column `{column}` {} times (columns {}), and [fields] reads it: which one is meant is ambiguous",
                        at.len(),
                        at.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    fn error(&self, record: Option<u64>, line: u64, message: String) -> Error {
        parse_error(&self.resource, record, Some(line), message)
    }
}

/// Where the quoted field that `raw` (one record, reaching the end of the
/// input) ends inside starts, or `None` when the record is closed. The
/// parser decides: with a line terminator appended, a closed record parses
/// to the same last field, while an open quote takes the terminator in.
pub(crate) fn open_quote(raw: &[u8], delimiter: u8) -> Option<usize> {
    // Without a quote nothing can be open; this is every record of most
    // files, and building the parser costs more than a small period's
    // parsing (it was 6 % of a 5-row period's CPU).
    if !raw.contains(&b'"') {
        return None;
    }
    let (start, field) = last_field(raw, delimiter);
    let mut closed = raw.to_vec();
    closed.push(b'\n');
    let (_, with_terminator) = last_field(&closed, delimiter);
    (field != with_terminator).then_some(start)
}

/// The start offset and the (unescaped) content of the last field of the
/// first record in `raw`.
fn last_field(raw: &[u8], delimiter: u8) -> (usize, Vec<u8>) {
    let mut parser = csv_core::ReaderBuilder::new().delimiter(delimiter).build();
    // A field is never longer than its raw text.
    let mut out = vec![0u8; raw.len() + 1];
    let (mut pos, mut start, mut len) = (0, 0, 0);
    loop {
        let (result, read, written) = parser.read_field(&raw[pos..], &mut out[len..]);
        pos += read;
        len += written;
        match result {
            ReadFieldResult::InputEmpty | ReadFieldResult::OutputFull => {}
            ReadFieldResult::Field { record_end: false } => {
                start = pos;
                len = 0;
            }
            ReadFieldResult::Field { record_end: true } | ReadFieldResult::End => {
                out.truncate(len);
                return (start, out);
            }
        }
    }
}

fn ends_with_terminator(raw: &[u8]) -> bool {
    matches!(raw.last(), Some(b'\n' | b'\r'))
}

fn trim_terminators(raw: &[u8]) -> &[u8] {
    let is_terminator = |b: &u8| matches!(b, b'\n' | b'\r');
    let start = raw
        .iter()
        .position(|b| !is_terminator(b))
        .unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|b| !is_terminator(b))
        .map_or(start, |i| i + 1);
    &raw[start..end.max(start)]
}

/// Maps a CSV error. Rows are read as bytes and flexibly, so only I/O
/// errors remain; they keep their transient/permanent nature.
fn csv_error(resource: &str, record: u64, err: csv::Error) -> Error {
    let line = err.position().map(csv::Position::line);
    match err.into_kind() {
        csv::ErrorKind::Io(err) => io_error("cannot read", resource, &err),
        other => parse_error(
            resource,
            Some(record),
            line,
            format!("malformed CSV: {other:?}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parser_tells_an_open_quote_from_a_closed_record() {
        let open = |raw: &[u8]| open_quote(raw, b',');
        assert_eq!(open(b"2,\"he said\n3,y\n"), Some(2));
        assert_eq!(
            open(b"\"a\nb\",\"c"),
            Some(6),
            "after a closed multi-line field"
        );
        assert_eq!(
            open(b"2,\"ab\"\""),
            Some(2),
            "an escaped quote does not close"
        );
        assert_eq!(open(b"2,\"ab\"\"\""), None);
        assert_eq!(open(b"2,\"y\""), None);
        assert_eq!(open(b"2,y"), None);
        assert_eq!(open(b"\n2,y\r"), None);
        assert_eq!(open(b"2,"), None);
        assert_eq!(
            open(b"x,ab\"c"),
            None,
            "a quote inside a field is a character"
        );
        assert_eq!(open_quote(b"1;\"x", b';'), Some(2));
    }
}
