//! `peerlink compare BASE OTHER`: two bench documents, figure by figure.

use super::args::{CompareArgs, Global};
use anyhow::Result;
use peerlink::report;
use std::path::Path;

pub fn run(global: &Global, args: &CompareArgs) -> Result<()> {
    global.refuse_backend_options("compare")?;
    let (base_name, other_name) = (
        args.base.display().to_string(),
        args.other.display().to_string(),
    );
    let comparison = report::compare::compare(
        &read(&args.base)?,
        &read(&args.other)?,
        &base_name,
        &other_name,
    )?;
    global.print(&report::compare::json(&comparison), || {
        report::compare::text(&comparison, &base_name, &other_name)
    })
}

fn read(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| peerlink::Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| {
        peerlink::Error::usage(format!(
            "{} is not JSON ({e}); give two `peerlink bench --json` outputs",
            path.display()
        ))
        .into()
    })
}
