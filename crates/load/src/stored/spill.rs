//! The file form of a run key's stored hashes, for a period whose stored
//! rows do not fit in the memory budget (ADR 0007).
//!
//! The pairs are sorted by key hash into an anonymous temporary file (an
//! external merge sort: runs of the budget's size, then one k-way merge),
//! of 32-byte entries. Memory then holds a sparse directory (the first key
//! of every block of [`BLOCK`] entries: a quarter of a byte per row), the
//! "seen" and "written" bits (two bits per row) and one block. A lookup
//! reads one block with `pread`; the lookups of a batch go in key order, so
//! keys that share a block share the read.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;

use tidemark_core::{Error, Hash128, KeySet};

use super::Found;

/// Entries per block of the sorted file: 2 KiB, one `pread` per lookup.
const BLOCK: usize = 64;

/// A sorted-file entry: key hash, row hash (both big-endian).
const ENTRY: usize = 32;

/// A run entry: key hash, row hash, and 1 when this run wrote the row.
const RUN_ENTRY: usize = 33;

/// Read buffer of each run during the merge.
const MERGE_BUFFER: usize = 64 << 10;

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

/// Sorted runs of `(key, row hash, written by this run)`, in one file.
#[derive(Debug)]
pub(crate) struct Runs {
    out: BufWriter<File>,
    /// Entries in each run, in file order.
    lengths: Vec<u64>,
}

impl Runs {
    pub(crate) fn new() -> Result<Runs, Error> {
        let file = tempfile::tempfile().map_err(|e| io_error("creating", e))?;
        Ok(Runs {
            out: BufWriter::with_capacity(MERGE_BUFFER, file),
            lengths: Vec::new(),
        })
    }

    /// Sorts and writes one run; `ours` are the keys this run wrote.
    pub(crate) fn write_run(
        &mut self,
        pairs: &mut [(Hash128, Hash128)],
        ours: &mut [Hash128],
    ) -> Result<(), Error> {
        pairs.sort_unstable_by_key(|(key, _)| *key);
        ours.sort_unstable();
        let mut ours = ours.iter().peekable();
        for (key, row) in pairs.iter() {
            while ours.next_if(|k| *k < key).is_some() {}
            let flag = u8::from(ours.next_if(|k| *k == key).is_some());
            let mut entry = [0u8; RUN_ENTRY];
            entry[..16].copy_from_slice(&key.to_bytes());
            entry[16..32].copy_from_slice(&row.to_bytes());
            entry[32] = flag;
            self.out
                .write_all(&entry)
                .map_err(|e| io_error("writing", e))?;
        }
        self.lengths.push(pairs.len() as u64);
        Ok(())
    }

    /// Merges the runs into the sorted file. Duplicate keys (a table that
    /// held one key twice cannot, but a scan racing a takeover might) keep
    /// their first entry.
    pub(crate) fn merge(self) -> Result<Spilled, Error> {
        let file = self
            .out
            .into_inner()
            .map_err(|e| io_error("writing", e.into_error()))?;
        let mut cursors = Vec::with_capacity(self.lengths.len());
        let mut start = 0u64;
        for &len in &self.lengths {
            cursors.push(Cursor::new(start * RUN_ENTRY as u64, len));
            start += len;
        }
        let total = usize::try_from(start).unwrap_or(usize::MAX);
        let sorted = tempfile::tempfile().map_err(|e| io_error("creating", e))?;
        let mut out = BufWriter::with_capacity(MERGE_BUFFER, &sorted);
        let mut heap = BinaryHeap::with_capacity(cursors.len());
        for (i, cursor) in cursors.iter_mut().enumerate() {
            if let Some(entry) = cursor.next(&file)? {
                heap.push(Reverse((entry, i)));
            }
        }
        let mut spilled = Spilled::with_capacity(total);
        let mut last: Option<[u8; 16]> = None;
        while let Some(Reverse((entry, i))) = heap.pop() {
            if let Some(next) = cursors[i].next(&file)? {
                heap.push(Reverse((next, i)));
            }
            let key: [u8; 16] = entry[..16].try_into().unwrap_or_default();
            if last == Some(key) {
                continue;
            }
            last = Some(key);
            spilled.push(&entry, &mut out)?;
        }
        out.flush().map_err(|e| io_error("writing", e))?;
        drop(out);
        spilled.file = Some(sorted);
        Ok(spilled)
    }
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

    fn next(&mut self, file: &File) -> Result<Option<[u8; RUN_ENTRY]>, Error> {
        if self.at == self.buffer.len() {
            if self.left == 0 {
                return Ok(None);
            }
            let entries = self.left.min((MERGE_BUFFER / RUN_ENTRY) as u64);
            let bytes = usize::try_from(entries).unwrap_or(0) * RUN_ENTRY;
            self.buffer.resize(bytes, 0);
            file.read_exact_at(&mut self.buffer, self.offset)
                .map_err(|e| io_error("reading", e))?;
            self.offset += bytes as u64;
            self.left -= entries;
            self.at = 0;
        }
        let mut entry = [0u8; RUN_ENTRY];
        entry.copy_from_slice(&self.buffer[self.at..self.at + RUN_ENTRY]);
        self.at += RUN_ENTRY;
        Ok(Some(entry))
    }
}

/// The sorted file and what is kept in memory about it.
#[derive(Debug)]
pub(crate) struct Spilled {
    file: Option<File>,
    len: usize,
    /// The first key of each block.
    directory: Vec<Hash128>,
    seen: Vec<u64>,
    /// Rows this run wrote since the start: their stored hash is stale.
    written: Vec<u64>,
    unseen: usize,
    /// The block last read, and which one it is.
    block: Vec<u8>,
    block_no: Option<usize>,
    /// The keys not seen, once the run reconciles.
    unseen_keys: Option<KeySet>,
}

fn bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

fn set(bits: &mut [u64], i: usize) -> bool {
    let was = bit(bits, i);
    bits[i / 64] |= 1 << (i % 64);
    !was
}

fn hash_at(bytes: &[u8]) -> Hash128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&bytes[..16]);
    Hash128(u128::from_be_bytes(b))
}

impl Spilled {
    fn with_capacity(len: usize) -> Spilled {
        Spilled {
            file: None,
            len: 0,
            directory: Vec::with_capacity(len.div_ceil(BLOCK)),
            seen: vec![0; len.div_ceil(64)],
            written: vec![0; len.div_ceil(64)],
            unseen: 0,
            block: Vec::new(),
            block_no: None,
            unseen_keys: None,
        }
    }

    /// Appends the next entry in key order (from the merge).
    fn push(&mut self, entry: &[u8; RUN_ENTRY], out: &mut impl Write) -> Result<(), Error> {
        if self.len % BLOCK == 0 {
            self.directory.push(hash_at(&entry[..16]));
        }
        out.write_all(&entry[..ENTRY])
            .map_err(|e| io_error("writing", e))?;
        if entry[32] == 1 {
            set(&mut self.seen, self.len);
        } else {
            self.unseen += 1;
        }
        self.len += 1;
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn sorted(&self) -> Result<&File, Error> {
        self.file
            .as_ref()
            .ok_or_else(|| io_error("reading", std::io::ErrorKind::NotFound.into()))
    }

    pub(crate) fn unseen(&self) -> usize {
        self.unseen
    }

    fn read_block(&mut self, block_no: usize) -> Result<(), Error> {
        if self.block_no == Some(block_no) {
            return Ok(());
        }
        let first = block_no * BLOCK;
        let entries = BLOCK.min(self.len - first);
        self.block.resize(entries * ENTRY, 0);
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| io_error("reading", std::io::ErrorKind::NotFound.into()))?;
        file.read_exact_at(&mut self.block, (first * ENTRY) as u64)
            .map_err(|e| io_error("reading", e))?;
        self.block_no = Some(block_no);
        Ok(())
    }

    /// Where `key` is and its stored row hash (`None` once this run wrote
    /// the row: the database then compares).
    fn find(&mut self, key: Hash128) -> Result<Option<Found>, Error> {
        let Some(block_no) = self
            .directory
            .partition_point(|first| *first <= key)
            .checked_sub(1)
        else {
            return Ok(None);
        };
        self.read_block(block_no)?;
        let entries = self.block.len() / ENTRY;
        let (mut lo, mut hi) = (0, entries);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let at = hash_at(&self.block[mid * ENTRY..]);
            match at.cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => {
                    let position = block_no * BLOCK + mid;
                    let row = hash_at(&self.block[mid * ENTRY + 16..]);
                    let row_hash = (!bit(&self.written, position)).then_some(row);
                    return Ok(Some(Found { position, row_hash }));
                }
            }
        }
        Ok(None)
    }

    /// [`Spilled::find`] for many keys, in key order so that keys sharing a
    /// block share its read; results in the order of `keys`.
    pub(crate) fn find_all(&mut self, keys: &[Hash128]) -> Result<Vec<Option<Found>>, Error> {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by_key(|&i| keys[i]);
        let mut found = vec![None; keys.len()];
        for i in order {
            found[i] = self.find(keys[i])?;
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

    /// Collects the keys not seen, for [`Spilled::vanished`]: one
    /// sequential read of the file.
    pub(crate) fn collect_unseen(&mut self) -> Result<(), Error> {
        let mut keys = KeySet::default();
        if self.unseen > 0 {
            let file = self.sorted()?;
            let mut reader = BufReader::with_capacity(MERGE_BUFFER, ReadAt { file, offset: 0 });
            let mut entry = [0u8; ENTRY];
            for position in 0..self.len {
                reader
                    .read_exact(&mut entry)
                    .map_err(|e| io_error("reading", e))?;
                if !bit(&self.seen, position) {
                    keys.insert(hash_at(&entry));
                }
            }
        }
        self.unseen_keys = Some(keys);
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
