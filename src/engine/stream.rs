//! The token stream of one generation.

use std::collections::VecDeque;

use crate::engine::generate::{Generator, Step};
use crate::engine::{StopReason, Timings};
use crate::error::Result;
use crate::ground::PhasePlacement;
use crate::scheduler::Fallback;

/// What a generation reports, in order: prompt progress, tokens, placement changes, and a
/// last [`Event::Done`].
#[derive(Debug, Clone)]
pub enum Event {
    /// `done` of the prompt's `total` tokens are evaluated.
    Prefill { done: usize, total: usize },
    /// A generated token and the text it completes (empty while a character is split across
    /// tokens).
    Token { id: u32, text: String },
    /// Text left at the end that no token completed (a broken character, as U+FFFD).
    Text(String),
    /// The stages moved (the offload policy re-placed them): where they run now.
    Placement(PhasePlacement),
    /// The GPU failed (lost, or out of memory) and its stages went on on the CPU from the
    /// same state: the generation continues with the same tokens. Also reported once by a
    /// session's first stream when the load itself left stages on the CPU.
    DeviceFallback(Fallback),
    /// The generation is over.
    Done(Box<Finished>),
}

impl Event {
    /// The text this event adds to the output ("" for events without text).
    pub fn text(&self) -> &str {
        match self {
            Event::Token { text, .. } | Event::Text(text) => text,
            _ => "",
        }
    }
}

/// The summary of a generation.
#[derive(Debug, Clone)]
pub struct Finished {
    pub stop: StopReason,
    /// The tokens evaluated for the prompt.
    pub prompt_ids: Vec<u32>,
    /// The tokens generated, an end-of-generation token included.
    pub generated_ids: Vec<u32>,
    pub text: String,
    /// With `set_n_probs(k)`: the k most likely tokens at each step.
    pub top_probs: Vec<Vec<(u32, f64)>>,
    pub timings: Timings,
    /// With a drafter (`set_draft_model`, `set_draft_lookup`): verification passes, drafted
    /// and accepted tokens.
    pub speculative: Option<crate::engine::speculative::SpecStats>,
    /// What ran where, e.g. `cpu+gpu:... [c|cccGGG|G]`.
    pub device: String,
    pub placement: PhasePlacement,
    /// Every move to the CPU after a GPU failure in this session so far (at load or start
    /// included), oldest first.
    pub fallbacks: Vec<Fallback>,
}

/// The events of one generation, as an iterator; dropping it mid-way leaves the context
/// holding what was evaluated.
pub struct TokenStream<'a> {
    gen: Generator<'a>,
    prompt_ids: Vec<u32>,
    placement: PhasePlacement,
    /// Events of the last step not handed out yet.
    queued: VecDeque<Event>,
    over: bool,
}

impl<'a> TokenStream<'a> {
    pub(super) fn new(gen: Generator<'a>, prompt_ids: Vec<u32>) -> TokenStream<'a> {
        let placement = gen.session().exec().placement().clone();
        TokenStream {
            gen,
            prompt_ids,
            placement,
            queued: VecDeque::new(),
            over: false,
        }
    }

    /// Ends the generation before the next token (as a cancel does, from this thread).
    pub fn stop(&mut self) {
        self.gen.stop(StopReason::Cancelled);
    }

    /// Runs the generation to its end, returning the summary.
    pub fn finish(mut self) -> Result<Finished> {
        for ev in &mut self {
            if let Event::Done(done) = ev? {
                return Ok(*done);
            }
        }
        Ok(self.summary())
    }

    fn summary(&self) -> Finished {
        let g = self.gen.generation();
        let s = self.gen.session();
        Finished {
            stop: g.stop,
            prompt_ids: self.prompt_ids.clone(),
            generated_ids: g.generated_ids.clone(),
            text: g.text.clone(),
            top_probs: g.top_probs.clone(),
            timings: g.timings.clone(),
            speculative: g.speculative,
            device: s.backend_name(),
            placement: s.exec().placement().clone(),
            fallbacks: s.exec().fallbacks().to_vec(),
        }
    }

    /// Runs one step and queues its events: a placement change first (the pass that made it
    /// produced the rest).
    fn step(&mut self) -> Result<()> {
        let step = self.gen.step();
        // A fallback comes first, also when the step failed after it.
        for f in self.gen.session_mut().take_unreported_fallbacks() {
            self.queued.push_back(Event::DeviceFallback(f));
        }
        let step = step?;
        let now = self.gen.session().exec().placement();
        if *now != self.placement {
            self.placement = now.clone();
            self.queued.push_back(Event::Placement(now.clone()));
        }
        match step {
            Step::Prefill { done, total } => self.queued.push_back(Event::Prefill { done, total }),
            Step::Token { id, text } => self.queued.push_back(Event::Token { id, text }),
            Step::Done { text, .. } => {
                self.over = true;
                if !text.is_empty() {
                    self.queued.push_back(Event::Text(text));
                }
                let done = Event::Done(Box::new(self.summary()));
                self.queued.push_back(done);
            }
        }
        Ok(())
    }
}

impl Iterator for TokenStream<'_> {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(ev) = self.queued.pop_front() {
                return Some(Ok(ev));
            }
            if self.over {
                return None;
            }
            if let Err(e) = self.step() {
                self.over = true;
                return Some(Err(e));
            }
        }
    }
}
