//! `peerlink report`: one self-contained HTML page (nothing fetched when viewed, no script) from
//! any mix of peerlink's JSON documents, its charts SVG drawn with plotters.
//!
//! Each document becomes a section: its header (where the figures come from — labelled SIMULATED
//! where they do not come from hardware), its charts, and its tables as the exports write them.
//! - topology (`topo.rs`): the GPUs as a graph and the link matrix, link classes coloured;
//! - bench and explain (`bench.rs`): a heatmap per matrix test, bars per GPU, size sweeps as
//!   log-log curves with the α–β fit and its 50% and 90% sizes, the latency as a waterfall;
//! - plan and tune's profile (`plan.rs`): the engine sweep's predicted against measured per
//!   strategy with the pick circled, one transfer's strategies, batches, concurrent traffic, hops;
//! - workloads against NCCL (`workload.rs`), and two runs side by side (`compare.rs`);
//! - the host's health (`health.rs`): doctor's verdicts, check's figures against expected.

mod bench;
mod chart;
mod compare;
mod health;
mod page;
mod plan;
mod plot;
mod topo;
mod workload;

pub use chart::Chart;

use crate::bench::compare::CompareDocument;
use crate::bench::document::{BenchDocument, ExplainDocument};
use crate::bench::proof::document::{
    PlanBatchDocument, PlanConcurrentDocument, PlanDocument, PlanSweepDocument,
};
use crate::check::document::CheckDocument;
use crate::doctor::document::DoctorDocument;
use crate::document::topo::TopoDocument;
use crate::document::{self, Document, Header};
use crate::model::Profile;
use crate::report::export::Tables;
use crate::workload::document::WorkloadDocument;
use crate::{Error, Result};

/// A document the report can show.
#[derive(Clone, Debug, PartialEq)]
pub enum Loaded {
    Topo(TopoDocument),
    Bench(BenchDocument),
    Explain(ExplainDocument),
    Plan(PlanDocument),
    PlanSweep(PlanSweepDocument),
    PlanBatch(PlanBatchDocument),
    PlanConcurrent(PlanConcurrentDocument),
    Profile(Profile),
    Compare(CompareDocument),
    Workload(WorkloadDocument),
    Doctor(DoctorDocument),
    Check(CheckDocument),
}

/// A document and the name it came by (its file).
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub name: String,
    pub doc: Loaded,
}

/// Reads the document in `text`, whichever peerlink wrote; `name` says where it came from in a
/// refusal (exit 2).
pub fn read(name: &str, text: &str) -> Result<Input> {
    fn as_<D: Document>(name: &str, text: &str, wrap: fn(D) -> Loaded) -> Result<Loaded> {
        document::read::<D>(text)
            .map(wrap)
            .map_err(|why| Error::usage(format!("{name} is {why}")))
    }
    let schema = serde_json::from_str::<serde_json::Value>(text)
        .map_err(|e| Error::usage(format!("{name} is not JSON ({e})")))?
        .get("schema")
        .and_then(|s| s.as_str().map(str::to_string));
    let doc = match schema.as_deref() {
        Some(TopoDocument::SCHEMA) => as_(name, text, Loaded::Topo)?,
        Some(BenchDocument::SCHEMA) => as_(name, text, Loaded::Bench)?,
        Some(ExplainDocument::SCHEMA) => as_(name, text, Loaded::Explain)?,
        Some(PlanDocument::SCHEMA) => as_(name, text, Loaded::Plan)?,
        Some(PlanSweepDocument::SCHEMA) => as_(name, text, Loaded::PlanSweep)?,
        Some(PlanBatchDocument::SCHEMA) => as_(name, text, Loaded::PlanBatch)?,
        Some(PlanConcurrentDocument::SCHEMA) => as_(name, text, Loaded::PlanConcurrent)?,
        Some(Profile::SCHEMA) => as_(name, text, Loaded::Profile)?,
        Some(CompareDocument::SCHEMA) => as_(name, text, Loaded::Compare)?,
        Some(WorkloadDocument::SCHEMA) => as_(name, text, Loaded::Workload)?,
        Some(DoctorDocument::SCHEMA) => as_(name, text, Loaded::Doctor)?,
        Some(CheckDocument::SCHEMA) => as_(name, text, Loaded::Check)?,
        other => {
            return Err(Error::usage(format!(
                "{name} is not a document peerlink writes ({}); give the --json output of topo, \
                 bench, explain, plan, tune, compare, workload, doctor or check",
                other.map_or("it has no `schema` string".to_string(), |s| {
                    format!("its schema is `{s}`")
                })
            )))
        }
    };
    Ok(Input {
        name: name.to_string(),
        doc,
    })
}

/// The page and every chart on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub html: String,
    pub charts: Vec<Chart>,
}

/// The report of `inputs`, a section each in their order.
pub fn report(inputs: &[Input]) -> Result<Report> {
    let mut sections = Vec::with_capacity(inputs.len());
    for (i, input) in inputs.iter().enumerate() {
        let mut section = Section::new(format!("d{}", i + 1), &input.name, &input.doc);
        match &input.doc {
            Loaded::Topo(doc) => topo::charts(&mut section, doc)?,
            Loaded::Bench(doc) => bench::charts(&mut section, doc)?,
            Loaded::Explain(doc) => bench::explain_charts(&mut section, doc)?,
            Loaded::Plan(doc) => plan::single_charts(&mut section, doc)?,
            Loaded::PlanSweep(doc) => plan::sweep_charts(&mut section, doc)?,
            Loaded::PlanBatch(doc) => plan::batch_charts(&mut section, doc)?,
            Loaded::PlanConcurrent(doc) => plan::concurrent_charts(&mut section, doc)?,
            Loaded::Profile(doc) => plan::profile_charts(&mut section, doc)?,
            Loaded::Compare(doc) => compare::charts(&mut section, doc)?,
            Loaded::Workload(doc) => workload::charts(&mut section, doc)?,
            Loaded::Doctor(doc) => health::doctor_notes(&mut section, doc),
            Loaded::Check(doc) => health::check_charts(&mut section, doc)?,
        }
        sections.push(section);
    }
    let html = page::page(&sections);
    let charts = sections.into_iter().flat_map(|s| s.charts).collect();
    Ok(Report { html, charts })
}

/// One document's part of the report.
pub struct Section {
    /// `d1`, `d2`, …: the HTML anchor, and the start of its charts' ids.
    pub id: String,
    /// The file the document came from.
    pub name: String,
    pub header: Header,
    /// What the document is, in words (`bandwidth and latency`).
    pub what: String,
    pub charts: Vec<Chart>,
    /// Sentences shown under the charts (warnings, notes, what was not measured).
    pub notes: Vec<String>,
    /// The document's tables, as the exports write them.
    pub tables: Vec<crate::report::export::Records>,
}

impl Section {
    fn new(id: String, name: &str, doc: &Loaded) -> Section {
        let (header, tables, what) = match doc {
            Loaded::Topo(d) => (d.header(), d.tables(), "topology"),
            Loaded::Bench(d) => (d.header(), d.tables(), "bandwidth and latency"),
            Loaded::Explain(d) => (d.header(), d.tables(), "where a transfer's time goes"),
            Loaded::Plan(d) => (d.header(), d.tables(), "the engine's plan for one transfer"),
            Loaded::PlanSweep(d) => (d.header(), d.tables(), "the engine over a size sweep"),
            Loaded::PlanBatch(d) => (d.header(), d.tables(), "a batch of small messages"),
            Loaded::PlanConcurrent(d) => (d.header(), d.tables(), "every GPU sending at once"),
            Loaded::Profile(d) => (d.header(), d.tables(), "this host's hop costs (tune)"),
            Loaded::Compare(d) => (d.header(), d.tables(), "two runs side by side"),
            Loaded::Workload(d) => (d.header(), d.tables(), "a workload against NCCL"),
            Loaded::Doctor(d) => (
                d.header(),
                d.tables(),
                "what stands between the GPUs and fast P2P",
            ),
            Loaded::Check(d) => (
                d.header(),
                d.tables(),
                "a health check against expected figures",
            ),
        };
        Section {
            id,
            name: name.to_string(),
            header: header.clone(),
            what: what.to_string(),
            charts: Vec::new(),
            notes: Vec::new(),
            tables,
        }
    }

    /// Adds the chart `make(id, title)` draws: its id made unique from `slug`, its title saying
    /// SIMULATED where the document's figures are.
    fn add(
        &mut self,
        slug: &str,
        title: &str,
        make: impl FnOnce(&str, &str) -> Result<Chart>,
    ) -> Result<()> {
        let mut id = format!("{}-{}", self.id, slugify(slug));
        let taken = |id: &str| self.charts.iter().any(|c| c.id == id);
        if taken(&id) {
            id = (2..)
                .map(|n| format!("{id}-{n}"))
                .find(|candidate| !taken(candidate))
                .expect("some suffix is free");
        }
        let title = if self.header.simulated {
            format!("{title} — SIMULATED")
        } else {
            title.to_string()
        };
        self.charts.push(make(&id, &title)?);
        Ok(())
    }
}

/// `ce-write 0→1` → `ce-write-0-1`: lower-case letters, digits and dashes.
fn slugify(text: &str) -> String {
    let mut slug = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c.to_ascii_lowercase());
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    slug.trim_matches('-').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_plain() {
        assert_eq!(slugify("ce-write 0→1"), "ce-write-0-1");
        assert_eq!(slugify("  All Reduce (bf16) "), "all-reduce-bf16");
    }

    #[test]
    fn only_peerlink_documents_are_read() {
        for (text, says) in [
            ("{", "not JSON"),
            ("[]", "no `schema`"),
            (r#"{"schema": "torch-allreduce/1"}"#, "`torch-allreduce/1`"),
            (r#"{"schema": "peerlink.topo/1"}"#, "missing field"),
        ] {
            let err = read("x.json", text).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            let err = err.to_string();
            assert!(err.starts_with("x.json is ") && err.contains(says), "{err}");
        }
    }
}
