//! `--export-json`, `--export-csv` and `--export-markdown`: every verb's document written to files
//! beside what it prints. The destinations are checked before anything is measured (in
//! `outputs`); the files are
//! written (atomically) from the document, whatever the verb.

use super::args::Exports;
use anyhow::Result;
use peerlink::document;
use peerlink::model::profile::write_atomically;
use peerlink::report::export;
use peerlink::report::export::Tables;
use std::path::Path;

impl Exports {
    /// Each destination given, with its flag.
    fn given(&self) -> Vec<(&'static str, &Path)> {
        [
            ("--export-json", &self.export_json),
            ("--export-csv", &self.export_csv),
            ("--export-markdown", &self.export_markdown),
        ]
        .into_iter()
        .filter_map(|(flag, path)| path.as_deref().map(|path| (flag, path)))
        .collect()
    }

    /// Whether any export was asked for.
    pub fn given_any(&self) -> bool {
        !self.given().is_empty()
    }

    /// Writes `doc` to every destination asked for; `shown` is what the verb prints, which the
    /// Markdown of a document without tables shows.
    pub fn write<D: Tables>(&self, doc: &D, shown: &str) -> Result<()> {
        if let Some(path) = &self.export_json {
            write_atomically(path, &document::to_json(doc))?;
        }
        if self.export_csv.is_none() && self.export_markdown.is_none() {
            // Tables of a large host are costly: a 1000-GPU topology has a million pairs.
            return Ok(());
        }
        let tables = doc.tables();
        if let Some(path) = &self.export_csv {
            if tables.is_empty() {
                return Err(peerlink::Error::usage(format!(
                    "--export-csv: a `{}` document has no table to write as CSV; use \
                     --export-json or --export-markdown",
                    D::SCHEMA
                ))
                .into());
            }
            write_atomically(path, export::csv(doc.header(), &tables).trim_end())?;
        }
        if let Some(path) = &self.export_markdown {
            write_atomically(
                path,
                export::markdown(doc.header(), &tables, shown).trim_end(),
            )?;
        }
        Ok(())
    }
}
