//! `peerlink tune`: measure this host's hop costs into a profile, and optionally a simulator preset.

use super::args::{Global, TuneArgs};
use anyhow::Result;
use peerlink::backend::sim::Preset;
use peerlink::backend::Backend;
use peerlink::bench::tune;
use peerlink::bench::tune::document::TuneDocument;
use peerlink::model::profile::write_atomically;
use peerlink::report;
use std::path::Path;
use std::sync::Arc;

pub fn run(global: &Global, args: &TuneArgs) -> Result<()> {
    // Where the results go was checked before anything ran (`outputs`); the preset's name is the
    // file's stem.
    let export = match &args.export_sim {
        Some(path) => {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    peerlink::Error::usage(format!(
                        "--export-sim {}: not a file name",
                        path.display()
                    ))
                })?;
            Some((path, name))
        }
        None => None,
    };
    // A preset written from the host describes every pair, whatever GPUs the run measures.
    let opened = match export {
        Some(_) => global.open_among(None)?,
        None => global.open()?,
    };
    let backend: Arc<dyn Backend> = Arc::from(opened.backend);
    if export.is_some() {
        tune::export::one_host(backend.topology())?;
    }
    let options = tune::Options {
        devices: global.devices.clone(),
        quick: args.quick,
        latencies: export.is_some(),
    };
    let measured = tune::run(&backend, &options, &*global.progress()).inspect_err(|e| {
        if let peerlink::Error::Interrupted = e {
            // Stopped before the costs every profile holds were measured: nothing is written.
            eprintln!(
                "peerlink: no profile was written ({} is as it was): tune was stopped before it \
                 measured the costs every profile holds",
                shown(&args.out)
            );
        }
    })?;
    let document = TuneDocument::of(&measured, backend.topology());
    document.profile.save(&args.out)?;
    if let Some((path, name)) = &export {
        let preset: Preset = tune::export::preset(&measured, backend.topology(), name)?;
        write_atomically(path, &serde_json::to_string_pretty(&preset)?)?;
    }
    global.print(&document.profile, || report::tune::text(&document))?;
    // Where the files went goes to stderr with --json (stdout holds the document), else stdout.
    let said = format!(
        "profile written to {}{}",
        shown(&args.out),
        export.map_or(String::new(), |(p, _)| format!(
            "\nsimulator preset written to {} (use it with --sim {})",
            shown(p),
            p.display()
        ))
    );
    if global.json {
        eprintln!("peerlink: {}", peerlink::echo::printable(&said));
    } else {
        super::emit(&format!("\n{said}\n"))?;
    }
    Ok(())
}

/// A path as the user can find it: absolute where the working directory is known.
fn shown(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}
