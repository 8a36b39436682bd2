//! Scratch: the smallest hyper reverse proxy shaped like weft-proxy (current-thread runtime,
//! own HTTP/1.1 upstream pool returning connections at end of body). Usage: min-proxy LISTEN UPSTREAM
use bytes::Bytes;
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

type Pool = Rc<RefCell<Vec<SendRequest<Incoming>>>>;

struct RespBody {
    inner: Incoming,
    back: Option<(SendRequest<Incoming>, Pool)>,
}

impl Body for RespBody {
    type Data = Bytes;
    type Error = hyper::Error;
    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if (matches!(r, Poll::Ready(None)) || self.inner.is_end_stream())
            && let Some((s, p)) = self.back.take()
        {
            p.borrow_mut().push(s);
        }
        r
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = args[1].parse().unwrap();
    let upstream: SocketAddr = args[2].parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let l = tokio::net::TcpListener::bind(listen).await.unwrap();
        let pool: Pool = Rc::default();
        loop {
            let (s, _) = l.accept().await.unwrap();
            let _ = s.set_nodelay(true);
            let pool = pool.clone();
            tokio::task::spawn_local(async move {
                let svc = service_fn(move |req: hyper::Request<Incoming>| {
                    let pool = pool.clone();
                    async move {
                        let popped = pool.borrow_mut().pop();
                        let mut sender = match popped {
                            Some(s) => s,
                            None => {
                                let up = tokio::net::TcpStream::connect(upstream).await.unwrap();
                                let _ = up.set_nodelay(true);
                                let (s, conn) = hyper::client::conn::http1::handshake(TokioIo::new(up)).await.unwrap();
                                tokio::task::spawn_local(conn);
                                s
                            }
                        };
                        sender.ready().await?;
                        let resp = sender.send_request(req).await?;
                        let (parts, body) = resp.into_parts();
                        Ok::<_, hyper::Error>(hyper::Response::from_parts(parts, RespBody { inner: body, back: Some((sender, pool)) }))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(s), svc).await;
            });
        }
    });
}
