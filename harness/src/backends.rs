//! One checkpoint folder loaded on every backend a run compares (the CPU and MLX, say), each
//! loaded once: parity, sweeps and goldens ask for a path's backend and get its pipeline. MLX
//! keeps weights in a form chosen by the numerics (stored dtypes for `fast`, f32 for `exact`),
//! so there a folder is loaded once per numerics its paths use.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use engine::{Backend, Pipeline};
use kernels::numerics::Numerics;

use crate::paths::PathSpec;

pub struct Loaded {
    dir: PathBuf,
    /// Keyed by backend and `Backend::resident_numerics`.
    pipelines: Vec<((Backend, Numerics), Pipeline)>,
}

impl Loaded {
    /// Nothing loaded yet; [`Loaded::ensure`] loads on demand.
    pub fn new(dir: &Path) -> Loaded {
        Loaded {
            dir: dir.to_path_buf(),
            pipelines: Vec::new(),
        }
    }

    /// `dir` loaded on every backend `paths` name (the CPU for paths that name none).
    pub fn for_paths(dir: &Path, paths: &[PathSpec]) -> Result<Loaded> {
        let mut l = Loaded::new(dir);
        for p in paths {
            l.ensure(p.backend(), p.numerics.unwrap_or_default())?;
        }
        Ok(l)
    }

    /// An already loaded CPU pipeline.
    pub fn from_cpu(p: Pipeline) -> Loaded {
        Loaded {
            dir: p.dir.clone(),
            pipelines: vec![((Backend::Cpu, Numerics::Exact), p)],
        }
    }

    /// Loads the folder on `backend` for `numerics` unless it already is.
    pub fn ensure(&mut self, backend: Backend, numerics: Numerics) -> Result<&Pipeline> {
        let key = (backend, backend.resident_numerics(numerics));
        if let Some(i) = self.pipelines.iter().position(|(k, _)| *k == key) {
            return Ok(&self.pipelines[i].1);
        }
        let p = Pipeline::load_for(&self.dir, backend, numerics)?;
        self.pipelines.push((key, p));
        Ok(&self.pipelines.last().expect("just pushed").1)
    }

    /// The pipeline on `backend` for `numerics`, which must have been loaded.
    pub fn get(&self, backend: Backend, numerics: Numerics) -> Result<&Pipeline> {
        let key = (backend, backend.resident_numerics(numerics));
        self.pipelines
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, p)| p)
            .ok_or_else(|| anyhow!("{} is not loaded on {backend}", self.dir.display()))
    }

    /// The pipeline for a path's backend and numerics.
    pub fn for_path(&self, path: &PathSpec) -> Result<&Pipeline> {
        self.get(path.backend(), path.numerics.unwrap_or_default())
    }

    /// Any loaded pipeline (the tokenizer and config are the same on every backend).
    pub fn first(&self) -> Result<&Pipeline> {
        self.pipelines
            .first()
            .map(|(_, p)| p)
            .ok_or_else(|| anyhow!("{} is not loaded on any backend", self.dir.display()))
    }
}
