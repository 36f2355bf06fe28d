//! A reader adapter that remembers what its consumer has consumed: a
//! running xxh3 hash of every byte before a mark, and the bytes after it.
//!
//! The CSV cursor reads through it, marking the start of each record. That
//! gives it, without a second pass over the input, the raw text of the row
//! being read (kept for the rejects table, and for the end-of-input check of
//! an unclosed quote) and the identity of the content consumed so far, for
//! the checkpoint. The csv crate reads ahead through its own buffer, so the
//! bytes after the mark are at most one record plus that buffer.

use std::io::{self, Read};

use xxhash_rust::xxh3::Xxh3;

/// Bytes released but not yet hashed are hashed and dropped once there
/// are this many, so a long file does not accumulate them.
const COMPACT_AT: usize = 64 << 10;

/// See the module documentation. Offsets are absolute: bytes since the
/// start of the input.
pub(crate) struct Consumed<R> {
    inner: R,
    /// Every byte before `kept_from`.
    hasher: Xxh3,
    /// The bytes read from `kept_from` on.
    kept: Vec<u8>,
    kept_from: u64,
    /// Bytes before this offset will not be asked for again.
    released: u64,
    /// The inner reader reported the end of its input.
    eof: bool,
}

impl<R: Read> Consumed<R> {
    /// Wraps `inner`, continuing `hasher` (the content consumed before
    /// this input, e.g. the earlier files of a period).
    pub(crate) fn new(inner: R, hasher: Xxh3) -> Consumed<R> {
        Consumed {
            inner,
            hasher,
            kept: Vec::new(),
            kept_from: 0,
            released: 0,
            eof: false,
        }
    }

    /// The bytes from `from` to `to` (absolute offsets; `from` must not be
    /// before the last [`release`](Consumed::release)).
    pub(crate) fn slice(&self, from: u64, to: u64) -> &[u8] {
        let start = self.index(from);
        let end = self.index(to).max(start);
        &self.kept[start..end]
    }

    /// Everything read from `from` on.
    pub(crate) fn since(&self, from: u64) -> &[u8] {
        &self.kept[self.index(from)..]
    }

    /// Whether `offset` is the end of the input: the inner reader has
    /// reported its end, and nothing was read after `offset`.
    pub(crate) fn at_end(&self, offset: u64) -> bool {
        self.eof && offset >= self.kept_from + self.kept.len() as u64
    }

    /// The bytes before `to` will not be asked for again.
    pub(crate) fn release(&mut self, to: u64) {
        self.released = self.released.max(to);
    }

    /// The hash of everything consumed before `to`.
    pub(crate) fn digest_through(&self, to: u64) -> u64 {
        let mut hasher = self.hasher.clone();
        hasher.update(&self.kept[..self.index(to)]);
        hasher.digest()
    }

    /// The hasher over everything read, once the input is finished.
    pub(crate) fn into_hasher(mut self) -> Xxh3 {
        self.hasher.update(&self.kept);
        self.hasher
    }

    fn index(&self, offset: u64) -> usize {
        usize::try_from(offset.saturating_sub(self.kept_from))
            .unwrap_or(usize::MAX)
            .min(self.kept.len())
    }

    /// Hashes and drops released bytes once enough have piled up: one
    /// `memmove` per 64 KiB, not one per record.
    fn compact(&mut self) {
        let releasable = self.index(self.released);
        if releasable >= COMPACT_AT {
            self.hasher.update(&self.kept[..releasable]);
            self.kept.drain(..releasable);
            self.kept_from += releasable as u64;
        }
    }
}

impl<R: Read> Read for Consumed<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.compact();
        let n = self.inner.read(buf)?;
        self.eof |= n == 0 && !buf.is_empty();
        self.kept.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hash_of(bytes: &[u8]) -> u64 {
        let mut h = Xxh3::new();
        h.update(bytes);
        h.digest()
    }

    #[test]
    fn keeps_what_is_not_released_and_hashes_the_prefix() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let mut reader = Consumed::new(&data[..], Xxh3::new());
        let mut buf = [0u8; 8192];
        let mut offset = 0usize;
        loop {
            let n = reader.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            offset += n;
            // A consumer that is done with all but the last 100 bytes.
            reader.release((offset - 100) as u64);
            assert_eq!(
                reader.slice((offset - 100) as u64, offset as u64),
                &data[offset - 100..offset]
            );
        }
        assert_eq!(reader.digest_through(199_950), hash_of(&data[..199_950]));
        assert_eq!(reader.since(199_990), &data[199_990..]);
        assert_eq!(reader.into_hasher().digest(), hash_of(&data));
    }
}
