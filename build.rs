//! Embeds the git commit peerlink is built from (every document's header names it): `unknown`
//! where there is no git or no repository, as in a source tarball.

use std::process::Command;

/// What `git <args>` prints, trimmed, when it succeeds and prints something.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PEERLINK_COMMIT={commit}");
    // Run again when HEAD moves: a checkout rewrites HEAD, a commit the branch HEAD names (or
    // packed-refs). Without a repository, only a change to this script does.
    println!("cargo:rerun-if-changed=build.rs");
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        // A path that does not exist would make Cargo run this script on every build.
        let path = git(&["rev-parse", "--git-path", &name]);
        if let Some(path) = path.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
