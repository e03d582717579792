//! Profiles in pprof's format on `pprofAddress` (Metacontroller's `--pprof-address`), for `go tool pprof`
//! and the tools that read it: `GET /debug/pprof/profile?seconds=N` samples the CPU for N seconds
//! (default 30, as Go's) with pprof-rs, a `SIGPROF` timer at 100 Hz recording every thread's stack;
//! `GET /debug/pprof/heap` is the heap profile [`crate::ops::heap`] samples from the moment profiles
//! are served (in metahook's own binary, whose allocator it wraps).
//!
//! Off unless an address is set: meant to be turned on while gathering a profile, as Metacontroller
//! says of its own. One CPU profile at a time (the timer is process-wide); a second request is refused.

use std::time::Duration;

use axum::extract::RawQuery;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tracing::{info, warn};

/// How long a CPU profile samples unless `seconds` says.
const DEFAULT_SECONDS: u64 = 30;
/// The longest CPU profile served.
const MAX_SECONDS: u64 = 600;
/// Samples per second, Go's rate.
const FREQUENCY: i32 = 100;

struct Response {
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Response {
    fn text(status: StatusCode, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into().into_bytes() }
    }

    fn profile(body: Vec<u8>) -> Self {
        Self { status: StatusCode::OK, content_type: "application/octet-stream", body }
    }
}

impl IntoResponse for Response {
    fn into_response(self) -> axum::response::Response {
        (self.status, [(header::CONTENT_TYPE, self.content_type)], self.body).into_response()
    }
}

/// Binds `address` (empty = off; Go's `:port` form too) and serves profiles on it in the background.
pub async fn start(address: &str) -> Option<tokio::task::JoinHandle<()>> {
    if address.is_empty() {
        return None;
    }
    match crate::ops::http::bind(address).await {
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

/// Serves profiles on `listener` until the task is dropped (a CPU profile takes as long as it
/// samples, so no request timeout but the head's).
pub async fn serve(listener: TcpListener) {
    crate::ops::http::serve(listener, router(), crate::ops::http::HEAD_TIMEOUT, None).await;
}

fn router() -> axum::Router {
    axum::Router::new()
        .route(
            "/debug/pprof/profile",
            get(|RawQuery(query): RawQuery| async move {
                match seconds(query.as_deref().unwrap_or_default()) {
                    Ok(seconds) => cpu_profile(Duration::from_secs(seconds)).await,
                    Err(reason) => Response::text(StatusCode::BAD_REQUEST, format!("{reason}\n")),
                }
            }),
        )
        .route("/debug/pprof/heap", get(heap_profile))
        .route("/debug/pprof", get(index))
        .route("/debug/pprof/", get(index))
        .fallback(|| async { Response::text(StatusCode::NOT_FOUND, "not found\n") })
}

async fn index() -> Response {
    Response::text(
        StatusCode::OK,
        "profile: CPU profile in pprof's format, ?seconds=N (default 30)\n\
         heap: heap profile in pprof's format (allocations sampled since profiles are served)\n",
    )
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
        Err(err) => return Response::text(StatusCode::CONFLICT, format!("cannot start a CPU profile: {err}\n")),
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
        Ok(Err(err)) => Response::text(StatusCode::INTERNAL_SERVER_ERROR, format!("building the CPU profile: {err}\n")),
        Err(err) => Response::text(StatusCode::INTERNAL_SERVER_ERROR, format!("building the CPU profile: {err}\n")),
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
            StatusCode::NOT_IMPLEMENTED,
            "no heap profile: this process's allocator is not metahook's sampling one\n",
        ),
        Ok(Some(Err(err))) => {
            Response::text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding the heap profile: {err}\n"))
        }
        Err(err) => Response::text(StatusCode::INTERNAL_SERVER_ERROR, format!("building the heap profile: {err}\n")),
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
        let response = cpu_profile(Duration::from_secs(1)).await;
        busy.join().unwrap();
        assert_eq!(response.status, StatusCode::OK, "{}", String::from_utf8_lossy(&response.body));
        let profile = pprof::protos::Profile::parse_from_bytes(&response.body).expect("a pprof protobuf");
        let types: Vec<_> =
            profile.sample_type.iter().map(|t| profile.string_table[usize::try_from(t.ty).unwrap()].clone()).collect();
        assert_eq!(types, ["samples", "cpu"]);
        assert!(!profile.sample.is_empty(), "a busy thread for a second gives samples");
        assert!(!profile.function.is_empty(), "with symbolized functions");
    }
}
