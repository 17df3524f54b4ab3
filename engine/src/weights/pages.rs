//! Where a checkpoint's bytes live while the CPU computes with them.
//!
//! A memory map views the page cache in 4 KiB pages. Decode reads every weight once per token,
//! so a 1.2 GB model walks some 300 000 pages a token, and nearly every one misses the TLB:
//! on a 2-core Zen 2, bench Qwen3 bf16 decoded at 13.8 tok/s from the map and at 17.8 from a
//! copy in 2 MiB pages, the same kernels reading the same bytes. So for the CPU backend each
//! file is copied once into anonymous memory advised for transparent huge pages
//! (`MADV_HUGEPAGE`), 2 MiB aligned, and the map is dropped.
//!
//! The copy is skipped, and the map kept, where it cannot help or might hurt: off Linux, when
//! the kernel's transparent huge pages are `never`, when the file would not fit in available
//! memory with room to spare (a map can page a model larger than memory; a copy cannot), when
//! the anonymous map fails, and when `ENGINE_HUGE_PAGES=off`. Other backends upload the
//! weights to their device, so they keep the map.

use std::sync::Arc;

use anyhow::{bail, Result};
use kernels::{ByteOwner, Bytes};
use memmap2::Mmap;

/// The environment variable that turns the copy off (`off`) or leaves it to [`Pages::for_cpu`]
/// (`auto`, the default).
pub const ENV: &str = "ENGINE_HUGE_PAGES";

/// How a loader keeps a file's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pages {
    /// Views of the memory map (zero-copy; what other backends upload from).
    Mapped,
    /// A copy in huge-page-advised memory where the machine allows it, else the map.
    Huge,
}

impl Pages {
    /// For weights the CPU backend computes with: [`Pages::Huge`] unless [`ENV`] says `off`.
    pub fn for_cpu() -> Result<Pages> {
        Pages::parse(std::env::var(ENV).ok().as_deref())
    }

    /// The value of [`ENV`] (`None` when unset).
    fn parse(value: Option<&str>) -> Result<Pages> {
        let Some(v) = value else {
            return Ok(Pages::Huge);
        };
        match v.trim().to_ascii_lowercase().as_str() {
            "" | "auto" | "on" | "1" => Ok(Pages::Huge),
            "off" | "0" => Ok(Pages::Mapped),
            _ => bail!("{ENV}={v:?}: expected `auto` (the default) or `off`"),
        }
    }
}

/// The 2 MiB of a transparent huge page on x86-64 and aarch64 with 4 KiB base pages.
const HUGE: usize = 2 << 20;

/// A file's bytes copied into anonymous memory that starts on a huge-page boundary.
struct HugeCopy {
    map: memmap2::MmapMut,
    start: usize,
    len: usize,
}

impl ByteOwner for HugeCopy {
    fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

/// The bytes of `map` (a whole file) as `pages` asks, where the machine allows.
pub(crate) fn place(map: Mmap, pages: Pages) -> Bytes {
    if pages == Pages::Huge && worth_copying(map.len()) {
        if let Some(copy) = huge_copy(&map) {
            return Bytes::new(Arc::new(copy));
        }
    }
    Bytes::new(Arc::new(MappedFile(map)))
}

/// A memory-mapped file as the owner of tensor bytes, so tensors view the page cache directly.
struct MappedFile(Mmap);

impl ByteOwner for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Huge pages are on, and `len` bytes fit in available memory with room to spare (an eighth,
/// at least 1 GiB). Unknown means no.
fn worth_copying(len: usize) -> bool {
    let (Some(enabled), Some(available)) = (thp_enabled(), mem_available()) else {
        return false;
    };
    let room = (len as u64 / 8).max(1 << 30);
    enabled && (len as u64).saturating_add(room) <= available
}

/// Whether transparent huge pages can back an advised region: the mode the kernel selects
/// (bracketed in sysfs) is `always` or `madvise`. `None` off Linux or when unreadable.
fn thp_enabled() -> Option<bool> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let mode = text.split_whitespace().find(|w| w.starts_with('['))?;
    Some(mode != "[never]")
}

/// `MemAvailable` from /proc/meminfo, in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `src` copied into a fresh anonymous map, advised for huge pages before its first touch, the
/// bytes starting on a 2 MiB boundary (file offsets keep their alignment). `None` when the
/// map or the advice is refused.
#[cfg(target_os = "linux")]
fn huge_copy(src: &[u8]) -> Option<HugeCopy> {
    use rayon::prelude::*;
    let len = src.len();
    let mut map = memmap2::MmapOptions::new()
        .len(len.checked_add(HUGE)?)
        .map_anon()
        .ok()?;
    map.advise(memmap2::Advice::HugePage).ok()?;
    let start = map.as_ptr().align_offset(HUGE);
    // Each thread faults in and fills its own huge pages.
    map[start..start + len]
        .par_chunks_mut(HUGE)
        .zip(src.par_chunks(HUGE))
        .for_each(|(dst, src)| dst.copy_from_slice(src));
    Some(HugeCopy { map, start, len })
}

#[cfg(not(target_os = "linux"))]
fn huge_copy(_src: &[u8]) -> Option<HugeCopy> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_reads_auto_and_off_and_refuses_the_rest() {
        let cases = [
            (None, Pages::Huge),
            (Some("auto"), Pages::Huge),
            (Some(""), Pages::Huge),
            (Some("off"), Pages::Mapped),
            (Some(" OFF "), Pages::Mapped),
            (Some("0"), Pages::Mapped),
        ];
        for (v, want) in cases {
            assert_eq!(Pages::parse(v).unwrap(), want, "{v:?}");
        }
        let e = Pages::parse(Some("sometimes")).unwrap_err().to_string();
        assert!(e.contains(ENV) && e.contains("sometimes"), "{e}");
    }

    /// The copy holds the file's bytes at a huge-page boundary, past several huge pages and a
    /// ragged end.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_copy_holds_the_same_bytes_on_a_huge_page_boundary() {
        let len = 3 * HUGE + 12_345;
        let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let copy = huge_copy(&src).expect("an anonymous map");
        assert_eq!(copy.bytes().as_ptr() as usize % HUGE, 0);
        assert_eq!(copy.bytes().len(), len);
        assert!(copy.bytes() == &src[..], "the copy differs from its source");
    }
}
