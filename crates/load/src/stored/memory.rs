//! The in-memory form of a run key's stored hashes: below the memory
//! budget, every lookup is a read of memory.

use tidemark_core::Hash128;

use super::Hashes;

/// `(key hash, row and raw hashes)` of the run key's live rows when the
/// attempt started, sorted by key, with one "seen by this run" bit each.
///
/// Memory is what matters here: a re-sync of a 1,000,000-row period holds
/// one entry per row. A sorted vector costs 48 bytes an entry with no
/// hash-table slack; the seen bit replaces a hash-set entry (~35 bytes) for
/// every key the run key already had. Lookups go through a directory on the
/// top bits of the key hash (uniformly distributed), so finding a key costs
/// one directory read and a scan of about two entries instead of a binary
/// search over the whole vector: a re-sync looks up every row it reads.
#[derive(Debug, Default)]
pub(crate) struct InMemory {
    pairs: Vec<(Hash128, Hashes)>,
    /// `directory[b]` is the index of the first pair whose key's top bits
    /// are `>= b`; one more entry than there are buckets.
    directory: Vec<u32>,
    /// Key hash bits below the bucket number.
    shift: u32,
    seen: Vec<u64>,
    unseen: usize,
    /// Some entry has a raw-record hash.
    raw: bool,
}

impl InMemory {
    pub(crate) fn new(mut pairs: Vec<(Hash128, Hashes)>) -> Self {
        pairs.sort_unstable_by_key(|(key, _)| *key);
        pairs.dedup_by_key(|(key, _)| *key);
        pairs.shrink_to_fit();
        // About two entries a bucket: 2 to 4 bytes of directory per entry.
        let bits = usize::BITS - (pairs.len() / 2).leading_zeros();
        let shift = u128::BITS - bits;
        let buckets = 1usize << bits;
        let mut directory = Vec::with_capacity(buckets + 1);
        let mut next = 0;
        for bucket in 0..buckets {
            while next < pairs.len() && bucket_of(pairs[next].0, shift) < bucket {
                next += 1;
            }
            directory.push(index(next));
        }
        directory.push(index(pairs.len()));
        let unseen = pairs.len();
        InMemory {
            raw: pairs.iter().any(|(_, h)| h.raw().is_some()),
            seen: vec![0; pairs.len().div_ceil(64)],
            pairs,
            directory,
            shift,
            unseen,
        }
    }

    /// Where a key is, if the run key had it.
    pub(crate) fn position(&self, key: Hash128) -> Option<usize> {
        let bucket = bucket_of(key, self.shift);
        let start = usize::try_from(*self.directory.get(bucket)?).ok()?;
        let end = usize::try_from(*self.directory.get(bucket + 1)?).ok()?;
        self.pairs[start..end]
            .iter()
            .position(|(k, _)| *k == key)
            .map(|i| start + i)
    }

    /// The stored row hash at `position`.
    pub(crate) fn row_hash(&self, position: usize) -> Hash128 {
        self.pairs[position].1.row
    }

    /// The stored hashes at `position`.
    pub(crate) fn hashes(&self, position: usize) -> Hashes {
        self.pairs[position].1
    }

    /// Whether some entry has a raw-record hash.
    pub(crate) fn has_raw_hashes(&self) -> bool {
        self.raw
    }

    /// Records that the run saw this key again, with this row hash now in
    /// the table (so a later duplicate compares against what is stored).
    /// A row hash other than the stored one drops the stored raw hash: the
    /// table now holds a row typed from another record.
    pub(crate) fn saw(&mut self, position: usize, row_hash: Hash128) {
        let stored = &mut self.pairs[position].1;
        if stored.row != row_hash {
            *stored = Hashes::new(row_hash, None);
        }
        let (word, bit) = (position / 64, 1u64 << (position % 64));
        if self.seen[word] & bit == 0 {
            self.seen[word] |= bit;
            self.unseen -= 1;
        }
    }

    /// Marks a stored key as seen, its row hash unchanged; false if the run
    /// key did not hold it.
    pub(crate) fn mark_seen(&mut self, key: Hash128) -> bool {
        let Some(at) = self.position(key) else {
            return false;
        };
        self.saw(at, self.row_hash(at));
        true
    }

    /// Takes back [`InMemory::saw`] of a key not seen before (its row hash
    /// unchanged), for a transaction that did not commit.
    pub(crate) fn unsee(&mut self, position: usize) {
        let (word, bit) = (position / 64, 1u64 << (position % 64));
        if self.seen[word] & bit != 0 {
            self.seen[word] &= !bit;
            self.unseen += 1;
        }
    }

    /// Whether the run has seen the key at `position`.
    pub(crate) fn was_seen(&self, position: usize) -> bool {
        self.seen[position / 64] & (1u64 << (position % 64)) != 0
    }

    /// Whether a key the run key held at the start has not been seen: a
    /// row reconciliation removes. Keys the run key did not hold were
    /// written by this attempt and never vanish.
    pub(crate) fn vanished(&self, key: Hash128) -> bool {
        self.position(key).is_some_and(|i| !self.was_seen(i))
    }

    /// How many keys held at the start have not been seen.
    pub(crate) fn unseen(&self) -> usize {
        self.unseen
    }

    pub(crate) fn len(&self) -> usize {
        self.pairs.len()
    }
}

/// A position as a directory entry: 4 bytes, not 8. The budget keeps an
/// in-memory set far below 2^32 rows.
fn index(position: usize) -> u32 {
    u32::try_from(position).unwrap_or(u32::MAX)
}

fn bucket_of(key: Hash128, shift: u32) -> usize {
    // `shift` leaves at most usize::BITS - 1 bits.
    usize::try_from(key.0.checked_shr(shift).unwrap_or(0)).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(i: u128) -> Hash128 {
        Hash128(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
    }

    #[test]
    fn finds_every_stored_key_and_no_other() {
        for n in [0u128, 1, 2, 3, 7, 64, 65, 1000] {
            let pairs = (0..n).map(|i| (spread(i), Hash128(i).into())).collect();
            let stored = InMemory::new(pairs);
            assert_eq!(stored.len(), usize::try_from(n).unwrap());
            for i in 0..n {
                let at = stored.position(spread(i)).expect("stored key found");
                assert_eq!(stored.row_hash(at), Hash128(i));
            }
            for i in n..n + 100 {
                assert_eq!(stored.position(spread(i)), None, "n = {n}, i = {i}");
            }
            assert_eq!(stored.position(Hash128(u128::MAX)), None);
        }
    }

    #[test]
    fn seen_bits_track_what_vanished() {
        let pairs = (0..100u128)
            .map(|i| (spread(i), Hashes::new(Hash128(i), Some(Hash128(7)))))
            .collect();
        let mut stored = InMemory::new(pairs);
        assert_eq!(stored.unseen(), 100);
        for i in 0..99 {
            let at = stored.position(spread(i)).unwrap();
            stored.saw(at, Hash128(1000 + i));
            stored.saw(at, Hash128(1000 + i)); // twice counts once
        }
        assert_eq!(stored.unseen(), 1);
        assert!(stored.vanished(spread(99)));
        assert!(!stored.vanished(spread(5)));
        assert!(!stored.vanished(spread(500)), "never stored: not vanished");
        let at = stored.position(spread(5)).unwrap();
        assert!(stored.was_seen(at));
        assert_eq!(stored.row_hash(at), Hash128(1005));
        assert_eq!(stored.hashes(at).raw(), None, "rewritten: no raw hash");
        let at = stored.position(spread(99)).unwrap();
        stored.saw(at, Hash128(99));
        assert_eq!(stored.hashes(at).raw(), Some(Hash128(7)), "unchanged: kept");
    }
}
