//! Host-and-port comparison for hook URLs: case-insensitive host, the scheme's default port filled in.
//!
//! Both `endpointConfigs[].host` (Metacontroller's matching rule) and the hub's `hookHosts` map name a
//! hook's server this way, so `greeter.hooks`, `GREETER.hooks:80` and `http://greeter.hooks:80/sync`
//! all name the same server.

use std::fmt;

use http::Uri;

/// A server as a hook URL names it: lower-case host and an explicit port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Authority {
    host: String,
    port: u16,
}

impl Authority {
    /// The authority a URL connects to (`None` without a host or with a scheme that has no default port).
    #[must_use]
    pub fn of(uri: &Uri) -> Option<Self> {
        let host = uri.host()?;
        let port = uri.port_u16().or_else(|| default_port(uri.scheme_str()?))?;
        Some(Self { host: host.to_ascii_lowercase(), port })
    }

    /// Parses `host` or `host:port` (IPv6 in brackets); a missing port is `default_port`.
    #[must_use]
    pub fn parse(text: &str, default_port: u16) -> Option<Self> {
        let (host, port) = split_host_port(text.trim())?;
        Some(Self { host: host.to_ascii_lowercase(), port: port.unwrap_or(default_port) })
    }

    /// Whether `text` (`host` or `host:port`) names this server, a missing port meaning `scheme`'s default.
    #[must_use]
    pub fn matches(&self, text: &str, scheme: &str) -> bool {
        let Some((host, port)) = split_host_port(text.trim()) else { return false };
        let port = port.or_else(|| default_port(scheme));
        host.eq_ignore_ascii_case(&self.host) && port == Some(self.port)
    }

    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }

    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// 80 for `http`, 443 for `https`.
#[must_use]
pub fn default_port(scheme: &str) -> Option<u16> {
    match scheme.to_ascii_lowercase().as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

/// `host[:port]` → (host, port); `[v6]` and `[v6]:port` keep their brackets. `None` for an empty host
/// or a port that is not a number.
fn split_host_port(text: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if text.starts_with('[') {
        let end = text.find(']')? + 1;
        match &text[end..] {
            "" => (&text[..end], None),
            rest => (&text[..end], Some(rest.strip_prefix(':')?)),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = port.map(str::parse).transpose().ok()?;
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(url: &str) -> Authority {
        Authority::of(&url.parse().unwrap()).unwrap()
    }

    #[test]
    fn urls_get_their_scheme_default_port() {
        assert_eq!(of("http://Hooks.Ops/sync").to_string(), "hooks.ops:80");
        assert_eq!(of("https://hooks.ops/sync").to_string(), "hooks.ops:443");
        assert_eq!(of("https://hooks.ops:8443/sync").to_string(), "hooks.ops:8443");
        assert_eq!(of("http://[::1]:8080/x").to_string(), "[::1]:8080");
        assert!(Authority::of(&"ftp://x/y".parse().unwrap()).is_none());
    }

    #[test]
    fn host_names_match_case_insensitively_with_default_port_equivalence() {
        let https = of("https://Example.COM/sync");
        assert!(https.matches("example.com", "https"));
        assert!(https.matches("EXAMPLE.com:443", "https"));
        assert!(!https.matches("example.com:80", "https"));
        assert!(!https.matches("other.com", "https"));
        let explicit_default = of("https://example.com:443/sync");
        assert!(explicit_default.matches("example.com", "https"));
        let other_port = of("https://example.com:8443/sync");
        assert!(!other_port.matches("example.com", "https"));
        assert!(other_port.matches("example.com:8443", "https"));
    }

    #[test]
    fn service_form_hosts_match_name_dot_namespace() {
        let service = of("http://greeter.hooks:80/sync");
        assert!(service.matches("greeter.hooks", "http"));
        assert!(service.matches("greeter.hooks:80", "http"));
        let on_8080 = of("http://greeter.hooks:8080/sync");
        assert!(on_8080.matches("greeter.hooks:8080", "http"));
        assert!(!on_8080.matches("greeter.hooks", "http"));
    }

    #[test]
    fn malformed_hosts_match_nothing() {
        let a = of("http://h:80/");
        assert!(!a.matches("", "http"));
        assert!(!a.matches("h:port", "http"));
        assert!(!a.matches(":80", "http"));
        assert_eq!(Authority::parse("[::1]", 80).unwrap().to_string(), "[::1]:80");
        assert!(Authority::parse("[::1]x", 80).is_none());
    }
}
