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
    Ok(document::compare::bench_input(
        &text,
        &path.display().to_string(),
    )?)
}
