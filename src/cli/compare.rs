//! `peerlink compare BASE OTHER`: two bench documents, figure by figure.

use super::args::{CompareArgs, Global};
use anyhow::Result;
use peerlink::document;
use peerlink::document::bench::BenchDocument;
use peerlink::document::compare::CompareDocument;
use peerlink::report;
use std::path::Path;

pub fn run(global: &Global, args: &CompareArgs) -> Result<()> {
    global.refuse_backend_options("compare")?;
    let (base_name, other_name) = (
        args.base.display().to_string(),
        args.other.display().to_string(),
    );
    let comparison = document::compare::compare(
        &read(&args.base)?,
        &read(&args.other)?,
        &base_name,
        &other_name,
    );
    global.print(&CompareDocument::new(&comparison), || {
        report::compare::text(&comparison, &base_name, &other_name)
    })
}

fn read(path: &Path) -> Result<BenchDocument> {
    let text = document::read_input(path)?;
    let doc: BenchDocument = document::read(&text).map_err(|why| {
        peerlink::Error::usage(format!(
            "{} is {why}; give two `peerlink bench --json` outputs",
            path.display()
        ))
    })?;
    document::compare::check_figures(&doc).map_err(|why| {
        peerlink::Error::usage(format!(
            "{} {why}; give two `peerlink bench --json` outputs as peerlink wrote them",
            path.display()
        ))
    })?;
    Ok(doc)
}
