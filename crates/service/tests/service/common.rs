//! What the modules share: a service opened as the binary opens it, from its configuration.

use std::path::Path;

use agentry_service::config::Config;

/// The configuration of a service whose data directory is `dir`, with no reachable code host
/// (nothing listens on port 9) and no runner (no run starts).
pub fn config(dir: &Path) -> Config {
    let data_dir = dir.to_str().unwrap().to_owned();
    Config::from_lookup(|name| match name {
        "AGENTRY_DATA_DIR" => Some(data_dir.clone()),
        "AGENTRY_CODEHOST_API_URL" => Some("http://127.0.0.1:9".into()),
        "AGENTRY_MAX_CONCURRENT_RUNS" => Some("0".into()),
        _ => None,
    })
    .unwrap()
}
