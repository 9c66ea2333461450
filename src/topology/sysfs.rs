//! A read-only view of a host's /sys and /proc under one root directory: `/` on a real host, a
//! directory of fake files in tests (or a tree captured from another host). Every read answers
//! `None` (or nothing, or why) where the file is not there or cannot be read — a container, a kernel
//! without the file, config space only root may read — so callers say "unknown" instead of failing.
//! Nothing here writes. The topology reads NICs and NUMA nodes through it, the doctor the PCIe tree,
//! the IOMMU and ACS ([`crate::doctor`]).

use std::path::{Path, PathBuf};

/// /sys and /proc under `root`.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Sysfs {
    /// This host's own /sys and /proc.
    pub fn system() -> Sysfs {
        Sysfs::at("/")
    }

    /// The tree under `root` (which holds `sys/…` and `proc/…`).
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// The directory the tree is read under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.join(relative.trim_start_matches('/'))
    }

    /// The bytes of a file (a device's PCI config space), or why it could not be read (its path
    /// and the system's reason).
    pub fn read_bytes(&self, relative: &str) -> Result<Vec<u8>, String> {
        let path = self.path(relative);
        std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// How many entries a directory holds; `None` where it does not exist.
    pub fn count(&self, relative: &str) -> Option<usize> {
        Some(std::fs::read_dir(self.path(relative)).ok()?.count())
    }

    /// The text of a file (`sys/module/nvidia/version`), trimmed; `None` where it cannot be read.
    pub fn read(&self, relative: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.path(relative)).ok()?;
        Some(text.trim().to_string())
    }

    /// The host's name as the kernel has it (`proc/sys/kernel/hostname`, else `etc/hostname`);
    /// `None` where neither names one.
    pub fn host_name(&self) -> Option<String> {
        ["proc/sys/kernel/hostname", "etc/hostname"]
            .iter()
            .filter_map(|path| self.read(path))
            .find(|name| !name.is_empty())
    }

    /// This boot's id (`proc/sys/kernel/random/boot_id`): processes that read the same one run
    /// on one host, whatever its name.
    pub fn boot_id(&self) -> Option<String> {
        self.read("proc/sys/kernel/random/boot_id")
            .filter(|id| !id.is_empty())
    }

    /// Whether a file or directory exists.
    pub fn exists(&self, relative: &str) -> bool {
        self.path(relative).exists()
    }

    /// The names in a directory, sorted; none where it does not exist.
    pub fn entries(&self, relative: &str) -> Vec<String> {
        let Ok(dir) = std::fs::read_dir(self.path(relative)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = dir
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// Where `relative` really is, every link followed: an absolute path; `None` where it does not
    /// exist.
    pub fn real_path(&self, relative: &str) -> Option<PathBuf> {
        self.path(relative).canonicalize().ok()
    }

    /// Where `relative` really is, every link followed, as a path under the root
    /// (`sys/devices/pci0000:00/0000:00:01.0/…`); `None` where it does not exist or leads out of
    /// the root.
    pub fn resolve(&self, relative: &str) -> Option<String> {
        let real = self.real_path(relative)?;
        let root = self.root.canonicalize().ok()?;
        let inside: &Path = real.strip_prefix(&root).ok()?;
        Some(inside.to_str()?.to_string())
    }

    /// `lspci -D -vvv`'s output: run on the host itself; a tree under another root may carry it
    /// as `lspci-vvv.txt`. `None` where there is none (no lspci, or it failed).
    pub fn lspci(&self) -> Option<String> {
        if self.root != Path::new("/") {
            return std::fs::read_to_string(self.path("lspci-vvv.txt")).ok();
        }
        let out = std::process::Command::new("lspci")
            .args(["-D", "-vvv"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_named_by_the_kernel_then_etc_and_the_boot_by_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let sysfs = Sysfs::at(dir.path());
        assert_eq!((sysfs.host_name(), sysfs.boot_id()), (None, None));
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(dir.path().join("etc/hostname"), "from-etc\n").unwrap();
        assert_eq!(sysfs.host_name().as_deref(), Some("from-etc"));
        std::fs::create_dir_all(dir.path().join("proc/sys/kernel/random")).unwrap();
        std::fs::write(dir.path().join("proc/sys/kernel/hostname"), "node17\n").unwrap();
        std::fs::write(dir.path().join("proc/sys/kernel/random/boot_id"), "b00t\n").unwrap();
        assert_eq!(sysfs.host_name().as_deref(), Some("node17"));
        assert_eq!(sysfs.boot_id().as_deref(), Some("b00t"));
    }

    #[test]
    fn reads_under_its_root_and_says_none_for_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/devices/pci0000:00/0000:00:01.0")).unwrap();
        std::fs::write(
            dir.path()
                .join("sys/devices/pci0000:00/0000:00:01.0/numa_node"),
            "1\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:01.0",
            dir.path().join("sys/bus/pci/devices/0000:00:01.0"),
        )
        .unwrap();
        let sysfs = Sysfs::at(dir.path());
        assert_eq!(
            sysfs
                .read("sys/bus/pci/devices/0000:00:01.0/numa_node")
                .as_deref(),
            Some("1")
        );
        assert_eq!(
            sysfs.resolve("sys/bus/pci/devices/0000:00:01.0").as_deref(),
            Some("sys/devices/pci0000:00/0000:00:01.0")
        );
        assert_eq!(sysfs.entries("sys/bus/pci/devices"), vec!["0000:00:01.0"]);
        assert!(sysfs.entries("sys/class/infiniband").is_empty());
        assert!(sysfs.read("sys/module/nvidia_peermem/version").is_none());
        assert!(sysfs.resolve("sys/class/infiniband/mlx5_0").is_none());
        assert!(!sysfs.exists("sys/module/nvidia_peermem"));
        assert_eq!(sysfs.count("sys/bus/pci/devices"), Some(1));
        assert_eq!(sysfs.count("sys/kernel/iommu_groups"), None);
        let missing = sysfs.read_bytes("sys/bus/pci/devices/0000:00:01.0/config");
        assert!(missing.unwrap_err().contains("0000:00:01.0/config"));
        assert_eq!(sysfs.lspci(), None, "no lspci-vvv.txt in the tree");
    }
}
