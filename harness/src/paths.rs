//! Execution paths: the engine's alternative ways of computing the same model (the backend,
//! Gated DeltaNet per step or chunked, the KV layout (rotating, flat, paged), MTP), named on the command line
//! as `KEY=VALUE[+KEY=VALUE...]` or `default`, e.g. `gdn=perstep`, `backend=mlx+gdn=chunked`. Goldens, parity
//! and sweeps all select paths through [`PathSpec`], so a new path is one new key here.
//!
//! A path is applied to the request (or the model state) directly; the harness never selects
//! paths through environment variables, so two paths can run side by side in one process.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};
use engine::cache::{KvPool, ModelState};
use engine::generate::{
    self, BatchOptions, ForcedDrafts, GenerateOutput, GenerateRequest, MtpOptions, PagedKv,
};
use engine::layers::GdnPath;
use engine::models::CausalLm;
use engine::Session;
use engine::{Backend, RequestOptions};
use kernels::numerics::Numerics;

/// The keys a path spec may set, with their values, for error messages and `--help`.
pub const VALID_PATHS: &str = "default, backend=cpu|mlx|metal|cuda, gdn=auto|perstep|chunked, kv=rotating|flat|paged, mtp=1|2|3|4, drafts=correct|wrong (with mtp), draft-vocab=full|N (with mtp), batch=2..64, session=reuse, numerics=exact|fast (combine keys with `+`)";

/// The block limit of the pools `kv=paged` gives states driven directly (a million positions;
/// pools grow only as far as they are used).
const STATE_POOL_BLOCKS: usize = 1 << 16;

/// One execution path. Unset keys take the engine's built-in default (never the environment).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathSpec {
    /// Where the model runs (the CPU when unset). A model is loaded once per backend.
    pub backend: Option<Backend>,
    /// Gated DeltaNet: per step, chunked, or by prompt length (`auto`).
    pub gdn: Option<GdnPath>,
    /// KV layout: sliding-window layers rotating (the default) or flat (every position), or
    /// full-attention layers paged (blocks of 16 in a pool; sliding layers keep rotating).
    pub kv: Option<KvLayout>,
    /// Speculative decoding with the checkpoint's MTP head, drafting this many tokens a round
    /// (plain decoding when unset).
    pub mtp: Option<u8>,
    /// With `mtp`: drafts forced to the plain greedy output's tokens (`correct`, every draft
    /// kept) or away from them (`wrong`, none kept), to time full and zero acceptance on
    /// weights whose own head rarely drafts well (synthetic ones). The plain run that gives
    /// the reference tokens runs first and is not timed.
    pub drafts: Option<Drafts>,
    /// With `mtp`: the draft vocabulary's bound (`engine generate --mtp-draft-vocab`; 0 for
    /// the whole vocabulary, `full` on the command line); the engine's default when unset.
    pub draft_vocab: Option<u32>,
    /// Run the request inside a continuous batch of this many requests (it and companions of
    /// other lengths), as `engine generate --prompts` does.
    pub batch: Option<u8>,
    /// Run the request as the second turn of a session whose first turn was the prompt's
    /// first half, so the cache is reused instead of prefilling from scratch.
    pub session_reuse: bool,
    /// The CPU kernels' arithmetic (`exact` when unset; `fast` quantizes decode activations
    /// for 4-bit weights, see `kernels::numerics`).
    pub numerics: Option<Numerics>,
}

/// Forced MTP drafts (see [`PathSpec::drafts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafts {
    Correct,
    Wrong,
}

impl fmt::Display for Drafts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Drafts::Correct => "correct",
            Drafts::Wrong => "wrong",
        })
    }
}

/// How sliding-window layers keep their keys and values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KvLayout {
    /// At most twice the window (the engine's default).
    #[default]
    Rotating,
    /// Every position, masked to the window: the reference the rotating cache must match.
    Flat,
    /// Full-attention layers in blocks of a pool, read through block tables.
    Paged,
}

impl fmt::Display for KvLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvLayout::Rotating => "rotating",
            KvLayout::Flat => "flat",
            KvLayout::Paged => "paged",
        })
    }
}

/// Parses one path: `default`, or `KEY=VALUE` pairs joined by `+`.
pub fn parse_path(s: &str) -> Result<PathSpec> {
    let s = s.trim();
    let mut spec = PathSpec::default();
    if s == "default" {
        return Ok(spec);
    }
    if s.is_empty() {
        bail!("empty path; valid paths: {VALID_PATHS}");
    }
    for part in s.split('+') {
        let Some((key, value)) = part.split_once('=') else {
            bail!("bad path `{part}` in `{s}`: expected KEY=VALUE; valid paths: {VALID_PATHS}");
        };
        match key.trim() {
            "gdn" => {
                if spec.gdn.is_some() {
                    bail!("path `{s}` sets `gdn` twice");
                }
                let v = GdnPath::from_str(value.trim()).map_err(|_| {
                    anyhow::anyhow!("unknown value `{value}` for path key `gdn` in `{s}`; expected one of: auto, perstep, chunked")
                })?;
                spec.gdn = Some(v);
            }
            "kv" => {
                if spec.kv.is_some() {
                    bail!("path `{s}` sets `kv` twice");
                }
                spec.kv = Some(match value.trim() {
                    "rotating" => KvLayout::Rotating,
                    "flat" => KvLayout::Flat,
                    "paged" => KvLayout::Paged,
                    _ => bail!("unknown value `{value}` for path key `kv` in `{s}`; expected one of: rotating, flat, paged"),
                });
            }
            "mtp" => {
                if spec.mtp.is_some() {
                    bail!("path `{s}` sets `mtp` twice");
                }
                spec.mtp = Some(match value.trim().parse::<u8>() {
                    Ok(d) if (1..=4).contains(&d) => d,
                    _ => bail!("unknown value `{value}` for path key `mtp` in `{s}`; expected a draft depth of 1 to 4"),
                });
            }
            "drafts" => {
                if spec.drafts.is_some() {
                    bail!("path `{s}` sets `drafts` twice");
                }
                spec.drafts = Some(match value.trim() {
                    "correct" => Drafts::Correct,
                    "wrong" => Drafts::Wrong,
                    _ => bail!("unknown value `{value}` for path key `drafts` in `{s}`; expected one of: correct, wrong"),
                });
            }
            "draft-vocab" => {
                if spec.draft_vocab.is_some() {
                    bail!("path `{s}` sets `draft-vocab` twice");
                }
                spec.draft_vocab = Some(match value.trim() {
                    "full" => 0,
                    v => match v.parse::<u32>() {
                        Ok(n) if n > 0 => n,
                        _ => bail!("unknown value `{value}` for path key `draft-vocab` in `{s}`; expected `full` or a number of token ids"),
                    },
                });
            }
            "batch" => {
                if spec.batch.is_some() {
                    bail!("path `{s}` sets `batch` twice");
                }
                spec.batch = Some(match value.trim().parse::<u8>() {
                    Ok(n) if (2..=64).contains(&n) => n,
                    _ => bail!("unknown value `{value}` for path key `batch` in `{s}`; expected a batch size of 2 to 64"),
                });
            }
            "session" => {
                if spec.session_reuse {
                    bail!("path `{s}` sets `session` twice");
                }
                match value.trim() {
                    "reuse" => spec.session_reuse = true,
                    _ => bail!(
                        "unknown value `{value}` for path key `session` in `{s}`; expected: reuse"
                    ),
                }
            }
            "numerics" => {
                if spec.numerics.is_some() {
                    bail!("path `{s}` sets `numerics` twice");
                }
                spec.numerics = Some(Numerics::from_str(value.trim()).map_err(|_| {
                    anyhow::anyhow!("unknown value `{value}` for path key `numerics` in `{s}`; expected one of: exact, fast")
                })?);
            }
            "backend" => {
                if spec.backend.is_some() {
                    bail!("path `{s}` sets `backend` twice");
                }
                let b = Backend::from_str(value.trim()).map_err(|_| {
                    anyhow::anyhow!("unknown value `{value}` for path key `backend` in `{s}`; expected one of: cpu, mlx, metal, cuda")
                })?;
                spec.backend = Some(b);
            }
            other => bail!("unknown path key `{other}` in `{s}`; valid paths: {VALID_PATHS}"),
        }
    }
    if spec.drafts.is_some() && spec.mtp.is_none() {
        bail!("path `{s}` forces drafts without `mtp`; add e.g. `mtp=2`");
    }
    if spec.draft_vocab.is_some() && spec.mtp.is_none() {
        bail!("path `{s}` sets a draft vocabulary without `mtp`; add e.g. `mtp=2`");
    }
    Ok(spec)
}

/// Parses a backend name for clap (`cpu`, `mlx`, `metal`, `cuda`).
pub fn parse_backend(s: &str) -> std::result::Result<Backend, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// Parses a comma-separated list of paths, e.g. `gdn=perstep,gdn=chunked`.
pub fn parse_paths(s: &str) -> Result<Vec<PathSpec>> {
    let paths = s.split(',').map(parse_path).collect::<Result<Vec<_>>>()?;
    Ok(paths)
}

impl PathSpec {
    /// The backend this spec runs on: its own, else the CPU.
    pub fn backend(&self) -> Backend {
        self.backend.unwrap_or_default()
    }

    /// The GDN path this spec runs: its own, else the engine's built-in `auto`.
    pub fn gdn_path(&self) -> GdnPath {
        self.gdn.unwrap_or_default()
    }

    /// Sets every key of this path on a request. Keys left unset are set to the engine's
    /// built-in default explicitly, so an inherited `GDN_KERNEL` cannot change what runs.
    pub fn apply(&self, opts: &mut RequestOptions) {
        opts.gdn_path = Some(self.gdn_path());
        opts.flat_kv = self.kv == Some(KvLayout::Flat);
        opts.kernels.numerics = self.numerics.unwrap_or_default();
        opts.paged_kv = (self.kv == Some(KvLayout::Paged)).then(PagedKv::default);
        opts.mtp = self.mtp.map(|depth| MtpOptions {
            draft_vocab: match self.draft_vocab {
                None => Some(generate::DEFAULT_DRAFT_VOCAB),
                Some(0) => None,
                Some(n) => Some(n as usize),
            },
            ..MtpOptions::new(depth as usize)
        });
    }

    /// Runs `req` the way this path says: alone, inside a batch with companions, or as the
    /// second turn of a session. The output is `req`'s own (what every path must agree on).
    pub fn generate(&self, model: &dyn CausalLm, req: &GenerateRequest) -> Result<GenerateOutput> {
        if self.batch.is_some() && self.session_reuse {
            bail!("path {self}: `batch` and `session` do not combine");
        }
        if self.drafts.is_some() && self.session_reuse {
            bail!("path {self}: forced `drafts` run alone or in a batch, not in a session");
        }
        if let Some(n) = self.batch {
            // Companions: the same prompt cut to other lengths and shifted, with other
            // budgets, so sequences join and leave around `req` at different steps.
            let mut reqs = vec![req.clone()];
            let ids = &req.prompt_ids;
            for c in 1..n as usize {
                let mut r = req.clone();
                let len = (ids.len() * (c % 4 + 1)).div_ceil(4).max(1);
                r.prompt_ids = ids[..len].iter().rev().copied().collect();
                r.max_tokens = req.max_tokens / 2 + 3 * c;
                reqs.push(r);
            }
            // Forced drafts: each sequence's from its own plain output.
            for r in reqs.iter_mut() {
                *r = self.forced(model, r)?;
            }
            let opts = BatchOptions {
                max_batch: n as usize,
            };
            let mut outs = generate::generate_batch(model, &reqs, opts, |_, _| {})?;
            return Ok(outs.swap_remove(0));
        }
        if self.drafts.is_some() {
            return generate::generate(model, &self.forced(model, req)?, |_| {});
        }
        if self.session_reuse {
            let mut session = Session::new(model);
            let mut first = req.clone();
            first.prompt_ids.truncate(req.prompt_ids.len().div_ceil(2));
            first.max_tokens = 3;
            session.generate(&first, |_| {})?;
            return Ok(session.generate(req, |_| {})?.output);
        }
        generate::generate(model, req, |_| {})
    }

    /// `req` with its MTP drafts forced as `drafts=` asks (the reference is its own plain
    /// output, run first); `req` itself without `drafts=` or `mtp=`.
    fn forced(&self, model: &dyn CausalLm, req: &GenerateRequest) -> Result<GenerateRequest> {
        let (Some(drafts), Some(mtp)) = (self.drafts, &req.mtp) else {
            return Ok(req.clone());
        };
        let mut plain = req.clone();
        plain.mtp = None;
        let reference = generate::generate(model, &plain, |_| {})?.tokens;
        let correct = match drafts {
            Drafts::Correct => mtp.depth,
            Drafts::Wrong => 0,
        };
        let mut forced = req.clone();
        forced.mtp = Some(MtpOptions {
            forced: Some(ForcedDrafts { reference, correct }),
            ..mtp.clone()
        });
        Ok(forced)
    }

    /// The same for a fresh state driven through `CausalLm::forward` directly.
    pub fn apply_state(&self, state: ModelState) -> Result<ModelState> {
        let mut state = match self.kv {
            Some(KvLayout::Flat) => state.with_flat_kv()?,
            Some(KvLayout::Paged) => {
                let p = PagedKv::default();
                let pool = KvPool::for_state(&state, p.block_size, STATE_POOL_BLOCKS)?;
                state.with_paged_kv(&pool)?
            }
            _ => state,
        };
        state.gdn_path = self.gdn_path();
        Ok(state)
    }
}

/// The canonical spelling: `default`, or the set keys in a fixed order joined by `+`.
impl fmt::Display for PathSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys = Vec::new();
        if let Some(b) = self.backend {
            keys.push(format!("backend={b}"));
        }
        if let Some(g) = self.gdn {
            keys.push(format!("gdn={g}"));
        }
        if let Some(k) = self.kv {
            keys.push(format!("kv={k}"));
        }
        if let Some(d) = self.mtp {
            keys.push(format!("mtp={d}"));
        }
        if let Some(d) = self.drafts {
            keys.push(format!("drafts={d}"));
        }
        match self.draft_vocab {
            Some(0) => keys.push("draft-vocab=full".to_string()),
            Some(n) => keys.push(format!("draft-vocab={n}")),
            None => {}
        }
        if let Some(n) = self.batch {
            keys.push(format!("batch={n}"));
        }
        if self.session_reuse {
            keys.push("session=reuse".to_string());
        }
        if let Some(n) = self.numerics {
            keys.push(format!("numerics={n}"));
        }
        if keys.is_empty() {
            write!(f, "default")
        } else {
            write!(f, "{}", keys.join("+"))
        }
    }
}

impl FromStr for PathSpec {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<PathSpec> {
        parse_path(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        for s in [
            "default",
            "gdn=perstep",
            "gdn=chunked",
            "gdn=auto",
            "backend=mlx",
            "backend=cpu+gdn=chunked",
            "kv=flat",
            "backend=mlx+gdn=perstep+kv=rotating",
            "mtp=2",
            "gdn=perstep+mtp=4",
            "mtp=2+drafts=correct",
            "mtp=3+drafts=wrong",
            "mtp=2+drafts=correct+draft-vocab=full",
            "mtp=2+draft-vocab=4096",
            "kv=paged+batch=8",
            "gdn=chunked+session=reuse",
            "numerics=fast",
            "kv=paged+batch=8+numerics=exact",
        ] {
            assert_eq!(parse_path(s).unwrap().to_string(), s);
        }
        assert_eq!(
            parse_path("gdn=per-step").unwrap().gdn,
            Some(GdnPath::PerStep)
        );
        let list = parse_paths("gdn=perstep,gdn=chunked").unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1].gdn, Some(GdnPath::Chunked));
        let p = parse_path("gdn=perstep+backend=mlx").unwrap();
        assert_eq!((p.backend(), p.gdn), (Backend::Mlx, Some(GdnPath::PerStep)));
        assert_eq!(p.to_string(), "backend=mlx+gdn=perstep");
        assert_eq!(PathSpec::default().backend(), Backend::Cpu);
    }

    #[test]
    fn rejects_unknown_keys_and_values_with_the_valid_ones() {
        let e = parse_path("paged=on").unwrap_err().to_string();
        assert!(
            e.contains("unknown path key `paged`") && e.contains("gdn=auto|perstep|chunked"),
            "{e}"
        );
        for (bad, want) in [
            ("batch=1", "batch size of 2 to 64"),
            ("batch=65", "batch size of 2 to 64"),
            ("session=fresh", "expected: reuse"),
            ("batch=2+batch=3", "twice"),
            ("drafts=correct", "without `mtp`"),
            ("mtp=2+drafts=right", "correct, wrong"),
            ("draft-vocab=full", "without `mtp`"),
            ("mtp=2+draft-vocab=0", "`full` or a number"),
        ] {
            let e = parse_path(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
        for bad in ["mtp=on", "mtp=0", "mtp=5"] {
            let e = parse_path(bad).unwrap_err().to_string();
            assert!(e.contains("draft depth of 1 to 4"), "{e}");
        }
        let e = parse_path("kv=pages").unwrap_err().to_string();
        assert!(
            e.contains("`pages`") && e.contains("rotating, flat, paged"),
            "{e}"
        );
        let e = parse_path("gdn=fast").unwrap_err().to_string();
        assert!(
            e.contains("`fast`") && e.contains("perstep, chunked"),
            "{e}"
        );
        let e = parse_path("backend=tpu").unwrap_err().to_string();
        assert!(e.contains("`tpu`") && e.contains("cpu, mlx, metal"), "{e}");
        for bad in [
            "",
            "gdn",
            "gdn=perstep+gdn=chunked",
            "gdn=perstep,",
            "backend=cpu+backend=mlx",
            "kv=flat+kv=flat",
        ] {
            assert!(parse_paths(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn apply_pins_the_default_against_the_environment() {
        let mut o = RequestOptions::default();
        PathSpec::default().apply(&mut o);
        assert_eq!(o.gdn_path, Some(GdnPath::Auto));
        assert!(!o.flat_kv);
        parse_path("gdn=chunked+kv=flat").unwrap().apply(&mut o);
        assert_eq!(o.gdn_path, Some(GdnPath::Chunked));
        assert!(o.flat_kv);
    }
}
