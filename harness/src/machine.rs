//! What a measurement ran on: the CPU model, its core count, the backend and the source commit.
//! Benchmarks record these beside every number so that results from different machines or
//! commits are never mixed up silently (docs/design.md §8).

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

/// The machine part of a measurement's identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Machine {
    /// `model name` from /proc/cpuinfo (or the platform's equivalent), e.g. `AMD EPYC 7B13`.
    pub cpu: String,
    /// Logical cores available to this process.
    pub cores: usize,
}

impl Machine {
    pub fn current() -> Machine {
        Machine {
            cpu: cpu_model(),
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} cores)", self.cpu, self.cores)
    }
}

/// The CPU's marketing name; `unknown` when the platform does not say.
pub fn cpu_model() -> String {
    let from_cpuinfo = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                // x86 says `model name`; some ARM kernels only say `Hardware` or `CPU part`.
                matches!(key.trim(), "model name" | "Hardware" | "cpu model")
                    .then(|| value.split_whitespace().collect::<Vec<_>>().join(" "))
                    .filter(|v| !v.is_empty())
            })
        });
    from_cpuinfo
        .or_else(|| command_output("sysctl", &["-n", "machdep.cpu.brand_string"], None))
        .unwrap_or_else(|| "unknown".to_string())
}

/// The backend measurements run on. Only the CPU backend exists so far; CUDA and MLX builds
/// will report theirs here.
pub fn backend() -> String {
    "cpu".to_string()
}

/// `git rev-parse --short HEAD` of the workspace, with `-dirty` when tracked files differ from
/// it (so a before/after of an uncommitted change is not labelled as the commit itself);
/// `None` outside a git checkout or without git.
pub fn commit() -> Option<String> {
    let root = synth::workspace_root();
    let head = command_output("git", &["rev-parse", "--short", "HEAD"], Some(&root))?;
    let dirty = command_output(
        "git",
        &["status", "--porcelain", "--untracked-files=no"],
        Some(&root),
    )
    .is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}-dirty") } else { head })
}

fn command_output(program: &str, args: &[&str], dir: Option<&Path>) -> Option<String> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let out = cmd.output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_machine_is_described() {
        let m = Machine::current();
        assert!(!m.cpu.is_empty());
        assert!(m.cores >= 1);
        assert!(m.to_string().contains("cores"));
    }
}
