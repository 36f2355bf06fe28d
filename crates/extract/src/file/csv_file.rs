//! CSV files (and HTTP pages) with a header row, streamed one row at a time.

use std::fs::File;
use std::io::Read;
use std::sync::Arc;

use csv::StringRecord;
use tidemark_core::{Error, Origin, RawData, RawRecord};

use super::{io_error, parse_error};

/// An open CSV file (or any other reader, such as an HTTP page's body).
/// Every row shares the header record, so a row costs one allocation, not
/// one per cell.
pub(crate) struct CsvCursor<R = File> {
    reader: csv::Reader<R>,
    headers: Arc<StringRecord>,
    resource: Arc<str>,
    /// Rows read so far.
    record: u64,
    /// The previous row's size, to allocate the next one in one go.
    last_len: (usize, usize),
}

impl<R: Read> CsvCursor<R> {
    /// Opens the reader and reads the header row. A row whose field count
    /// differs from the header's is an error, not a silently shifted row.
    pub(crate) fn open(file: R, resource: Arc<str>, delimiter: u8) -> Result<CsvCursor<R>, Error> {
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(delimiter)
            .has_headers(true)
            .flexible(false)
            .from_reader(file);
        let headers = match reader.headers() {
            Ok(headers) => Arc::new(headers.clone()),
            Err(err) => return Err(csv_error(&resource, None, err)),
        };
        Ok(CsvCursor {
            reader,
            headers,
            resource,
            record: 0,
            last_len: (0, 0),
        })
    }

    /// The next row, or `None` at the end of the file.
    pub(crate) fn next_record(&mut self) -> Result<Option<RawRecord>, Error> {
        let (bytes, fields) = self.last_len;
        let mut row = StringRecord::with_capacity(bytes, fields);
        match self.reader.read_record(&mut row) {
            Ok(false) => Ok(None),
            Ok(true) => {
                self.record += 1;
                self.last_len = (row.as_byte_record().as_slice().len(), row.len());
                let line = row.position().map(csv::Position::line);
                Ok(Some(RawRecord {
                    data: RawData::Csv {
                        headers: Arc::clone(&self.headers),
                        row,
                    },
                    origin: Origin {
                        resource: Arc::clone(&self.resource),
                        page: None,
                        record: self.record,
                        line,
                    },
                }))
            }
            Err(err) => Err(csv_error(&self.resource, Some(self.record + 1), err)),
        }
    }
}

/// Maps a CSV error: I/O errors keep their transient/permanent nature,
/// anything else is a parse error at the row (`None`: the header).
fn csv_error(resource: &str, record: Option<u64>, err: csv::Error) -> Error {
    let line = err.position().map(csv::Position::line);
    match err.into_kind() {
        csv::ErrorKind::Io(err) => io_error("cannot read", resource, &err),
        csv::ErrorKind::Utf8 { err, .. } => parse_error(
            resource,
            record,
            line,
            format!("invalid UTF-8 in field {}: {err}", err.field() + 1),
        ),
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => parse_error(
            resource,
            record,
            line,
            format!("malformed row: {len} fields where the header has {expected_len}"),
        ),
        other => parse_error(resource, record, line, format!("malformed CSV: {other:?}")),
    }
}
