//! Takes a TLS hook server's close without `close_notify` as the end of its answer, as Go's HTTP client
//! (and so Metacontroller) does.
//!
//! A hook that answers HTTP/1.0 without `Content-Length` ends its body by closing the connection —
//! Python's `http.server` behind `ssl.wrap_socket`, Metacontroller's own `webhook-auth` example, closes
//! the socket without TLS's `close_notify`. rustls reports that as an error ("peer closed connection
//! without sending TLS `close_notify`"), hyper gives up on the body, and the hook can never be read.
//! rustls leaves the choice to the application because a missing `close_notify` lets an attacker cut
//! a stream short; that matters only where the end of the stream is the only sign of the end of the
//! data. Here it costs nothing: a body with a length or chunks still has its truncation caught by
//! hyper (it wants more bytes than came), and a body read to the close must parse as one whole JSON
//! document before anything is written — a cut answer is refused, never half-applied.
//!
//! hyper-rustls offers no setting for this, so the connector's streams are wrapped here: an
//! `UnexpectedEof` from the TLS layer reads as the end of the stream. Plain TCP streams are untouched.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use hyper::rt;
use hyper_rustls::MaybeHttpsStream;
use hyper_util::client::legacy::connect::{Connected, Connection};

/// A connector whose TLS streams end at the peer's close, `close_notify` or not.
#[derive(Clone, Debug)]
pub struct ClosedIsEnd<C>(pub C);

/// A stream of [`ClosedIsEnd`].
#[derive(Debug)]
pub struct Stream<T>(MaybeHttpsStream<T>);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<C, T> tower_service::Service<Uri> for ClosedIsEnd<C>
where
    C: tower_service::Service<Uri, Response = MaybeHttpsStream<T>>,
    C::Error: Into<BoxError>,
    C::Future: Send + 'static,
    T: Send + 'static,
{
    type Response = Stream<T>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Stream<T>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move { connecting.await.map(Stream).map_err(Into::into) })
    }
}

impl<T: rt::Read + rt::Write + Unpin> rt::Read for Stream<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: rt::ReadBufCursor<'_>) -> Poll<io::Result<()>> {
        let inner = &mut self.get_mut().0;
        let tls = matches!(inner, MaybeHttpsStream::Https(_));
        match Pin::new(inner).poll_read(cx, buf) {
            // Nothing was read into `buf`: to hyper this is the end of the stream.
            Poll::Ready(Err(e)) if tls && e.kind() == io::ErrorKind::UnexpectedEof => Poll::Ready(Ok(())),
            other => other,
        }
    }
}

impl<T: rt::Read + rt::Write + Unpin> rt::Write for Stream<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }
}

impl<T: rt::Read + rt::Write + Connection + Unpin> Connection for Stream<T> {
    fn connected(&self) -> Connected {
        self.0.connected()
    }
}
