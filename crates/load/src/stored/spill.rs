//! The file form of a run key's stored hashes, for a period whose stored
//! rows do not fit in the memory budget (ADR 0007, ADR 0021).
//!
//! The pairs are written to an anonymous temporary file in the order the
//! database returned them (48-byte entries: key, row and raw-record
//! hashes), which for a table tidemark
//! loaded is the order the source listed them: a re-sync of an unchanged
//! export asks for the keys in the same order. A lookup therefore first
//! compares the entry at a cursor that follows the source (and a few after
//! it, for rows deleted upstream), read sequentially through a window; only
//! a key that is not there goes to a key-sorted copy of the file, built the
//! first time one is needed ([`SortedIndex`]: an external merge sort, runs
//! of the budget's size, then one k-way merge). An unchanged re-sync in
//! source order never sorts; profiling put the sort, and the one `pread`
//! per key of sorted lookups, at the top of a 4,000,000-row re-sync.
//!
//! Memory holds the "seen" and "written" bits (two bits per row), the
//! cursor's window and, once sorted, a sparse directory (the first key of
//! every block of [`BLOCK`] entries) and one block.
//!
//! The file may also be filled while it is read ([`Spilled::streaming`]):
//! a scan on another thread sends the stored pairs as it reads them, and
//! the cursor compares each key as soon as the scan has passed its
//! position (and the lookahead after it), so an unchanged re-sync compares
//! while SQLite is still reading. What needs every stored row (a key not
//! at the cursor, the count of keys not seen, reconciliation) waits for the
//! scan's end first.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Mutex;

use tidemark_core::{Error, Hash128, KeySet};

use super::{scan_stopped, Found, Hashes, Scanned};

/// Entries per block of the sorted file: one `pread` per fallback lookup.
const BLOCK: usize = 64;

/// An arrival-file entry: key hash, row hash, raw hash (all big-endian;
/// [`Hashes::to_bytes`]).
const ENTRY: usize = 48;

/// A sorted-file entry: key hash, arrival position, row hash, raw hash
/// (big-endian, so that byte order is key order, then arrival order for a
/// key stored twice).
const SORTED_ENTRY: usize = 56;

/// Entries the cursor's window holds: 128 KiB, read sequentially.
const WINDOW: usize = 4096;

/// How far past the cursor a key is looked for before the sorted file:
/// rows deleted upstream leave gaps of a few entries in the stored order.
const LOOKAHEAD: usize = 32;

/// Read and write buffer of the files' sequential passes.
const BUFFER: usize = 64 << 10;

/// A failure of the spill file: the machine's temporary directory, not
/// the database, so it says which directory and what to do about it.
fn io_error(what: &str, e: std::io::Error) -> Error {
    let dir = std::env::temp_dir();
    Error::TempFile {
        message: format!(
            "{what} the file of the stored row hashes a period larger than load.memory_budget compares through: {e}; free space in {} or point TMPDIR at a writable directory with room",
            dir.display()
        ),
        dir: dir.display().to_string(),
    }
}

fn new_file() -> Result<File, Error> {
    tempfile::tempfile().map_err(|e| io_error("creating", e))
}

fn bit(bits: &[u64], i: usize) -> bool {
    bits.get(i / 64)
        .is_some_and(|word| word & (1 << (i % 64)) != 0)
}

/// Sets bit `i`; true if it was clear.
fn set(bits: &mut [u64], i: usize) -> bool {
    let was = bit(bits, i);
    if let Some(word) = bits.get_mut(i / 64) {
        *word |= 1 << (i % 64);
    }
    !was
}

fn hash_at(bytes: &[u8]) -> Hash128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&bytes[..16]);
    Hash128(u128::from_be_bytes(b))
}

/// Writes the stored pairs in arrival order, once they pass the budget.
#[derive(Debug)]
pub(crate) struct Writer {
    out: BufWriter<File>,
    len: usize,
    /// Rows this run wrote before (a resumed attempt): seen already.
    seen: Vec<u64>,
    unseen: usize,
    /// Some entry has a raw-record hash.
    raw: bool,
}

impl Writer {
    pub(crate) fn new() -> Result<Writer, Error> {
        Ok(Writer {
            out: BufWriter::with_capacity(BUFFER, new_file()?),
            len: 0,
            seen: Vec::new(),
            unseen: 0,
            raw: false,
        })
    }

    /// Appends the next stored row; `ours` when this run wrote it.
    pub(crate) fn push(&mut self, key: Hash128, hashes: Hashes, ours: bool) -> Result<(), Error> {
        let mut entry = [0u8; ENTRY];
        entry[..16].copy_from_slice(&key.to_bytes());
        entry[16..].copy_from_slice(&hashes.to_bytes());
        self.raw |= hashes.raw().is_some();
        self.out
            .write_all(&entry)
            .map_err(|e| io_error("writing", e))?;
        if self.len % 64 == 0 {
            self.seen.push(0);
        }
        if ours {
            set(&mut self.seen, self.len);
        } else {
            self.unseen += 1;
        }
        self.len += 1;
        Ok(())
    }

    /// The file form, with a sorted copy built only when a lookup misses
    /// the cursor (its runs sized by `budget`).
    pub(crate) fn finish(self, budget: u64) -> Result<Spilled, Error> {
        let file = self
            .out
            .into_inner()
            .map_err(|e| io_error("writing", e.into_error()))?;
        Ok(Spilled {
            written: vec![0; self.seen.len()],
            seen: self.seen,
            len: self.len,
            unseen: self.unseen,
            raw: self.raw,
            ..Spilled::empty(file, budget)
        })
    }
}

/// The arrival-order file and what is kept in memory about it.
#[derive(Debug)]
pub(crate) struct Spilled {
    file: File,
    len: usize,
    seen: Vec<u64>,
    /// Rows this run wrote since the start: their stored hash is stale.
    written: Vec<u64>,
    unseen: usize,
    /// The entries from `window_start` on, read ahead of the cursor.
    window: Vec<u8>,
    window_start: usize,
    /// Where the next key is expected: after the last one the cursor found.
    next: usize,
    /// The key-sorted copy, once a lookup needed it.
    sorted: Option<SortedIndex>,
    budget: u64,
    /// The keys not seen, once the run reconciles.
    unseen_keys: Option<KeySet>,
    /// The scan still sending stored pairs, until its end ([`Spilled::streaming`]).
    /// In a mutex only so that the stored hashes can be shared by reference
    /// across an `.await`: every use has `&mut self`.
    incoming: Option<Mutex<Receiver<Scanned>>>,
    /// How the scan failed: every later lookup fails the same way (its
    /// rows are not all known, so no answer would be right).
    failed: Option<Error>,
    /// Some entry has a raw-record hash.
    raw: bool,
}

impl Spilled {
    /// No entries yet, nothing read, nothing sorted: what both ways of
    /// filling `file` start from.
    fn empty(file: File, budget: u64) -> Spilled {
        Spilled {
            file,
            len: 0,
            seen: Vec::new(),
            written: Vec::new(),
            unseen: 0,
            window: Vec::new(),
            window_start: 0,
            next: 0,
            sorted: None,
            budget,
            unseen_keys: None,
            incoming: None,
            failed: None,
            raw: false,
        }
    }

    /// An empty file that `incoming` fills as a scan on another thread
    /// reads the stored rows (none of them written by this run: a resumed
    /// attempt scans before it compares). Lookups at the cursor wait only
    /// for the positions they need; see the module's documentation.
    pub(crate) fn streaming(incoming: Receiver<Scanned>, budget: u64) -> Result<Spilled, Error> {
        Ok(Spilled {
            incoming: Some(Mutex::new(incoming)),
            ..Spilled::empty(new_file()?, budget)
        })
    }

    /// Records that some stored row has a raw-record hash.
    pub(crate) fn note_raw(&mut self, raw: bool) {
        self.raw |= raw;
    }

    /// Whether some entry read so far has a raw-record hash.
    pub(crate) fn has_raw_hashes(&self) -> bool {
        self.raw
    }

    /// Appends stored pairs that the scan read, in its order.
    pub(crate) fn append(&mut self, pairs: &[(Hash128, Hashes)]) -> Result<(), Error> {
        let mut bytes = Vec::with_capacity(pairs.len() * ENTRY);
        for (key, hashes) in pairs {
            bytes.extend_from_slice(&key.to_bytes());
            bytes.extend_from_slice(&hashes.to_bytes());
            self.raw |= hashes.raw().is_some();
        }
        self.file
            .write_all_at(&bytes, (self.len * ENTRY) as u64)
            .map_err(|e| io_error("writing", e))?;
        self.len += pairs.len();
        self.unseen += pairs.len();
        let words = self.len.div_ceil(64);
        self.seen.resize(words, 0);
        self.written.resize(words, 0);
        Ok(())
    }

    /// Takes in what the scan has sent so far, and waits for more while
    /// fewer than `need` entries are in (`usize::MAX`: until its end).
    /// Nothing to do once the scan ended, or for a file filled up front.
    fn take_in(&mut self, need: usize) -> Result<(), Error> {
        if let Some(failed) = &self.failed {
            return Err(failed.clone());
        }
        loop {
            let Some(incoming) = self.incoming.as_mut() else {
                return Ok(());
            };
            let incoming = incoming
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let message = match incoming.try_recv() {
                Ok(message) => Some(message),
                Err(TryRecvError::Empty) if self.len >= need => return Ok(()),
                Err(TryRecvError::Empty) => crate::blocking(|| incoming.recv().ok()),
                Err(TryRecvError::Disconnected) => None,
            };
            match message {
                Some(Scanned::Rows(pairs)) => self.append(&pairs)?,
                Some(Scanned::End) => {
                    self.incoming = None;
                    tracing::debug!(stored = self.len, "the stored-row scan ended");
                }
                Some(Scanned::Failed(e)) => return Err(self.fail(e)),
                None => return Err(self.fail(scan_stopped())),
            }
        }
    }

    fn fail(&mut self, e: Error) -> Error {
        self.incoming = None;
        self.failed = Some(e.clone());
        e
    }

    /// Waits for the scan's end: every stored row is in the file.
    pub(crate) fn complete(&mut self) -> Result<(), Error> {
        self.take_in(usize::MAX)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn unseen(&self) -> usize {
        self.unseen
    }

    /// Whether a lookup needed the key-sorted copy.
    #[cfg(test)]
    pub(crate) fn sorted(&self) -> bool {
        self.sorted.is_some()
    }

    /// A found entry: `None` as the row hash (and the raw hash) once this
    /// run wrote the row (the database then compares).
    fn found(&self, position: usize, hashes: Hashes) -> Found {
        Found::at(position, hashes, bit(&self.written, position))
    }

    /// Makes entries `from..from + count` (clamped to the file) readable
    /// in the window, reading from `from` on when they are not.
    fn window_holds(&mut self, from: usize, count: usize) -> Result<(), Error> {
        let end = (from + count).min(self.len);
        let held = self.window.len() / ENTRY;
        if from >= self.window_start && end <= self.window_start + held {
            return Ok(());
        }
        let entries = WINDOW.min(self.len - from);
        self.window.resize(entries * ENTRY, 0);
        self.file
            .read_exact_at(&mut self.window, (from * ENTRY) as u64)
            .map_err(|e| io_error("reading", e))?;
        self.window_start = from;
        Ok(())
    }

    /// The key at or shortly after the cursor, moving the cursor past it.
    fn at_cursor(&mut self, key: Hash128) -> Result<Option<Found>, Error> {
        let need = self.next.saturating_add(LOOKAHEAD);
        if self.incoming.is_some() && need > self.len {
            self.take_in(need)?;
        }
        if self.next >= self.len {
            return Ok(None);
        }
        self.window_holds(self.next, LOOKAHEAD)?;
        let ahead = (self.len - self.next).min(LOOKAHEAD);
        for position in self.next..self.next + ahead {
            let at = (position - self.window_start) * ENTRY;
            if hash_at(&self.window[at..]) == key {
                let hashes = Hashes::from_bytes(&self.window[at + 16..]);
                self.next = position + 1;
                return Ok(Some(self.found(position, hashes)));
            }
        }
        Ok(None)
    }

    /// Finds each key (results in the order of `keys`): at the cursor when
    /// the keys come in the stored order, else in the sorted copy, in key
    /// order so that keys sharing a block share its read.
    pub(crate) fn find_all(&mut self, keys: &[Hash128]) -> Result<Vec<Option<Found>>, Error> {
        // What the scan sent meanwhile, so that it need not wait for room.
        self.take_in(0)?;
        let mut found = Vec::with_capacity(keys.len());
        let mut missed = Vec::new();
        for (i, &key) in keys.iter().enumerate() {
            let hit = self.at_cursor(key)?;
            if hit.is_none() {
                missed.push(i);
            }
            found.push(hit);
        }
        if missed.is_empty() {
            return Ok(found);
        }
        // A key not at the cursor may still be anywhere in the stored rows.
        self.complete()?;
        if self.sorted.is_none() {
            tracing::debug!(
                stored = self.len,
                "a key is not where the stored order expects it: sorting the stored hashes"
            );
            self.sorted = Some(SortedIndex::build(&self.file, self.len, self.budget)?);
        }
        missed.sort_unstable_by_key(|&i| keys[i]);
        for i in missed {
            let hit = match self.sorted.as_mut() {
                Some(sorted) => sorted.find(keys[i])?,
                None => None,
            };
            found[i] = hit.map(|(position, hashes)| self.found(position, hashes));
        }
        Ok(found)
    }

    /// Records that the run saw the key at `position`; `written` when it
    /// wrote the row (its stored hash is then stale).
    pub(crate) fn saw(&mut self, position: usize, written: bool) {
        if set(&mut self.seen, position) {
            self.unseen -= 1;
        }
        if written {
            set(&mut self.written, position);
        }
    }

    /// Takes back [`Spilled::saw`] of a key not seen before and not
    /// written, for a transaction that did not commit.
    pub(crate) fn unsee(&mut self, position: usize) {
        if bit(&self.seen, position) {
            self.seen[position / 64] &= !(1 << (position % 64));
            self.unseen += 1;
        }
    }

    pub(crate) fn was_seen(&self, position: usize) -> bool {
        bit(&self.seen, position)
    }

    /// Collects the keys not seen, for [`Spilled::vanished`]: a sequential
    /// read of the file, and a second one when some were not seen, so that
    /// a key the table held twice (a scan racing a takeover) and that was
    /// seen at either place does not vanish.
    pub(crate) fn collect_unseen(&mut self) -> Result<(), Error> {
        self.complete()?;
        let mut keys = KeySet::default();
        if self.unseen > 0 {
            self.each_entry(|position, key| {
                if !bit(&self.seen, position) {
                    keys.insert(key);
                }
            })?;
            self.each_entry(|position, key| {
                if bit(&self.seen, position) {
                    keys.remove(&key);
                }
            })?;
        }
        self.unseen_keys = Some(keys);
        Ok(())
    }

    /// Calls `each` with the position and key of every entry, in order.
    fn each_entry(&self, mut each: impl FnMut(usize, Hash128)) -> Result<(), Error> {
        let reader = ReadAt {
            file: &self.file,
            offset: 0,
        };
        let mut reader = BufReader::with_capacity(BUFFER, reader);
        let mut entry = [0u8; ENTRY];
        for position in 0..self.len {
            reader
                .read_exact(&mut entry)
                .map_err(|e| io_error("reading", e))?;
            each(position, hash_at(&entry));
        }
        Ok(())
    }

    /// Whether a key the run key held at the start was not seen; after
    /// [`Spilled::collect_unseen`].
    pub(crate) fn vanished(&self, key: Hash128) -> bool {
        self.unseen_keys
            .as_ref()
            .is_some_and(|keys| keys.contains(&key))
    }
}

/// The stored pairs sorted by key, with their arrival positions: what a
/// key the cursor did not find is looked up in.
#[derive(Debug)]
struct SortedIndex {
    file: File,
    len: usize,
    /// The first key of each block.
    directory: Vec<Hash128>,
    /// The block last read, and which one it is.
    block: Vec<u8>,
    block_no: Option<usize>,
}

impl SortedIndex {
    /// Sorts the arrival file (`len` entries) in runs of about `budget`
    /// bytes, then merges them. A key stored twice keeps its first entry.
    fn build(arrival: &File, len: usize, budget: u64) -> Result<SortedIndex, Error> {
        let run_entries = usize::try_from(budget / SORTED_ENTRY as u64)
            .unwrap_or(usize::MAX)
            .max(1024);
        let mut runs = BufWriter::with_capacity(BUFFER, new_file()?);
        let mut lengths = Vec::new();
        let mut reader = BufReader::with_capacity(
            BUFFER,
            ReadAt {
                file: arrival,
                offset: 0,
            },
        );
        let mut position = 0;
        let mut chunk: Vec<[u8; SORTED_ENTRY]> = Vec::with_capacity(run_entries.min(len));
        while position < len {
            chunk.clear();
            while chunk.len() < run_entries && position < len {
                let mut entry = [0u8; ENTRY];
                reader
                    .read_exact(&mut entry)
                    .map_err(|e| io_error("reading", e))?;
                chunk.push(sorted_entry(&entry, position));
                position += 1;
            }
            chunk.sort_unstable();
            for entry in &chunk {
                runs.write_all(entry).map_err(|e| io_error("writing", e))?;
            }
            lengths.push(chunk.len() as u64);
        }
        drop(chunk);
        let runs = runs
            .into_inner()
            .map_err(|e| io_error("writing", e.into_error()))?;
        merge(&runs, &lengths, len)
    }

    /// The arrival position and hashes of `key`, if stored.
    fn find(&mut self, key: Hash128) -> Result<Option<(usize, Hashes)>, Error> {
        let Some(block_no) = self
            .directory
            .partition_point(|first| *first <= key)
            .checked_sub(1)
        else {
            return Ok(None);
        };
        self.read_block(block_no)?;
        let entries = self.block.len() / SORTED_ENTRY;
        let (mut lo, mut hi) = (0, entries);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let at = mid * SORTED_ENTRY;
            match hash_at(&self.block[at..]).cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => {
                    let mut pos = [0u8; 8];
                    pos.copy_from_slice(&self.block[at + 16..at + 24]);
                    let position = usize::try_from(u64::from_be_bytes(pos)).unwrap_or(usize::MAX);
                    return Ok(Some((position, Hashes::from_bytes(&self.block[at + 24..]))));
                }
            }
        }
        Ok(None)
    }

    fn read_block(&mut self, block_no: usize) -> Result<(), Error> {
        if self.block_no == Some(block_no) {
            return Ok(());
        }
        let first = block_no * BLOCK;
        let entries = BLOCK.min(self.len - first);
        self.block.resize(entries * SORTED_ENTRY, 0);
        self.file
            .read_exact_at(&mut self.block, (first * SORTED_ENTRY) as u64)
            .map_err(|e| io_error("reading", e))?;
        self.block_no = Some(block_no);
        Ok(())
    }
}

/// An arrival entry at `position` as a sorted-file entry.
fn sorted_entry(entry: &[u8; ENTRY], position: usize) -> [u8; SORTED_ENTRY] {
    let mut out = [0u8; SORTED_ENTRY];
    out[..16].copy_from_slice(&entry[..16]);
    out[16..24].copy_from_slice(&(position as u64).to_be_bytes());
    out[24..].copy_from_slice(&entry[16..]);
    out
}

/// Merges the sorted runs (`lengths` entries each, in file order) into
/// the sorted file, keeping the first entry of a key stored twice.
fn merge(runs: &File, lengths: &[u64], total: usize) -> Result<SortedIndex, Error> {
    let mut cursors = Vec::with_capacity(lengths.len());
    let mut start = 0u64;
    for &len in lengths {
        cursors.push(Cursor::new(start * SORTED_ENTRY as u64, len));
        start += len;
    }
    let file = new_file()?;
    let mut out = BufWriter::with_capacity(BUFFER, &file);
    let mut heap = BinaryHeap::with_capacity(cursors.len());
    for (i, cursor) in cursors.iter_mut().enumerate() {
        if let Some(entry) = cursor.next(runs)? {
            heap.push(Reverse((entry, i)));
        }
    }
    let mut directory = Vec::with_capacity(total.div_ceil(BLOCK));
    let mut len = 0;
    let mut last: Option<Hash128> = None;
    while let Some(Reverse((entry, i))) = heap.pop() {
        if let Some(next) = cursors[i].next(runs)? {
            heap.push(Reverse((next, i)));
        }
        let key = hash_at(&entry);
        if last == Some(key) {
            continue;
        }
        last = Some(key);
        if len % BLOCK == 0 {
            directory.push(key);
        }
        out.write_all(&entry).map_err(|e| io_error("writing", e))?;
        len += 1;
    }
    out.flush().map_err(|e| io_error("writing", e))?;
    drop(out);
    Ok(SortedIndex {
        file,
        len,
        directory,
        block: Vec::new(),
        block_no: None,
    })
}

/// Reads one run of the runs file in chunks.
struct Cursor {
    offset: u64,
    left: u64,
    buffer: Vec<u8>,
    at: usize,
}

impl Cursor {
    fn new(offset: u64, len: u64) -> Cursor {
        Cursor {
            offset,
            left: len,
            buffer: Vec::new(),
            at: 0,
        }
    }

    fn next(&mut self, file: &File) -> Result<Option<[u8; SORTED_ENTRY]>, Error> {
        if self.at == self.buffer.len() {
            if self.left == 0 {
                return Ok(None);
            }
            let entries = self.left.min((BUFFER / SORTED_ENTRY) as u64);
            let bytes = usize::try_from(entries).unwrap_or(0) * SORTED_ENTRY;
            self.buffer.resize(bytes, 0);
            file.read_exact_at(&mut self.buffer, self.offset)
                .map_err(|e| io_error("reading", e))?;
            self.offset += bytes as u64;
            self.left -= entries;
            self.at = 0;
        }
        let mut entry = [0u8; SORTED_ENTRY];
        entry.copy_from_slice(&self.buffer[self.at..self.at + SORTED_ENTRY]);
        self.at += SORTED_ENTRY;
        Ok(Some(entry))
    }
}

/// Sequential reads through `pread`, so the file's own offset is not used.
struct ReadAt<'f> {
    file: &'f File,
    offset: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}
