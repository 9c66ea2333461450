//! Anonymous shared files: memory another process can map once it holds the file descriptor.
//!
//! A file in `/dev/shm` (tmpfs: memory, not disk), unlinked as soon as it is open, so that it lives
//! exactly as long as some process holds it (like a memfd, without an unsafe call). The simulator
//! keeps an exported buffer's bytes in one; on real GPUs shared pinned host memory is one mapped
//! and registered with the driver.

use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where the files are made: tmpfs where the host has it, else the temporary directory.
fn directory() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Shared files are a whole number of this many bytes (a multiple of every page size Linux uses),
/// so that a mapping of the first `bytes` never touches a page that lies partly past the file's end.
const GRAIN: u64 = 64 << 10;

/// A new shared file of at least `bytes` zero bytes, already unlinked.
pub(crate) fn create(bytes: usize) -> Result<File> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "peerlink-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let path = directory().join(name);
    let io_error = |source| Error::Io {
        path: path.clone(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(io_error)?;
    std::fs::remove_file(&path).map_err(io_error)?;
    file.set_len((bytes as u64).div_ceil(GRAIN) * GRAIN)
        .map_err(io_error)?;
    Ok(file)
}

/// Refuses a received file shorter than the `len` bytes its descriptor promises.
pub(crate) fn check_len(file: &File, len: usize) -> Result<()> {
    let size = file
        .metadata()
        .map_err(|source| Error::Io {
            path: PathBuf::from("(shared buffer's file descriptor)"),
            source,
        })?
        .len();
    if size < len as u64 {
        return Err(Error::usage(format!(
            "the shared buffer's file holds {size} bytes but its descriptor says {len}: the file \
             descriptor does not belong to this descriptor; send both from one export"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    #[test]
    fn a_shared_file_is_zeroed_unlinked_and_shared_by_its_clones() {
        let file = create(64).unwrap();
        assert_eq!(file.metadata().unwrap().len(), GRAIN);
        let other = file.try_clone().unwrap();
        file.write_all_at(&[7; 8], 8).unwrap();
        let mut out = [1; 16];
        other.read_exact_at(&mut out, 0).unwrap();
        assert_eq!(out[..8], [0; 8]);
        assert_eq!(out[8..], [7; 8]);
        assert_eq!(file.metadata().unwrap().nlink(), 0);
        check_len(&file, GRAIN as usize).unwrap();
        let longer = GRAIN as usize + 1;
        assert!(matches!(check_len(&file, longer), Err(Error::Usage(_))));
    }
}
