//! The fingerprint of a pipeline's `[fields]`, recorded in the ledger by
//! every run (`_tm_runs.fields_fingerprint`), so that a period done under
//! other fields can be told apart from one done under the current ones
//! (`stale`), and the difference named.
//!
//! It is readable text, one `name:digest` per field, in name order,
//! separated by spaces (`amount:9c1e… note:04d2…`): the digest (xxh3-64,
//! 16 hex digits) covers everything `[fields]` says about the field (type,
//! `from`, `format`, `required`, `default`, `value`), and the names let a
//! later run say which fields were added, removed or changed without
//! keeping the old pipeline file. Field order is not part of it: moving a
//! field changes no stored value (rows are written by column name, and
//! the row hash ignores column order). Neither is `added`: it says which
//! exports may lack a column, not what any stored value is.
//!
//! An entry may end in `?` (`note:04d2…?`): the field is *new to the
//! period*. The ledger saw the period (its row recorded a fingerprint)
//! before the field was in `[fields]`, so the period's export may predate
//! the column, and a CSV header without it is not drift for that period:
//! the field loads as NULL (or its default), which is what the period's
//! rows already held. A claim records the mark ([`FieldsFingerprint::carry`])
//! so it outlives the attempt: a failed or forced re-run of the period
//! still knows. Changing the field's definition drops the mark (values may
//! have been loaded from its old column). Comparisons ignore the mark
//! ([`same_fields`]).

use std::collections::BTreeMap;

use indexmap::IndexMap;
use xxhash_rust::xxh3::xxh3_64;

use crate::spec::{FieldSpec, Pipeline};

/// The fingerprint of one `[fields]` table; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldsFingerprint(String);

impl FieldsFingerprint {
    /// The fingerprint of `fields`.
    pub fn of(fields: &IndexMap<String, FieldSpec>) -> FieldsFingerprint {
        let digests: BTreeMap<&str, String> = fields
            .iter()
            .map(|(name, field)| (name.as_str(), digest(field)))
            .collect();
        FieldsFingerprint(
            digests
                .iter()
                .map(|(name, digest)| format!("{name}:{digest}"))
                .collect::<Vec<_>>()
                .join(" "),
        )
    }

    /// A fingerprint as text (sent in a claim request): taken as it is.
    pub fn from_stored(text: &str) -> FieldsFingerprint {
        FieldsFingerprint(text.to_string())
    }

    /// The text stored in the ledger.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The fingerprint a claim records for a period whose ledger row held
    /// `previous`: this one, with every field that `previous` lacks, or
    /// marked new under the same definition, marked new to the period (see
    /// the module docs). A row
    /// without a fingerprint (never claimed, or by a build before
    /// fingerprints) marks nothing: nothing says what the period was
    /// loaded with; nor does one whose text names no field (empty, or
    /// edited by hand).
    pub fn carry(&self, previous: Option<&str>) -> String {
        let then = previous.map(entries).unwrap_or_default();
        if then.is_empty() {
            return self.0.clone();
        }
        self.0
            .split(' ')
            .map(|entry| {
                let (name, digest) = entry.split_once(':').unwrap_or((entry, ""));
                // A marked field whose definition changed since loses its
                // mark: the period may have loaded values from its old
                // column, which an export without the new one must not
                // turn into NULL.
                let new = then
                    .get(name)
                    .map_or(true, |old| old.strip_suffix(NEW) == Some(digest));
                match new && !entry.is_empty() {
                    true => format!("{entry}{NEW}"),
                    false => entry.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// What changed since `earlier` (a stored fingerprint), as `+ name`
    /// (added), `~ name` (changed) and `- name` (removed), comma separated;
    /// `None` when nothing did.
    pub fn changes_since(&self, earlier: &str) -> Option<String> {
        if same_fields(earlier, &self.0) {
            return None;
        }
        let (now, then) = (unmarked(&self.0), unmarked(earlier));
        let mut changes: Vec<String> = Vec::new();
        for (name, digest) in &now {
            match then.get(name) {
                None => changes.push(format!("+ {name}")),
                Some(old) if old != digest => changes.push(format!("~ {name}")),
                Some(_) => {}
            }
        }
        changes.extend(
            then.keys()
                .filter(|name| !now.contains_key(*name))
                .map(|name| format!("- {name}")),
        );
        // Text that is not a fingerprint (edited by hand) still differs.
        Some(if changes.is_empty() {
            "fields differ".to_string()
        } else {
            changes.join(", ")
        })
    }
}

impl Pipeline {
    /// The fingerprint of this pipeline's `[fields]`.
    pub fn fields_fingerprint(&self) -> FieldsFingerprint {
        FieldsFingerprint::of(&self.spec.fields)
    }
}

/// 16 hex digits over the field's whole definition, as a JSON array (its
/// parts unambiguous, absent ones `null`).
fn digest(field: &FieldSpec) -> String {
    let definition = serde_json::json!([
        field.ty.name(),
        field.from,
        field.format,
        field.required,
        field.default,
        field.value,
    ]);
    format!("{:016x}", xxh3_64(definition.to_string().as_bytes()))
}

/// The mark of a field new to the period (see the module docs).
const NEW: char = '?';

/// The fields a stored fingerprint marks new to its period.
pub fn new_fields(fingerprint: &str) -> Vec<String> {
    entries(fingerprint)
        .into_iter()
        .filter(|(_, digest)| digest.ends_with(NEW))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Whether two fingerprints describe the same fields, marks aside.
pub fn same_fields(a: &str, b: &str) -> bool {
    a == b || unmarked(a) == unmarked(b)
}

fn unmarked(fingerprint: &str) -> BTreeMap<&str, &str> {
    entries(fingerprint)
        .into_iter()
        .map(|(name, digest)| (name, digest.trim_end_matches(NEW)))
        .collect()
}

fn entries(fingerprint: &str) -> BTreeMap<&str, &str> {
    fingerprint
        .split(' ')
        .filter_map(|entry| entry.split_once(':'))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::FieldType;

    fn field(ty: FieldType) -> FieldSpec {
        FieldSpec {
            ty,
            from: None,
            format: None,
            required: false,
            default: None,
            value: None,
            added: crate::spec::Added::No,
        }
    }

    fn fields(list: &[(&str, FieldSpec)]) -> IndexMap<String, FieldSpec> {
        list.iter()
            .map(|(name, spec)| ((*name).to_string(), spec.clone()))
            .collect()
    }

    #[test]
    fn is_pinned_readable_and_in_name_order() {
        let print = FieldsFingerprint::of(&fields(&[
            ("id", field(FieldType::Text)),
            ("amount", field(FieldType::Decimal)),
        ]));
        // Stored in the ledger: if this changes, every done period of every
        // pipeline turns stale.
        assert_eq!(
            print.as_str(),
            "amount:d5a6dec85b1b148b id:2e5e389e4142c5f5"
        );
        let reordered = FieldsFingerprint::of(&fields(&[
            ("amount", field(FieldType::Decimal)),
            ("id", field(FieldType::Text)),
        ]));
        assert_eq!(reordered, print);
    }

    #[test]
    fn names_what_was_added_changed_and_removed() {
        let before = FieldsFingerprint::of(&fields(&[
            ("id", field(FieldType::Text)),
            ("amount", field(FieldType::Decimal)),
            ("legacy", field(FieldType::Text)),
        ]));
        let mut amount = field(FieldType::Decimal);
        amount.from = Some("total".into());
        let after = FieldsFingerprint::of(&fields(&[
            ("id", field(FieldType::Text)),
            ("amount", amount),
            ("note", field(FieldType::Text)),
        ]));
        assert_eq!(
            after.changes_since(before.as_str()).as_deref(),
            Some("~ amount, + note, - legacy")
        );
        assert_eq!(after.changes_since(after.as_str()), None);
        assert_eq!(
            after.changes_since("garbage").as_deref(),
            Some("+ amount, + id, + note")
        );
    }

    #[test]
    fn every_part_of_a_field_counts() {
        let base = field(FieldType::Text);
        let variants = [
            FieldSpec {
                ty: FieldType::Json,
                ..base.clone()
            },
            FieldSpec {
                from: Some("x".into()),
                ..base.clone()
            },
            FieldSpec {
                format: Some("%Y".into()),
                ..base.clone()
            },
            FieldSpec {
                required: true,
                ..base.clone()
            },
            FieldSpec {
                default: Some(toml::Value::String("x".into())),
                ..base.clone()
            },
            FieldSpec {
                value: Some("x".into()),
                ..base.clone()
            },
        ];
        let plain = FieldsFingerprint::of(&fields(&[("a", base.clone())]));
        for variant in variants {
            let changed = FieldsFingerprint::of(&fields(&[("a", variant.clone())]));
            assert_eq!(
                changed.changes_since(plain.as_str()).as_deref(),
                Some("~ a"),
                "{variant:?}"
            );
        }
        let added = FieldSpec {
            added: crate::spec::Added::Any,
            ..base.clone()
        };
        let declared = FieldsFingerprint::of(&fields(&[("a", added)]));
        assert_eq!(declared, plain, "`added` changes no stored value");
    }

    #[test]
    fn a_claim_marks_fields_new_to_the_period_and_comparisons_ignore_the_mark() {
        let before = FieldsFingerprint::of(&fields(&[("id", field(FieldType::Text))]));
        let after = FieldsFingerprint::of(&fields(&[
            ("id", field(FieldType::Text)),
            ("note", field(FieldType::Text)),
        ]));
        let stored = after.carry(Some(before.as_str()));
        assert!(
            stored.ends_with('?') && stored.contains("note:"),
            "{stored}"
        );
        assert_eq!(new_fields(&stored), ["note"]);
        assert_eq!(after.changes_since(&stored), None, "not stale once re-run");
        assert!(same_fields(&stored, after.as_str()));
        // The mark outlives the next claim; a period never seen marks nothing.
        assert_eq!(after.carry(Some(&stored)), stored);
        assert_eq!(after.carry(None), after.as_str());
        assert_eq!(after.carry(Some("")), after.as_str());
        assert_eq!(after.carry(Some("garbage")), after.as_str());
        assert!(new_fields(&after.carry(Some(after.as_str()))).is_empty());
        // A field changed since is stale, marked or not.
        let mut text = field(FieldType::Text);
        text.from = Some("remark".into());
        let renamed =
            FieldsFingerprint::of(&fields(&[("id", field(FieldType::Text)), ("note", text)]));
        assert_eq!(renamed.changes_since(&stored).as_deref(), Some("~ note"));
        assert!(
            new_fields(&renamed.carry(Some(&stored))).is_empty(),
            "a changed definition may have loaded values: the mark goes"
        );
    }
}
