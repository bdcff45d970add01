//! `sinter serve`: an OpenAI-compatible HTTP server over the engine's continuous batching.
//!
//! Endpoints: `POST /v1/completions` and `POST /v1/chat/completions` (JSON, or server-sent
//! events with `"stream": true`), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus
//! text format). Request fields: `model`, `prompt` / `messages`, `max_tokens`
//! (`max_completion_tokens`), `temperature` (default 1; 0 is greedy), `top_p`, `seed`,
//! `stop` (up to 4 strings), `stream`, `stream_options.include_usage`; responses carry
//! `usage`. Fields asking for what is not served (`logprobs`, `echo`, `best_of`, `suffix`,
//! penalties, `logit_bias`, `n` > 1) are refused with a 400 naming them; others are ignored.
//! Errors are OpenAI's error body with a 4xx status: a bad field (named in `param`), an
//! unknown model (404, `model_not_found`), a prompt past the context (400,
//! `context_length_exceeded`), a full queue or a server shutting down (503, `Retry-After`).
//!
//! **Connections.** `axum` routes on hyper's HTTP/1 connections, at most
//! [`ServeOptions::max_connections`] at once (the listener waits for a free slot), each closed
//! when a request's headers take longer than [`ServeOptions::header_read_timeout`].
//!
//! **Threads.** A tokio runtime serves HTTP (`axum`); one scheduler thread owns the
//! [`crate::llm::Batcher`] and steps the batch ([`worker`]). A handler tokenizes, submits its
//! request over a channel and reads its tokens from another; a client that disconnects drops
//! that channel, and the scheduler cancels the request and frees its KV pages before the next
//! step.
//!
//! **Shutdown** (SIGINT/SIGTERM, or [`Server::shutdown`]): the port stops accepting
//! connections, and a request on a connection already open gets 503; accepted ones run to the
//! end; any still running after [`ServeOptions::shutdown_timeout`] end with an explicit error (a
//! 500 body, or an error event on a stream); a second later the server stops, dropping any
//! connection still open (a client that never finished sending its request). [`Server::start`]
//! returns only once the KV pool is allocated and the batch buckets warmed (their errors are
//! its), and a scheduler thread that ends on its own stops the server with its error.

mod api;
mod metrics;
mod routes;
mod text;
mod worker;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;

pub use api::{ApiError, Usage};
pub use metrics::Metrics;
pub use text::TextStream;

use crate::llm::{BatchOptions, DecoderModel, Engine};
use crate::Error;
use worker::Command;

/// How [`Server::start`] serves.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model's id in requests and `GET /v1/models`.
    pub model_name: String,
    /// Batching limits (batch size, KV pool, queue).
    pub batch: BatchOptions,
    /// `max_tokens` of a chat request that gives none (at most the context's rest); a
    /// completion request's default is 16, as OpenAI's.
    pub default_max_tokens: usize,
    /// How long a shutdown waits for accepted requests before failing them.
    pub shutdown_timeout: Duration,
    /// How long a connection may take to send a request's headers (the first request's from
    /// the connection's start, later ones' from the previous response) before it is closed:
    /// idle or stalled connections cannot pile up.
    pub header_read_timeout: Duration,
    /// Connections served at once; the listener accepts no more until one closes (later
    /// clients wait in the kernel's backlog), so that open sockets stay bounded.
    pub max_connections: usize,
}

impl ServeOptions {
    /// Defaults for serving `model_name`.
    pub fn new(model_name: impl Into<String>) -> ServeOptions {
        ServeOptions {
            model_name: model_name.into(),
            batch: BatchOptions::default(),
            default_max_tokens: 512,
            shutdown_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
        }
    }
}

/// What every handler shares.
struct State<M: DecoderModel> {
    engine: Arc<Engine<M>>,
    tx: mpsc::Sender<Command>,
    metrics: Arc<Metrics>,
    opts: ServeOptions,
    accepting: AtomicBool,
    next_id: AtomicU64,
}

/// A running server: its address, and the means to stop it.
pub struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), Error>>>,
    metrics: Arc<Metrics>,
}

impl Server {
    /// Binds `addr` (port 0 picks a free one), starts the scheduler thread and the HTTP server,
    /// and returns at once. With `signals`, SIGINT and SIGTERM shut it down too.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the address cannot be bound or the runtime cannot start.
    pub fn start<M: DecoderModel + 'static>(engine: Engine<M>, addr: SocketAddr, opts: ServeOptions, signals: bool) -> Result<Server, Error> {
        let io = |what: &str, e: std::io::Error| Error::Unsupported(format!("sinter serve: {what}: {e}"));
        let listener = std::net::TcpListener::bind(addr).map_err(|e| io(&format!("cannot listen on {addr}"), e))?;
        listener.set_nonblocking(true).map_err(|e| io("cannot set the socket non-blocking", e))?;
        let addr = listener.local_addr().map_err(|e| io("no local address", e))?;
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().thread_name("sinter-http").build().map_err(|e| io("cannot start the async runtime", e))?;
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::new());
        let engine = Arc::new(engine);
        let batch = opts.batch;
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        // Set when the scheduler thread ends, by return or by panic (the guard's drop).
        let worker_done = Arc::new(AtomicBool::new(false));
        let worker = {
            let (engine, metrics) = (engine.clone(), metrics.clone());
            let done = worker::DoneGuard(worker_done.clone());
            std::thread::Builder::new()
                .name("sinter-batcher".into())
                .spawn(move || {
                    let _done = done;
                    worker::run(&*engine, batch, &rx, &metrics, ready_tx)
                })
                .map_err(|e| io("cannot start the scheduler thread", e))?
        };
        // The KV pool allocated and the buckets warmed before the port answers: an error there
        // (a pool larger than memory) ends `start`, not a server that cannot serve.
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                let _ = worker.join();
                return Err(e);
            }
            Err(_) => {
                let _ = worker.join();
                return Err(Error::Unsupported("sinter serve: the scheduler thread panicked while allocating the KV pool".into()));
            }
        }
        let state = Arc::new(State { engine, tx, metrics: metrics.clone(), opts, accepting: AtomicBool::new(true), next_id: AtomicU64::new(1) });
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sinter-serve".into())
            .spawn(move || runtime.block_on(routes::serve(state, listener, stop_rx, signals, worker, worker_done)))
            .map_err(|e| io("cannot start the server thread", e))?;
        Ok(Server { addr, stop: Some(stop_tx), thread: Some(thread), metrics })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's metrics (what `GET /metrics` renders).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Shuts the server down gracefully (module documentation) and waits for it.
    ///
    /// # Errors
    /// The server's or the scheduler's error.
    pub fn shutdown(mut self) -> Result<(), Error> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.join()
    }

    /// Waits until the server stops (after a signal, with `signals`).
    ///
    /// # Errors
    /// The server's or the scheduler's error.
    pub fn wait(mut self) -> Result<(), Error> {
        self.join()
    }

    fn join(&mut self) -> Result<(), Error> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(Error::Unsupported("sinter serve: the server thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = self.join();
    }
}
