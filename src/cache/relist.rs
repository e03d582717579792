//! Relisting: a watch started anew every so often, so that it lists its type again (Metacontroller's
//! `--cache-flush-interval`).
//!
//! A watch resumes from the last resourceVersion it saw, so a dropped connection loses nothing; but an
//! event the hub never received while the watch looked alive (a stalled connection, a bug anywhere on
//! the way) is lost for as long as the object does not change again. A level-triggered controller keeps
//! a safety net against that: it lists again now and then, and syncs what differs from its cache.
//! kube-runtime's watcher never relists on its own (only after its resourceVersion expired), so
//! [`Relisting`] starts a fresh one — which lists first, as every watcher does. The cache compares that
//! list with what it holds ([`crate::cache::informers`]): only objects whose resourceVersion differs, and
//! those that are gone, reach the controllers, marked `relisted`. A hub limited to some namespaces
//! watches a type once per namespace, each watch relisting on its own (jittered) timer, so a relist
//! lists one namespace and removes from the cache only what is gone from it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use kube::runtime::watcher;
use tokio::time::{Instant, Sleep};
use tracing::debug;

/// A watch stream, started anew by `start` every `every` (jittered, see [`jittered`]) after its last
/// complete list; never while a list is under way, whichever watcher started it.
pub struct Relisting<K, F> {
    start: F,
    stream: BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
    every: Option<Duration>,
    /// When to start the watch again; re-armed at the end of every list.
    timer: Pin<Box<Sleep>>,
    /// Between a list's `Init` and its `InitDone` (and from a start until then): the timer waits.
    listing: bool,
}

/// Watches with `start()`, and starts it again `every` after each complete list (`None`: never).
pub fn relisting<K, F>(mut start: F, every: Option<Duration>) -> Relisting<K, F>
where
    F: FnMut() -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>>,
{
    let stream = start();
    let first = Instant::now() + every.map_or(Duration::MAX / 4, jittered);
    Relisting { start, stream, every, timer: Box::pin(tokio::time::sleep_until(first)), listing: true }
}

impl<K, F> Stream for Relisting<K, F>
where
    F: FnMut() -> BoxStream<'static, Result<watcher::Event<K>, watcher::Error>> + Unpin,
{
    type Item = Result<watcher::Event<K>, watcher::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.every.is_some() && !this.listing && this.timer.as_mut().poll(cx).is_ready() {
            debug!("relisting (cache flush interval)");
            // Dropping the old stream closes its connection; the new watcher lists first.
            this.stream = (this.start)();
            this.listing = true;
        }
        let item = std::task::ready!(this.stream.poll_next_unpin(cx));
        match &item {
            Some(Ok(watcher::Event::Init)) => this.listing = true,
            Some(Ok(watcher::Event::InitDone)) => {
                this.listing = false;
                if let Some(every) = this.every {
                    this.timer.as_mut().reset(Instant::now() + jittered(every));
                }
            }
            _ => {}
        }
        Poll::Ready(item)
    }
}

/// Between 80% and 100% of `every`, at random: types whose watches started together (a controller's
/// parent and child types, every type after a restart) spread their relists over a fifth of the
/// interval instead of listing all at once, and none waits longer than the interval asks.
#[must_use]
pub fn jittered(every: Duration) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    // Each RandomState has fresh random keys: hashing nothing with them is a random number.
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let permille = u32::try_from(random % 1000).unwrap_or(0);
    every.mul_f64(0.8 + 0.2 * f64::from(permille) / 1000.0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::stream;

    use super::*;

    type Item = Result<watcher::Event<u32>, watcher::Error>;

    /// A watcher stand-in counting its starts: each start lists `listed` (never finishing the list when
    /// `None`) and then waits forever for events.
    fn starts(listed: Option<u32>) -> (Arc<AtomicUsize>, impl FnMut() -> BoxStream<'static, Item> + Unpin) {
        let count = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&count);
        let start = move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let mut events = vec![Ok(watcher::Event::Init)];
            if let Some(object) = listed {
                events.extend([Ok(watcher::Event::InitApply(object)), Ok(watcher::Event::InitDone)]);
            }
            stream::iter(events).chain(stream::pending()).boxed()
        };
        (count, start)
    }

    async fn next(stream: &mut (impl Stream<Item = Item> + Unpin)) -> watcher::Event<u32> {
        stream.next().await.expect("the stream goes on").expect("no error")
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_lists_again_within_the_interval_after_its_last_list() {
        let (count, start) = starts(Some(7));
        let mut watch = relisting(start, Some(Duration::from_secs(10)));
        assert!(matches!(next(&mut watch).await, watcher::Event::Init));
        for _ in 0..3 {
            assert!(matches!(next(&mut watch).await, watcher::Event::InitApply(7)));
            assert!(matches!(next(&mut watch).await, watcher::Event::InitDone));
            let listed = Instant::now();
            // Nothing before 80% of the interval...
            assert!(tokio::time::timeout(Duration::from_secs(8), watch.next()).await.is_err());
            // ...and a new list by the interval's end, from a new watcher.
            let started = count.load(Ordering::SeqCst);
            let event = tokio::time::timeout(Duration::from_secs(3), watch.next()).await.expect("relisted");
            assert!(matches!(event, Some(Ok(watcher::Event::Init))));
            assert_eq!(count.load(Ordering::SeqCst), started + 1);
            assert!(listed.elapsed() <= Duration::from_secs(10), "relisted after {:?}", listed.elapsed());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_under_way_is_not_started_again_and_no_interval_means_never() {
        let (count, start) = starts(None);
        let mut watch = relisting(start, Some(Duration::from_secs(10)));
        assert!(matches!(next(&mut watch).await, watcher::Event::Init));
        assert!(tokio::time::timeout(Duration::from_secs(60), watch.next()).await.is_err());
        assert_eq!(count.load(Ordering::SeqCst), 1, "a list that has not finished is left to finish");

        let (count, start) = starts(Some(1));
        let mut watch = relisting(start, None);
        for _ in 0..3 {
            next(&mut watch).await;
        }
        assert!(tokio::time::timeout(Duration::from_secs(3600 * 24), watch.next()).await.is_err());
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn jitter_stays_within_the_last_fifth_of_the_interval_and_varies() {
        let every = Duration::from_secs(1800);
        let delays: std::collections::BTreeSet<Duration> = (0..50).map(|_| jittered(every)).collect();
        assert!(delays.iter().all(|d| *d >= every.mul_f64(0.8) && *d <= every), "{delays:?}");
        assert!(delays.len() > 10, "not spread: {delays:?}");
    }
}
