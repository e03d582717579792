//! Who may read `/metrics` (`metricsAuth`): anyone who reaches the address, or — with `kubernetes` —
//! whoever the API server says may `get` the non-resource URL `/metrics`, as controller-runtime's
//! `filters.WithAuthenticationAndAuthorization` decides it for every controller built on it.
//!
//! A scrape carries `Authorization: Bearer <token>` (Prometheus sends its `ServiceAccount` token). A
//! `TokenReview` asks the API server who the token belongs to, then a `SubjectAccessReview` whether
//! that user may `get` the path, so access is granted the Kubernetes way: a `ClusterRole` with
//! `nonResourceURLs: ["/metrics"], verbs: ["get"]`, bound to the scraper. No token, or one the API
//! server does not accept, is answered 401; a user not allowed, 403.
//!
//! Verdicts are remembered briefly, keyed by a SHA-256 of the token (the token itself is not kept):
//! Prometheus scrapes every 15–60 s with the same token, and two API calls per scrape would cost the
//! API server more than the scrape is worth. An allowed token is trusted for [`ALLOWED_FOR`], so a
//! revoked binding takes effect within that; a refusal is remembered for [`REFUSED_FOR`] only, so a
//! binding just added is honoured soon.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Client;
use kube::api::{Api, PostParams};

/// How long an allowed token is trusted without asking the API server again.
pub const ALLOWED_FOR: Duration = Duration::from_secs(60);

/// How long a refused token stays refused without asking again.
pub const REFUSED_FOR: Duration = Duration::from_secs(10);

/// Verdicts remembered at most; past that the expired ones are dropped, and if none had, all of them
/// (a flood of made-up tokens must not grow the hub's memory).
const REMEMBERED: usize = 1024;

/// Who may read `/metrics`.
#[derive(Clone, Debug, Default)]
pub enum MetricsAccess {
    /// Anyone who reaches the address.
    #[default]
    Anyone,
    /// Whoever the API server allows (`metricsAuth: kubernetes`).
    Reviewed(Arc<Reviewer>),
}

/// The answer to one scrape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No bearer token, or one the API server does not accept: 401.
    Unauthenticated,
    /// A user the API server knows, not allowed to `get` the path: 403.
    Forbidden,
}

/// The API server could not be asked; the scrape is answered 500 and nothing is remembered.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("reviewing the token of a scrape: {0}")]
    Token(#[source] kube::Error),
    #[error("asking whether {user} may get {path}: {source}")]
    Access {
        user: String,
        path: String,
        #[source]
        source: kube::Error,
    },
}

impl MetricsAccess {
    /// Checks the `Authorization` header of a request for `path`.
    pub async fn check(&self, authorization: Option<&str>, path: &str) -> Result<Verdict, ReviewError> {
        match self {
            Self::Anyone => Ok(Verdict::Allowed),
            Self::Reviewed(reviewer) => reviewer.check(authorization, path).await,
        }
    }
}

/// Asks the API server about the tokens of scrapes, and remembers its answers briefly.
pub struct Reviewer {
    /// Sends the reviews. Not the leader's gated client: a standby must answer scrapes too, and a
    /// review changes nothing in the cluster.
    client: Client,
    verdicts: Mutex<Verdicts>,
}

impl std::fmt::Debug for Reviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reviewer").finish_non_exhaustive()
    }
}

impl Reviewer {
    #[must_use]
    pub fn new(client: Client) -> Self {
        Self { client, verdicts: Mutex::new(Verdicts::default()) }
    }

    /// Checks the `Authorization` header of a request for `path`.
    pub async fn check(&self, authorization: Option<&str>, path: &str) -> Result<Verdict, ReviewError> {
        let Some(token) = authorization.and_then(bearer) else { return Ok(Verdict::Unauthenticated) };
        let key = Verdicts::key(path, token);
        if let Some(verdict) = self.verdicts.lock().expect("verdicts lock").get(&key, Instant::now()) {
            return Ok(verdict);
        }
        let verdict = self.review(token, path).await?;
        self.verdicts.lock().expect("verdicts lock").insert(key, verdict, Instant::now());
        Ok(verdict)
    }

    /// What the API server says of `token`, for `get` on `path`.
    async fn review(&self, token: &str, path: &str) -> Result<Verdict, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_owned(), audiences: None },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(ReviewError::Token)?;
        let Some(user) = reviewed.status.filter(|s| s.authenticated == Some(true)).and_then(|s| s.user) else {
            return Ok(Verdict::Unauthenticated);
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|source| ReviewError::Access { user: name, path: path.to_owned(), source })?;
        let allowed = answered.status.is_some_and(|s| s.allowed);
        Ok(if allowed { Verdict::Allowed } else { Verdict::Forbidden })
    }
}

/// The token of an `Authorization: Bearer <token>` header value (the scheme in any case, as HTTP has it).
fn bearer(authorization: &str) -> Option<&str> {
    let (scheme, token) = authorization.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Verdicts by a digest of (path, token), each with when it expires.
#[derive(Default)]
struct Verdicts(HashMap<[u8; 32], (Verdict, Instant)>);

impl Verdicts {
    fn key(path: &str, token: &str) -> [u8; 32] {
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        digest.update(path.as_bytes());
        digest.update(b"\0");
        digest.update(token.as_bytes());
        let mut key = [0; 32];
        key.copy_from_slice(digest.finish().as_ref());
        key
    }

    fn get(&self, key: &[u8; 32], now: Instant) -> Option<Verdict> {
        self.0.get(key).filter(|(_, until)| now < *until).map(|(verdict, _)| *verdict)
    }

    fn insert(&mut self, key: [u8; 32], verdict: Verdict, now: Instant) {
        if self.0.len() >= REMEMBERED {
            self.0.retain(|_, (_, until)| now < *until);
            if self.0.len() >= REMEMBERED {
                self.0.clear();
            }
        }
        let ttl = if verdict == Verdict::Allowed { ALLOWED_FOR } else { REFUSED_FOR };
        self.0.insert(key, (verdict, now + ttl));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer("Bearer abc.def"), Some("abc.def"));
        assert_eq!(bearer("bearer   abc "), Some("abc"), "the scheme in any case, spaces around the token");
        assert_eq!(bearer("Basic dXNlcjpwdw=="), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("Bearer"), None);
    }

    #[test]
    fn allowed_tokens_are_remembered_longer_than_refused_ones() {
        let mut verdicts = Verdicts::default();
        let now = Instant::now();
        let (allowed, refused) = (Verdicts::key("/metrics", "good"), Verdicts::key("/metrics", "bad"));
        verdicts.insert(allowed, Verdict::Allowed, now);
        verdicts.insert(refused, Verdict::Forbidden, now);
        assert_eq!(verdicts.get(&allowed, now), Some(Verdict::Allowed));
        assert_eq!(verdicts.get(&refused, now), Some(Verdict::Forbidden));
        let later = now + REFUSED_FOR;
        assert_eq!(verdicts.get(&allowed, later), Some(Verdict::Allowed));
        assert_eq!(verdicts.get(&refused, later), None, "a refusal is asked again soon");
        assert_eq!(verdicts.get(&allowed, now + ALLOWED_FOR), None);
        assert_eq!(verdicts.get(&Verdicts::key("/other", "good"), now), None, "a verdict is for its path");
    }

    #[test]
    fn a_flood_of_tokens_does_not_grow_the_memory_past_its_bound() {
        let mut verdicts = Verdicts::default();
        let now = Instant::now();
        for n in 0..REMEMBERED * 3 {
            verdicts.insert(Verdicts::key("/metrics", &n.to_string()), Verdict::Unauthenticated, now);
        }
        assert!(verdicts.0.len() <= REMEMBERED);
    }

    #[tokio::test]
    async fn anyone_may_read_when_access_is_open_and_no_token_is_asked_about() {
        assert_eq!(MetricsAccess::Anyone.check(None, "/metrics").await.unwrap(), Verdict::Allowed);
        // A client that cannot connect: a request without a bearer token is refused before any review.
        let client = Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let reviewed = MetricsAccess::Reviewed(Arc::new(Reviewer::new(client)));
        assert_eq!(reviewed.check(None, "/metrics").await.unwrap(), Verdict::Unauthenticated);
        assert_eq!(reviewed.check(Some("Basic dXNlcjpwdw=="), "/metrics").await.unwrap(), Verdict::Unauthenticated);
        let err = reviewed.check(Some("Bearer t"), "/metrics").await.unwrap_err();
        assert!(matches!(err, ReviewError::Token(_)), "{err}");
    }
}
