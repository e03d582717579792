//! The hub's settings: defaults, overlaid by a YAML file, overlaid by flags and environment variables.
//!
//! `config/metahook.yaml` documents every field with its default; a test keeps that file and
//! [`Config::default`] in agreement.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Errors loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("parsing config file {path}: {source}")]
    Parse { path: PathBuf, source: serde_yaml::Error },
    #[error("invalid setting {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// Settings of one hub process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
pub struct Config {
    /// Concurrent syncs per controller (each parent is still synced by one worker at a time).
    pub workers: usize,
    /// How often API discovery is refreshed, so newly installed CRDs become usable.
    #[serde(with = "secs")]
    pub discovery_interval: Duration,
    /// Server-side apply field manager for children and attachments. One per hub, so that two
    /// controllers writing the same object show up as a conflict instead of silently fighting.
    pub field_manager: String,
    /// Only run CompositeControllers whose labels match this selector (`key=value,key2!=v`); empty = all.
    pub target_label_selector: String,
    /// Base delay of the per-parent exponential backoff after a failed sync.
    #[serde(with = "millis")]
    pub backoff_base: Duration,
    /// Cap of the per-parent exponential backoff.
    #[serde(with = "secs")]
    pub backoff_max: Duration,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`host:port`); empty disables them.
    pub metrics_address: String,
    /// Largest hook response body accepted, in bytes; a larger one fails the sync unread.
    pub hook_response_limit: usize,
    /// Field managers whose ownership of children and attachments the hub takes over on its first
    /// write to them (Metacontroller's); empty turns taking over off.
    pub take_over_field_managers: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: 5,
            discovery_interval: Duration::from_secs(30),
            field_manager: "metahook".to_owned(),
            target_label_selector: String::new(),
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_secs(1000),
            metrics_address: "0.0.0.0:9999".to_owned(),
            hook_response_limit: crate::hooks::DEFAULT_RESPONSE_LIMIT,
            take_over_field_managers: vec![crate::migrate::METACONTROLLER_MANAGER.to_owned()],
        }
    }
}

/// Command-line / environment overrides; each `None` leaves the file's (or default) value.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ConfigOverrides {
    /// Concurrent syncs per controller.
    #[arg(long, env = "METAHOOK_WORKERS")]
    pub workers: Option<usize>,
    /// Discovery refresh interval in seconds.
    #[arg(long, env = "METAHOOK_DISCOVERY_INTERVAL_SECONDS")]
    pub discovery_interval_seconds: Option<u64>,
    /// Server-side apply field manager.
    #[arg(long, env = "METAHOOK_FIELD_MANAGER")]
    pub field_manager: Option<String>,
    /// Only run controllers whose labels match this selector.
    #[arg(long, env = "METAHOOK_TARGET_LABEL_SELECTOR")]
    pub target_label_selector: Option<String>,
    /// Address of the metrics and health endpoints; empty disables them.
    #[arg(long, env = "METAHOOK_METRICS_ADDRESS")]
    pub metrics_address: Option<String>,
}

impl Config {
    /// Defaults, then `file` (if any), then `overrides`.
    pub fn load(file: Option<&Path>, overrides: &ConfigOverrides) -> Result<Self, ConfigError> {
        let mut config = match file {
            Some(path) => Self::from_file(path)?,
            None => Self::default(),
        };
        if let Some(workers) = overrides.workers {
            config.workers = workers;
        }
        if let Some(secs) = overrides.discovery_interval_seconds {
            config.discovery_interval = Duration::from_secs(secs);
        }
        if let Some(manager) = &overrides.field_manager {
            config.field_manager.clone_from(manager);
        }
        if let Some(selector) = &overrides.target_label_selector {
            config.target_label_selector.clone_from(selector);
        }
        if let Some(address) = &overrides.metrics_address {
            config.metrics_address.clone_from(address);
        }
        config.validate()?;
        Ok(config)
    }

    fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        serde_yaml::from_str(&text).map_err(|source| ConfigError::Parse { path: path.to_owned(), source })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError::Invalid { field: "workers", reason: "must be at least 1".into() });
        }
        if self.field_manager.is_empty() {
            return Err(ConfigError::Invalid { field: "fieldManager", reason: "must not be empty".into() });
        }
        if self.hook_response_limit == 0 {
            return Err(ConfigError::Invalid { field: "hookResponseLimit", reason: "must be at least 1 byte".into() });
        }
        if self.backoff_base > self.backoff_max {
            return Err(ConfigError::Invalid {
                field: "backoffBase",
                reason: "must not exceed backoffMaxSeconds".into(),
            });
        }
        crate::selector::parse_selector_string(&self.target_label_selector)
            .map_err(|e| ConfigError::Invalid { field: "targetLabelSelector", reason: e.to_string() })?;
        Ok(())
    }
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_default_file_matches_built_in_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/metahook.yaml");
        let from_file = Config::from_file(&path).expect("config/metahook.yaml parses");
        assert_eq!(from_file, Config::default());
    }

    #[test]
    fn overrides_win_over_file_values() {
        let overrides = ConfigOverrides { workers: Some(9), ..ConfigOverrides::default() };
        let config = Config::load(None, &overrides).unwrap();
        assert_eq!(config.workers, 9);
        assert_eq!(config.field_manager, "metahook");
    }

    #[test]
    fn zero_workers_is_rejected() {
        let overrides = ConfigOverrides { workers: Some(0), ..ConfigOverrides::default() };
        let err = Config::load(None, &overrides).unwrap_err();
        assert!(err.to_string().contains("workers"), "{err}");
    }

    #[test]
    fn unknown_keys_in_file_are_rejected() {
        let err = serde_yaml::from_str::<Config>("workerz: 3").unwrap_err();
        assert!(err.to_string().contains("workerz"), "{err}");
    }
}
