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
//! the row hash ignores column order).

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

    /// The text stored in the ledger.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// What changed since `earlier` (a stored fingerprint), as `+ name`
    /// (added), `~ name` (changed) and `- name` (removed), comma separated;
    /// `None` when nothing did.
    pub fn changes_since(&self, earlier: &str) -> Option<String> {
        if earlier == self.0 {
            return None;
        }
        let (now, then) = (entries(&self.0), entries(earlier));
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
    }
}
