//! Test 3: a client error (404, 400, 401) is permanent: exit 1 after
//! exactly one request, class `source`, and a message with the URL (query
//! secrets redacted) and the status.

use super::api::{Api, Fault};
use super::case::{Case, Source, QUICK_RETRY};

const KEY: &str = "k3y-only-in-env-5150";

#[test]
fn client_errors_fail_after_one_request_with_url_and_status() {
    let cases = [
        ("2024-03-01", 404, "404 Not Found"),
        ("2024-03-02", 400, "400 Bad Request"),
        ("2024-03-03", 401, "401 Unauthorized"),
    ];
    let api = Api::start(|_| 30, None);
    api.faults(|r| {
        let code = match r.day.as_str() {
            "2024-03-01" => 404,
            "2024-03-02" => 400,
            _ => 401,
        };
        Some(Fault::Status(
            code,
            None,
            format!("{{\"error\": \"refused with {code}\"}}"),
        ))
    });
    let case = Case::new().env("TM_HTTP_ERRORS_KEY", KEY);
    let settings = format!(
        r#"url = "{}/page"
format = "json"
query = {{ day = "{{period.start:%Y-%m-%d}}", api_key = "${{TM_HTTP_ERRORS_KEY}}" }}
records = "/data"
pagination = {{ style = "page", size_param = "per_page", size = 10 }}"#,
        api.base
    );
    case.pipeline(&Source {
        settings: &settings,
        batch_size: 10,
        retry: QUICK_RETRY,
    });
    for (day, code, status_text) in cases {
        let out = case.run(&["run", "orders", "--period", day]);
        out.expect_code(1, "run");
        let requests = api.hits().iter().filter(|h| h.day == day).count();
        eprintln!("test 3: HTTP {code} -> {requests} request(s)");
        assert_eq!(requests, 1, "no retry for {code}");
        let status = case.status_of(day);
        assert_eq!(status["status"], "failed", "{status}");
        assert_eq!(status["error_class"], "source", "{status}");
        let message = status["error_message"].as_str().unwrap();
        let url = format!("{}/page?day={day}&api_key=***&page=1&per_page=10", api.base);
        assert!(message.contains(&url), "{message}");
        assert!(
            message.contains(&format!("HTTP {status_text}")),
            "{message}"
        );
        assert!(
            message.contains(&format!("refused with {code}")),
            "body excerpt: {message}"
        );
        assert!(
            !message.contains(KEY) && !out.stderr.contains(KEY) && !out.stdout.contains(KEY),
            "{out}"
        );
        assert!(!out.stderr.contains("retrying"), "{out}");
    }
}
