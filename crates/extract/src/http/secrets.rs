//! Values read from the environment by a source's templates. They are
//! secrets (tokens, API keys): they go into requests and nowhere else.
//!
//! Redaction works on values, not on templates, because secrets come back
//! in text tidemark did not build itself: a `Link` URL that repeats the
//! `api_key` parameter, a 401 body that quotes the token, a client error
//! that prints the request URL.

use std::borrow::Cow;
use std::fmt;

use tidemark_core::template::Template;

/// What replaces a secret in anything shown.
pub(crate) const REDACTED: &str = "***";

/// The secrets of one source, each in the forms it can take in text.
#[derive(Clone, Default)]
pub(crate) struct Secrets {
    /// `(placeholder, form)` pairs, longest form first so that a secret
    /// that contains another is replaced whole.
    forms: Vec<(String, String)>,
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} forms, redacted)", self.forms.len())
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

    /// Adds `value` of variable `name`, as written and as it appears in a
    /// URL query (`form-urlencoded`).
    pub(crate) fn add(&mut self, name: &str, value: &str) {
        if value.is_empty() {
            return;
        }
        let encoded: String = url::form_urlencoded::byte_serialize(value.as_bytes()).collect();
        let mut push = |placeholder: String, form: String| {
            if !self.forms.iter().any(|(_, f)| *f == form) {
                self.forms.push((placeholder, form));
            }
        };
        push(format!("${{{name}}}"), value.to_string());
        if encoded != value {
            push(format!("${{{name}:url}}"), encoded);
        }
        self.forms
            .sort_by_key(|(_, form)| std::cmp::Reverse(form.len()));
    }

    /// `text` with every secret replaced by `***`: safe to log or store.
    pub(crate) fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        self.replace(text, |_| REDACTED)
    }

    /// `text` with every secret replaced by a placeholder naming its
    /// variable (`${TOKEN}`), so that it can be stored in a checkpoint and
    /// [`unseal`](Secrets::unseal)ed with the then current value on resume.
    pub(crate) fn seal(&self, text: &str) -> String {
        self.replace(text, |placeholder| placeholder).into_owned()
    }

    /// The inverse of [`seal`](Secrets::seal).
    pub(crate) fn unseal(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (placeholder, form) in &self.forms {
            if out.contains(placeholder.as_str()) {
                out = out.replace(placeholder.as_str(), form);
            }
        }
        out
    }

    fn replace<'t, 's>(&'s self, text: &'t str, with: impl Fn(&'s str) -> &'s str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for (placeholder, form) in &self.forms {
            if out.contains(form.as_str()) {
                out = Cow::Owned(out.replace(form.as_str(), with(placeholder)));
            }
        }
        out
    }
}
