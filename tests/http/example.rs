//! The example pipeline `pipelines/http_orders.toml` is valid, needs its
//! token from the environment, and its HTTP source opens (no request is
//! sent before the first batch).

use std::path::Path;

use tidemark_core::{ErrorClass, Pipeline};
use tidemark_extract::SourceReader;

#[test]
fn the_http_example_pipeline_is_valid_and_needs_its_token() {
    let path = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/pipelines/http_orders.toml"
    ));
    let pipeline = Pipeline::load(path).unwrap_or_else(|e| panic!("{e}"));
    if std::env::var_os("SHOP_API_TOKEN").is_none() {
        let err = pipeline.check_env().unwrap_err();
        assert_eq!(err.class(), ErrorClass::Config);
        assert!(err.to_string().contains("SHOP_API_TOKEN"), "{err}");
    }
    std::env::set_var("SHOP_API_TOKEN", "t0k3n-example");
    pipeline.check_env().unwrap();
    let period = pipeline.period("2024-01-05").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reader = runtime
        .block_on(SourceReader::open(
            &pipeline,
            &pipeline.spec.sources[0],
            &period,
            None,
            None,
        ))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!format!("{reader:?}").contains("t0k3n-example"));
}
