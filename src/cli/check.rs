//! `peerlink check [--baseline FILE] [--tolerance PCT]`: a short bench compared with a baseline or
//! with the reference figures shipped for known GPUs; exit 1 naming what regressed.

use super::args::{CheckArgs, Global};
use anyhow::{bail, Result};
use peerlink::bench::compare::read_bench;
use peerlink::check::document::CheckDocument;
use peerlink::check::{self, Plan, DEFAULT_TOLERANCE_PCT};
use peerlink::files;
use peerlink::report;
use peerlink::units::parse::parse_percent;

pub fn run(global: &Global, args: &CheckArgs) -> Result<()> {
    let tolerance = match args.tolerance.as_deref() {
        None => DEFAULT_TOLERANCE_PCT,
        Some(text) => parse_percent(text, "--tolerance")?,
    };
    if !(tolerance > 0.0 && tolerance < 100.0) {
        return Err(peerlink::Error::usage(format!(
            "--tolerance {tolerance}% cannot be met sensibly: give more than 0 (no two \
             measurements agree to the last digit, the simulator's included) and less than 100 \
             (which would pass a bandwidth that fell to nothing)"
        ))
        .into());
    }
    // The baseline is read before any GPU is opened: a wrong file costs no start-up.
    let baseline = match &args.baseline {
        None => None,
        Some(path) => {
            let name = path.display().to_string();
            let text = files::read_input(path)?;
            let wanted = "a `peerlink bench --json` output (--baseline)";
            Some((read_bench(&text, &name, wanted)?, name))
        }
    };
    let opened = global.open()?;
    let host = opened.backend.topology();
    let devices = host.select(global.devices.as_deref())?;
    let plan = match &baseline {
        Some((doc, name)) => Plan::against_baseline(host, &devices, doc, name)?,
        None => Plan::against_references(host, &devices)?,
    };
    let kept = check::run(
        opened.backend.as_ref(),
        &plan,
        tolerance,
        &*global.progress(),
    )?;
    let mut doc = CheckDocument::new(host, kept.found);
    doc.header.partial |= kept.failure.is_some();
    global.print(&doc, || report::check::text(&doc))?;
    super::failed(kept.failure)?;
    if let Some(what) = doc.report.what_failed(report::first_few) {
        bail!("check failed: {what}");
    }
    Ok(())
}
