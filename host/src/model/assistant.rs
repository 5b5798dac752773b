//! Stage 3, personalized inference: one resident base model that answers
//! with whichever user's LoRA adapter is installed in its slots
//! ([`crate::lora::slots`]). `hexlora generate` and `hexlora serve` both
//! answer through [`Assistant::complete`], so a request to the server and
//! the same command line give the same text.
use crate::lora::slots::{AdapterSlots, PreparedAdapter};
use crate::lora::Adapter;
use crate::model::chat::{ChatTemplate, Message};
use crate::model::checkpoint::Checkpoint;
use crate::ops::cpu_projection::inference_projection;
use crate::model::decoder::{Model, ProjectionFactory};
use crate::model::generate::{decode_while, prefill, Sampling};
use crate::model::source::RawTensor;
use crate::model::tokenizer::Tokenizer;
use crate::projection::ProjectionInfo;
use crate::{Error, Result};
use std::cell::RefCell;

/// What to generate.
#[derive(Clone, Debug)]
pub struct Request {
    /// Prompt token ids (from [`Assistant::chat_prompt`] or [`Assistant::raw_prompt`]).
    pub prompt: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Temperature, top-p and seed.
    pub sampling: Sampling,
    /// Generation ends before the first occurrence of any of these strings
    /// (which is not part of the answer).
    pub stop: Vec<String>,
}

/// Why generation ended (OpenAI's `finish_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-turn token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl Finish {
    /// OpenAI's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// A finished answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The generated text (special tokens and stop string removed).
    pub text: String,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Why it ended.
    pub finish: Finish,
    /// Seconds spent on the prompt (prefill).
    pub prompt_seconds: f64,
    /// Seconds spent generating after it.
    pub decode_seconds: f64,
}

/// A model with adapter slots, its tokenizer and chat template.
pub struct Assistant {
    /// The inference model; every frozen projection carries a slot.
    pub model: Model,
    /// The checkpoint's tokenizer.
    pub tokenizer: Tokenizer,
    template: ChatTemplate,
    slots: AdapterSlots,
    stop_ids: Vec<u32>,
}

impl Assistant {
    /// Loads the model of `ckpt` (a quantized checkpoint's weights stay in
    /// their blocks, others are held in f32: `inference_projection`) with an empty
    /// slot on every frozen projection.
    pub fn load(ckpt: &Checkpoint) -> Result<Self> {
        Self::load_with(ckpt, &inference_projection)
    }

    /// [`Assistant::load`] with every frozen projection made by `make`
    /// (`serve --learn` shares them with the learner's training graph).
    pub fn load_with(ckpt: &Checkpoint, make: &ProjectionFactory<'_>) -> Result<Self> {
        let slots = RefCell::new(AdapterSlots::default());
        let wrap = |info: ProjectionInfo, raw: &RawTensor<'_>| Ok(slots.borrow_mut().wrap(make(info, raw)?));
        let model = Model::load(ckpt.config.clone(), ckpt.tensors(), &wrap)?;
        let tokenizer = ckpt.tokenizer()?;
        let template = ckpt.template()?;
        let stop_ids = tokenizer.stop_ids(&model.config.eos_token_ids);
        Ok(Assistant { model, tokenizer, template, slots: slots.into_inner(), stop_ids })
    }

    /// Checks `adapter` against this model and transposes its factors;
    /// `scale` multiplies its scaling.
    pub fn prepare(&self, adapter: &Adapter, scale: f32) -> Result<PreparedAdapter> {
        self.slots.prepare(adapter, scale)
    }

    /// Token ids of `messages` in the model's chat template, ending with the
    /// opening of the assistant's turn.
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>> {
        if messages.is_empty() {
            return Err(Error::invalid("messages", "empty"));
        }
        self.tokenizer.encode(&self.template.render(messages, true))
    }

    /// Token ids of `text` as it is (no template).
    pub fn raw_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text)
    }

    /// Generates for `req` with `adapter` installed (`None`: the base
    /// model). `on_text` sees each new piece of the answer as soon as it is
    /// final (whole characters, never part of a stop string) and returns
    /// `false` to cancel; a cancelled answer holds what was produced.
    pub fn complete(&self, req: &Request, adapter: Option<&PreparedAdapter>, mut on_text: impl FnMut(&str) -> bool + Send) -> Result<Answer> {
        req.sampling.validate()?;
        if req.max_tokens == 0 {
            return Err(Error::invalid("max_tokens", "0 (must be at least 1)"));
        }
        if let Some(i) = req.prompt.iter().position(|&id| id as usize >= self.model.config.vocab_size) {
            return Err(Error::invalid("prompt", format!("token {i} has id {} beyond the vocabulary ({})", req.prompt[i], self.model.config.vocab_size)));
        }
        self.slots.install(adapter)?;
        // On a worker of the thread pool, so this thread takes its share of
        // every parallel product instead of sleeping until the pool's
        // threads finish it and wake it (two wake-ups per product, ~200
        // products a token).
        let result = rayon::scope(|_| self.run(req, &mut on_text));
        self.slots.install(None)?;
        result
    }

    fn run(&self, req: &Request, on_text: &mut impl FnMut(&str) -> bool) -> Result<Answer> {
        let start = std::time::Instant::now();
        let (mut state, logits) = prefill(&self.model, &req.prompt)?;
        let prompt_seconds = start.elapsed().as_secs_f64();
        let mut ids = Vec::new();
        let mut stream = TextStream::new(&req.stop);
        let mut failed = None;
        decode_while(&self.model, &mut state, logits, req.max_tokens, &req.sampling, &self.stop_ids, |id| {
            ids.push(id);
            match self.tokenizer.decode(&ids, true) {
                Ok(text) => stream.update(&text),
                Err(e) => failed = Some(e),
            }
            failed.is_none() && !stream.stopped && stream.flush(on_text)
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        let decode_seconds = start.elapsed().as_secs_f64() - prompt_seconds;
        let (text, stopped_by_string) = stream.finish(on_text);
        let ended_on_token = ids.last().is_some_and(|id| self.stop_ids.contains(id));
        let finish = if stopped_by_string || ended_on_token { Finish::Stop } else { Finish::Length };
        Ok(Answer { text, prompt_tokens: req.prompt.len(), completion_tokens: ids.len(), finish, prompt_seconds, decode_seconds })
    }
}

/// Turns the growing decoded text into final pieces: text is held back
/// while it could still be the start of a stop string or ends inside a
/// character, and generation is cut at the first stop string.
struct TextStream<'a> {
    stop: &'a [String],
    text: String,
    /// Bytes of `text` that are final.
    ready: usize,
    /// Bytes already handed out.
    sent: usize,
    stopped: bool,
}

impl<'a> TextStream<'a> {
    fn new(stop: &'a [String]) -> Self {
        TextStream { stop, text: String::new(), ready: 0, sent: 0, stopped: false }
    }

    fn update(&mut self, decoded: &str) {
        if self.stopped {
            return;
        }
        self.text = decoded.to_string();
        if let Some(cut) = self.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| self.text.find(s.as_str())).min() {
            self.text.truncate(cut);
            self.ready = cut;
            self.stopped = true;
            return;
        }
        // A trailing U+FFFD is a byte-fallback character still being spelled.
        let mut end = self.text.trim_end_matches('\u{fffd}').len();
        for s in self.stop.iter().filter(|s| !s.is_empty()) {
            for k in (1..s.len()).rev() {
                if s.is_char_boundary(k) && self.text[..end].ends_with(&s[..k]) {
                    end = end.min(self.text.len() - k);
                    break;
                }
            }
        }
        self.ready = self.ready.max(end.min(self.text.len()));
    }

    /// Hands out what is ready since the last call; `false` from `on_text` cancels.
    fn flush(&mut self, on_text: &mut impl FnMut(&str) -> bool) -> bool {
        if self.ready > self.sent && self.text.is_char_boundary(self.ready) {
            let piece = &self.text[self.sent..self.ready];
            self.sent = self.ready;
            return on_text(piece);
        }
        true
    }

    /// The whole answer, after handing out the rest; and whether a stop string ended it.
    fn finish(mut self, on_text: &mut impl FnMut(&str) -> bool) -> (String, bool) {
        self.ready = self.text.len();
        self.flush(on_text);
        (self.text, self.stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stop: &[&str], steps: &[&str]) -> (Vec<String>, String, bool) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut s = TextStream::new(&stop);
        let mut pieces = Vec::new();
        for t in steps {
            s.update(t);
            s.flush(&mut |p: &str| {
                pieces.push(p.to_string());
                true
            });
        }
        let (text, stopped) = s.finish(&mut |p: &str| {
            pieces.push(p.to_string());
            true
        });
        (pieces, text, stopped)
    }

    #[test]
    fn text_stream_holds_back_possible_stop_prefixes_and_cuts_at_the_stop() {
        let (pieces, text, stopped) = run(&["END"], &["Hi", "Hi E", "Hi EN", "Hi ENx", "Hi ENx END more"]);
        assert_eq!(pieces, ["Hi", " ", "ENx", " "]);
        assert_eq!((text.as_str(), stopped), ("Hi ENx ", true));
        let (pieces, text, stopped) = run(&[], &["a", "ab\u{fffd}", "abé"]);
        assert_eq!(pieces, ["a", "b", "é"]);
        assert_eq!((text.as_str(), stopped), ("abé", false));
    }
}
