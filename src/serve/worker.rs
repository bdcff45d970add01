//! The scheduler thread: owns the [`Batcher`], takes requests from the HTTP handlers over a
//! channel, and steps the batch while anything waits or runs (blocking on the channel when
//! idle).

use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};

use super::metrics::Metrics;
use crate::llm::{BatchOptions, Batcher, DecoderModel, Engine, Event, FinishReason, Rejected, Request, Sink};
use crate::Error;

/// What the HTTP side asks of the scheduler thread.
pub(crate) enum Command {
    /// Queue a request; the reply says whether it was accepted.
    Submit(Request, oneshot::Sender<Result<(), Rejected>>),
    /// Finish what is queued and running, then stop.
    Drain,
    /// Stop every queued and running request now, with this error.
    Abort(String),
}

/// A request's events, sent to its HTTP handler; closed when the handler (its client) is gone.
pub(crate) struct ChannelSink(pub(crate) mpsc::UnboundedSender<Event>);

impl Sink for ChannelSink {
    fn send(&mut self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Sets its flag when dropped: the scheduler thread holds one, so the flag says the thread
/// has ended, by return or by panic.
pub(crate) struct DoneGuard(pub(crate) std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Runs the scheduler until [`Command::Drain`] (and the batch is empty) or the channel closes.
///
/// # Errors
/// None: the pool's allocation error or its warm-up's goes to `ready` (before any request);
/// a decode step's error is reported to the requests it stopped and the loop goes on.
pub(crate) fn run<M: DecoderModel>(engine: &Engine<M>, opts: BatchOptions, rx: &Receiver<Command>, metrics: &Metrics, ready: std::sync::mpsc::SyncSender<Result<(), Error>>) -> Result<(), Error> {
    // Every bucket compiled and captured before the first request, not in the middle of a
    // served batch; the server starts listening once `ready` says so (or gets the error).
    let mut b = match engine.batcher(opts).and_then(|mut b| b.warm().map(|()| b)) {
        Ok(b) => {
            let _ = ready.send(Ok(()));
            b
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    metrics.kv_pages_total.set(b.pages_total() as i64);
    let mut draining = false;
    let (mut window, mut tokens) = (Instant::now(), 0usize);
    loop {
        if b.is_idle() {
            metrics.tokens_per_second.set(0.0);
            if draining {
                return Ok(());
            }
            match rx.recv() {
                Ok(c) => handle(&mut b, c, &mut draining),
                Err(_) => return Ok(()),
            }
        }
        loop {
            match rx.try_recv() {
                Ok(c) => handle(&mut b, c, &mut draining),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    draining = true;
                    break;
                }
            }
        }
        match b.step() {
            // Cancellations are counted by the HTTP side, which knows a client that left
            // from an answer that ended at a stop string.
            Ok(r) => tokens += r.decoded + r.prefilled,
            Err(e) => log_step_error(&e),
        }
        metrics.queue_length.set(b.queued() as i64);
        metrics.running.set(b.running() as i64);
        metrics.kv_pages_in_use.set(b.pages_in_use() as i64);
        let dt = window.elapsed();
        if dt >= Duration::from_secs(1) {
            metrics.tokens_per_second.set(tokens as f64 / dt.as_secs_f64());
            (window, tokens) = (Instant::now(), 0);
        }
    }
}

fn handle(b: &mut Batcher<'_>, c: Command, draining: &mut bool) {
    match c {
        Command::Submit(req, reply) => {
            // A handler that went away before the reply: its sink is closed, the step drops it.
            let _ = reply.send(b.submit(req));
        }
        Command::Drain => *draining = true,
        Command::Abort(why) => b.cancel_all(FinishReason::Failed(why)),
    }
}

fn log_step_error(e: &Error) {
    eprintln!("sinter serve: a decode step failed (its requests got the error): {e}");
}
