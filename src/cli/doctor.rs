//! `peerlink doctor`: every check printed, and exit status 1 when one fails.

use super::args::{DoctorArgs, Global};
use anyhow::{anyhow, Result};
use peerlink::doctor::document::DoctorDocument;
use peerlink::doctor::{self, Options};
use peerlink::report;

pub fn run(global: &Global, args: &DoctorArgs) -> Result<()> {
    if let Some(root) = args.root.as_ref().filter(|root| !root.is_dir()) {
        return Err(peerlink::Error::usage(format!(
            "--root {}: not a directory; name the directory that holds the host's sys/ and proc/",
            root.display()
        ))
        .into());
    }
    let opened = global.open()?;
    let options = Options {
        devices: global.devices.clone(),
        host_root: args.root.clone(),
    };
    let report = doctor::run(opened.backend.as_ref(), &options, &*global.progress())?;
    let doc = DoctorDocument::new(opened.backend.topology(), report);
    global.print(&doc, || report::doctor::text(&doc))?;
    match report::doctor::failed_sentence(&doc) {
        Some(sentence) => Err(anyhow!(sentence)),
        None => Ok(()),
    }
}
