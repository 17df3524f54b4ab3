//! Which rows are the baseline and which the comparison: a value along one dimension (path,
//! commit, machine, backend or label), as `--baseline`/`--compare` name them.

use std::fmt;

use anyhow::{bail, Result};
use serde::Serialize;

use crate::sweep::Measurement;

/// A dimension measurements differ along besides model and prompt length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dim {
    Path,
    Commit,
    Machine,
    Backend,
    Label,
}

impl Dim {
    pub const ALL: [Dim; 5] = [
        Dim::Path,
        Dim::Commit,
        Dim::Machine,
        Dim::Backend,
        Dim::Label,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dim::Path => "path",
            Dim::Commit => "commit",
            Dim::Machine => "machine",
            Dim::Backend => "backend",
            Dim::Label => "label",
        }
    }

    fn from_name(s: &str) -> Option<Dim> {
        Dim::ALL.into_iter().find(|d| d.name() == s)
    }

    /// A row's value along this dimension, as shown in tables (`-` when unrecorded).
    pub fn value(self, row: &Measurement) -> String {
        match self {
            Dim::Path => row.path.clone(),
            Dim::Commit => row.commit.clone().unwrap_or_else(|| "-".into()),
            Dim::Machine => row.machine.to_string(),
            Dim::Backend => row.backend.clone(),
            Dim::Label => row.label.clone().unwrap_or_else(|| "-".into()),
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--baseline`/`--compare`: `DIM=VALUE` for a known dimension (`commit=abc1234`,
/// `machine=EPYC`, `label=before`, `path=gdn=chunked`), otherwise the whole text is a path
/// (`gdn=chunked`, `default`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub dim: Dim,
    pub value: String,
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector> {
        let s = s.trim();
        if s.is_empty() {
            bail!("empty selector: give a path (gdn=chunked) or DIM=VALUE with DIM one of path, commit, machine, backend, label");
        }
        if let Some((key, value)) = s.split_once('=') {
            // `backend=mlx+gdn=chunked` is a path whose first key is named like a dimension,
            // not the backend `mlx+gdn=chunked`: dimension values never hold `=`.
            let dim =
                Dim::from_name(key.trim()).filter(|&d| d == Dim::Path || !value.contains('='));
            if let Some(dim) = dim {
                let value = value.trim();
                if value.is_empty() {
                    bail!("`{s}`: no value after `{key}=`");
                }
                return Ok(Selector::new(dim, value));
            }
        }
        Ok(Selector::new(Dim::Path, s))
    }

    /// Paths are stored in canonical spelling; a selector's path is canonicalised the same way
    /// when it parses (so `gdn=per-step` finds `gdn=perstep` rows).
    pub fn new(dim: Dim, value: &str) -> Selector {
        let value = match dim {
            Dim::Path => crate::paths::parse_path(value)
                .map(|p| p.to_string())
                .unwrap_or_else(|_| value.to_string()),
            _ => value.to_string(),
        };
        Selector { dim, value }
    }

    /// Commits match by prefix (short or long hashes), machines by case-insensitive substring
    /// of `CPU (N cores)`, the rest exactly.
    pub fn matches(&self, row: &Measurement) -> bool {
        let v = self.dim.value(row);
        match self.dim {
            Dim::Commit => v.starts_with(&self.value) || (self.value.starts_with(&v) && v != "-"),
            Dim::Machine => v.to_lowercase().contains(&self.value.to_lowercase()),
            _ => v == self.value,
        }
    }

    /// The name of this side in headers: the value, or `DIM=VALUE` for dimensions other than
    /// path.
    pub fn label(&self) -> String {
        match self.dim {
            Dim::Path => self.value.clone(),
            d => format!("{d}={}", self.value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_dims_and_falls_back_to_paths() {
        assert_eq!(
            Selector::parse("commit=abc").unwrap(),
            Selector {
                dim: Dim::Commit,
                value: "abc".into()
            }
        );
        assert_eq!(
            Selector::parse("gdn=chunked").unwrap(),
            Selector {
                dim: Dim::Path,
                value: "gdn=chunked".into()
            }
        );
        assert_eq!(
            Selector::parse("path=gdn=per-step").unwrap().value,
            "gdn=perstep"
        );
        assert_eq!(Selector::parse("default").unwrap().dim, Dim::Path);
        assert_eq!(
            Selector::parse("backend=mlx+gdn=chunked").unwrap(),
            Selector {
                dim: Dim::Path,
                value: "backend=mlx+gdn=chunked".into()
            }
        );
        assert_eq!(
            Selector::parse("backend=mlx-cpu").unwrap().dim,
            Dim::Backend
        );
        assert!(Selector::parse("commit=").is_err());
        assert!(Selector::parse(" ").is_err());
    }
}
