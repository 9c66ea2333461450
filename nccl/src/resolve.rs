//! Where the real NCCL is found, at the first call: the library `PEERLINK_NCCL_LIB` names (and no
//! other); else a `libnccl.so.2` this process has loaded already (PyTorch loads NCCL where
//! `dlsym(RTLD_NEXT)` cannot see it, but `dlopen(…, RTLD_NOLOAD)` finds it by name); else the
//! search peerlink's own NCCL loader makes. Never this library itself: standing as
//! `libnccl.so.2`, the names above find it, so every library found is checked ([`Loader::is_ours`]).

use std::path::{Path, PathBuf};

use crate::switches::LIBRARY_VARIABLE;

/// NCCL's soname, which an already loaded NCCL answers to.
pub const SONAME: &str = "libnccl.so.2";

/// What the search needs of the dynamic loader (the C layer's `dlopen`, or a test's stand-in).
pub trait Loader {
    /// An opened library.
    type Handle: Copy;
    /// Opens a library by path or by a name for the dynamic loader; the loader's reason if not.
    fn open(&self, path: &Path) -> Result<Self::Handle, String>;
    /// The library loaded already under `name`, without loading anything.
    fn loaded(&self, name: &str) -> Option<Self::Handle>;
    /// Whether the library is this one, or another copy of peerlink's NCCL-API library.
    fn is_ours(&self, handle: Self::Handle) -> bool;
}

/// The real NCCL found, and how it was found (for the log).
#[derive(Debug, PartialEq, Eq)]
pub struct Found<H> {
    pub handle: H,
    pub how: String,
}

/// Finds the real NCCL: `named` is `PEERLINK_NCCL_LIB`'s value; `candidates` gives peerlink's
/// search order (only asked for when the first two ways find nothing). The error is one sentence
/// saying where it looked and what to do.
pub fn find<L: Loader>(
    loader: &L,
    named: Option<PathBuf>,
    candidates: impl FnOnce() -> Vec<PathBuf>,
) -> Result<Found<L::Handle>, String> {
    if let Some(path) = named.filter(|path| !path.as_os_str().is_empty()) {
        let handle = loader.open(&path).map_err(|why| {
            format!(
                "{LIBRARY_VARIABLE}={} cannot be loaded ({why}); name NCCL's libnccl.so.2 there",
                path.display()
            )
        })?;
        if loader.is_ours(handle) {
            return Err(format!(
                "{LIBRARY_VARIABLE}={} is peerlink's NCCL-API library, not NCCL; name NCCL's \
                 libnccl.so.2 there",
                path.display()
            ));
        }
        return Ok(Found {
            handle,
            how: format!("named by {LIBRARY_VARIABLE}"),
        });
    }
    if let Some(handle) = loader
        .loaded(SONAME)
        .filter(|&handle| !loader.is_ours(handle))
    {
        return Ok(Found {
            handle,
            how: format!("the {SONAME} this process had loaded"),
        });
    }
    let mut refusals = Vec::new();
    for candidate in candidates() {
        match loader.open(&candidate) {
            Ok(handle) if loader.is_ours(handle) => {}
            Ok(handle) => {
                return Ok(Found {
                    handle,
                    how: format!("found by peerlink's search as {}", candidate.display()),
                })
            }
            Err(why) if why.contains("cannot open shared object file") => {}
            Err(why) => refusals.push(format!(
                "{} could not be loaded ({why})",
                candidate.display()
            )),
        }
    }
    let mut sentence = format!(
        "no NCCL to forward to: none was named by {LIBRARY_VARIABLE}, no {SONAME} other than this \
         library was loaded, and peerlink's search (libnccl.so.2 and libnccl.so through the \
         dynamic loader, then pip's nvidia/nccl/lib/libnccl.so.2 in the Python installs) found \
         none"
    );
    for refusal in refusals {
        sentence += &format!("; {refusal}");
    }
    sentence += &format!(
        ". Install NCCL 2 (PyTorch brings it), or set {LIBRARY_VARIABLE}=/path/to/libnccl.so.2"
    );
    Err(sentence)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Libraries by path: which exist, which is ours, which is loaded already as `libnccl.so.2`.
    struct Fake {
        libraries: Vec<(&'static str, bool)>,
        loaded: Option<&'static str>,
    }

    impl Loader for Fake {
        type Handle = &'static str;
        fn open(&self, path: &Path) -> Result<&'static str, String> {
            let path = path.to_str().unwrap();
            match self.libraries.iter().find(|(name, _)| *name == path) {
                Some((name, _)) => Ok(name),
                None if path.ends_with("broken.so") => Err(format!("{path}: invalid ELF header")),
                None => Err(format!(
                    "{path}: cannot open shared object file: No such file"
                )),
            }
        }
        fn loaded(&self, _: &str) -> Option<&'static str> {
            self.loaded
        }
        fn is_ours(&self, handle: &'static str) -> bool {
            self.libraries
                .iter()
                .any(|(name, ours)| *name == handle && *ours)
        }
    }

    fn search_order() -> Vec<PathBuf> {
        [
            "libnccl.so.2",
            "libnccl.so",
            "/broken.so",
            "/wheel/libnccl.so.2",
        ]
        .map(PathBuf::from)
        .to_vec()
    }

    #[test]
    fn the_named_library_comes_first_and_alone() {
        let fake = Fake {
            libraries: vec![("/opt/libnccl.so.2", false), ("libnccl.so.2", false)],
            loaded: Some("libnccl.so.2"),
        };
        let found = find(&fake, Some("/opt/libnccl.so.2".into()), search_order).unwrap();
        assert_eq!(found.handle, "/opt/libnccl.so.2");
        let missing = find(&fake, Some("/nowhere.so".into()), search_order).unwrap_err();
        assert!(
            missing.starts_with("PEERLINK_NCCL_LIB=/nowhere.so cannot be loaded"),
            "{missing}"
        );
    }

    #[test]
    fn naming_this_library_is_refused() {
        let fake = Fake {
            libraries: vec![("/ours.so", true)],
            loaded: None,
        };
        let why = find(&fake, Some("/ours.so".into()), search_order).unwrap_err();
        assert!(
            why.contains("is peerlink's NCCL-API library, not NCCL"),
            "{why}"
        );
    }

    #[test]
    fn an_already_loaded_nccl_comes_before_the_search() {
        let fake = Fake {
            libraries: vec![("libnccl.so.2", false), ("/torch/libnccl.so.2", false)],
            loaded: Some("/torch/libnccl.so.2"),
        };
        assert_eq!(
            find(&fake, None, search_order).unwrap().handle,
            "/torch/libnccl.so.2"
        );
    }

    #[test]
    fn standing_as_libnccl_so_2_the_search_skips_this_library() {
        let fake = Fake {
            libraries: vec![("libnccl.so.2", true), ("/wheel/libnccl.so.2", false)],
            loaded: Some("libnccl.so.2"),
        };
        let found = find(&fake, None, search_order).unwrap();
        assert_eq!(found.handle, "/wheel/libnccl.so.2");
        assert!(found.how.contains("peerlink's search"), "{}", found.how);
    }

    #[test]
    fn with_only_this_library_the_error_says_where_it_looked_and_what_to_do() {
        let fake = Fake {
            libraries: vec![("libnccl.so.2", true)],
            loaded: Some("libnccl.so.2"),
        };
        let why = find(&fake, None, search_order).unwrap_err();
        assert!(why.starts_with("no NCCL to forward to"), "{why}");
        assert!(why.contains("/broken.so could not be loaded (/broken.so: invalid ELF header)"));
        assert!(!why.contains("libnccl.so could not"), "{why}");
        assert!(
            why.ends_with("set PEERLINK_NCCL_LIB=/path/to/libnccl.so.2"),
            "{why}"
        );
    }
}
