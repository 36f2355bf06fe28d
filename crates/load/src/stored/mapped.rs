//! The sorted spill file, mapped read-only for its lookups.
//!
//! A re-sync of a period over the memory budget looks each key of a batch
//! up in the sorted file. Through `pread` that was one system call and a
//! 2 KiB copy per block a batch touched: a quarter of a 2,000,000-row
//! unchanged re-sync (perf). Mapped, a lookup is a memory read; the pages
//! a batch touched are dropped from the process's resident set afterwards
//! ([`Mapped::release`]), so memory does not grow with the file (the pages
//! stay in the page cache, and a later lookup maps them again).
//!
//! `unsafe` is allowed here, as in `sqlite::ffi`, and nowhere else: mapping
//! a file is unsafe in general because another process could change it
//! under the mapping. This one cannot be changed (see [`Mapped::new`]).
#![allow(unsafe_code)]

use std::fs::File;

use memmap2::{Mmap, UncheckedAdvice};

/// A read-only mapping of a complete, private file.
#[derive(Debug)]
pub(super) struct Mapped {
    /// `None` for an empty file, which cannot be mapped.
    map: Option<Mmap>,
}

impl Mapped {
    /// Maps `file`, which must be an anonymous temporary file that is
    /// complete: unlinked when created, so no other process can open it,
    /// and never written again by this one.
    pub(super) fn new(file: &File) -> std::io::Result<Mapped> {
        if file.metadata()?.len() == 0 {
            return Ok(Mapped { map: None });
        }
        // SAFETY: the file has no name (`tempfile::tempfile`), so no other
        // process can write or truncate it, and this process writes it only
        // before mapping it (the spill's merge): its contents cannot change
        // while the mapping exists.
        let map = unsafe { Mmap::map(file) }?;
        Ok(Mapped { map: Some(map) })
    }

    /// The file's bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or_default()
    }

    /// Drops the pages read so far from the resident set; they read the
    /// same when next touched.
    pub(super) fn release(&self) {
        if let Some(map) = &self.map {
            // SAFETY: on a shared, read-only file mapping `MADV_DONTNEED`
            // only unmaps the pages: a later read faults them in again from
            // the file, whose contents do not change (see `new`), so every
            // slice of the mapping keeps reading the same bytes.
            if let Err(e) = unsafe { map.unchecked_advise(UncheckedAdvice::DontNeed) } {
                tracing::debug!(error = %e, "could not release the spill file's pages");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Released pages read the same bytes again; an empty file maps to
    /// nothing.
    #[test]
    fn released_pages_read_the_same_bytes() {
        let mut file = tempfile::tempfile().expect("file");
        let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8).collect();
        file.write_all(&data).expect("write");
        let mapped = Mapped::new(&file).expect("map");
        assert_eq!(mapped.bytes(), &data[..]);
        mapped.release();
        assert_eq!(mapped.bytes(), &data[..]);
        let empty = Mapped::new(&tempfile::tempfile().expect("file")).expect("map");
        assert!(empty.bytes().is_empty());
        empty.release();
    }
}
