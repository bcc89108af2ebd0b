//! Shared by the tests that need Debian's nats-server.

use fairfeed_bridge::server::find_server;

/// Whether nats-server is installed; without it the test says SKIPPED, and
/// fails when FAIRFEED_REQUIRE_TOOLS=1 (scripts/test.sh installs it).
pub fn have_server() -> bool {
    if find_server().is_some() {
        return true;
    }
    let msg = "nats-server is not installed (apt-get install nats-server)";
    if std::env::var("FAIRFEED_REQUIRE_TOOLS").as_deref() == Ok("1") {
        panic!("{msg} and FAIRFEED_REQUIRE_TOOLS=1: run scripts/test.sh");
    }
    eprintln!("SKIPPED: {msg}");
    false
}
