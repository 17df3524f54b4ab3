//! One checkpoint folder loaded on every backend a run compares (the CPU and MLX, say), each
//! loaded once: parity, sweeps and goldens ask for a path's backend and get its pipeline.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};
use engine::{Backend, Pipeline};

use crate::paths::PathSpec;

pub struct Loaded {
    dir: PathBuf,
    pipelines: Vec<(Backend, Pipeline)>,
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
            l.ensure(p.backend())?;
        }
        Ok(l)
    }

    /// An already loaded CPU pipeline.
    pub fn from_cpu(p: Pipeline) -> Loaded {
        Loaded {
            dir: p.dir.clone(),
            pipelines: vec![(Backend::Cpu, p)],
        }
    }

    /// Loads the folder on `backend` unless it already is.
    pub fn ensure(&mut self, backend: Backend) -> Result<&Pipeline> {
        if let Some(i) = self.pipelines.iter().position(|(b, _)| *b == backend) {
            return Ok(&self.pipelines[i].1);
        }
        let p = Pipeline::load_on(&self.dir, backend)?;
        self.pipelines.push((backend, p));
        Ok(&self.pipelines.last().expect("just pushed").1)
    }

    /// The pipeline on `backend`, which must have been loaded.
    pub fn get(&self, backend: Backend) -> Result<&Pipeline> {
        self.pipelines
            .iter()
            .find(|(b, _)| *b == backend)
            .map(|(_, p)| p)
            .ok_or_else(|| anyhow!("{} is not loaded on {backend}", self.dir.display()))
    }

    /// The pipeline for a path's backend.
    pub fn for_path(&self, path: &PathSpec) -> Result<&Pipeline> {
        self.get(path.backend())
    }

    /// Any loaded pipeline (the tokenizer and config are the same on every backend).
    pub fn first(&self) -> Result<&Pipeline> {
        self.pipelines
            .first()
            .map(|(_, p)| p)
            .ok_or_else(|| anyhow!("{} is not loaded on any backend", self.dir.display()))
    }
}
