//! `peerlink compare BASE OTHER [--threshold PCT]`: two bench documents, figure by figure.

use super::args::{CompareArgs, Global};
use anyhow::{bail, Result};
use peerlink::bench::compare::CompareDocument;
use peerlink::bench::document::BenchDocument;
use peerlink::files;
use peerlink::report;
use peerlink::units::parse::parse_percent;
use std::path::Path;

pub fn run(global: &Global, args: &CompareArgs) -> Result<()> {
    global.refuse_backend_options("compare")?;
    let threshold = args
        .threshold
        .as_deref()
        .map(|text| parse_percent(text, "--threshold"))
        .transpose()?;
    let (base_name, other_name) = (
        args.base.display().to_string(),
        args.other.display().to_string(),
    );
    let comparison = peerlink::bench::compare::compare(
        &read(&args.base)?,
        &read(&args.other)?,
        &base_name,
        &other_name,
    );
    comparison.check_paired(&base_name, &other_name)?;
    let doc = CompareDocument::new(&comparison, threshold);
    global.print(&doc, || report::compare::text(&doc))?;
    let Some(pct) = threshold else {
        return Ok(());
    };
    let beyond: Vec<String> = comparison.beyond(pct).iter().map(|p| p.named()).collect();
    if !beyond.is_empty() {
        bail!(
            "{} of {} paired figures moved by more than {pct}%: {}",
            beyond.len(),
            comparison.pairs.len(),
            report::first_few(&beyond)
        );
    }
    Ok(())
}

fn read(path: &Path) -> Result<BenchDocument> {
    let text = files::read_input(path)?;
    Ok(peerlink::bench::compare::bench_input(
        &text,
        &path.display().to_string(),
    )?)
}
