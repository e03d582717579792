//! Profiles in pprof's format on `pprofAddress` (Metacontroller's `--pprof-address`), for `go tool pprof`
//! and the tools that read it: `GET /debug/pprof/profile?seconds=N` samples the CPU for N seconds
//! (default 30, as Go's) with pprof-rs, a `SIGPROF` timer at 100 Hz recording every thread's stack;
//! `GET /debug/pprof/heap` is the heap profile [`crate::ops::heap`] samples from the moment profiles
//! are served (in metahook's own binary, whose allocator it wraps).
//!
//! Off unless an address is set: meant to be turned on while gathering a profile, as Metacontroller
//! says of its own. One CPU profile at a time (the timer is process-wide); a second request is refused.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

/// How long a CPU profile samples unless `seconds` says.
const DEFAULT_SECONDS: u64 = 30;
/// The longest CPU profile served.
const MAX_SECONDS: u64 = 600;
/// Samples per second, Go's rate.
const FREQUENCY: i32 = 100;

struct Response {
    status: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Response {
    fn text(status: &'static str, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into().into_bytes() }
    }

    fn profile(body: Vec<u8>) -> Self {
        Self { status: "200 OK", content_type: "application/octet-stream", body }
    }
}

/// Binds `address` (empty = off; Go's `:port` form too) and serves profiles on it in the background.
pub async fn start(address: &str) -> Option<tokio::task::JoinHandle<()>> {
    if address.is_empty() {
        return None;
    }
    match crate::ops::metrics::bind(address).await {
        Ok(listener) => {
            let heap = crate::ops::heap::start();
            if let Ok(local) = listener.local_addr() {
                if heap {
                    info!(address = %local, "serving CPU and heap profiles at /debug/pprof/profile and /debug/pprof/heap");
                } else {
                    info!(address = %local, "serving CPU profiles at /debug/pprof/profile (no heap profiles: the process's allocator does not sample)");
                }
            }
            Some(tokio::spawn(serve(listener)))
        }
        Err(err) => {
            warn!(address, "cannot serve profiles: {err}");
            None
        }
    }
}

/// Serves profiles on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else { continue };
        tokio::spawn(async move {
            let mut buffer = [0_u8; 2048];
            let Ok(read) = stream.read(&mut buffer).await else { return };
            let request = String::from_utf8_lossy(&buffer[..read]);
            let target = request.split_whitespace().nth(1).unwrap_or("/");
            let response = respond(target).await;
            let head = format!(
                "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                response.status,
                response.content_type,
                response.body.len()
            );
            if let Err(err) = async {
                stream.write_all(head.as_bytes()).await?;
                stream.write_all(&response.body).await
            }
            .await
            {
                debug!("profile client went away: {err}");
            }
        });
    }
}

async fn respond(target: &str) -> Response {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/debug/pprof/profile" => match seconds(query) {
            Ok(seconds) => cpu_profile(Duration::from_secs(seconds)).await,
            Err(reason) => Response::text("400 Bad Request", format!("{reason}\n")),
        },
        "/debug/pprof/heap" => heap_profile().await,
        "/debug/pprof" | "/debug/pprof/" => Response::text(
            "200 OK",
            "profile: CPU profile in pprof's format, ?seconds=N (default 30)\n\
             heap: heap profile in pprof's format (allocations sampled since profiles are served)\n",
        ),
        _ => Response::text("404 Not Found", "not found\n"),
    }
}

/// The `seconds` parameter of a query string.
fn seconds(query: &str) -> Result<u64, String> {
    let Some(value) = query.split('&').find_map(|pair| pair.strip_prefix("seconds=")) else {
        return Ok(DEFAULT_SECONDS);
    };
    match value.parse::<u64>() {
        Ok(s) if (1..=MAX_SECONDS).contains(&s) => Ok(s),
        _ => Err(format!("seconds must be a whole number from 1 to {MAX_SECONDS}, not {value:?}")),
    }
}

/// Samples the CPU for `duration`; the profile, encoded.
async fn cpu_profile(duration: Duration) -> Response {
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(FREQUENCY)
        .blocklist(&["libc", "libgcc", "pthread", "vdso"])
        .build()
    {
        Ok(guard) => guard,
        Err(err) => return Response::text("409 Conflict", format!("cannot start a CPU profile: {err}\n")),
    };
    tokio::time::sleep(duration).await;
    let encoded = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, String> {
        use pprof::protos::Message as _;
        let report = guard.report().build().map_err(|e| e.to_string())?;
        drop(guard);
        let profile = report.pprof().map_err(|e| e.to_string())?;
        profile.write_to_bytes().map_err(|e| e.to_string())
    })
    .await;
    match encoded {
        Ok(Ok(body)) => Response::profile(body),
        Ok(Err(err)) => Response::text("500 Internal Server Error", format!("building the CPU profile: {err}\n")),
        Err(err) => Response::text("500 Internal Server Error", format!("building the CPU profile: {err}\n")),
    }
}

/// The heap profile so far.
async fn heap_profile() -> Response {
    let encoded = tokio::task::spawn_blocking(|| {
        use pprof::protos::Message as _;
        crate::ops::heap::profile().map(|profile| profile.write_to_bytes().map_err(|e| e.to_string()))
    })
    .await;
    match encoded {
        Ok(Some(Ok(body))) => Response::profile(body),
        Ok(None) => Response::text(
            "501 Not Implemented",
            "no heap profile: this process's allocator is not metahook's sampling one\n",
        ),
        Ok(Some(Err(err))) => {
            Response::text("500 Internal Server Error", format!("encoding the heap profile: {err}\n"))
        }
        Err(err) => Response::text("500 Internal Server Error", format!("building the heap profile: {err}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_to_go_and_are_bounded() {
        assert_eq!(seconds(""), Ok(30));
        assert_eq!(seconds("debug=1&seconds=5"), Ok(5));
        assert!(seconds("seconds=0").is_err());
        assert!(seconds("seconds=601").is_err());
        assert!(seconds("seconds=x").unwrap_err().contains("\"x\""));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cpu_profile_is_a_pprof_profile_of_this_process() {
        use pprof::protos::Message as _;
        let busy = std::thread::spawn(|| {
            let deadline = std::time::Instant::now() + Duration::from_millis(1500);
            let mut x = 0_u64;
            while std::time::Instant::now() < deadline {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
            x
        });
        let response = respond("/debug/pprof/profile?seconds=1").await;
        busy.join().unwrap();
        assert_eq!(response.status, "200 OK", "{}", String::from_utf8_lossy(&response.body));
        let profile = pprof::protos::Profile::parse_from_bytes(&response.body).expect("a pprof protobuf");
        let types: Vec<_> =
            profile.sample_type.iter().map(|t| profile.string_table[usize::try_from(t.ty).unwrap()].clone()).collect();
        assert_eq!(types, ["samples", "cpu"]);
        assert!(!profile.sample.is_empty(), "a busy thread for a second gives samples");
        assert!(!profile.function.is_empty(), "with symbolized functions");
    }
}
