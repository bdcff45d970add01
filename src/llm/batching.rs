//! Continuous batching: requests join the running batch between decode steps and leave it when
//! they finish, over one KV page pool ([`super::pool`]).
//!
//! A [`Batcher`] keeps a FIFO queue of waiting requests and the running ones. Each
//! [`Batcher::step`]:
//!
//! 1. drops requests whose client went away ([`Sink::is_closed`]), freeing their pages;
//! 2. admits waiting requests in arrival order while the batch has room
//!    ([`BatchOptions::max_batch`]) and the pool has the page groups the request needs for its
//!    prompt *and* all of its `max_new` tokens (reserved up front, so a running sequence never
//!    runs out of pages and is never preempted), prefilling each (at most
//!    [`BatchOptions::prefill_tokens_per_step`] prompt tokens a step beyond the first prompt,
//!    so that long prompts do not stall the running decodes) and emitting its first token;
//! 3. runs one decode step for every running sequence and emits one token each;
//! 4. finishes sequences at an end-of-sequence token or `max_new` tokens and frees their pages
//!    at once.
//!
//! Each request samples with its own [`Sampler`] (seeded by its options), and rows of a decode
//! step are independent, so a request produces the tokens it produces alone whatever joins or
//! leaves the batch around it (on the interpreter exactly; on the GPU up to the kernels of the
//! batch size's decode program). Admission is bounded by the queue
//! ([`BatchOptions::max_queue`]: a full queue rejects at once, the caller's back-pressure) and
//! by the pool. The scheme is Orca's iteration-level scheduling (Yu et al., OSDI 2022) over
//! vLLM's paged KV cache (Kwon et al., SOSP 2023), without preemption.

use std::collections::VecDeque;
use std::time::Instant;

use super::decoder::{DecoderModel, KvGeometry};
use super::pool::{PooledSession, Row};
use super::sample::{SampleOptions, Sampler};
use super::session::Step;
use crate::Error;

/// Limits of a [`Batcher`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// Sequences decoding together at most.
    pub max_batch: usize,
    /// Tokens the KV pool holds over all sequences (rounded up to whole page groups).
    pub kv_tokens: usize,
    /// Requests waiting at most beyond the batch's free places (those the next step admits);
    /// [`Batcher::submit`] rejects beyond it.
    pub max_queue: usize,
    /// Prompt tokens prefilled per step beyond the first admitted prompt.
    pub prefill_tokens_per_step: usize,
}

impl Default for BatchOptions {
    fn default() -> BatchOptions {
        BatchOptions { max_batch: 64, kv_tokens: 64 * 1024, max_queue: 256, prefill_tokens_per_step: 2048 }
    }
}

/// Why a sequence stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced an end-of-sequence token (the last [`Event::Token`]).
    Eos,
    /// It produced `max_new` tokens.
    Length,
    /// Its client went away ([`Sink::is_closed`]) or [`Batcher::cancel_all`] stopped it.
    Cancelled,
    /// A device or interpreter error stopped it.
    Failed(String),
}

/// What a request's [`Sink`] receives: its tokens in order, then exactly one `Finished`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The next generated token.
    Token(u32),
    /// The request is done; nothing follows.
    Finished(FinishReason),
}

/// Where a request's events go (a channel to an HTTP response, a test's vector).
pub trait Sink: Send {
    /// Delivers `event`; returns false when no one listens any more (the request is then
    /// cancelled and its pages freed).
    fn send(&mut self, event: Event) -> bool;
    /// True once no one listens (checked before each step, so that a queued or running
    /// request whose client went away is dropped without waiting for its next token).
    fn is_closed(&self) -> bool;
}

/// A request to a [`Batcher`].
pub struct Request {
    /// The prompt's token ids (not empty).
    pub prompt: Vec<u32>,
    /// Sampling and `max_new`.
    pub options: SampleOptions,
    /// Where the tokens go.
    pub sink: Box<dyn Sink>,
}

/// Why [`Batcher::submit`] refused a request (nothing was queued; the sink got no event).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejected {
    /// The queue holds [`BatchOptions::max_queue`] requests beyond the batch's free places.
    #[error("the server is busy: {0} requests are waiting; retry later")]
    QueueFull(usize),
    /// An empty prompt.
    #[error("the prompt is empty: there is no token to continue from")]
    EmptyPrompt,
    /// Prompt plus `max_new` exceed the model's context.
    #[error("the prompt has {tokens} tokens and {max_new} more were asked for, but the model's context holds {context} tokens")]
    ContextOverflow {
        /// Prompt tokens.
        tokens: usize,
        /// Tokens asked for.
        max_new: usize,
        /// The model's context.
        context: usize,
    },
    /// Prompt plus `max_new` need more pages than the whole pool has.
    #[error("the prompt and the tokens asked for need {needed} tokens of KV cache, more than the pool's {pool} (a server's pool is set by `sinter serve --kv-tokens`)")]
    ExceedsPool {
        /// Tokens of cache the request needs (whole pages).
        needed: usize,
        /// Tokens the pool holds.
        pool: usize,
    },
    /// A prompt token id past the model's vocabulary (a tokenizer larger than the model's
    /// embedding table).
    #[error("prompt token {position} is id {id}, past the model's vocabulary of {vocab} ids")]
    TokenOutOfRange {
        /// Its position in the prompt.
        position: usize,
        /// The id.
        id: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// Bad sampling options.
    #[error("{0}")]
    Options(String),
}

struct Waiting {
    req: Request,
    queued_at: Instant,
}

struct Running {
    req: Request,
    groups: Vec<usize>,
    sampler: Sampler,
    generated: usize,
    last: u32,
}

/// What one [`Batcher::step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReport {
    /// Requests admitted and prefilled.
    pub prefilled: usize,
    /// Prompt tokens prefilled.
    pub prompt_tokens: usize,
    /// Rows of the decode step (0 when none ran).
    pub decoded: usize,
    /// Requests that finished (any reason).
    pub finished: usize,
    /// Of those, requests whose client went away.
    pub cancelled: usize,
}

/// Continuous batching of generation requests over one KV page pool (module documentation).
/// Made by [`super::Engine::batcher`]; driven by calling [`Batcher::step`] in a loop.
pub struct Batcher<'e> {
    session: Box<dyn PooledSession + 'e>,
    kv: KvGeometry,
    vocab: usize,
    context: usize,
    eos: Vec<u32>,
    opts: BatchOptions,
    groups: usize,
    free: Vec<usize>,
    queue: VecDeque<Waiting>,
    running: Vec<Running>,
}

impl<'e> Batcher<'e> {
    pub(crate) fn new(session: Box<dyn PooledSession + 'e>, model: &dyn DecoderModel, opts: BatchOptions, groups: usize) -> Batcher<'e> {
        Batcher {
            session,
            kv: model.kv(),
            vocab: model.vocab(),
            context: model.context(),
            eos: model.eos_tokens(),
            opts,
            groups,
            // Handed out from the end: lowest groups first.
            free: (0..groups).rev().collect(),
            queue: VecDeque::new(),
            running: Vec::new(),
        }
    }

    /// Page groups a pool for `opts` holds (one group = one page of every layer).
    pub(crate) fn groups_for(kv: &KvGeometry, opts: &BatchOptions) -> usize {
        kv.pages_for(opts.kv_tokens.max(1))
    }

    /// Makes every decode batch size and block-table width this batcher can meet ready before
    /// the first request (on the GPU: the batch-specialised programs compiled, each bucket's
    /// CUDA graph captured), so that no step later stalls on compiling or capturing. Widths
    /// go up to a request as long as the context or the pool allows; on the interpreter this
    /// does nothing.
    ///
    /// # Errors
    /// The device's or the compiler's errors.
    pub fn warm(&mut self) -> Result<(), Error> {
        let longest = self.context.min(self.groups * self.kv.page_size);
        self.session.warm(self.kv.pages_for(longest.max(1)))
    }

    /// Queues `req` (it is admitted by a later [`Batcher::step`]).
    ///
    /// # Errors
    /// [`Rejected`]: a full queue, an empty prompt, a prompt plus `max_new` past the context
    /// or the pool, bad sampling options. The request's sink gets no event then.
    pub fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        // Requests the next step admits (free places in the batch) do not count as waiting.
        let places = self.opts.max_batch.max(1).saturating_sub(self.running.len());
        if self.queue.len() >= self.opts.max_queue.saturating_add(places) {
            return Err(Rejected::QueueFull(self.queue.len()));
        }
        let (tokens, max_new) = (req.prompt.len(), req.options.max_new);
        if tokens == 0 {
            return Err(Rejected::EmptyPrompt);
        }
        if tokens.checked_add(max_new).is_none_or(|n| n > self.context) {
            return Err(Rejected::ContextOverflow { tokens, max_new, context: self.context });
        }
        req.options.validate().map_err(|e| Rejected::Options(e.to_string()))?;
        if let Some((position, &id)) = req.prompt.iter().enumerate().find(|(_, t)| **t as usize >= self.vocab) {
            return Err(Rejected::TokenOutOfRange { position, id, vocab: self.vocab });
        }
        let need = self.groups_needed(&req);
        if need > self.groups {
            return Err(Rejected::ExceedsPool { needed: need * self.kv.page_size, pool: self.groups * self.kv.page_size });
        }
        self.queue.push_back(Waiting { req, queued_at: Instant::now() });
        Ok(())
    }

    fn groups_needed(&self, req: &Request) -> usize {
        self.kv.pages_for(req.prompt.len() + req.options.max_new)
    }

    /// Requests waiting.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Requests decoding.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// True when nothing waits or runs.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty()
    }

    /// KV pages in use (page groups held by running sequences × layers).
    pub fn pages_in_use(&self) -> usize {
        (self.groups - self.free.len()) * self.kv.layers
    }

    /// KV pages in the pool (groups × layers).
    pub fn pages_total(&self) -> usize {
        self.groups * self.kv.layers
    }

    /// How long the oldest waiting request has waited.
    pub fn oldest_wait(&self) -> Option<std::time::Duration> {
        self.queue.front().map(|w| w.queued_at.elapsed())
    }

    /// Stops every waiting and running request with `reason` (their sinks get
    /// `Finished(reason)`) and frees their pages.
    pub fn cancel_all(&mut self, reason: FinishReason) {
        for mut w in std::mem::take(&mut self.queue) {
            w.req.sink.send(Event::Finished(reason.clone()));
        }
        for r in std::mem::take(&mut self.running) {
            self.finish(r, reason.clone());
        }
    }

    fn finish(&mut self, mut r: Running, reason: FinishReason) {
        r.req.sink.send(Event::Finished(reason));
        self.free.extend(r.groups.drain(..).rev());
    }

    /// Emits `t` for running sequence `r`; returns why it is done, if it is.
    fn emit(&self, r: &mut Running, t: u32) -> Option<FinishReason> {
        r.generated += 1;
        r.last = t;
        if !r.req.sink.send(Event::Token(t)) {
            return Some(FinishReason::Cancelled);
        }
        if r.req.options.stop_at_eos && self.eos.contains(&t) {
            return Some(FinishReason::Eos);
        }
        (r.generated >= r.req.options.max_new).then_some(FinishReason::Length)
    }

    /// One scheduling step: drop cancelled requests, admit and prefill waiting ones, run one
    /// decode step of the running ones (module documentation).
    ///
    /// # Errors
    /// A decode step's device or interpreter error: every running request is then finished
    /// with [`FinishReason::Failed`] and its pages freed (waiting requests stay queued). A
    /// prefill's error fails only its own request.
    pub fn step(&mut self) -> Result<StepReport, Error> {
        let mut report = StepReport::default();
        let waiting = self.queue.len();
        self.queue.retain_mut(|w| {
            let closed = w.req.sink.is_closed();
            if closed {
                w.req.sink.send(Event::Finished(FinishReason::Cancelled));
            }
            !closed
        });
        report.cancelled += waiting - self.queue.len();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].req.sink.is_closed() {
                let r = self.running.swap_remove(i);
                self.finish(r, FinishReason::Cancelled);
                report.finished += 1;
                report.cancelled += 1;
            } else {
                i += 1;
            }
        }
        self.admit(&mut report);
        if self.running.is_empty() {
            return Ok(report);
        }
        let want_logits = self.running.iter().any(|r| r.req.options.temperature > 0.0);
        let rows: Vec<Row<'_>> = self.running.iter().map(|r| Row { token: r.last, position: r.req.prompt.len() + r.generated - 1, groups: &r.groups }).collect();
        report.decoded = rows.len();
        let step = match self.session.decode(&rows, want_logits) {
            Ok(s) => s,
            Err(e) => {
                self.cancel_all_running(FinishReason::Failed(e.to_string()));
                return Err(e);
            }
        };
        let v = self.vocab;
        let mut running = std::mem::take(&mut self.running);
        let mut kept = Vec::with_capacity(running.len());
        for (s, mut r) in running.drain(..).enumerate() {
            let t = match &step {
                Step::Logits(l) => match l.get(s * v..(s + 1) * v) {
                    Some(row) => match r.sampler.pick(row) {
                        Ok(t) => t,
                        Err(e) => {
                            self.finish(r, FinishReason::Failed(e.to_string()));
                            report.finished += 1;
                            continue;
                        }
                    },
                    None => {
                        self.finish(r, FinishReason::Failed("the decode step returned too few logits".into()));
                        report.finished += 1;
                        continue;
                    }
                },
                Step::Greedy(next) => match next.get(s) {
                    Some(&t) => t,
                    None => {
                        self.finish(r, FinishReason::Failed("the decode step returned too few tokens".into()));
                        report.finished += 1;
                        continue;
                    }
                },
            };
            match self.emit(&mut r, t) {
                Some(reason) => {
                    report.cancelled += usize::from(reason == FinishReason::Cancelled);
                    self.finish(r, reason);
                    report.finished += 1;
                }
                None => kept.push(r),
            }
        }
        self.running = kept;
        Ok(report)
    }

    fn cancel_all_running(&mut self, reason: FinishReason) {
        for r in std::mem::take(&mut self.running) {
            self.finish(r, reason.clone());
        }
    }

    /// Admits waiting requests in order while the batch and the pool have room.
    fn admit(&mut self, report: &mut StepReport) {
        while self.running.len() < self.opts.max_batch.max(1) {
            let Some(front) = self.queue.front() else { break };
            let need = self.groups_needed(&front.req);
            if need > self.free.len() || report.prefilled > 0 && report.prompt_tokens + front.req.prompt.len() > self.opts.prefill_tokens_per_step {
                break;
            }
            let Some(w) = self.queue.pop_front() else { break };
            let groups: Vec<usize> = (0..need).filter_map(|_| self.free.pop()).collect();
            let sampler = Sampler::new(&w.req.options);
            let mut r = Running { req: w.req, groups, sampler, generated: 0, last: 0 };
            report.prefilled += 1;
            report.prompt_tokens += r.req.prompt.len();
            let row = match self.session.prefill(&r.groups, &r.req.prompt) {
                Ok(row) => row,
                Err(e) => {
                    self.finish(r, FinishReason::Failed(e.to_string()));
                    report.finished += 1;
                    continue;
                }
            };
            if r.req.options.max_new == 0 {
                self.finish(r, FinishReason::Length);
                report.finished += 1;
                continue;
            }
            debug_assert_eq!(row.len(), self.vocab);
            let t = match r.sampler.pick(&row) {
                Ok(t) => t,
                Err(e) => {
                    self.finish(r, FinishReason::Failed(e.to_string()));
                    report.finished += 1;
                    continue;
                }
            };
            match self.emit(&mut r, t) {
                Some(reason) => {
                    report.cancelled += usize::from(reason == FinishReason::Cancelled);
                    self.finish(r, reason);
                    report.finished += 1;
                }
                None => self.running.push(r),
            }
        }
    }
}
