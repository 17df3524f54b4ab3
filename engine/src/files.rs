//! Opening the files of a checkpoint folder, which is untrusted input: only regular files are
//! opened (a named pipe would block the loader forever, a device such as `/dev/zero` would feed
//! it without end), and text files are read only up to a size limit, before anything is
//! allocated for them. Folders this project writes (imports, quantized copies) appear whole or
//! not at all ([`write_new_folder`]).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};

/// config.json, generation_config.json, tokenizer_config.json, the shard index, chat templates:
/// the largest real ones are a few hundred KiB.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// tokenizer.json: the largest real ones (Gemma's 262k-token vocabularies) are ~35 MiB.
pub const MAX_TOKENIZER_BYTES: u64 = 512 << 20;

/// Whether `path` exists at all (a broken link counts as present, so opening it names it).
pub fn exists(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}

/// Opens `path` for reading after checking (through links) that it is a regular file.
pub fn open_regular(path: &Path) -> Result<File> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("{}: cannot read", path.display()))?;
    if !meta.is_file() {
        bail!(
            "{}: not a regular file ({}); a checkpoint folder holds plain files",
            path.display(),
            kind(&meta.file_type())
        );
    }
    File::open(path).with_context(|| format!("{}: cannot read", path.display()))
}

/// Reads a regular text file of at most `limit` bytes.
pub fn read_text(path: &Path, limit: u64) -> Result<String> {
    let file = open_regular(path)?;
    let size = file
        .metadata()
        .with_context(|| format!("{}: cannot read file size", path.display()))?
        .len();
    if size > limit {
        bail!(
            "{}: {size} bytes is more than the {limit} bytes such a file may have",
            path.display()
        );
    }
    let mut text = String::with_capacity(size as usize);
    // `take` guards against a file that grows while it is read.
    file.take(limit)
        .read_to_string(&mut text)
        .with_context(|| format!("{}: cannot read (not UTF-8 text?)", path.display()))?;
    Ok(text)
}

fn kind(t: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a named pipe";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a folder"
    } else {
        "not a plain file"
    }
}

/// Runs `write` on a scratch folder beside `out` (named with `what` and this process's id), then
/// renames it to `out`, which must not exist: a failure removes the scratch folder, so nothing
/// half-written is left at either place.
pub fn write_new_folder<T>(
    out: &Path,
    what: &str,
    write: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    ensure!(
        !out.exists(),
        "{}: already exists; choose a new folder",
        out.display()
    );
    let tmp = out.with_extension(format!("{what}-{}", std::process::id()));
    let result = write(&tmp).and_then(|v| Ok(std::fs::rename(&tmp, out).map(|()| v)?));
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}
