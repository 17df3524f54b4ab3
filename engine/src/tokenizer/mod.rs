//! `tokenizer.json` (through the tokenizers crate) and `tokenizer_config.json` (special tokens,
//! chat template).

mod chat;

pub use chat::{ChatMessage, ChatTemplate};

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use crate::config::{read_json, short};

pub struct Tokenizer {
    dir: PathBuf,
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    template: Option<ChatTemplate>,
}

impl Tokenizer {
    /// Reads `tokenizer.json`, plus `tokenizer_config.json` and `chat_template.jinja` when
    /// present.
    pub fn load(dir: &Path) -> Result<Tokenizer> {
        let tok_path = dir.join("tokenizer.json");
        if !crate::files::exists(&tok_path) {
            bail!(
                "{}: missing (only the Hugging Face fast-tokenizer format is supported; a \
                 tokenizer.model alone is not enough)",
                tok_path.display()
            );
        }
        let text = crate::files::read_text(&tok_path, crate::files::MAX_TOKENIZER_BYTES)?;
        // tokenizers 0.22 panics on some malformed JSON (a syntax error inside `decoder`, found
        // by fuzz/tokenizer_json): check the syntax first, and turn any other panic of its
        // parser into an error naming the file.
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .map_err(|e| anyhow!("{}: not valid JSON: {e}", tok_path.display()))?;
        let inner = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_bytes(text.as_bytes()))
            .map_err(|_| {
                anyhow!(
                    "{}: cannot load: the tokenizers crate panicked on it",
                    tok_path.display()
                )
            })?
            .map_err(|e| anyhow!("{}: cannot load: {e}", tok_path.display()))?;

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if crate::files::exists(&cfg_path) {
            read_json(&cfg_path)?
        } else {
            Value::Object(Default::default())
        };
        let special = |key: &str| -> Result<Option<String>> {
            match cfg.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                // An AddedToken written out in full: {"content": "...", ...}.
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    _ => bail!(
                        "{}: field `{key}.content` must be a string",
                        cfg_path.display()
                    ),
                },
                Some(other) => bail!(
                    "{}: field `{key}` must be a string, got {}",
                    cfg_path.display(),
                    short(other)
                ),
            }
        };
        let bos_token = special("bos_token")?;
        let eos_token = special("eos_token")?;
        let template = chat::find_template(dir, &cfg, &cfg_path)?
            .map(|(source, origin)| ChatTemplate::new(source, origin))
            .transpose()?;
        Ok(Tokenizer {
            dir: dir.to_path_buf(),
            inner,
            bos_token,
            eos_token,
            template,
        })
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| anyhow!("{}: encoding failed: {e}", self.path().display()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Ids the tokenizer does not know are skipped, as transformers does: real checkpoints
    /// often pad the embedding past the tokenizer's vocabulary (Qwen3: 151936 rows, 151669
    /// tokens), and a sampler may still pick one of those rows.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| anyhow!("{}: decoding failed: {e}", self.path().display()))
    }

    /// Number of token ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The id of tokenizer_config.json's `eos_token`, when it names a known token.
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token
            .as_deref()
            .and_then(|t| self.token_id(t))
            .into_iter()
            .collect()
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Renders the conversation with the checkpoint's chat template, the way transformers'
    /// `apply_chat_template(..., tokenize=False)` does.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_thinking(messages, add_generation_prompt, None)
    }

    /// [`Tokenizer::apply_chat_template`] with `enable_thinking` set for the template (Qwen3's
    /// and Qwen3.5's switch), as transformers passes `enable_thinking=...`; `None` leaves it
    /// undefined.
    pub fn apply_chat_template_thinking(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String> {
        let Some(template) = &self.template else {
            bail!(
                "{}: no chat template (looked for `chat_template` in tokenizer_config.json, \
                 chat_template.jinja and chat_template.json); pass a raw prompt instead",
                self.dir.display()
            );
        };
        let specials = (self.bos_token.as_deref(), self.eos_token.as_deref());
        template.render(messages, add_generation_prompt, specials, enable_thinking)
    }

    fn path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
}

/// Generated tokens as text while they come: each push returns the new whole characters (a
/// token may end inside a multi-byte character, which then waits for the next one). The
/// pieces always join to a prefix of the decode of all tokens, so a stream ends with
/// [`TextStream::finish`]'s remainder.
#[derive(Debug, Default)]
pub struct TextStream {
    ids: Vec<u32>,
    shown: String,
}

impl TextStream {
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// Adds a token; the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, tok: u32) -> String {
        self.ids.push(tok);
        match tokenizer.decode(&self.ids, true) {
            Ok(text) if !text.ends_with('\u{FFFD}') && text.starts_with(&self.shown) => {
                let new = text[self.shown.len()..].to_string();
                self.shown = text;
                new
            }
            _ => String::new(),
        }
    }

    /// What the final decode adds to what was shown (empty when it rewrote shown text).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let text = tokenizer.decode(&self.ids, true)?;
        let rest = text
            .strip_prefix(self.shown.as_str())
            .unwrap_or_default()
            .to_string();
        self.shown = text;
        Ok(rest)
    }
}
