//! The running hub (placeholder filled by the engine).
use kube::Client;
use crate::config::Config;
pub async fn run(_client: Client, _config: Config) -> Result<(), std::io::Error> {
    tokio::signal::ctrl_c().await
}
