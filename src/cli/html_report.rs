//! `peerlink report FILE… -o report.html [--svg DIR]`: the HTML page of any mix of documents, and
//! its charts as SVG files.

use super::args::{Global, ReportArgs};
use anyhow::Result;
use peerlink::files;
use peerlink::html;
use peerlink::model::profile::write_atomically;
use peerlink::Error;

pub fn run(global: &Global, args: &ReportArgs) -> Result<()> {
    global.refuse_backend_options("report")?;
    if global.json || global.exports.given_any() {
        return Err(Error::usage(
            "`report` writes an HTML page (and SVG files), not a document: leave --json and \
             --export-* out",
        )
        .into());
    }
    let inputs = args
        .files
        .iter()
        .map(|path| {
            let name = path.display().to_string();
            html::read(&name, &files::read_input(path)?)
        })
        .collect::<peerlink::Result<Vec<_>>>()?;
    let report = html::report(&inputs)?;
    let mut said = Vec::new();
    if let Some(out) = &args.out {
        write_atomically(out, &report.html)?;
        said.push(format!("report written to {}", out.display()));
    }
    if let Some(dir) = &args.svg {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        for chart in &report.charts {
            write_atomically(&dir.join(format!("{}.svg", chart.id)), &chart.svg)?;
        }
        said.push(format!("charts written to {}", dir.display()));
    }
    super::emit(&format!(
        "{}: {} document{}, {} chart{}\n",
        said.join("; "),
        inputs.len(),
        if inputs.len() == 1 { "" } else { "s" },
        report.charts.len(),
        if report.charts.len() == 1 { "" } else { "s" },
    ))
}
