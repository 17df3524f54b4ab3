//! Chat templates: the Jinja templates of Hugging Face checkpoints, rendered with minijinja set
//! up like transformers' Jinja2 environment (trim_blocks, lstrip_blocks, loop controls, Python
//! string/dict methods, `raise_exception`, `strftime_now`).

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;
use serde_json::Value;

use crate::alloc_budget::{self, Stopped};
use crate::config::{read_json, short};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

const TEMPLATE_NAME: &str = "chat";

/// Template instructions one render may run. Real templates (Qwen3's, with tools) use a few
/// thousand per message; a template that loops without end runs out instead of hanging.
const FUEL: u64 = 20_000_000;

/// Rendered bytes allowed beyond the messages' own text (templates add a few hundred per turn).
const RENDER_OVERHEAD: usize = 1 << 20;

/// Bytes a render may allocate (net), beyond [`MEMORY_PER_TEXT_BYTE`] per byte of messages.
/// Real templates (Qwen3's with tools, Gemma's) stay under a megabyte; a template that doubles a
/// string in a loop reaches this within a few dozen steps and is stopped there.
const MEMORY_OVERHEAD: usize = 64 << 20;

/// Allocation allowed per byte of messages: the context's copy of them, the rendered output and
/// the strings a template builds from them.
const MEMORY_PER_TEXT_BYTE: usize = 16;

/// Collects rendered output up to a limit, then refuses more (which stops the render).
struct Capped {
    out: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            return Err(std::io::Error::other("output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A compiled chat template; `origin` (file and field) names it in errors.
pub struct ChatTemplate {
    /// Shared with the thread each render runs on (under a memory budget).
    env: Arc<Environment<'static>>,
    origin: String,
}

impl ChatTemplate {
    pub fn new(source: String, origin: String) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<(), minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template_owned(TEMPLATE_NAME, source)
            .map_err(|e| anyhow!("{origin}: chat template does not parse: {}", describe(&e)))?;
        Ok(ChatTemplate {
            env: Arc::new(env),
            origin,
        })
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        (bos_token, eos_token): (Option<&str>, Option<&str>),
        enable_thinking: Option<bool>,
    ) -> Result<String> {
        let text_len: usize = messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum();
        let output_limit = RENDER_OVERHEAD + 2 * text_len;
        let memory_limit = MEMORY_OVERHEAD + MEMORY_PER_TEXT_BYTE * text_len;
        let env = Arc::clone(&self.env);
        let origin = self.origin.clone();
        let messages = messages.to_vec();
        let (bos, eos) = (
            bos_token.unwrap_or("").to_string(),
            eos_token.unwrap_or("").to_string(),
        );
        let work = move || {
            let tmpl = env
                .get_template(TEMPLATE_NAME)
                .map_err(|e| anyhow!("{origin}: {}", describe(&e)))?;
            let ctx = minijinja::context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => bos,
                eos_token => eos,
                tools => minijinja::Value::from(()),
            };
            // Undefined unless asked, as transformers leaves a keyword it was not given.
            let ctx = match enable_thinking {
                Some(on) => minijinja::context! { enable_thinking => on, ..ctx },
                None => ctx,
            };
            let mut out = Capped {
                out: Vec::new(),
                limit: output_limit,
            };
            match tmpl.render_captured_to(ctx, &mut out) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WriteFailure => bail!(
                    "{origin}: chat template rendered more than {output_limit} bytes for \
                     {text_len} bytes of messages"
                ),
                Err(e) if e.kind() == ErrorKind::OutOfFuel => bail!(
                    "{origin}: chat template ran out of its budget of {FUEL} instructions (does \
                     it loop without end?)"
                ),
                Err(e) => bail!("{origin}: chat template failed: {}", describe(&e)),
            }
            String::from_utf8(out.out)
                .map_err(|_| anyhow!("{origin}: chat template rendered invalid UTF-8"))
        };
        match alloc_budget::run_within(memory_limit, work) {
            Ok(rendered) => rendered,
            Err(Stopped::OverBudget) => bail!(
                "{}: chat template needed more than its memory budget of {} MiB for {text_len} \
                 bytes of messages (does it grow a string in a loop?)",
                self.origin,
                memory_limit >> 20
            ),
            Err(Stopped::Panicked) => bail!("{}: chat template rendering panicked", self.origin),
            Err(Stopped::NoThread) => bail!(
                "{}: no thread could be started to render the chat template",
                self.origin
            ),
        }
    }
}

/// A minijinja error with its template line, when known.
fn describe(e: &minijinja::Error) -> String {
    let mut s = match e.detail() {
        Some(d) => d.to_string(),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (template line {line})"));
    }
    s
}

/// Finds the template source: `chat_template.jinja` (newer transformers), else
/// tokenizer_config.json's `chat_template` (a string, or a list of `{name, template}` where
/// `default` is used), else `chat_template.json`. Returns the source and where it came from.
pub(crate) fn find_template(
    dir: &Path,
    cfg: &Value,
    cfg_path: &Path,
) -> Result<Option<(String, String)>> {
    let jinja = dir.join("chat_template.jinja");
    if crate::files::exists(&jinja) {
        let src = crate::files::read_text(&jinja, crate::files::MAX_CONFIG_BYTES)?;
        return Ok(Some((src, jinja.display().to_string())));
    }
    if let Some(found) = template_field(cfg, cfg_path)? {
        return Ok(Some(found));
    }
    let json = dir.join("chat_template.json");
    if crate::files::exists(&json) {
        return template_field(&read_json(&json)?, &json);
    }
    Ok(None)
}

fn template_field(cfg: &Value, path: &Path) -> Result<Option<(String, String)>> {
    let shown = path.display();
    match cfg.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some((s.clone(), format!("{shown}: `chat_template`")))),
        Some(Value::Array(list)) => {
            let mut named = Vec::new();
            for (i, item) in list.iter().enumerate() {
                let name = item.get("name").and_then(Value::as_str);
                let src = item.get("template").and_then(Value::as_str);
                match (name, src) {
                    (Some(n), Some(t)) => named.push((n, t)),
                    _ => bail!(
                        "{shown}: field `chat_template[{i}]` must be {{\"name\": .., \
                         \"template\": ..}}, got {}",
                        short(item)
                    ),
                }
            }
            let Some((name, src)) = named
                .iter()
                .find(|(n, _)| *n == "default")
                .or_else(|| named.first())
            else {
                return Ok(None);
            };
            Ok(Some((
                src.to_string(),
                format!("{shown}: `chat_template` named `{name}`"),
            )))
        }
        Some(other) => bail!(
            "{shown}: field `chat_template` must be a string or a list of named templates, got {}",
            short(other)
        ),
    }
}

/// transformers' `strftime_now`: the current UTC date/time formatted with a small subset of
/// strftime (templates use it for "Today is 26 Jul 2024").
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_time(secs, fmt)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

pub(crate) fn format_time(unix_secs: i64, fmt: &str) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&d.to_string());
            }
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (Howard
/// Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::format_time;

    #[test]
    fn strftime_subset_matches_known_dates() {
        // Timestamps from Python's calendar.timegm.
        assert_eq!(format_time(1_721_999_109, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(
            format_time(1_721_999_109, "%Y-%m-%d %H:%M:%S"),
            "2024-07-26 13:05:09"
        );
        assert_eq!(
            format_time(951_782_400, "%-d %B %Y %%"),
            "29 February 2000 %"
        );
        assert_eq!(format_time(-1, "%Y-%m-%d %H:%M:%S"), "1969-12-31 23:59:59");
        assert_eq!(format_time(0, "%A %q"), "%A %q");
    }
}
