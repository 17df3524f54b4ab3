//! Kernel parameter lists read from the CUDA sources, so every launch is checked against the
//! kernel it calls: a wrong count or type of argument would otherwise be silent memory
//! corruption on the GPU. The check runs on the host before each launch (parsed once per kernel).

use super::sources::Source;

/// How a kernel parameter is passed: device pointers as 64-bit addresses, then the scalars.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Ptr,
    I32,
    I64,
    U32,
    F32,
}

/// The parameter kinds of kernel `name` in `src`: a plain `extern "C" __global__ void name(`,
/// or an instance of a macro template `void prefix_##NAME(` (`matvec_bf16` from
/// `matvec_##NAME`). `None` when the source declares no such kernel or a parameter type is not
/// one the launcher passes.
pub fn params(src: &Source, name: &str) -> Option<Vec<Kind>> {
    let text = src.text;
    let direct = format!("__global__ void {name}(");
    let start = match text.find(&direct) {
        Some(i) => i + direct.len(),
        None => {
            let (prefix, _) = name.rsplit_once('_')?;
            let templ = format!("__global__ void {prefix}_##NAME(");
            text.find(&templ)? + templ.len()
        }
    };
    let list = &text[start..start + text[start..].find(')')?];
    list.replace('\\', " ")
        .split(',')
        .map(|p| {
            let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
            Some(match p.as_str() {
                _ if p.contains('*') => Kind::Ptr,
                _ if p.starts_with("int ") => Kind::I32,
                _ if p.starts_with("i64 ") => Kind::I64,
                _ if p.starts_with("u32 ") => Kind::U32,
                _ if p.starts_with("float ") => Kind::F32,
                _ => return None,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::sources::{ELEMENTWISE, SOURCES, WEIGHTS};

    #[test]
    fn every_kernel_parameter_has_a_kind_the_launcher_passes() {
        for src in SOURCES {
            for (i, _) in src.text.match_indices("__global__ void ") {
                let rest = &src.text[i + "__global__ void ".len()..];
                let name = &rest[..rest.find('(').unwrap()];
                let name = name.replace("##NAME", "x");
                assert!(
                    params(&src, &name).is_some(),
                    "{}: kernel {name} has a parameter type the launcher cannot pass",
                    src.name
                );
            }
        }
    }

    #[test]
    fn plain_and_templated_kernels_are_read() {
        use Kind::*;
        assert_eq!(
            params(&ELEMENTWISE, "unary").unwrap(),
            [Ptr, Ptr, I64, I32, F32]
        );
        assert_eq!(
            params(&WEIGHTS, "matvec_bf16").unwrap(),
            [Ptr, Ptr, Ptr, I32, I32, Ptr, Ptr, I32, I32, I32]
        );
        assert_ne!(
            params(&ELEMENTWISE, "unary").unwrap(),
            [Ptr, Ptr, I32, I32, F32],
            "a 32-bit count where the kernel takes i64 must not pass"
        );
        assert!(params(&ELEMENTWISE, "no_such_kernel").is_none());
    }
}
