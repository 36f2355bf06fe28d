//! Values read from the environment by a source's templates. They are
//! secrets (tokens, API keys): they go into requests and nowhere else.
//!
//! The first line of defence is structural and lives in the request
//! builder: the URL shown in logs, errors and origins is built from the
//! templates rendered with `***`, never by cleaning the real one. This
//! module is the second line, for text tidemark did not build itself: a
//! `Link` URL or a cursor that repeats the key, a 401 body that quotes the
//! token, a client error that prints the request URL.
//!
//! Such text may hold a secret in any form it takes on the way out and
//! back: as written, form-encoded (`+` for a space), percent-encoded in a
//! path or a query with upper- or lower-case hex (or encoded twice), or
//! escaped in JSON or a Rust debug string (`\"`, `\u00f6`, `\u{f6}`), and
//! mixed (a server that encodes some characters and not others). The
//! matcher therefore compares character by character, accepting every one
//! of those spellings of each character of the secret, instead of looking
//! for a few pre-encoded strings.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use tidemark_core::template::Template;
use tidemark_core::{Error, Location};

/// What replaces a secret in anything shown.
pub(crate) const REDACTED: &str = "***";

/// RFC 3986 unreserved characters stay; everything else is encoded.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The spellings a sealed secret is restored in. A span that matches none
/// of them exactly is sealed as [`Spelling::Percent`], which any URL decoder
/// reads as the same value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// As written.
    Raw,
    /// `application/x-www-form-urlencoded`, as `url` builds queries.
    FormUrlencoded,
    /// Every byte but the unreserved ones as `%XX`.
    Percent,
    /// The same with lower-case hex.
    PercentLower,
}

impl Spelling {
    const ALL: [Spelling; 4] = [
        Spelling::Raw,
        Spelling::FormUrlencoded,
        Spelling::Percent,
        Spelling::PercentLower,
    ];

    fn encode(self, value: &str) -> String {
        match self {
            Spelling::Raw => value.to_string(),
            Spelling::FormUrlencoded => {
                url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
            }
            Spelling::Percent => utf8_percent_encode(value, UNRESERVED).to_string(),
            Spelling::PercentLower => {
                lower_hex(&utf8_percent_encode(value, UNRESERVED).to_string())
            }
        }
    }

    fn placeholder(self, name: &str) -> String {
        match self {
            Spelling::Raw => format!("${{{name}}}"),
            Spelling::FormUrlencoded => format!("${{{name}:url}}"),
            Spelling::Percent => format!("${{{name}:pct}}"),
            Spelling::PercentLower => format!("${{{name}:pct-lower}}"),
        }
    }
}

/// The secrets of one source.
#[derive(Clone, Default)]
pub(crate) struct Secrets {
    /// `(variable name, value)`, longest value first so that a secret that
    /// contains another is replaced whole.
    values: Vec<(String, String)>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} values, redacted)", self.values.len())
    }
}

impl Secrets {
    /// The current values of every environment variable the templates read.
    /// Unset variables are skipped: the template renderer reports them.
    pub(crate) fn from_templates<'a>(templates: impl IntoIterator<Item = &'a Template>) -> Secrets {
        let mut secrets = Secrets::default();
        for template in templates {
            for name in template.env_names() {
                if let Ok(value) = std::env::var(name) {
                    secrets.add(name, &value);
                }
            }
        }
        secrets
    }

    /// Adds `value` of variable `name`.
    pub(crate) fn add(&mut self, name: &str, value: &str) {
        if value.is_empty() || self.values.iter().any(|(n, _)| n == name) {
            return;
        }
        self.values.push((name.to_string(), value.to_string()));
        self.values
            .sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
    }

    /// `text` with every secret, in any spelling, replaced by `***`: safe
    /// to log or store.
    pub(crate) fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        self.replace(text, |_, _| REDACTED.to_string())
    }

    /// Every text field of `error` redacted.
    pub(crate) fn redact_error(&self, error: Error) -> Error {
        if self.values.is_empty() {
            return error;
        }
        let clean = |text: String| self.redact(&text).into_owned();
        let place = |location: Location| Location {
            resource: clean(location.resource),
            ..location
        };
        match error {
            Error::Source {
                message,
                transient,
                retry_after,
            } => Error::Source {
                message: clean(message),
                transient,
                retry_after,
            },
            Error::Parse { location, message } => Error::Parse {
                location: place(location),
                message: clean(message),
            },
            Error::Validation {
                location,
                field,
                value,
                message,
            } => Error::Validation {
                location: place(location),
                field,
                value: clean(value),
                message: clean(message),
            },
            Error::Invariant(message) => Error::Invariant(clean(message)),
            Error::DeletesRefused(message) => Error::DeletesRefused(clean(message)),
            Error::StaleCheckpoint(message) => Error::StaleCheckpoint(clean(message)),
            Error::Config { file, key, message } => Error::Config {
                file,
                key,
                message: clean(message),
            },
            other => other,
        }
    }

    /// `text` with every secret replaced by a placeholder naming its
    /// variable and spelling (`${TOKEN}`, `${TOKEN:url}`, ...), so that it
    /// can be stored in a checkpoint and [`unseal`](Secrets::unseal)ed with
    /// the then current value on resume.
    pub(crate) fn seal(&self, text: &str) -> String {
        self.replace(text, |(name, value), span| {
            let form = Spelling::ALL
                .into_iter()
                .find(|form| form.encode(value) == span)
                .unwrap_or(Spelling::Percent);
            form.placeholder(name)
        })
        .into_owned()
    }

    /// The inverse of [`seal`](Secrets::seal).
    pub(crate) fn unseal(&self, text: &str) -> String {
        self.fill(text, |form, value| form.encode(value))
    }

    /// Sealed text as it may be shown: placeholders as `***`.
    pub(crate) fn show_sealed(&self, text: &str) -> String {
        let filled = self.fill(text, |_, _| REDACTED.to_string());
        self.redact(&filled).into_owned()
    }

    fn fill(&self, text: &str, with: impl Fn(Spelling, &str) -> String) -> String {
        let mut out = text.to_string();
        for (name, value) in &self.values {
            for form in Spelling::ALL {
                let placeholder = form.placeholder(name);
                if out.contains(&placeholder) {
                    out = out.replace(&placeholder, &with(form, value));
                }
            }
        }
        out
    }

    /// `text` with every match of a secret replaced by `with(secret, span)`.
    fn replace<'t>(
        &self,
        text: &'t str,
        with: impl Fn(&(String, String), &str) -> String,
    ) -> Cow<'t, str> {
        if self.values.is_empty() {
            return Cow::Borrowed(text);
        }
        let bytes = text.as_bytes();
        let chars: Vec<Vec<char>> = self
            .values
            .iter()
            .map(|(_, v)| v.chars().collect())
            .collect();
        let mut out = String::new();
        let (mut copied, mut i) = (0, 0);
        while i < bytes.len() {
            let found =
                self.values.iter().zip(&chars).find_map(|(secret, chars)| {
                    match_from(bytes, i, chars).map(|end| (secret, end))
                });
            match found {
                // A match starts and ends on character boundaries: it is
                // made of whole characters or ASCII escapes.
                Some((secret, end)) if text.is_char_boundary(end) => {
                    out.push_str(&text[copied..i]);
                    out.push_str(&with(secret, &text[i..end]));
                    copied = end;
                    i = end;
                }
                _ => i += 1,
            }
            while i < bytes.len() && !text.is_char_boundary(i) {
                i += 1;
            }
        }
        if copied == 0 {
            return Cow::Borrowed(text);
        }
        out.push_str(&text[copied..]);
        Cow::Owned(out)
    }
}

/// The end of the secret `chars` spelled in `text` from `at`, in any mix
/// of the spellings [`spellings`] accepts. A character may have more than
/// one spelling that fits (a `%` in the secret, and `%25` in the text), so
/// the match backtracks.
fn match_from(text: &[u8], at: usize, chars: &[char]) -> Option<usize> {
    let Some((&c, rest)) = chars.split_first() else {
        return Some(at);
    };
    spellings(text, at, c)
        .into_iter()
        .find_map(|end| match_from(text, end, rest))
}

/// Where each spelling of `c` that `text` has at `at` ends: as written;
/// `+` for a space; its UTF-8 bytes percent-encoded (either hex case, `%`
/// itself possibly encoded again as `%25`); or escaped as in JSON or Rust
/// debug output (`\c`, `\uXXXX` with surrogate pairs, `\u{X}`, `\xNN`).
fn spellings(text: &[u8], at: usize, c: char) -> Vec<usize> {
    let mut ends = Vec::new();
    let Some(rest) = text.get(at..) else {
        return ends;
    };
    let mut utf8 = [0u8; 4];
    let utf8 = c.encode_utf8(&mut utf8).as_bytes();
    if rest.starts_with(utf8) {
        ends.push(at + utf8.len());
    }
    if c == ' ' && rest.first() == Some(&b'+') {
        ends.push(at + 1);
    }
    ends.extend(percent_encoded(text, at, utf8));
    if rest.first() == Some(&b'\\') {
        ends.extend(escaped(text, at + 1, c, utf8));
    }
    ends
}

/// Where `utf8` percent-encoded at `at` ends: each byte as `%XX`, or
/// (encoded twice) each as `%25XX`.
fn percent_encoded(text: &[u8], at: usize, utf8: &[u8]) -> Vec<usize> {
    let bytes = || utf8.iter().map(|&b| u32::from(b));
    [
        escape_sequence(text, at, b"%", 2, bytes()),
        escape_sequence(text, at, b"%25", 2, bytes()),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// After a backslash at `at - 1`, where each escape of `c` ends: `\\c`,
/// `\\uXXXX` (UTF-16, so a surrogate pair outside the BMP), `\\u{X...}`
/// or `\\xNN` per UTF-8 byte.
fn escaped(text: &[u8], at: usize, c: char, utf8: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let Some(rest) = text.get(at..) else {
        return ends;
    };
    if rest.starts_with(utf8) {
        ends.push(at + utf8.len());
    }
    if rest.starts_with(b"u{") {
        if let Some(close) = rest.iter().position(|&b| b == b'}') {
            if hex_value(&rest[2..close]) == Some(u32::from(c)) {
                ends.push(at + close + 1);
            }
        }
    }
    let mut units = [0u16; 2];
    let units = c.encode_utf16(&mut units);
    ends.extend(escape_sequence(
        text,
        at - 1,
        b"\\u",
        4,
        units.iter().map(|&u| u32::from(u)),
    ));
    ends.extend(escape_sequence(
        text,
        at - 1,
        b"\\x",
        2,
        utf8.iter().map(|&b| u32::from(b)),
    ));
    ends
}

/// `prefix` + `digits` hex digits for each of `values`, from `at`.
fn escape_sequence(
    text: &[u8],
    at: usize,
    prefix: &[u8],
    digits: usize,
    values: impl Iterator<Item = u32>,
) -> Option<usize> {
    let len = prefix.len() + digits;
    values.into_iter().try_fold(at, |at, value| {
        let escape = text.get(at..at + len)?;
        (escape.starts_with(prefix) && hex_value(&escape[prefix.len()..]) == Some(value))
            .then_some(at + len)
    })
}

/// The value of ASCII hex digits (either case); `None` if any is not one.
fn hex_value(hex: &[u8]) -> Option<u32> {
    if hex.is_empty() || hex.len() > 8 {
        return None;
    }
    hex.iter().try_fold(0u32, |acc, &b| {
        let digit = char::from(b).to_digit(16)?;
        Some(acc * 16 + digit)
    })
}

fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut chars = encoded.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '%' {
            out.extend(chars.by_ref().take(2).map(|h| h.to_ascii_lowercase()));
        }
    }
    out
}
