//! The hook to call: the controller's own URL, or a process started from `--hook-cmd` with `PORT` set.

use std::process::Stdio;
use std::time::Duration;

use crate::api::{Hook, Webhook};
use crate::engine::error::with_causes;
use crate::hooks::{Endpoint, HookClient, HookKind, HookLabels};

use super::args::{RenderArgs, RenderError};

/// The hook to call: the controller's, or `--hook`, or a server started with `--hook-cmd` (kept alive
/// by the returned handle).
pub(super) async fn hook_to_call(hook: &Hook, args: &RenderArgs) -> Result<(Hook, Option<HookProcess>), RenderError> {
    Ok(match (&args.hook, &args.hook_cmd) {
        (Some(url), _) => (with_url(hook, url.clone()), None),
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
pub(super) struct HookProcess {
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
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
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

#[cfg(test)]
mod tests {
    use super::*;

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
