//! The hook to call: the controller's own URL, or a process started from `--hook-cmd` with `PORT` set.

use std::process::Stdio;
use std::time::Duration;

use crate::api::{Hook, Webhook};
use crate::engine::error::with_causes;
use crate::hooks::{Endpoint, HookClient, HookKind, HookLabels};

use super::args::{RenderArgs, RenderError};

/// The hook to call: the controller's, or the one at `url` (`--hook`, `--hook-url`), or a server
/// started with `cmd` (`--hook-cmd`, kept alive by the returned handle). `metahook render` and
/// `metahook diff` both call their candidate so.
pub(crate) async fn hook_to_call(
    hook: &Hook,
    url: Option<&str>,
    cmd: Option<&str>,
) -> Result<(Hook, Option<HookProcess>), RenderError> {
    Ok(match (url, cmd) {
        (Some(url), _) => (with_url(hook, url.to_owned()), None),
        (None, Some(cmd)) => {
            let server = HookProcess::start(cmd).await?;
            let path = hook_path(hook);
            (with_url(hook, format!("http://127.0.0.1:{}{path}", server.port)), Some(server))
        }
        (None, None) => (hook.clone(), None),
    })
}

/// The hook client's endpoint for `hook`, with the TLS/auth settings the controller gives it (settings
/// that need the cluster, such as a Secret reference, are refused with the reason).
pub(super) fn endpoint(
    hook: &Hook,
    endpoint_configs: &[crate::api::EndpointConfig],
    kind: &str,
    name: Option<&str>,
    args: &RenderArgs,
) -> Result<Endpoint, RenderError> {
    let labels = HookLabels {
        kind: kind.to_owned(),
        controller: name.unwrap_or_default().to_owned(),
        hook: if args.finalizing { HookKind::Finalize } else { HookKind::Sync },
    };
    HookClient::default().endpoint(hook, endpoint_configs, labels).map_err(|e| RenderError::Setup(with_causes(&e)))
}

fn with_url(hook: &Hook, url: String) -> Hook {
    Hook { webhook: Webhook { url: Some(url), service: None, ..hook.webhook.clone() }, ..hook.clone() }
}

/// The path part of a hook's URL (`/sync`), to call on a locally started server.
fn hook_path(hook: &Hook) -> String {
    let url = hook.webhook.resolved_url().unwrap_or_default();
    let after_scheme = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    after_scheme.find('/').map_or_else(|| "/".to_owned(), |i| after_scheme[i..].to_owned())
}

/// A hook server started for one render, killed when dropped. Its stdout and stderr go to render's
/// stderr, so a hook's prints and tracebacks are seen without mixing into the report.
pub(crate) struct HookProcess {
    port: u16,
    _child: tokio::process::Child,
}

impl HookProcess {
    async fn start(cmd: &str) -> Result<Self, RenderError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| RenderError::Setup(format!("finding a free port: {e}")))?
            .port();
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", &format!("exec {cmd}")])
            .env("PORT", port.to_string())
            .env("HOST", "127.0.0.1")
            .stdout(Stdio::from(std::io::stderr()))
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| RenderError::Setup(format!("starting {cmd:?}: {e}")))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let pid = child.id().unwrap_or_default();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err()
            || listener_owned_by(pid, port) == Some(false)
        {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(RenderError::Setup(format!("hook command {cmd:?} exited with {status}")));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(RenderError::Setup(format!(
                    "hook command {cmd:?} did not listen on $PORT ({port}) in 15s; does it read PORT? \
                     (serve() of the helper libraries does, unless given a port)"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self { port, _child: child })
    }
}

/// Whether the socket listening on `port` belongs to process `pid` or one of its descendants; `None`
/// where `/proc` cannot tell (not Linux). Why: the free port is found by binding and closing it, and
/// until the hook binds it another process may (a test binary starts many servers at once); a probe
/// that connects there would send the hook's request to a stranger (seen as "connection closed before
/// message completed" from a hook that had not even started).
fn listener_owned_by(pid: u32, port: u16) -> Option<bool> {
    let listening: Vec<String> =
        ["/proc/net/tcp", "/proc/net/tcp6"].iter().filter_map(|table| std::fs::read_to_string(table).ok()).collect();
    if listening.is_empty() {
        return None;
    }
    let inodes: Vec<String> = listening.iter().flat_map(|table| listening_inodes(table, port)).collect();
    if inodes.is_empty() {
        return Some(false);
    }
    let sockets: Vec<String> = inodes.iter().map(|inode| format!("socket:[{inode}]")).collect();
    let owns = |pid: &u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd")).into_iter().flatten().flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| sockets.iter().any(|s| target.as_os_str() == s.as_str()))
        })
    };
    Some(family(pid).iter().any(owns))
}

/// The inodes of the sockets a `/proc/net/tcp`-format `table` lists as listening (state `0A`) on `port`.
fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    let wanted = format!("{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit_once(':')?.1;
            (local_port == wanted && *fields.get(3)? == "0A").then(|| fields.get(9).map(|s| (*s).to_owned()))?
        })
        .collect()
}

/// `pid` and its descendants (a hook command may be a wrapper that starts the server).
fn family(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so read after the last `)`.
            let parent = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((child, parent))
        })
        .collect();
    let mut family = vec![pid];
    let mut i = 0;
    while i < family.len() {
        let of = family[i];
        family.extend(parents.iter().filter(|(_, parent)| *parent == of).map(|(child, _)| *child));
        i += 1;
    }
    family
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_socket_of_a_port_is_found_in_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:9E63 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000 100 0 0 10 0
   1: 0100007F:9E63 0100007F:ADDE 01 00000000:00000000 00:00000000 00000000     0        0 5678 1 0000 20 4 30 10 -1
   2: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 9999 1 0000 100 0 0 10 0";
        assert_eq!(listening_inodes(table, 0x9E63), vec!["1234".to_owned()], "listening only, not the connection");
        assert!(listening_inodes(table, 0x9E64).is_empty());
    }

    #[test]
    fn a_listener_is_found_in_this_process_and_not_in_another() {
        if !std::path::Path::new("/proc/net/tcp").exists() {
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listener_owned_by(std::process::id(), port), Some(true));
        let mut other = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        assert_eq!(listener_owned_by(other.id(), port), Some(false), "another process has no such socket");
        let _ = other.kill();
        let _ = other.wait();
        drop(listener);
        assert_eq!(listener_owned_by(std::process::id(), port), Some(false), "nothing listens");
    }

    #[test]
    fn hook_paths_come_from_the_controller_url() {
        let hook: Hook =
            serde_json::from_value(serde_json::json!({"webhook": {"url": "http://h.ns:8080/sync"}})).unwrap();
        assert_eq!(hook_path(&hook), "/sync");
        let hook: Hook = serde_json::from_value(
            serde_json::json!({"webhook": {"service": {"name": "h", "namespace": "n"}, "path": "/f"}}),
        )
        .unwrap();
        assert_eq!(hook_path(&hook), "/f");
    }
}
