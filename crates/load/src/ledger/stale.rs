//! Stale run keys: done under another handler `version` or other
//! `[fields]` than the pipeline has now. Derived when the ledger is read,
//! never stored, so changing the pipeline back makes them current again.

use tidemark_core::FieldsFingerprint;

use super::{LedgerEntry, RunStatus};

impl LedgerEntry {
    /// Sets [`LedgerEntry::stale`] and [`LedgerEntry::stale_reason`] for
    /// the pipeline's current `version` and `[fields]`. Only a `done` key
    /// can be stale: any other state runs again anyway. A run recorded
    /// without a fingerprint (by a build before fingerprints) counts as
    /// stale, since nothing says which fields its rows were loaded with.
    pub fn judge_staleness(&mut self, version: &str, fields: &FieldsFingerprint) {
        self.stale_reason = None;
        if self.status == RunStatus::Done {
            self.stale_reason = stale_reason(
                self.handler_version.as_deref(),
                self.fields_fingerprint.as_deref(),
                version,
                fields,
            );
        }
        self.stale = self.stale_reason.is_some();
    }
}

/// Why a done run recorded with `handler_version` and `fingerprint` is
/// stale against the pipeline's `version` and `fields`, or `None` when it
/// is not (see [`LedgerEntry::judge_staleness`]).
pub fn stale_reason(
    handler_version: Option<&str>,
    fingerprint: Option<&str>,
    version: &str,
    fields: &FieldsFingerprint,
) -> Option<String> {
    let mut reasons = Vec::new();
    match handler_version {
        Some(done) if done == version => {}
        done => reasons.push(format!("version {} -> {version}", done.unwrap_or("(none)"))),
    }
    match fingerprint {
        Some(done) => {
            if let Some(changes) = fields.changes_since(done) {
                reasons.push(format!("fields changed: {changes}"));
            }
        }
        None => reasons.push("fields not recorded (done by an earlier tidemark)".into()),
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Counts;

    fn entry(status: RunStatus, version: &str, fingerprint: Option<&str>) -> LedgerEntry {
        LedgerEntry {
            pipeline: "p".into(),
            source: "s".into(),
            export_type: "e".into(),
            period_start: "2024-01-01T00:00:00Z".into(),
            period_end: "2024-01-02T00:00:00Z".into(),
            status,
            attempts: 1,
            run_id: None,
            counts: Counts::default(),
            error_class: None,
            error_message: None,
            started_at: None,
            finished_at: None,
            handler_version: Some(version.into()),
            provisional: false,
            stale: false,
            stale_reason: None,
            fields_fingerprint: fingerprint.map(Into::into),
            lease_owner: None,
            lease_expires_at: None,
            priority: 0,
            not_before: None,
            backing_off: false,
            enqueued_by: None,
            marked: None,
            mark_note: None,
        }
    }

    #[test]
    fn done_under_another_version_or_fields_is_stale_and_says_why() {
        let pipeline = tidemark_core::Pipeline::parse(
            r#"name = "p"
export_type = "e"
[period]
granularity = "day"
[[sources]]
id = "s"
transport = "file"
format = "csv"
path = "x.csv"
[fields]
id = { type = "int", required = true }
note = { type = "text" }
[load]
table = "t"
key = ["id"]
"#,
            std::path::Path::new("p.toml"),
        )
        .unwrap();
        let now = pipeline.fields_fingerprint();
        let before = "id:9d0ab5e3c6b1e4b5";
        let current = now.as_str().to_string();
        let judged = |mut e: LedgerEntry| {
            e.judge_staleness("3", &now);
            (e.stale, e.stale_reason)
        };
        assert_eq!(
            judged(entry(RunStatus::Done, "3", Some(&current))),
            (false, None)
        );
        assert_eq!(
            judged(entry(RunStatus::Done, "2", Some(&current))),
            (true, Some("version 2 -> 3".into()))
        );
        let (stale, reason) = judged(entry(RunStatus::Done, "2", Some(before)));
        assert!(stale);
        assert_eq!(
            reason.as_deref(),
            Some("version 2 -> 3; fields changed: ~ id, + note")
        );
        assert_eq!(
            judged(entry(RunStatus::Done, "3", None)),
            (
                true,
                Some("fields not recorded (done by an earlier tidemark)".into())
            )
        );
        // Only done keys are stale.
        assert_eq!(
            judged(entry(RunStatus::Failed, "2", Some(before))),
            (false, None)
        );
    }
}
