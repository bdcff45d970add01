//! The HTTP routes and the server's lifetime (module documentation of [`super`]).

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State as AxState;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::api::{content_text, fields, parse_body, ApiError, ChatRequest, CompletionRequest, OneOrMany, Prompt, Sampling, Usage};
use super::text::TextStream;
use super::worker::{ChannelSink, Command};
use super::State;
use crate::llm::chat::{ChatTemplate, Message};
use crate::llm::{DecoderModel, Event, FinishReason, Rejected, Request, SampleOptions};
use crate::Error;

type Shared<M> = Arc<State<M>>;

/// Serves until `stop` fires (or a signal, with `signals`), then shuts down gracefully.
pub(super) async fn serve<M: DecoderModel + 'static>(state: Shared<M>, listener: std::net::TcpListener, stop: oneshot::Receiver<()>, signals: bool, worker: JoinHandle<Result<(), Error>>, worker_done: Arc<std::sync::atomic::AtomicBool>) -> Result<(), Error> {
    let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| Error::Unsupported(format!("sinter serve: {e}")))?;
    let app = Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics::<M>))
        .route("/v1/models", get(models::<M>))
        .route("/v1/completions", post(completions::<M>))
        .route("/v1/chat/completions", post(chat::<M>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state.clone());
    let shutting = state.clone();
    // Past the shutdown timeout (and a second for the failed requests' answers), connections
    // still open — a client that never finishes sending its request — are dropped.
    let (deadline_tx, deadline) = oneshot::channel::<()>();
    // A scheduler that ends on its own (it panicked) stops the server: nothing could answer.
    let worker_gone = {
        let done = worker_done.clone();
        async move {
            while !done.load(Ordering::SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    let signal = async move {
        tokio::select! {
            _ = stop => {}
            _ = os_signal(), if signals => {}
            () = worker_gone => {}
        }
        // Refuse new requests; fail the accepted ones still running after the timeout.
        shutting.accepting.store(false, Ordering::SeqCst);
        let (tx, timeout) = (shutting.tx.clone(), shutting.opts.shutdown_timeout);
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let _ = tx.send(Command::Abort("the server is shutting down".into()));
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let _ = deadline_tx.send(());
        });
    };
    let accept = accept_loop(listener, app, &state.opts, signal);
    tokio::select! {
        () = accept => {}
        Ok(()) = deadline => {}
    }
    let _ = state.tx.send(Command::Drain);
    let worker = tokio::task::spawn_blocking(move || worker.join()).await;
    match worker {
        Ok(Ok(r)) => r,
        _ => Err(Error::Unsupported("sinter serve: the scheduler thread panicked".into())),
    }
}

/// Serves connections from `listener` until `signal` completes, then waits for the open ones
/// to finish their requests: hyper's HTTP/1 connection per socket with the options' header
/// read timeout (axum's `serve` sets no timer, so it has none), at most `max_connections` at
/// once (a permit taken before each accept), `TCP_NODELAY` for the streamed tokens.
async fn accept_loop(listener: tokio::net::TcpListener, app: Router, opts: &super::ServeOptions, signal: impl std::future::Future<Output = ()>) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(opts.max_connections.max(1)));
    let header_timeout = opts.header_read_timeout;
    tokio::pin!(signal);
    loop {
        let permit = tokio::select! {
            () = &mut signal => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = &mut signal => break,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                // Out of file descriptors and the like: wait a little rather than spin.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = hyper::server::conn::http1::Builder::new().timer(TokioTimer::new()).header_read_timeout(header_timeout).serve_connection(TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

async fn os_signal() {
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term => {}
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

async fn not_found(uri: axum::http::Uri) -> Response {
    ApiError { status: StatusCode::NOT_FOUND, kind: "not_found_error", ..ApiError::invalid(format!("no route `{}`: sinter serve answers /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics", uri.path()), None) }.with_code("not_found").into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    ApiError { status: StatusCode::METHOD_NOT_ALLOWED, ..ApiError::invalid(format!("`{method}` is not allowed on `{}`", uri.path()), None) }.with_code("method_not_allowed").into_response()
}

/// A request body axum could not read (too large, cut off) as an OpenAI-style error.
fn body_of(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| ApiError { status: e.status(), ..ApiError::invalid(e.body_text(), None) })
}

/// `text` tokenized off the async workers (a long prompt takes a while).
async fn tokenize<M: DecoderModel + 'static>(s: &Shared<M>, text: String, param: &'static str) -> Result<Vec<u32>, ApiError> {
    let st = s.clone();
    tokio::task::spawn_blocking(move || st.engine.model().tokenizer().encode(&text))
        .await
        .map_err(|_| ApiError::server("the tokenizer stopped"))?
        .map_err(|e| ApiError::invalid(format!("cannot tokenize the {param}: {e}"), Some(param)))
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

async fn metrics<M: DecoderModel>(AxState(s): AxState<Shared<M>>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.render()).into_response()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn models<M: DecoderModel>(AxState(s): AxState<Shared<M>>) -> Json<Value> {
    Json(json!({ "object": "list", "data": [{ "id": s.opts.model_name, "object": "model", "created": now(), "owned_by": "sinter" }] }))
}

/// Which endpoint a request came to (the response shapes differ).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

async fn completions<M: DecoderModel + 'static>(AxState(s): AxState<Shared<M>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    let r = async {
        let body = parse_body(&body_of(body)?)?;
        let (req, sampling): (CompletionRequest, Sampling) = (fields(&body)?, fields(&body)?);
        check_model(&s, &req.model)?;
        let ids = match req.prompt {
            Prompt::Text(t) => tokenize(&s, t, "prompt").await?,
            Prompt::Tokens(ids) => ids,
            Prompt::Texts(mut v) if v.len() == 1 => tokenize(&s, v.remove(0), "prompt").await?,
            Prompt::TokenLists(v) if v.len() == 1 => v[0].clone(),
            _ => return Err(ApiError::invalid("one prompt per request is served", Some("prompt"))),
        };
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= s.engine.model().vocab()) {
            return Err(ApiError::invalid(format!("token id {bad} is not in the model's {}-token vocabulary", s.engine.model().vocab()), Some("prompt")));
        }
        generate(&s, ids, sampling, Kind::Completion, arrived).await
    };
    r.await.unwrap_or_else(|e| reject(&s, e))
}

async fn chat<M: DecoderModel + 'static>(AxState(s): AxState<Shared<M>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    let r = async {
        let body = parse_body(&body_of(body)?)?;
        let (req, sampling): (ChatRequest, Sampling) = (fields(&body)?, fields(&body)?);
        check_model(&s, &req.model)?;
        if req.messages.is_empty() {
            return Err(ApiError::invalid("messages must not be empty", Some("messages")));
        }
        let messages = req.messages.iter().enumerate().map(|(i, m)| Ok(Message { role: m.role.clone(), content: content_text(&m.content, i)? })).collect::<Result<Vec<_>, ApiError>>()?;
        let model = s.engine.model();
        let plain = ChatTemplate::default();
        let text = model.chat_template().unwrap_or(&plain).render(&messages).map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
        let ids = tokenize(&s, text, "messages").await?;
        generate(&s, ids, sampling, Kind::Chat, arrived).await
    };
    r.await.unwrap_or_else(|e| reject(&s, e))
}

fn reject<M: DecoderModel>(s: &State<M>, e: ApiError) -> Response {
    s.metrics.rejected.inc();
    e.into_response()
}

fn check_model<M: DecoderModel>(s: &State<M>, model: &str) -> Result<(), ApiError> {
    if model == s.opts.model_name {
        return Ok(());
    }
    Err(ApiError { status: StatusCode::NOT_FOUND, ..ApiError::invalid(format!("the model `{model}` does not exist; this server serves `{}`", s.opts.model_name), Some("model")) }.with_code("model_not_found"))
}

/// The sampling options of a request for a prompt of `prompt` tokens.
fn options<M: DecoderModel>(s: &State<M>, p: &Sampling, kind: Kind, prompt: usize) -> Result<(SampleOptions, Vec<String>), ApiError> {
    if p.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n = 1 is served", Some("n")));
    }
    if let Some(field) = p.unsupported() {
        return Err(ApiError::invalid(format!("`{field}` is not supported by sinter serve"), Some(field)));
    }
    let context = s.engine.model().context();
    let room = context.saturating_sub(prompt);
    let max_new = match p.max_tokens.or(p.max_completion_tokens) {
        Some(n) => n,
        None if kind == Kind::Completion => 16,
        // The rest of the context and of the KV pool, whichever is less.
        None => s.opts.default_max_tokens.min(room).min(s.opts.batch.kv_tokens.saturating_sub(prompt)).max(1),
    };
    if prompt.saturating_add(max_new) > context || room == 0 {
        let msg = format!("this model's context holds {context} tokens; the prompt has {prompt} and {max_new} more were asked for");
        return Err(ApiError::invalid(msg, Some(if kind == Kind::Chat { "messages" } else { "prompt" })).with_code("context_length_exceeded"));
    }
    let stops = p.stop.clone().map(OneOrMany::into_vec).unwrap_or_default();
    if stops.len() > 4 || stops.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop takes at most 4 strings, none empty", Some("stop")));
    }
    let o = SampleOptions { max_new, temperature: p.temperature.unwrap_or(1.0), top_p: p.top_p.unwrap_or(1.0), seed: p.seed.unwrap_or_else(rand::random), stop_at_eos: true };
    o.validate().map_err(|e| ApiError::invalid(e.to_string(), Some(if o.temperature.is_finite() && o.temperature >= 0.0 { "top_p" } else { "temperature" })))?;
    Ok((o, stops))
}

/// Submits a request and answers it (JSON or a stream).
async fn generate<M: DecoderModel + 'static>(s: &Shared<M>, ids: Vec<u32>, p: Sampling, kind: Kind, arrived: Instant) -> Result<Response, ApiError> {
    if !s.accepting.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let (o, stops) = options(s, &p, kind, ids.len())?;
    let prompt_tokens = ids.len();
    let (tx, rx) = mpsc::unbounded_channel();
    let (reply_tx, reply_rx) = oneshot::channel();
    let req = Request { prompt: ids, options: o, sink: Box::new(ChannelSink(tx)) };
    s.tx.send(Command::Submit(req, reply_tx)).map_err(|_| ApiError::unavailable("the server is shutting down"))?;
    match reply_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(r)) => return Err(rejected(r, kind)),
        Err(_) => return Err(ApiError::unavailable("the server is shutting down")),
    }
    s.metrics.requests.inc();
    s.metrics.prompt_tokens.inc_by(prompt_tokens as u64);
    let id = format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, s.next_id.fetch_add(1, Ordering::Relaxed));
    let run = Run { state: s.clone(), id, kind, prompt_tokens, text: TextStream::new(stops, s.engine.model().eos_tokens()), arrived, last: None, generated: 0, ended: false };
    if p.stream {
        let usage = p.stream_options.is_some_and(|o| o.include_usage);
        Ok(stream(run, rx, usage))
    } else {
        whole(run, rx).await
    }
}

fn rejected(r: Rejected, kind: Kind) -> ApiError {
    let param = if kind == Kind::Chat { "messages" } else { "prompt" };
    match r {
        Rejected::QueueFull(_) => ApiError::unavailable(r.to_string()),
        Rejected::ContextOverflow { .. } | Rejected::ExceedsPool { .. } => ApiError::invalid(r.to_string(), Some(param)).with_code("context_length_exceeded"),
        Rejected::EmptyPrompt | Rejected::TokenOutOfRange { .. } => ApiError::invalid(r.to_string(), Some(param)),
        Rejected::Options(_) => ApiError::invalid(r.to_string(), None),
    }
}

/// One accepted request's progress.
struct Run<M: DecoderModel> {
    state: Shared<M>,
    id: String,
    kind: Kind,
    prompt_tokens: usize,
    text: TextStream,
    arrived: Instant,
    last: Option<Instant>,
    generated: usize,
    /// The answer ended (finished, stopped, failed); a run dropped before it was cancelled by
    /// its client's leaving.
    ended: bool,
}

impl<M: DecoderModel> Drop for Run<M> {
    fn drop(&mut self) {
        if !self.ended {
            self.state.metrics.cancelled.inc();
        }
    }
}

/// What a token or the end gives the response.
enum Step {
    Text(String),
    Done(&'static str, String),
    Failed(String),
}

/// The model's detokenizer, as [`TextStream`] takes it.
fn detokenizer<M: DecoderModel>(s: &Shared<M>) -> impl Fn(&[u32]) -> Result<String, String> {
    let s = s.clone();
    move |ids| s.engine.model().tokenizer().decode(ids).map_err(|e| e.to_string())
}

impl<M: DecoderModel> Run<M> {
    /// Takes one event: the text to send, or the end.
    fn on(&mut self, e: Event) -> Step {
        let step = self.step(e);
        self.ended |= !matches!(step, Step::Text(_));
        step
    }

    fn step(&mut self, e: Event) -> Step {
        match e {
            Event::Token(t) => {
                let now = Instant::now();
                let m = &self.state.metrics;
                match self.last {
                    None => m.time_to_first_token.observe((now - self.arrived).as_secs_f64()),
                    Some(l) => m.inter_token_latency.observe((now - l).as_secs_f64()),
                }
                m.generated_tokens.inc();
                self.last = Some(now);
                self.generated += 1;
                let decode = detokenizer(&self.state);
                let r = self.text.push(t, &decode);
                match r {
                    Ok(d) if self.text.stopped() => Step::Done("stop", d),
                    Ok(d) => Step::Text(d),
                    Err(e) => Step::Failed(format!("cannot detokenize: {e}")),
                }
            }
            Event::Finished(r) => {
                let decode = detokenizer(&self.state);
                let rest = self.text.finish(&decode);
                match (r, rest) {
                    (FinishReason::Eos, Ok(d)) => Step::Done("stop", d),
                    (FinishReason::Length, Ok(d)) => Step::Done("length", d),
                    (FinishReason::Failed(e), _) => Step::Failed(e),
                    (FinishReason::Cancelled, _) => Step::Failed("the request was cancelled".into()),
                    (_, Err(e)) => Step::Failed(format!("cannot detokenize: {e}")),
                }
            }
        }
    }

    fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.generated)
    }

    /// A streamed chunk with `text` (and `finish`, on the last one).
    fn chunk(&self, text: &str, finish: Option<&str>, first: bool) -> Value {
        let (object, choice) = match self.kind {
            Kind::Completion => ("text_completion", json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": finish })),
            Kind::Chat => {
                let delta = match (first, finish) {
                    (true, _) => json!({ "role": "assistant", "content": text }),
                    (false, Some(_)) if text.is_empty() => json!({}),
                    _ => json!({ "content": text }),
                };
                ("chat.completion.chunk", json!({ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }))
            }
        };
        json!({ "id": self.id, "object": object, "created": now(), "model": self.state.opts.model_name, "choices": [choice] })
    }
}

/// The whole answer as one JSON body.
async fn whole<M: DecoderModel>(mut run: Run<M>, mut rx: mpsc::UnboundedReceiver<Event>) -> Result<Response, ApiError> {
    let mut text = String::new();
    let finish = loop {
        let Some(e) = rx.recv().await else {
            run.ended = true;
            return Err(ApiError::server("the scheduler stopped"));
        };
        match run.on(e) {
            Step::Text(d) => text.push_str(&d),
            Step::Done(f, d) => {
                text.push_str(&d);
                break f;
            }
            Step::Failed(e) => return Err(ApiError::server(e)),
        }
    };
    // Dropping `rx` cancels a request stopped by a stop string.
    drop(rx);
    let choice = match run.kind {
        Kind::Completion => json!({ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }),
        Kind::Chat => json!({ "index": 0, "message": { "role": "assistant", "content": text }, "logprobs": null, "finish_reason": finish }),
    };
    let object = if run.kind == Kind::Chat { "chat.completion" } else { "text_completion" };
    let usage = run.usage();
    Ok(Json(json!({ "id": run.id, "object": object, "created": now(), "model": run.state.opts.model_name, "choices": [choice], "usage": usage })).into_response())
}

/// The answer as server-sent events: a chunk per text delta, the finish reason on the last,
/// then (`usage`) a chunk with the counts, then `[DONE]`; an error event ends a failed request.
fn stream<M: DecoderModel + 'static>(mut run: Run<M>, mut rx: mpsc::UnboundedReceiver<Event>, usage: bool) -> Response {
    let (out, body) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
    tokio::spawn(async move {
        let send = |v: Value| out.send(Ok(SseEvent::default().data(v.to_string()))).is_ok();
        let mut first = true;
        loop {
            // A client that goes away is noticed at once, even while the request waits.
            let step = tokio::select! {
                e = rx.recv() => match e {
                    Some(e) => run.on(e),
                    None => {
                        run.ended = true;
                        Step::Failed("the scheduler stopped".into())
                    }
                },
                () = out.closed() => return,
            };
            let alive = match &step {
                Step::Text(d) if d.is_empty() && !(first && run.kind == Kind::Chat) => true,
                Step::Text(d) => send(run.chunk(d, None, first)),
                Step::Done(f, d) => send(run.chunk(d, Some(f), first)),
                Step::Failed(e) => send(ApiError::server(e.clone()).body()),
            };
            first = false;
            if !alive {
                // The client went away: dropping `rx` cancels the request.
                return;
            }
            match step {
                Step::Text(_) => continue,
                Step::Done(..) => break,
                Step::Failed(_) => return,
            }
        }
        drop(rx);
        if usage {
            let mut v = run.chunk("", None, false);
            v["choices"] = json!([]);
            v["usage"] = json!(run.usage());
            send(v);
        }
        let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(UnboundedReceiverStream::new(body)).keep_alive(KeepAlive::default()).into_response()
}
