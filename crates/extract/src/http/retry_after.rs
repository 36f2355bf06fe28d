//! `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date.

use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, Utc};

/// The delay a `Retry-After` value asks for, measured from `now`. A date in
/// the past means "now" (zero); an unreadable value is ignored (`None`), so
/// the normal backoff applies instead of failing the request.
pub(crate) fn parse(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // More digits than fit are "a very long time": capped by max_delay later.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let at = http_date(value)?;
    Some((at - now).to_std().unwrap_or(Duration::ZERO))
}

/// IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`) and the two obsolete forms
/// that recipients must still accept: RFC 850 (`Sunday, 06-Nov-94 08:49:37
/// GMT`) and asctime (`Sun Nov  6 08:49:37 1994`).
fn http_date(value: &str) -> Option<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc2822(value) {
        return Some(at.with_timezone(&Utc));
    }
    const OBSOLETE: [&str; 2] = ["%A, %d-%b-%y %H:%M:%S GMT", "%a %b %e %H:%M:%S %Y"];
    OBSOLETE
        .iter()
        .find_map(|fmt| NaiveDateTime::parse_from_str(value, fmt).ok())
        .map(|naive| naive.and_utc())
}
