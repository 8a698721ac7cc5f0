//! Polling a request's future and its connection together, in the calling task.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use hyper::client::conn::http1::Connection;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::body::ReqBody;

/// Polls a request's future and its connection in one task until the request is
/// answered. The two wake each other at every step (request queued, bytes read); such a
/// wake, while this future is being polled, polls again at once instead of going
/// through the scheduler, which on a multi-thread runtime wakes another worker thread
/// to steal the task.
pub(super) struct Together<'a, W> {
    pub(super) work: Pin<&'a mut W>,
    pub(super) conn: &'a mut Connection<TokioIo<TcpStream>, ReqBody>,
    /// The connection future completed (closed or failed).
    pub(super) ended: bool,
    pub(super) wakes: (Arc<WakeFlag>, Waker),
}

/// A waker that notes wakes arriving while its task is being polled here, and passes
/// the others on to the task.
#[derive(Default)]
pub(super) struct WakeFlag {
    polling: std::sync::atomic::AtomicBool,
    woken: std::sync::atomic::AtomicBool,
    task: Mutex<Option<Waker>>,
}

impl WakeFlag {
    /// A flag and the waker that sets it (made once per exchange, not per poll).
    pub(super) fn new() -> (Arc<Self>, Waker) {
        let flag = Arc::new(Self::default());
        let waker = Waker::from(Arc::clone(&flag));
        (flag, waker)
    }
}

impl std::task::Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        use std::sync::atomic::Ordering::SeqCst;
        self.woken.store(true, SeqCst);
        if !self.polling.load(SeqCst) {
            if let Some(w) = self.task.lock().ok().and_then(|t| t.clone()) {
                w.wake();
            }
        }
    }
}

impl<T, W: Future<Output = T>> Future for Together<'_, W> {
    /// The request's outcome, and whether the connection ended meanwhile.
    type Output = (T, bool);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        use std::sync::atomic::Ordering::SeqCst;
        let this = &mut *self;
        let (wakes, waker) = &this.wakes;
        if let Ok(mut task) = wakes.task.lock() {
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let mut inner = Context::from_waker(waker);
        // Bounded: a pair that keeps waking each other yields to the scheduler.
        for _ in 0..64 {
            wakes.woken.store(false, SeqCst);
            wakes.polling.store(true, SeqCst);
            if !this.ended && Pin::new(&mut *this.conn).poll(&mut inner).is_ready() {
                // The request future fails next, with what happened.
                this.ended = true;
            }
            let answer = this.work.as_mut().poll(&mut inner);
            wakes.polling.store(false, SeqCst);
            if let Poll::Ready(a) = answer {
                return Poll::Ready((a, this.ended));
            }
            if !wakes.woken.load(SeqCst) {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
