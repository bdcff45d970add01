//! Continuous batching and `sinter serve` on the interpreter, with the tiny GPT-2 of
//! [`super::decoder`] (4-token pages, a 32-token context, word tokens `t0..t63`).
//!
//! - The [`Batcher`]: requests submitted at staggered steps into a batch of 3 and a pool too
//!   small for all of them at once produce exactly the tokens each produces alone (greedy and
//!   seeded), a request whose client goes away is dropped and its pages freed, the pool is
//!   empty at the end; each kind of refusal.
//! - The server, driven by the `openai` Python package (the real client, installed by
//!   `scripts/setup` into `$SINTER_CACHE/py`): completions and chat, streaming and not, stop
//!   strings, seeds, usage, errors (unknown model, bad fields, context overflow), then 64
//!   concurrent streaming clients, every eighth disconnecting mid-stream — each other answer
//!   equal to the request alone, no request hanging, no KV page held at the end.
//! - Graceful shutdown: a request running when shutdown starts gets its whole answer; the
//!   port is closed afterwards.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sinter::llm::chat::{ChatTemplate, Message};
use sinter::llm::{BatchOptions, DecoderModel, Engine, Event, FinishReason, Gpt2Model, Rejected, Request, SampleOptions, Sink};
use sinter::serve::{ServeOptions, Server};
use sinter::zoo::gpt2::Gpt2Config;

use super::decoder::{cfg, load, scratch, write_gpt2_folder};

fn engine(tag: &str) -> Engine<Gpt2Model> {
    let dir = scratch(tag);
    write_gpt2_folder(&dir, &cfg(), 11);
    Engine::new(load(&dir)).unwrap()
}

/// A sink that records events and closes after `close_after` tokens (if set).
#[derive(Clone, Default)]
struct Record {
    events: Arc<Mutex<Vec<Event>>>,
    close_after: Option<usize>,
}

impl Record {
    fn tokens(&self) -> Vec<u32> {
        self.events.lock().unwrap().iter().filter_map(|e| if let Event::Token(t) = e { Some(*t) } else { None }).collect()
    }
    fn finish(&self) -> Option<FinishReason> {
        self.events.lock().unwrap().iter().find_map(|e| if let Event::Finished(r) = e { Some(r.clone()) } else { None })
    }
}

impl Sink for Record {
    fn send(&mut self, e: Event) -> bool {
        let mut ev = self.events.lock().unwrap();
        ev.push(e);
        self.close_after.is_none_or(|n| ev.iter().filter(|e| matches!(e, Event::Token(_))).count() < n)
    }
    fn is_closed(&self) -> bool {
        self.close_after.is_some_and(|n| self.tokens().len() >= n)
    }
}

fn prompt(i: usize, n: usize) -> Vec<u32> {
    (0..n).map(|k| ((i * 7 + k * 3 + 5) % 60) as u32 + 3).collect()
}

#[test]
fn continuous_batching_gives_each_request_the_tokens_it_gets_alone() {
    let e = engine("batching");
    let opts = |i: usize| if i % 3 == 2 { SampleOptions::seeded(6 + i % 4, 0.8, 0.9, i as u64) } else { SampleOptions::greedy(6 + i % 4) };
    let prompts: Vec<Vec<u32>> = (0..7).map(|i| prompt(i, 2 + i % 5)).collect();
    let alone: Vec<Vec<u32>> = prompts.iter().enumerate().map(|(i, p)| e.generate(std::slice::from_ref(p), &opts(i), &mut |_, _| {}).unwrap().tokens.remove(0)).collect();
    // Room for 3 sequences of at most 16 tokens: later requests wait for pages.
    let mut b = e.batcher(BatchOptions { max_batch: 3, kv_tokens: 48, max_queue: 16, prefill_tokens_per_step: 8 }).unwrap();
    let sinks: Vec<Record> = (0..8).map(|i| Record { close_after: (i == 7).then_some(2), ..Record::default() }).collect();
    let mut submitted = 0;
    let mut steps = 0;
    let mut peak = 0;
    while submitted < 8 || !b.is_idle() {
        // One request every other step: they join a batch already decoding.
        if submitted < 8 && steps % 2 == 0 {
            let (p, o) = if submitted == 7 { (prompt(9, 3), SampleOptions::greedy(12)) } else { (prompts[submitted].clone(), opts(submitted)) };
            b.submit(Request { prompt: p, options: o, sink: Box::new(sinks[submitted].clone()) }).unwrap();
            submitted += 1;
        }
        b.step().unwrap();
        peak = peak.max(b.running());
        steps += 1;
        assert!(steps < 500, "the batch never drained");
    }
    assert_eq!(peak, 3, "the batch filled up");
    for (i, want) in alone.iter().enumerate() {
        assert_eq!(&sinks[i].tokens(), want, "request {i}: tokens differ from the request alone");
        let eos = want.last().is_some_and(|t| e.model().eos_tokens().contains(t));
        assert_eq!(sinks[i].finish(), Some(if eos { FinishReason::Eos } else { FinishReason::Length }), "request {i}");
    }
    assert_eq!(sinks[7].tokens().len(), 2, "the cancelled request stopped after its client left");
    assert_eq!(sinks[7].finish(), Some(FinishReason::Cancelled));
    assert_eq!(b.pages_in_use(), 0, "every page is back in the pool");
}

#[test]
fn the_batcher_refuses_what_it_cannot_serve() {
    let e = engine("refusals");
    let mut b = e.batcher(BatchOptions { max_batch: 2, kv_tokens: 16, max_queue: 1, prefill_tokens_per_step: 64 }).unwrap();
    let req = |p: Vec<u32>, n: usize| Request { prompt: p, options: SampleOptions::greedy(n), sink: Box::new(Record::default()) };
    assert_eq!(b.submit(req(vec![], 4)).unwrap_err(), Rejected::EmptyPrompt);
    assert_eq!(b.submit(req(prompt(0, 30), 4)).unwrap_err(), Rejected::ContextOverflow { tokens: 30, max_new: 4, context: 32 });
    assert_eq!(b.submit(req(prompt(0, 10), 10)).unwrap_err(), Rejected::ExceedsPool { needed: 20, pool: 16 });
    let bad = Request { prompt: prompt(0, 2), options: SampleOptions::seeded(2, f64::NAN, 1.0, 0), sink: Box::new(Record::default()) };
    assert!(matches!(b.submit(bad), Err(Rejected::Options(m)) if m.contains("temperature")));
    // At idle the batch's two free places and the queue's one take three requests.
    for i in 0..3 {
        b.submit(req(prompt(i, 2), 4)).unwrap();
    }
    assert_eq!(b.submit(req(prompt(3, 2), 2)).unwrap_err(), Rejected::QueueFull(3));
    b.step().unwrap();
    // Two running, one waiting: the queue is full.
    assert_eq!(b.submit(req(prompt(4, 2), 2)).unwrap_err(), Rejected::QueueFull(1));
    while !b.is_idle() {
        b.step().unwrap();
    }
    assert_eq!(b.pages_in_use(), 0);
}

/// On the GPU (skipped without one): continuous batching at buckets 1, 2 and 4, with CUDA
/// graphs and without, gives each request the interpreter's tokens for it alone.
#[test]
fn gpu_continuous_batching_gives_the_interpreters_tokens() {
    let Some(dev) = crate::gpu::device() else { return };
    let dir = scratch("batching-gpu");
    write_gpt2_folder(&dir, &cfg(), 11);
    let cpu = Engine::new(load(&dir)).unwrap();
    let mut gpu = Engine::new_gpu(load(&dir), &dev, sinter::gpu::Lowering::Fused).unwrap();
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| prompt(i, 2 + i % 5)).collect();
    let o = |i: usize| SampleOptions { stop_at_eos: false, ..SampleOptions::greedy(5 + i % 4) };
    let alone: Vec<Vec<u32>> = prompts.iter().enumerate().map(|(i, p)| cpu.generate(std::slice::from_ref(p), &o(i), &mut |_, _| {}).unwrap().tokens.remove(0)).collect();
    for graphs in [false, true] {
        gpu.set_cuda_graph(graphs);
        let mut b = gpu.batcher(BatchOptions { max_batch: 4, kv_tokens: 96, max_queue: 16, prefill_tokens_per_step: 16 }).unwrap();
        if graphs {
            // Every bucket captured before the first request, as the server does.
            b.warm().unwrap();
        }
        let sinks: Vec<Record> = (0..6).map(|_| Record::default()).collect();
        let (mut submitted, mut steps) = (0, 0);
        while submitted < 6 || !b.is_idle() {
            if submitted < 6 && steps % 2 == 0 {
                b.submit(Request { prompt: prompts[submitted].clone(), options: o(submitted), sink: Box::new(sinks[submitted].clone()) }).unwrap();
                submitted += 1;
            }
            b.step().unwrap();
            steps += 1;
            assert!(steps < 500, "the batch never drained");
        }
        for (i, want) in alone.iter().enumerate() {
            assert_eq!(&sinks[i].tokens(), want, "request {i} (CUDA graphs {graphs}): tokens differ from the interpreter's alone");
        }
        assert_eq!(b.pages_in_use(), 0);
    }
}

/// The text the server should answer for `tokens` (the model's generation): EOS not shown.
fn text_of(e: &Engine<Gpt2Model>, tokens: &[u32]) -> (String, &'static str) {
    let eos = e.model().eos_tokens();
    let shown: Vec<u32> = tokens.iter().copied().filter(|t| !eos.contains(t)).collect();
    let reason = if tokens.last().is_some_and(|t| eos.contains(t)) { "stop" } else { "length" };
    (e.model().tokenizer().decode(&shown).unwrap(), reason)
}

fn expected(e: &Engine<Gpt2Model>, prompt: &str, max: usize) -> serde_json::Value {
    let ids = e.model().tokenizer().encode(prompt).unwrap();
    let g = e.generate(&[ids.clone()], &SampleOptions::greedy(max), &mut |_, _| {}).unwrap();
    let (text, reason) = text_of(e, &g.tokens[0]);
    json!({ "prompt": prompt, "max_tokens": max, "text": text, "finish_reason": reason, "prompt_tokens": ids.len(), "completion_tokens": g.tokens[0].len() })
}

fn python() -> PathBuf {
    let cache = std::env::var_os("SINTER_CACHE").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/sinter"));
    cache.join("py/bin/python")
}

#[test]
fn the_openai_client_talks_to_sinter_serve() {
    let e = engine("openai");
    let chat_text = ChatTemplate::default().render(&[Message { role: "user".into(), content: "t9 t4 t33".into() }]).unwrap();
    let load: Vec<serde_json::Value> = (0..64).map(|i| expected(&e, &format!("t{} t{} t{}", 3 + i % 50, 5 + i % 41, 7 + i % 30), 4 + i % 9)).collect();
    let want = json!({
        "completion": expected(&e, "t5 t17 t42", 8),
        "chat": expected(&e, &chat_text, 8),
        "context": 32,
        "load": load,
    });
    let dir = scratch("openai-client");
    let file = dir.join("expected.json");
    std::fs::write(&file, want.to_string()).unwrap();
    let server = Server::start(e, "127.0.0.1:0".parse().unwrap(), ServeOptions { batch: BatchOptions { max_batch: 16, kv_tokens: 1024, max_queue: 128, prefill_tokens_per_step: 64 }, ..ServeOptions::new("tiny-gpt2") }, false).unwrap();
    let py = python();
    assert!(py.exists(), "{} is missing: run scripts/setup (it installs the openai client for this test)", py.display());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/serve_client.py");
    let out = Command::new(&py).arg(&script).arg(format!("http://{}/v1", server.addr())).arg("tiny-gpt2").arg(&file).output().unwrap();
    let log = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the OpenAI client's checks failed:\n{log}");
    assert!(log.contains("all checks passed"), "{log}");
    let m = server.metrics().render();
    assert!(m.contains("sinter_requests_cancelled_total "), "{m}");
    server.shutdown().unwrap();
}

/// One HTTP/1.1 request on a fresh connection; the whole response.
fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn a_kv_pool_beyond_memory_is_an_error_from_start_not_a_crash() {
    for (tokens, want) in [(usize::MAX, "overflows"), (1usize << 46, "GiB of host memory")] {
        let opts = ServeOptions { batch: BatchOptions { kv_tokens: tokens, ..BatchOptions::default() }, ..ServeOptions::new("tiny") };
        let e = Server::start(engine("huge-pool"), "127.0.0.1:0".parse().unwrap(), opts, false).err().expect("a server over an impossible pool");
        assert!(e.to_string().contains(want), "{e}");
    }
}

#[test]
fn shutdown_finishes_the_running_request_then_closes_the_port() {
    // A wider model than the others: decode steps slow enough that shutdown starts mid-request.
    let dir = scratch("shutdown");
    write_gpt2_folder(&dir, &Gpt2Config { hidden: 128, n_layers: 4, ffn: 512, context: 64, ..cfg() }, 5);
    let e = Engine::new(load(&dir)).unwrap();
    let want = expected(&e, "t8 t1", 24);
    let opts = ServeOptions { batch: BatchOptions { kv_tokens: 256, ..BatchOptions::default() }, ..ServeOptions::new("tiny") };
    let server = Server::start(e, "127.0.0.1:0".parse().unwrap(), opts, false).unwrap();
    let addr = server.addr();
    let health = http(addr, "GET", "/health", "").unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let body = json!({ "model": "tiny", "prompt": "t8 t1", "max_tokens": 24, "temperature": 0 }).to_string();
    let client = std::thread::spawn(move || http(addr, "POST", "/v1/completions", &body));
    let t0 = Instant::now();
    while !server.metrics().render().contains("sinter_requests_total 1") {
        assert!(t0.elapsed() < Duration::from_secs(30), "the request was never accepted");
        std::thread::sleep(Duration::from_millis(1));
    }
    server.shutdown().unwrap();
    let r = client.join().unwrap().unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let v: serde_json::Value = serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(v["choices"][0]["text"], want["text"], "{r}");
    assert!(TcpStream::connect(addr).is_err(), "the port is closed after shutdown");
}

/// The body of an HTTP response as JSON.
fn json_body(r: &str) -> serde_json::Value {
    serde_json::from_str(r.split("\r\n\r\n").nth(1).unwrap_or("")).unwrap_or_else(|e| panic!("not JSON ({e}): {r}"))
}

/// What a careless or hostile client does: unknown routes and methods, a body over the limit,
/// `max_tokens` at u64::MAX, a chat without `max_tokens` on a pool smaller than the context,
/// an answer ended by a stop string (not a cancellation), and a request never finished — which
/// must not keep the server from stopping once the shutdown timeout has passed.
#[test]
fn odd_clients_get_openai_errors_and_cannot_hold_the_server_open() {
    let e = engine("odd-clients");
    let want = expected(&e, "t8 t1", 8);
    let stop = want["text"].as_str().unwrap().split_whitespace().nth(2).unwrap().to_string();
    let opts = ServeOptions {
        batch: BatchOptions { max_batch: 2, kv_tokens: 16, max_queue: 4, prefill_tokens_per_step: 64 },
        shutdown_timeout: Duration::from_millis(500),
        header_read_timeout: Duration::from_secs(1),
        max_connections: 3,
        ..ServeOptions::new("tiny")
    };
    let server = Server::start(e, "127.0.0.1:0".parse().unwrap(), opts, false).unwrap();
    let addr = server.addr();
    let err = |r: &str, status: &str, kind: &str| {
        assert!(r.starts_with(&format!("HTTP/1.1 {status}")), "{r}");
        assert_eq!(json_body(r)["error"]["type"], kind, "{r}");
    };
    err(&http(addr, "GET", "/v1/nope", "").unwrap(), "404", "not_found_error");
    err(&http(addr, "GET", "/v1/completions", "").unwrap(), "405", "invalid_request_error");
    // A body past the 2 MB limit (the server may answer and close before it is all sent).
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let n = 3 << 20;
    let _ = write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n");
    let _ = c.write_all(&vec![b' '; n]);
    let mut r = String::new();
    let _ = c.read_to_string(&mut r);
    err(&r, "413", "invalid_request_error");
    let r = http(addr, "POST", "/v1/completions", r#"{"model":"tiny","prompt":"t1","max_tokens":18446744073709551615}"#).unwrap();
    err(&r, "400", "invalid_request_error");
    assert_eq!(json_body(&r)["error"]["code"], "context_length_exceeded", "{r}");
    // The chat default (512 new tokens) is capped by the 16-token pool as by the context.
    let r = http(addr, "POST", "/v1/chat/completions", r#"{"model":"tiny","messages":[{"role":"user","content":"t3"}],"temperature":0}"#).unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    let body = json!({ "model": "tiny", "prompt": "t8 t1", "max_tokens": 8, "temperature": 0, "stop": stop }).to_string();
    let r = http(addr, "POST", "/v1/completions", &body).unwrap();
    assert_eq!(json_body(&r)["choices"][0]["finish_reason"], "stop", "{r}");
    assert!(server.metrics().render().contains("sinter_requests_cancelled_total 0"), "{}", server.metrics().render());
    // Headers never finished: the connection is closed after the header read timeout.
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(slow, "GET /health HTTP/1.1\r\nHost:").unwrap();
    let t0 = Instant::now();
    let mut r = String::new();
    let _ = slow.read_to_string(&mut r);
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(800) && waited < Duration::from_secs(10), "a half-sent header was held {waited:?}: {r:?}");
    assert!(!r.contains("200 OK"), "{r}");
    // Three idle sockets take every connection slot: a fourth client waits in the backlog
    // until the header timeout frees one, then gets its answer.
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let r = http(addr, "GET", "/health", "").unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(t0.elapsed() >= Duration::from_millis(500), "served at once with every slot held: {:?}", t0.elapsed());
    drop(idle);
    // Half a request, held open: shutdown ends after its timeout, not when the client leaves.
    let mut held = TcpStream::connect(addr).unwrap();
    write!(held, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{\"mo").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    server.shutdown().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10), "shutdown took {:?} with a half-sent request open", t0.elapsed());
    drop(held);
}
