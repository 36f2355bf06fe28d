//! What a run key held when an attempt started, and which of it the run has
//! seen since: the half of "unchanged rows are never written" and of
//! reconciliation that lives in the client.
//!
//! Below the pipeline's `memory_budget` the `(key hash, row hash)` pairs
//! are held in memory ([`memory::InMemory`]); a run key whose stored rows
//! need more go to a temporary file ([`spill::Spilled`]), so a period of
//! any size runs in the same memory (ADR 0007); that file keeps the order
//! the rows came in, which an unchanged re-sync reads them in (ADR 0021).
//!
//! On SQLite a fresh attempt may read the stored rows on another thread
//! while the run compares ([`streamed`]): the 2 s scan of a 4,000,000-row
//! period then overlaps reading and typing the source instead of coming
//! before it (ADR 0021, "Overlapping the stored scan").

mod memory;
mod spill;

use std::sync::mpsc::Receiver;

use tidemark_core::{Error, Hash128, KeySet};

pub(crate) use memory::InMemory;

/// Bytes an in-memory entry costs: the key and its [`Hashes`] (48), its
/// share of the directory (2 to 4) and its seen bit, rounded up.
const MEMORY_ENTRY: u64 = 56;

/// What is stored for a key besides it: the row hash that decides whether
/// a typed row changed, and the raw-record hash that lets an unchanged
/// raw record skip typing (ADR 0021, "The raw-record hash"). 32 bytes:
/// the raw hash is `Hash128(0)` when the row has none (a row written
/// before the column existed); a computed raw hash is never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hashes {
    pub row: Hash128,
    raw: Hash128,
}

impl Hashes {
    pub(crate) fn new(row: Hash128, raw: Option<Hash128>) -> Hashes {
        Hashes {
            row,
            raw: raw.unwrap_or(Hash128(0)),
        }
    }

    /// The stored raw hash, if the row has one.
    pub(crate) fn raw(self) -> Option<Hash128> {
        (self.raw.0 != 0).then_some(self.raw)
    }

    /// Row hash then raw hash, big-endian: how the spill files hold them.
    pub(crate) fn to_bytes(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&self.row.to_bytes());
        out[16..].copy_from_slice(&self.raw.to_bytes());
        out
    }

    /// Reads [`Hashes::to_bytes`] from the start of `bytes`.
    pub(crate) fn from_bytes(bytes: &[u8]) -> Hashes {
        let at = |from: usize| {
            let mut b = [0u8; 16];
            b.copy_from_slice(&bytes[from..from + 16]);
            Hash128(u128::from_be_bytes(b))
        };
        Hashes {
            row: at(0),
            raw: at(16),
        }
    }
}

#[cfg(test)]
impl From<Hash128> for Hashes {
    /// A row hash without a raw hash, as the tests mostly store.
    fn from(row: Hash128) -> Hashes {
        Hashes::new(row, None)
    }
}

/// Bytes a key this run wrote before a crash costs while it is collected.
const OURS_ENTRY: u64 = 16;

/// Stored rows a scan read before the run compares anything: below this,
/// the scan's end is awaited and the pairs are held as a serial scan would
/// hold them (most periods are small, and the memory form is the fastest to
/// look up); past it, or past the budget, the run compares while the scan
/// goes on.
const STREAM_AFTER: u64 = 65_536;

/// What a scan on another thread sends, in the order it reads the rows.
#[derive(Debug)]
pub(crate) enum Scanned {
    /// The next stored `(key hash, hashes)` pairs.
    Rows(Vec<(Hash128, Hashes)>),
    /// Every row was read.
    End,
    /// The scan failed; nothing follows.
    Failed(Error),
}

/// A scan that stopped sending without saying why (its thread is gone).
pub(crate) fn scan_stopped() -> Error {
    Error::Database {
        message: "the scan of the period's stored rows stopped before its end".into(),
        transient: true,
    }
}

/// The stored hashes of a scan that runs on another thread and sends what
/// it reads through `incoming`. A scan that ends within [`STREAM_AFTER`]
/// rows (and the budget) is held in memory, as [`Builder`] holds a serial
/// one; a longer one goes to the arrival-order file as it is read, and the
/// run compares at the cursor while it goes on ([`spill::Spilled`]): no
/// sort, no wait for rows the cursor has not reached.
pub(crate) fn streamed(incoming: Receiver<Scanned>, budget: u64) -> Result<StoredHashes, Error> {
    let first_rows = usize::try_from(STREAM_AFTER.min(budget / MEMORY_ENTRY)).unwrap_or(0);
    let mut first = Vec::new();
    while first.len() < first_rows.max(1) {
        match crate::blocking(|| incoming.recv().ok()) {
            Some(Scanned::Rows(pairs)) => first.extend(pairs),
            Some(Scanned::End) => {
                let mut builder = Builder::new(budget);
                for (key, hashes) in first {
                    builder.push(key, hashes, false)?;
                }
                return builder.finish();
            }
            Some(Scanned::Failed(e)) => return Err(e),
            None => return Err(scan_stopped()),
        }
    }
    tracing::debug!(
        read = first.len(),
        "comparing while the stored rows are read"
    );
    let mut file = spill::Spilled::streaming(incoming, budget)?;
    file.note_raw(first.iter().any(|(_, h)| h.raw().is_some()));
    file.append(&first)?;
    Ok(StoredHashes::Spilled(Box::new(file)))
}

/// A stored key, as a lookup finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    /// Where it is, for [`StoredHashes::saw`].
    pub position: usize,
    /// The row hash to compare with; `None` when this run has written the
    /// row since it started (the database then compares).
    pub row_hash: Option<Hash128>,
    /// The stored raw-record hash; `None` when the row has none, or
    /// whenever `row_hash` is `None` (the table may hold another row now).
    pub raw_hash: Option<Hash128>,
}

impl Found {
    /// `hashes` as found at `position`; `stale` once this run wrote the row.
    pub(crate) fn at(position: usize, hashes: Hashes, stale: bool) -> Found {
        Found {
            position,
            row_hash: (!stale).then_some(hashes.row),
            raw_hash: hashes.raw().filter(|_| !stale),
        }
    }
}

/// The run key's stored hashes, in memory or in a file.
#[derive(Debug)]
pub(crate) enum StoredHashes {
    Memory(InMemory),
    /// Boxed: the file form's state is several times the memory form's.
    Spilled(Box<spill::Spilled>),
}

impl Default for StoredHashes {
    fn default() -> Self {
        StoredHashes::Memory(InMemory::default())
    }
}

impl StoredHashes {
    /// Finds each key (results in the order of `keys`).
    pub(crate) fn find_all(&mut self, keys: &[Hash128]) -> Result<Vec<Option<Found>>, Error> {
        match self {
            StoredHashes::Memory(m) => Ok(keys
                .iter()
                .map(|&key| {
                    m.position(key)
                        .map(|position| Found::at(position, m.hashes(position), false))
                })
                .collect()),
            StoredHashes::Spilled(s) => s.find_all(keys),
        }
    }

    /// Records that the run saw the key at `position` again and the table
    /// now holds `row_hash` for it (so a later duplicate compares against
    /// what is stored); `written` when this run wrote it.
    pub(crate) fn saw(&mut self, position: usize, row_hash: Hash128, written: bool) {
        match self {
            StoredHashes::Memory(m) => m.saw(position, row_hash),
            StoredHashes::Spilled(s) => s.saw(position, written),
        }
    }

    /// Marks the key at `position` seen, its row hash unchanged; false if
    /// it was seen already. [`StoredHashes::unsee`] takes it back.
    pub(crate) fn see(&mut self, position: usize) -> bool {
        if self.was_seen(position) {
            return false;
        }
        match self {
            StoredHashes::Memory(m) => m.saw(position, m.row_hash(position)),
            StoredHashes::Spilled(s) => s.saw(position, false),
        }
        true
    }

    /// Takes back [`StoredHashes::see`].
    pub(crate) fn unsee(&mut self, position: usize) {
        match self {
            StoredHashes::Memory(m) => m.unsee(position),
            StoredHashes::Spilled(s) => s.unsee(position),
        }
    }

    /// Marks a stored key as seen; false if the run key did not hold it.
    pub(crate) fn mark_seen(&mut self, key: Hash128) -> Result<bool, Error> {
        match self {
            StoredHashes::Memory(m) => Ok(m.mark_seen(key)),
            StoredHashes::Spilled(s) => Ok(match s.find_all(&[key])?.pop().flatten() {
                Some(found) => {
                    s.saw(found.position, false);
                    true
                }
                None => false,
            }),
        }
    }

    /// Whether the run has seen the key at `position`.
    pub(crate) fn was_seen(&self, position: usize) -> bool {
        match self {
            StoredHashes::Memory(m) => m.was_seen(position),
            StoredHashes::Spilled(s) => s.was_seen(position),
        }
    }

    /// Waits for a scan still reading the stored rows to end
    /// ([`streamed`]): what counts keys not seen needs all of them.
    pub(crate) fn complete(&mut self) -> Result<(), Error> {
        match self {
            StoredHashes::Memory(_) => Ok(()),
            StoredHashes::Spilled(s) => s.complete(),
        }
    }

    /// Gets ready for [`StoredHashes::vanished`]; the file form reads the
    /// keys not seen into memory (none, when every key was seen).
    pub(crate) fn prepare_reconcile(&mut self) -> Result<(), Error> {
        match self {
            StoredHashes::Memory(_) => Ok(()),
            StoredHashes::Spilled(s) => s.collect_unseen(),
        }
    }

    /// Whether a key the run key held at the start has not been seen: a
    /// row reconciliation removes. Keys the run key did not hold were
    /// written by this attempt and never vanish.
    pub(crate) fn vanished(&self, key: Hash128) -> bool {
        match self {
            StoredHashes::Memory(m) => m.vanished(key),
            StoredHashes::Spilled(s) => s.vanished(key),
        }
    }

    /// How many keys held at the start have not been seen.
    pub(crate) fn unseen(&self) -> usize {
        match self {
            StoredHashes::Memory(m) => m.unseen(),
            StoredHashes::Spilled(s) => s.unseen(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            StoredHashes::Memory(m) => m.len(),
            StoredHashes::Spilled(s) => s.len(),
        }
    }

    /// Whether some stored row carries a raw-record hash (of the rows read
    /// so far, for a scan still going on): without one, no record can
    /// skip its typing, and deferring it would only cost.
    pub(crate) fn has_raw_hashes(&self) -> bool {
        match self {
            StoredHashes::Memory(m) => m.has_raw_hashes(),
            StoredHashes::Spilled(s) => s.has_raw_hashes(),
        }
    }

    /// Whether the pairs went to a file.
    pub(crate) fn spilled(&self) -> bool {
        matches!(self, StoredHashes::Spilled(_))
    }
}

/// Collects a run key's stored rows as the database streams them, in
/// memory until they pass the budget, then in a file in the order they
/// came (see [`spill`]).
#[derive(Debug)]
pub(crate) struct Builder {
    budget: u64,
    pairs: Vec<(Hash128, Hashes)>,
    /// Keys this run wrote before (a resumed attempt): seen already.
    ours: Vec<Hash128>,
    file: Option<spill::Writer>,
}

impl Builder {
    pub(crate) fn new(budget: u64) -> Builder {
        Builder {
            budget,
            pairs: Vec::new(),
            ours: Vec::new(),
            file: None,
        }
    }

    fn used(&self) -> u64 {
        self.pairs.len() as u64 * MEMORY_ENTRY + self.ours.len() as u64 * OURS_ENTRY
    }

    /// Adds one stored row; `ours` when this run wrote it.
    pub(crate) fn push(
        &mut self,
        key: Hash128,
        hashes: impl Into<Hashes>,
        ours: bool,
    ) -> Result<(), Error> {
        let hashes = hashes.into();
        if let Some(file) = self.file.as_mut() {
            return file.push(key, hashes, ours);
        }
        if self.pairs.len() == self.pairs.capacity() {
            // Grow by doubling, never past what the budget holds. A full
            // vector that could not double within the budget goes to the
            // file instead of growing once more: the copy of a growth holds
            // the old and the new vector at once, which near the budget
            // was the period's peak RSS (ADR 0021, "The raw-record hash").
            let most = usize::try_from(self.budget / MEMORY_ENTRY).unwrap_or(usize::MAX);
            let doubled = (self.pairs.len() * 2).max(1024);
            if doubled > most && self.pairs.len() >= 1024 {
                self.spill()?;
                return self.push(key, hashes, ours);
            }
            let want = doubled.min(most.max(1));
            self.pairs
                .reserve_exact(want.saturating_sub(self.pairs.len()).max(1));
        }
        self.pairs.push((key, hashes));
        if ours {
            self.ours.push(key);
        }
        if self.used() >= self.budget {
            self.spill()?;
        }
        Ok(())
    }

    /// Moves what is collected to the file, in the order it came; every
    /// later row goes straight there.
    fn spill(&mut self) -> Result<(), Error> {
        let mut file = spill::Writer::new()?;
        let ours: KeySet = self.ours.drain(..).collect();
        for (key, hashes) in std::mem::take(&mut self.pairs) {
            file.push(key, hashes, ours.contains(&key))?;
        }
        self.file = Some(file);
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<StoredHashes, Error> {
        if let Some(file) = self.file {
            return Ok(StoredHashes::Spilled(Box::new(file.finish(self.budget)?)));
        }
        let mut stored = InMemory::new(self.pairs);
        for key in self.ours {
            stored.mark_seen(key);
        }
        Ok(StoredHashes::Memory(stored))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spread(i: u128) -> Hash128 {
        Hash128(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
    }

    fn build(budget: u64, n: u128, ours: impl Fn(u128) -> bool) -> StoredHashes {
        let mut builder = Builder::new(budget);
        for i in 0..n {
            builder.push(spread(i), Hash128(i), ours(i)).unwrap();
        }
        builder.finish().unwrap()
    }

    /// The file form answers exactly as the memory form: every stored key
    /// with its hash, no other key, seen bits, stale hashes of rows this
    /// run wrote, and the keys that vanished.
    #[test]
    fn both_forms_agree() {
        for n in [0u128, 1, 63, 64, 65, 1000, 5000] {
            let mut memory = build(u64::MAX, n, |i| i % 7 == 0);
            let mut file = build(3000, n, |i| i % 7 == 0);
            assert!(!memory.spilled());
            assert_eq!(file.spilled(), n * 56 >= 3000, "n = {n}");
            assert_eq!(memory.len(), file.len());
            assert_eq!(memory.unseen(), file.unseen(), "n = {n}");
            let keys: Vec<Hash128> = (0..n + 50).map(spread).collect();
            let a = memory.find_all(&keys).unwrap();
            let b = file.find_all(&keys).unwrap();
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    a.map(|f| f.row_hash),
                    b.map(|f| f.row_hash),
                    "n = {n}, key {i}"
                );
                assert_eq!(a.is_some(), (i as u128) < n);
            }
            // See every third key; write every sixth.
            for (i, (fa, fb)) in a.iter().zip(&b).enumerate().filter(|(i, _)| i % 3 == 0) {
                if let (Some(fa), Some(fb)) = (fa, fb) {
                    memory.saw(fa.position, Hash128(7), i % 6 == 0);
                    file.saw(fb.position, Hash128(7), i % 6 == 0);
                }
            }
            assert_eq!(memory.unseen(), file.unseen(), "n = {n}");
            let again = file.find_all(&keys[..1]).unwrap();
            if n > 0 && file.spilled() {
                assert_eq!(again[0].and_then(|f| f.row_hash), None, "written: stale");
            }
            file.prepare_reconcile().unwrap();
            for key in &keys {
                assert_eq!(memory.vanished(*key), file.vanished(*key), "n = {n}");
            }
        }
    }

    /// The lookups of one pass, in memory and from the file, in any order
    /// of the keys: each stored key with its hash, each other key absent.
    fn agree_in_order(n: u128, order: &[u128]) -> StoredHashes {
        let mut memory = build(u64::MAX, n, |_| false);
        let mut file = build(3000, n, |_| false);
        assert!(file.spilled());
        agree_on(&mut memory, &mut file, n, order);
        file
    }

    /// Looks `order` up in both and checks they agree, each stored key
    /// (below `n`) found with its hash; what each answered, for marking.
    fn agree_on(
        memory: &mut StoredHashes,
        other: &mut StoredHashes,
        n: u128,
        order: &[u128],
    ) -> (Vec<Option<Found>>, Vec<Option<Found>>) {
        let keys: Vec<Hash128> = order.iter().map(|&i| spread(i)).collect();
        let a = memory.find_all(&keys).unwrap();
        let b = other.find_all(&keys).unwrap();
        for ((&i, a), b) in order.iter().zip(&a).zip(&b) {
            assert_eq!(a.map(|f| f.row_hash), b.map(|f| f.row_hash), "key {i}");
            assert_eq!(b.and_then(|f| f.row_hash), (i < n).then_some(Hash128(i)));
        }
        (a, b)
    }

    fn sorted_built(stored: &StoredHashes) -> bool {
        matches!(stored, StoredHashes::Spilled(s) if s.sorted())
    }

    /// Keys asked for in the stored order (an unchanged re-sync) are found
    /// at the cursor, without sorting; gaps of rows deleted upstream too.
    #[test]
    fn the_stored_order_needs_no_sort() {
        let n = 5000;
        let all: Vec<u128> = (0..n).collect();
        assert!(!sorted_built(&agree_in_order(n, &all)));
        let gaps: Vec<u128> = (0..n).filter(|i| i % 50 != 7 && i % 97 > 2).collect();
        assert!(!sorted_built(&agree_in_order(n, &gaps)));
        // A key never stored needs the sorted copy to be told apart.
        let added: Vec<u128> = (0..n + 10).collect();
        assert!(sorted_built(&agree_in_order(n, &added)));
    }

    /// Any other order gives the same answers through the sorted copy.
    #[test]
    fn any_order_finds_the_same() {
        use rand::seq::SliceRandom;
        let n = 3000;
        let mut rng = rand::thread_rng();
        let mut shuffled: Vec<u128> = (0..n + 100).collect();
        shuffled.shuffle(&mut rng);
        agree_in_order(n, &shuffled);
        let reversed: Vec<u128> = (0..n).rev().collect();
        agree_in_order(n, &reversed);
        // Updated rows moved to the end of the table (PostgreSQL's heap).
        let moved: Vec<u128> = (0..n)
            .filter(|i| i % 10 != 3)
            .chain((0..n).filter(|i| i % 10 == 3))
            .collect();
        agree_in_order(n, &moved);
    }

    /// A key the scan returned twice vanishes only if neither entry was
    /// seen, whichever one the lookup found.
    #[test]
    fn a_key_stored_twice_vanishes_only_unseen() {
        let mut builder = Builder::new(3000);
        for i in 0..200u128 {
            builder.push(spread(i), Hash128(i), false).unwrap();
        }
        builder.push(spread(5), Hash128(5), false).unwrap();
        builder.push(spread(6), Hash128(6), false).unwrap();
        let mut file = builder.finish().unwrap();
        assert!(file.spilled());
        let keys: Vec<Hash128> = (0..200u128).filter(|&i| i != 6).map(spread).collect();
        for found in file.find_all(&keys).unwrap().into_iter().flatten() {
            file.see(found.position);
        }
        file.prepare_reconcile().unwrap();
        assert!(!file.vanished(spread(5)), "seen once: kept");
        assert!(file.vanished(spread(6)), "never seen: vanished");
        assert!(!file.vanished(spread(500)), "never stored");
    }

    /// A scan on another thread sending `n` pairs in chunks of `chunk`,
    /// slowly, then its end (or a failure, with `fail`).
    fn scan_of(n: u128, chunk: usize, fail: bool) -> Receiver<Scanned> {
        let (to, incoming) = std::sync::mpsc::sync_channel(2);
        std::thread::spawn(move || {
            let pairs: Vec<(Hash128, Hashes)> =
                (0..n).map(|i| (spread(i), Hash128(i).into())).collect();
            for part in pairs.chunks(chunk) {
                std::thread::sleep(std::time::Duration::from_millis(1));
                if to.send(Scanned::Rows(part.to_vec())).is_err() {
                    return;
                }
            }
            let last = if fail {
                Scanned::Failed(Error::Database {
                    message: "disk I/O error".into(),
                    transient: false,
                })
            } else {
                Scanned::End
            };
            let _ = to.send(last);
        });
        incoming
    }

    /// Lookups made while the scan is still sending answer as a serial
    /// scan's would: in the stored order (with gaps) at the cursor, a key
    /// not at the cursor after the scan's end, and reconciliation sees
    /// every key not seen, including those sent after the last lookup.
    #[test]
    fn a_streamed_scan_answers_as_a_serial_one() {
        let n = 20_000u128;
        for order in [
            (0..n).filter(|i| i % 50 != 7).collect::<Vec<u128>>(),
            (0..n).rev().collect(),
            (0..n / 2).chain([n + 5]).chain(n / 2..n - 100).collect(),
        ] {
            let mut memory = build(u64::MAX, n, |_| false);
            let mut streamed = streamed(scan_of(n, 1000, false), 3000).unwrap();
            assert!(streamed.spilled());
            for batch in order.chunks(700) {
                let (a, b) = agree_on(&mut memory, &mut streamed, n, batch);
                for (a, b) in a.iter().zip(&b) {
                    if let (Some(a), Some(b)) = (a, b) {
                        memory.saw(a.position, Hash128(1), false);
                        streamed.saw(b.position, Hash128(1), false);
                    }
                }
            }
            streamed.complete().unwrap();
            assert_eq!(streamed.len(), memory.len());
            assert_eq!(streamed.unseen(), memory.unseen());
            streamed.prepare_reconcile().unwrap();
            for i in 0..n + 10 {
                assert_eq!(
                    memory.vanished(spread(i)),
                    streamed.vanished(spread(i)),
                    "key {i}"
                );
            }
        }
    }

    /// A scan that ends within the first rows is held in memory, as a
    /// serial one; a failed scan fails every later lookup.
    #[test]
    fn a_short_or_failed_scan() {
        let mut short = streamed(scan_of(500, 100, false), u64::MAX).unwrap();
        assert!(!short.spilled());
        assert_eq!(short.len(), 500);
        assert!(short.find_all(&[spread(499)]).unwrap()[0].is_some());
        assert!(streamed(scan_of(500, 100, true), u64::MAX).is_err());
        let mut failed = streamed(scan_of(5000, 100, true), 3000).unwrap();
        assert!(failed.complete().is_err());
        assert!(failed.find_all(&[spread(1)]).is_err(), "still failed");
        assert!(failed.prepare_reconcile().is_err());
    }

    /// Rows a resumed attempt wrote before count as seen in either form,
    /// including those collected before the pairs went to the file.
    #[test]
    fn rows_of_a_resumed_attempt_are_seen() {
        for budget in [u64::MAX, 3000, 400] {
            let mut stored = build(budget, 1000, |i| i % 3 == 0);
            assert_eq!(stored.unseen(), 1000 - 334, "budget {budget}");
            stored.prepare_reconcile().unwrap();
            assert!(!stored.vanished(spread(3)));
            assert!(stored.vanished(spread(4)));
        }
    }
}
