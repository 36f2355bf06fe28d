//! `tidemark completions` and `tidemark schema` (issue 21, the toolbox),
//! run as the built binary, and the shipped alert rules `deploy/alerts.yml`
//! under `promtool`, and the allocator options the binary carries. No
//! database: each test runs in seconds.
//!
//! The schema tests hold it to two promises: it accepts every pipeline the
//! project ships (and every file whose only fault is one the schema cannot
//! see), and it rejects each configuration-error pipeline of the test suite
//! whose fault is in the file's shape. Every file it rejects is also one
//! `tidemark validate` refuses (exit 2), so an editor never flags a file
//! that tidemark would load.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value as Json;

const BIN: &str = env!("CARGO_BIN_EXE_tidemark");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const SHIPPED: &str = "schema/pipeline.schema.json";

fn tidemark(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("TIDEMARK_NOW")
        .env_remove("TIDEMARK_DATABASE_URL")
        .output()
        .expect("run tidemark")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

#[track_caller]
fn expect_success(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout(out)
}

// ---------------------------------------------------------------------------
// completions
// ---------------------------------------------------------------------------

/// Every subcommand a completion script must offer.
const SUBCOMMANDS: &[&str] = &[
    "run",
    "backfill",
    "sync",
    "serve",
    "cancel",
    "mark",
    "status",
    "validate",
    "prune",
    "migrate",
    "completions",
    "schema",
];

#[test]
fn completions_for_each_shell_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let script = expect_success(
            &tidemark(&["completions", shell]),
            &format!("completions {shell}"),
        );
        assert!(script.contains("tidemark"), "{shell}: names the binary");
        for sub in SUBCOMMANDS {
            assert!(
                script.contains(sub),
                "{shell}: the script offers `{sub}`\n{script}"
            );
        }
        // Flags of the commands, not only their names (fish writes them
        // as `-l NAME`).
        for flag in ["period", "database-url", "dry-run"] {
            assert!(script.contains(flag), "{shell}: offers {flag}");
        }
    }
}

#[test]
fn the_bash_script_is_valid_bash() {
    let script = expect_success(&tidemark(&["completions", "bash"]), "completions bash");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("tidemark.bash");
    std::fs::write(&file, &script).expect("write script");
    let check = Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .expect("run bash -n");
    assert!(
        check.status.success(),
        "bash -n refuses the script: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    // Sourcing it registers the completion function for `tidemark`.
    let source = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p tidemark", file.display()))
        .output()
        .expect("run bash");
    let registered = String::from_utf8_lossy(&source.stdout);
    assert!(
        source.status.success() && registered.contains("tidemark"),
        "sourcing registers a completion: {registered}{}",
        String::from_utf8_lossy(&source.stderr)
    );
}

#[test]
fn completions_help_says_how_to_install_and_an_unknown_shell_is_a_usage_error() {
    let help = expect_success(&tidemark(&["completions", "--help"]), "completions --help");
    for text in [
        "bash",
        "zsh",
        "fish",
        "completions/tidemark.fish",
        "_tidemark",
    ] {
        assert!(help.contains(text), "--help names {text:?}\n{help}");
    }
    let out = tidemark(&["completions", "powershell"]);
    assert_eq!(out.status.code(), Some(2), "an unknown shell: exit 2");
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let help = expect_success(&tidemark(&["--help"]), "--help");
    assert!(
        help.contains("completions") && help.contains("schema"),
        "{help}"
    );
}

// ---------------------------------------------------------------------------
// schema
// ---------------------------------------------------------------------------

/// What `tidemark schema` prints, parsed.
fn printed_schema() -> Json {
    let text = expect_success(&tidemark(&["schema"]), "tidemark schema");
    serde_json::from_str(&text).expect("schema is JSON")
}

fn validator() -> jsonschema::Validator {
    jsonschema::validator_for(&printed_schema()).expect("a valid draft-07 schema")
}

/// A pipeline file as the schema sees it: TOML turned into JSON.
fn as_json(toml_text: &str, what: &str) -> Json {
    let value: toml::Value =
        toml::from_str(toml_text).unwrap_or_else(|e| panic!("{what}: not TOML: {e}"));
    serde_json::to_value(value).expect("TOML as JSON")
}

fn errors(validator: &jsonschema::Validator, instance: &Json) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect()
}

/// `tidemark validate` on `text` written as `NAME.toml` in a fresh folder.
fn validate(text: &str) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("p.toml");
    std::fs::write(&file, text).expect("write pipeline");
    let file = file.display().to_string();
    let out = tidemark(&["validate", &file]);
    drop(dir);
    out
}

/// The shipped file is what `tidemark schema` prints, byte for byte: a
/// change to the spec types that is not followed by
/// `tidemark schema > schema/pipeline.schema.json` fails here.
#[test]
fn the_shipped_schema_is_what_the_binary_prints() {
    let printed = expect_success(&tidemark(&["schema"]), "tidemark schema");
    let shipped = std::fs::read_to_string(Path::new(ROOT).join(SHIPPED))
        .unwrap_or_else(|e| panic!("read {SHIPPED}: {e}"));
    assert!(
        printed == shipped,
        "{SHIPPED} is stale: regenerate it with `cargo run -q -- schema > {SHIPPED}`"
    );
}

#[test]
fn the_schema_is_draft_07_with_descriptions_and_closed_objects() {
    let schema = printed_schema();
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    assert!(
        jsonschema::meta::is_valid(&schema),
        "valid against its meta-schema"
    );
    // deny_unknown_fields everywhere: the file and every table in it.
    assert_eq!(schema["additionalProperties"], false);
    let defs = schema["definitions"].as_object().expect("definitions");
    for name in [
        "PeriodSpec",
        "FieldSpec",
        "LoadSpec",
        "RetrySpec",
        "ScheduleSpec",
        "RateLimit",
        "ExpectCount",
    ] {
        assert_eq!(defs[name]["additionalProperties"], false, "{name}");
    }
    for variant in defs["SourceSpec"]["oneOf"]
        .as_array()
        .into_iter()
        .chain(defs["Pagination"]["oneOf"].as_array())
        .flatten()
    {
        assert_eq!(variant["additionalProperties"], false, "{variant}");
    }
    // The doc comments are the descriptions an editor shows.
    assert_eq!(
        schema["properties"]["name"]["description"],
        "Pipeline name; part of every run key."
    );
    assert!(
        defs["LoadSpec"]["properties"]["memory_budget"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("64MiB"))
    );
}

/// The pipelines the project ships.
fn shipped_pipelines() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("pipelines"))
        .expect("pipelines/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_schema_accepts_every_shipped_pipeline() {
    let validator = validator();
    let files = shipped_pipelines();
    assert!(files.len() >= 3, "the examples are there: {files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read pipeline");
        let errors = errors(&validator, &as_json(&text, &file.display().to_string()));
        assert!(errors.is_empty(), "{}: {errors:#?}", file.display());
    }
}

const ORDERS: &str = include_str!("../pipelines/orders.toml");

/// `pipelines/orders.toml` with `from` replaced by `to` (which must occur).
fn orders(from: &str, to: &str) -> String {
    assert!(ORDERS.contains(from), "orders.toml has {from:?}");
    ORDERS.replacen(from, to, 1)
}

/// The HTTP pipeline of `settings_that_cannot_work_exit_2_before_any_database`
/// (tests/hardening_periods.rs), with lines added to its source, period,
/// load, and at the end.
fn shop(source: &str, period: &str, load: &str, rest: &str) -> String {
    format!(
        r#"name = "shop"
export_type = "orders"
[period]
granularity = "day"
{period}
[[sources]]
id = "api"
transport = "http"
format = "json"
url = "http://127.0.0.1:9/orders"
{source}
[fields]
id = {{ type = "text" }}
[load]
table = "shop"
key = ["id"]
{load}
{rest}"#
    )
}

/// The pipeline `p` of tests/hardening_config.rs with these `[fields]`
/// lines and this table name.
fn p(fields: &str, table: &str) -> String {
    format!(
        r#"name = "p"
export_type = "t"

[period]
granularity = "day"
timezone = "UTC"
start = "2024-01-01"

[[sources]]
id = "files"
transport = "file"
format = "csv"
path = "../data/{{period.start:%Y-%m-%d}}.csv"

[fields]
id = {{ type = "text", required = true }}
v = {{ type = "int" }}
{fields}

[load]
table = "{table}"
key = ["id"]
batch_size = 500
"#
    )
}

/// The configuration-error pipelines whose fault is in the file's shape,
/// which the schema rejects: (where the test suite has it, what is wrong,
/// the file). An unknown key (`deny_unknown_fields`), a value that is not
/// one of an enum's, a wrong type, a missing required key or table, a
/// number outside the bounds the checker allows (the schema carries them),
/// a name that is not an identifier or is too long.
fn structural_errors() -> Vec<(&'static str, &'static str, String)> {
    let long_field = format!("{} = {{ type = \"text\" }}", "n".repeat(64));
    vec![
        // tests/foundation.rs config_errors_exit_2_and_touch_nothing, also
        // tests/scheduler.rs serve_without_pipelines_is_a_config_error.
        (
            "foundation.rs: unknown key",
            "`on_mising`: an unknown field",
            orders("on_missing", "on_mising"),
        ),
        // tests/foundation.rs config_errors_exit_2_and_touch_nothing and
        // validate_checks_files_and_touches_no_database.
        (
            "foundation.rs: bad type name",
            "`type = \"money\"`: not a field type",
            orders("type = \"decimal\"", "type = \"money\""),
        ),
        // tests/hardening_config.rs names_equal_on_either_database_are_config_errors.
        (
            "hardening_config.rs: names",
            "a 64-byte field name",
            p(&long_field, "p"),
        ),
        (
            "hardening_config.rs: names",
            "a 52-byte table name (no room for TABLE__tm_run_key)",
            p("", &"t".repeat(52)),
        ),
        // tests/hardening_periods.rs settings_that_cannot_work_exit_2_before_any_database.
        (
            "hardening_periods.rs: settings",
            "rate_limit.per_second past 1000000",
            shop("rate_limit = { per_second = 4294967295 }", "", "", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "pagination.size 0",
            shop("pagination = { style = \"offset\", size = 0 }", "", "", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "period.lookback past 1000",
            shop("", "lookback = 4000000000", "", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "load.batch_size 0",
            shop("", "", "batch_size = 0", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "retry.max_attempts past 100",
            shop("", "", "", "[retry]\nmax_attempts = 1000000"),
        ),
        // The spec's unit tests (crates/core/src/spec/).
        (
            "core spec tests: timezone",
            "`timezone = \"Mars/Olympus\"`: no IANA zone",
            orders("Europe/Berlin", "Mars/Olympus"),
        ),
        (
            "core spec tests: added",
            "`added = 3`: a number where a bool or a period is wanted",
            orders(
                "note       = { type = \"text\" }",
                "note       = { type = \"text\", added = 3 }",
            ),
        ),
        (
            "core spec tests: expect_count",
            "`expect_count = {}`: neither header nor pointer",
            shop("expect_count = {}", "", "", ""),
        ),
        (
            "core spec tests: expect_count",
            "`expect_count` with both header and pointer",
            shop(
                "expect_count = { header = \"X-Total\", pointer = \"/total\" }",
                "",
                "",
                "",
            ),
        ),
        (
            "core spec tests: expect_count",
            "`expect_count = { total = 5 }`: an unknown field",
            shop("expect_count = { total = 5 }", "", "", ""),
        ),
        // No test above has these shapes; they stand for their kind here.
        (
            "shape",
            "no [load]: a missing required table",
            ORDERS[..ORDERS.find("[load]").expect("[load]")].to_string(),
        ),
        (
            "shape",
            "`key = \"order_id\"`: a string where a list is wanted",
            orders("key = [\"order_id\"]", "key = \"order_id\""),
        ),
        (
            "shape",
            "a source without `transport`",
            orders("transport = \"file\"\n", ""),
        ),
        (
            "shape",
            "`batch_size = \"10000\"`: a string where a number is wanted",
            orders("batch_size = 10000", "batch_size = \"10000\""),
        ),
    ]
}

/// The configuration-error pipelines of the test suite that the schema
/// cannot catch: each is well-formed, and wrong only for what its values
/// mean together or outside the file. `tidemark validate` (and every
/// command) still refuses them. Out of the schema's reach because:
/// - a key naming a field that `[fields]` lacks, and two field names that
///   differ only in case, relate two values of the file;
/// - reserved and system-column names (`_tm_…`, `rowid`, `xmin`,
///   `…__tm_run_key`) are one rule per database, kept in one place
///   (`spec/names.rs`) rather than copied into regular expressions;
/// - durations (`timeout`, `lag`, `base_delay`, `every`) are humantime
///   text, and `base_delay` ≤ `max_delay` compares two of them;
/// - a cron that never fires depends on the clock (`TIDEMARK_NOW`), one
///   that names years on the cron grammar;
/// - `[schedule]` needs `period.start`: two tables together;
/// - a `default` that does not fit its field's type, and a period that is
///   outside 0001–9999, need the type's and the calendar's parsers;
/// - the CSV delimiter `"` is one character, refused for its meaning.
///
/// (The `SHOP_API_TOKEN` case of tests/commands.rs depends on the
/// environment, not on the file, and is left out.)
fn semantic_errors() -> Vec<(&'static str, &'static str, String)> {
    let field = |line: &str| p(line, "p");
    vec![
        (
            "foundation.rs: key field not in [fields]",
            "load.key",
            orders("key = [\"order_id\"]", "key = [\"id\"]"),
        ),
        (
            "hardening_config.rs: names",
            "fields.Note",
            field("note = { type = \"text\" }\nNote = { type = \"text\" }"),
        ),
        (
            "hardening_config.rs: names",
            "fields._TM_Source",
            field("_TM_Source = { type = \"text\" }"),
        ),
        (
            "hardening_config.rs: names",
            "fields.rowid",
            field("rowid = { type = \"int\" }"),
        ),
        (
            "hardening_config.rs: names",
            "fields.Xmin",
            field("Xmin = { type = \"int\" }"),
        ),
        (
            "hardening_config.rs: names",
            "load.table",
            p("", "p__TM_run_key"),
        ),
        (
            "hardening_config.rs: schedules",
            "schedule.cron",
            format!("{}\n[schedule]\ncron = \"0 0 30 2 *\"\n", p("", "p")),
        ),
        (
            "hardening_config.rs: schedules",
            "schedule.cron",
            format!("{}\n[schedule]\ncron = \"0 0 0 1 1 * 2025\"\n", p("", "p")),
        ),
        (
            "hardening_config.rs: schedules",
            "schedule",
            format!("{}\n[schedule]\nevery = \"1h\"\n", p("", "p"))
                .replace("start = \"2024-01-01\"\n", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "sources[0].timeout",
            shop("timeout = \"0s\"", "", "", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "sources[0].delimiter",
            shop("delimiter = '\"'", "", "", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "period.lag",
            shop("", "lag = \"300000000y\"", "", ""),
        ),
        (
            "hardening_periods.rs: settings",
            "retry.base_delay",
            shop("", "", "", "[retry]\nbase_delay = \"0s\""),
        ),
        (
            "hardening_periods.rs: settings",
            "retry.base_delay",
            shop(
                "",
                "",
                "",
                "[retry]\nbase_delay = \"1m\"\nmax_delay = \"10s\"",
            ),
        ),
        (
            "hardening_periods.rs: settings",
            "schedule.every",
            shop("", "", "", "[schedule]\nevery = \"0s\""),
        ),
        (
            "hardening_periods.rs: years",
            "period.start",
            orders("start = \"2024-01-01\"", "start = \"0000-01\""),
        ),
        (
            "commands.rs: a default that does not fit",
            "fields.quantity.default",
            orders(
                "note       = { type = \"text\" }",
                "note = { type = \"text\" }\nquantity = { type = \"int\", default = \"abc\" }",
            ),
        ),
    ]
}

#[test]
fn the_schema_rejects_each_structural_config_error() {
    let validator = validator();
    for (origin, what, text) in structural_errors() {
        let errors = errors(&validator, &as_json(&text, what));
        assert!(
            !errors.is_empty(),
            "{origin}: the schema accepts {what}\n{text}"
        );
        let out = validate(&text);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{origin}: {what} is a configuration error for tidemark too (the schema said {errors:?})\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn semantic_config_errors_pass_the_schema_and_fail_validate() {
    let validator = validator();
    for (origin, key, text) in semantic_errors() {
        let errors = errors(&validator, &as_json(&text, key));
        assert!(
            errors.is_empty(),
            "{origin}: the file is well-formed, its fault is semantic ({key}): {errors:#?}"
        );
        let out = validate(&text);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{origin}: {key}\n{stderr}");
        assert!(stderr.contains(key), "{origin}: names {key}\n{stderr}");
    }
}

/// Files that are right in every way pass both: the schema never flags a
/// file tidemark loads (its bounds are the checker's, its edges included).
#[test]
fn valid_variants_pass_the_schema_and_validate() {
    let validator = validator();
    let cases = [
        p(&format!("{} = {{ type = \"text\" }}", "n".repeat(63)), "p"),
        p("", &"t".repeat(51)),
        shop(
            "rate_limit = { per_second = 1000000, burst = 0 }\npagination = { style = \"offset\", size = 1000000 }\nmax_page_bytes = \"4MB\"\nexpect_count = { pointer = \"/meta/total\" }",
            "lookback = 1000\ntimezone = \"US/Eastern\"",
            "batch_size = 1000000\nmax_delete_fraction = 1.0",
            "[retry]\nmax_attempts = 100\n[schedule]\ncron = \"*/15 * * * *\"",
        )
        .replace("granularity = \"day\"", "granularity = \"day\"\nstart = \"2024-01-01\""),
        shop(
            "pagination = { style = \"cursor\", cursor = \"/next\", param = \"after\" }\nmax_page_bytes = 4096\nexpect_count = { header = \"X-Total-Count\" }",
            "",
            "",
            "",
        ),
        orders(
            "note       = { type = \"text\" }",
            "note       = { type = \"text\", added = \"2024-01-05\" }",
        ),
        orders("transport = \"file\"", "transport = \"file\"\ndelimiter = \";\""),
    ];
    for text in cases {
        let errors = errors(&validator, &as_json(&text, "variant"));
        assert!(errors.is_empty(), "{errors:#?}\n{text}");
        let out = validate(&text);
        assert!(
            out.status.success(),
            "validate: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// ---------------------------------------------------------------------------
// alert rules
// ---------------------------------------------------------------------------

const ALERTS: &str = "deploy/alerts.yml";
const ALERT_TESTS: &str = "deploy/alerts.test.yml";

/// `promtool ARGS` run in the repository root. promtool comes with Debian's
/// `prometheus` package, which scripts/test-setup.sh installs; without it
/// the test fails (a skip would let CI pass with the rules unchecked).
fn promtool(args: &[&str]) -> Output {
    match Command::new("promtool")
        .args(args)
        .current_dir(ROOT)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool is not installed: run scripts/test-setup.sh \
             (it installs Debian's `prometheus` package, which ships promtool)"
        ),
        Err(e) => panic!("run promtool: {e}"),
    }
}

/// promtool's output on both streams (it prints failures on stdout).
#[track_caller]
fn expect_promtool_success(args: &[&str]) -> String {
    let out = promtool(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool {}: exit {:?}\n{text}",
        args.join(" "),
        out.status.code()
    );
    text
}

/// The values of `KEY: VALUE` lines of a YAML file, in order (the rule and
/// test files keep alert names on lines of their own).
fn yaml_values(path: &str, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(path))
        .unwrap_or_else(|e| panic!("read {path}: {e}"));
    text.lines()
        .filter_map(|line| {
            let line = line.trim_start().trim_start_matches("- ");
            line.strip_prefix(key)?.strip_prefix(':')
        })
        .map(|value| value.trim().to_string())
        .collect()
}

/// The issue's four alerts, each on the metric family it watches.
#[test]
fn the_shipped_alert_rules_pass_promtool_check() {
    let text = expect_promtool_success(&["check", "rules", ALERTS]);
    let alerts = yaml_values(ALERTS, "alert");
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "promtool reads every alert of {ALERTS} ({alerts:?}):\n{text}"
    );
    let rules = std::fs::read_to_string(Path::new(ROOT).join(ALERTS)).expect("read rules");
    for (alert, family) in [
        (
            "TidemarkPeriodFailed",
            "tidemark_periods{status=\"failed\"}",
        ),
        ("TidemarkFreshnessLagging", "tidemark_freshness_seconds"),
        ("TidemarkFreshnessLagging", "tidemark_period_length_seconds"),
        (
            "TidemarkQueueWaitHigh",
            "tidemark_queue_oldest_pending_seconds",
        ),
        (
            "TidemarkQueueWaitSlow",
            "tidemark_queue_wait_seconds_bucket",
        ),
        ("TidemarkNoLiveWorker", "tidemark_workers{state=\"live\"}"),
    ] {
        assert!(alerts.iter().any(|a| a == alert), "{ALERTS} has {alert}");
        assert!(rules.contains(family), "{ALERTS} watches {family}");
    }
}

/// `promtool test rules`: every alert fires on the synthetic series where
/// it should and stays quiet where it should not, and no alert of the rule
/// file goes untested.
#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let text = expect_promtool_success(&["test", "rules", ALERT_TESTS]);
    assert!(text.contains("SUCCESS"), "{text}");
    let tested = yaml_values(ALERT_TESTS, "alertname");
    for alert in yaml_values(ALERTS, "alert") {
        assert!(
            tested.contains(&alert),
            "{ALERT_TESTS} has no test of {alert} (tested: {tested:?})"
        );
    }
}

/// The binary hands jemalloc its decay settings (crates/cli/main.rs): freed
/// pages go back to the kernel after 1 s, not 10 s. jemalloc itself says
/// which options it read when asked to confirm them; a renamed symbol or a
/// changed allocator would silently drop them, so this reads them back.
#[test]
fn the_binary_gives_jemalloc_its_decay_settings() {
    let out = Command::new(BIN)
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "confirm_conf:true")
        .output()
        .expect("run tidemark");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    for set in [
        "Set conf value: dirty_decay_ms:1000",
        "Set conf value: muzzy_decay_ms:0",
    ] {
        assert!(
            said.contains(set),
            "jemalloc did not confirm `{set}`:\n{said}"
        );
    }
}
