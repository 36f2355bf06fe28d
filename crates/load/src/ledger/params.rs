//! Named parameters for the ledger statements that take many.
//!
//! Both databases bind parameters by position (`$1`, `$2`, ...). A statement
//! with twenty of them, its text in one file and its argument list in
//! another, lets a reordering swap two values of the same type without a
//! compiler or a test noticing. So such a statement is written with named
//! placeholders (`$attempt`, `$run_id`) and its parameters are one struct
//! declared with [`ledger_params!`]: the struct's field order numbers the
//! placeholders ([`number`]) and orders the values it binds
//! (`args`), from the one list.

use std::time::Duration;

use super::driver::Arg;
use super::{AttemptStatus, Counts, StoredClass};

/// A field type of a parameter struct: the placeholders it fills and the
/// values it binds, in the same order.
pub(crate) trait Param<'a> {
    /// The placeholder names of a field named `field`: its name, or for a
    /// group of values (the counts) one name per value.
    fn names(field: &'static str) -> Vec<&'static str> {
        vec![field]
    }

    /// Appends the field's values, one per name of [`Param::names`].
    fn push(&self, args: &mut Vec<Arg<'a>>);
}

impl<'a> Param<'a> for i64 {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::Int(*self));
    }
}

impl<'a> Param<'a> for Option<i64> {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::OptInt(*self));
    }
}

impl<'a> Param<'a> for bool {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::Bool(*self));
    }
}

impl<'a> Param<'a> for &'a str {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::Text(self));
    }
}

impl<'a> Param<'a> for Option<&'a str> {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::OptText(*self));
    }
}

/// A JSON document, or NULL.
impl<'a> Param<'a> for Option<&'a serde_json::Value> {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::Json(*self));
    }
}

/// A JSON document.
impl<'a> Param<'a> for &'a serde_json::Value {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::Json(Some(self)));
    }
}

/// A length of time, bound as seconds (a float).
impl<'a> Param<'a> for Duration {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::Float(self.as_secs_f64()));
    }
}

impl<'a> Param<'a> for AttemptStatus {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::Text(self.as_str()));
    }
}

impl<'a> Param<'a> for Option<StoredClass> {
    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.push(Arg::OptText(self.map(StoredClass::as_str)));
    }
}

/// The counters: one placeholder per column, named after it
/// (`$rows_read`, ...), in [`Counts::COLUMNS`] order.
impl<'a> Param<'a> for Counts {
    fn names(_field: &'static str) -> Vec<&'static str> {
        Counts::COLUMNS.to_vec()
    }

    fn push(&self, args: &mut Vec<Arg<'a>>) {
        args.extend(self.values().map(Arg::OptInt));
    }
}

/// Declares the parameters of a statement as a struct whose field order is
/// the binding order: `names()` numbers the statement's placeholders
/// ([`number`]), `args()` binds the values, both from the field list.
macro_rules! ledger_params {
    (
        $(#[$doc:meta])*
        $name:ident<$lt:lifetime> {
            $( $(#[$field_doc:meta])* $field:ident: $ty:ty, )*
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub(crate) struct $name<$lt> {
            $( $(#[$field_doc])* pub $field: $ty, )*
        }

        impl<$lt> $name<$lt> {
            /// The placeholder names, in binding order.
            pub(crate) fn names() -> Vec<&'static str> {
                let mut names = Vec::new();
                $( names.extend(<$ty as $crate::ledger::params::Param>::names(stringify!($field))); )*
                names
            }

            /// The values, in binding order.
            pub(crate) fn args(&self) -> Vec<$crate::ledger::driver::Arg<$lt>> {
                let mut args = Vec::new();
                $( $crate::ledger::params::Param::push(&self.$field, &mut args); )*
                args
            }
        }

        /// A parameter struct is a field of a larger one (a statement that
        /// runs two in one, PostgreSQL's data-modifying `WITH`): its
        /// placeholders and values, in its own order.
        impl<$lt> $crate::ledger::params::Param<$lt> for $name<$lt> {
            fn names(_field: &'static str) -> Vec<&'static str> {
                Self::names()
            }

            fn push(&self, args: &mut Vec<$crate::ledger::driver::Arg<$lt>>) {
                args.extend(self.args());
            }
        }
    };
}
pub(crate) use ledger_params;

/// `sql` with each named placeholder (`$` and a lower-case name:
/// `$run_ref`) replaced by its number in `names` (`$1` for the first).
/// Numbered placeholders and other `$`s (JSON paths: `'$[0]'`) are left as
/// they are.
///
/// # Panics
///
/// On a name `names` lacks: the statement text and its parameter struct
/// disagree, a mistake in this crate's code that the unit tests, which
/// build every statement, find.
pub(crate) fn number(sql: &str, names: &[&str]) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let len = after
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
            .unwrap_or(after.len());
        let name = &after[..len];
        if name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') {
            let Some(i) = names.iter().position(|n| *n == name) else {
                panic!("statement placeholder `${name}` is no parameter of {names:?}: {sql}");
            };
            out.push_str(&format!("${}", i + 1));
            rest = &after[len..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    ledger_params! {
        /// A statement's parameters.
        Example<'a> {
            /// First.
            run_ref: i64,
            /// Then a group of eight.
            counts: Counts,
            /// Last.
            run_id: &'a str,
        }
    }

    #[test]
    fn names_and_values_follow_the_field_order() {
        let names = Example::names();
        assert_eq!(names.len(), 10);
        assert_eq!(
            (names[0], names[1], names[9]),
            ("run_ref", "rows_read", "run_id")
        );
        let args = Example {
            run_ref: 7,
            counts: Counts::default(),
            run_id: "r",
        }
        .args();
        assert_eq!(args.len(), names.len());
        assert!(matches!(args[0], Arg::Int(7)));
        assert!(matches!(args[9], Arg::Text("r")));
    }

    #[test]
    fn named_placeholders_are_numbered_and_others_left() {
        let sql = "UPDATE t SET a = $run_id, b = json_extract(x, '$[0]'), c = $1::jsonb \
                   WHERE id = $run_ref AND r = $run_id";
        assert_eq!(
            number(sql, &["run_ref", "run_id"]),
            "UPDATE t SET a = $2, b = json_extract(x, '$[0]'), c = $1::jsonb \
             WHERE id = $1 AND r = $2"
        );
    }
}
