//! What `PEERLINK_NCCL_SERVE=auto` compares against: a `peerlink workload all-reduce --json`
//! document of this host (named by `PEERLINK_NCCL_TABLE`), which measured peerlink's pick and
//! NCCL at each size. A call is served where peerlink's pick was faster than the best NCCL row
//! of every NCCL contender the document holds (plain NCCL, NCCL with symmetric windows, …) at
//! the nearest measured size at or above the call's (the largest measured, past the end). Like is
//! compared with like: only the rows of calls on streams count (served calls are queued on the
//! caller's stream; captured ones are forwarded), and a communicator is decided by the document
//! only where its ranks number and are laid out (one process, or a process each) as the
//! measurement's were.

use std::collections::BTreeMap;
use std::path::Path;

/// Names the workload document `auto` decides by.
pub const TABLE_VARIABLE: &str = "PEERLINK_NCCL_TABLE";

/// Per element type and size, peerlink's pick's time and NCCL's best, µs; and the ranks it
/// measured: how many, and whether each was a process.
#[derive(Debug, Default, PartialEq)]
pub struct Table {
    sizes: BTreeMap<(String, u64), Times>,
    ranks: usize,
    rank_per_process: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Times {
    peerlink_us: Option<f64>,
    nccl_us: Option<f64>,
}

impl Table {
    /// Reads the document at `path`; one sentence where it cannot be read, holds no size with
    /// both peerlink's pick and NCCL measured, or is the simulator's where the library serves on
    /// GPUs (`on_simulator` false).
    pub fn read(path: &Path, on_simulator: bool) -> Result<Table, String> {
        let text =
            peerlink::files::read_text(path).map_err(|why| format!("{}: {why}", path.display()))?;
        Table::parse(&text, on_simulator).map_err(|why| format!("{} {why}", path.display()))
    }

    /// The table in a workload document's text.
    pub fn parse(text: &str, on_simulator: bool) -> Result<Table, String> {
        let document: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("is not a JSON document ({e})"))?;
        let simulated = document.get("simulated").and_then(|s| s.as_bool()) == Some(true);
        if simulated && !on_simulator {
            return Err(
                "is the simulator's (\"simulated\": true), not a measurement of this host's \
                 GPUs: name one `peerlink --gpu workload all-reduce --json` wrote here"
                    .into(),
            );
        }
        let rows = document
            .get("rows")
            .and_then(|rows| rows.as_array())
            .ok_or("has no rows: name a `peerlink workload all-reduce --json` document")?;
        let mut table = Table {
            ranks: document
                .get("devices")
                .and_then(|d| d.as_array())
                .map_or(0, Vec::len),
            // Documents written before the field were of one process.
            rank_per_process: document.get("process_layout").and_then(|l| l.as_str())
                == Some("rank-per-process"),
            ..Table::default()
        };
        for row in rows {
            let field = |name: &str| row.get(name);
            if field("workload").and_then(|w| w.as_str()) != Some("all-reduce")
                || field("verified").and_then(|v| v.as_bool()) == Some(false)
                || field("issue").and_then(|i| i.as_str()).unwrap_or("stream") != "stream"
            {
                continue;
            }
            let (Some(contender), Some(bytes), Some(us)) = (
                field("contender").and_then(|c| c.as_str()),
                field("bytes").and_then(|b| b.as_u64()),
                field("time_us").and_then(|t| t.as_f64()),
            ) else {
                continue;
            };
            let dtype = field("dtype").and_then(|d| d.as_str()).unwrap_or("f32");
            let times = table.sizes.entry((dtype.to_string(), bytes)).or_default();
            let best = |slot: &mut Option<f64>| *slot = Some(slot.map_or(us, |b: f64| b.min(us)));
            if contender == "peerlink-pick" {
                best(&mut times.peerlink_us);
            } else if contender.starts_with("nccl") {
                best(&mut times.nccl_us);
            }
        }
        table
            .sizes
            .retain(|_, t| t.peerlink_us.is_some() && t.nccl_us.is_some());
        if table.sizes.is_empty() {
            return Err(
                "holds no all-reduce size with both peerlink's pick and NCCL measured".into(),
            );
        }
        Ok(table)
    }

    /// Whether peerlink's pick beat NCCL's best for `bytes` of `dtype` (`f32`, `bf16`): at the
    /// nearest measured size at or above, or the largest measured. `false` for a type the
    /// document did not measure.
    pub fn peerlink_faster(&self, dtype: &str, bytes: u64) -> bool {
        let mut sizes = self
            .sizes
            .range((dtype.to_string(), 0)..=(dtype.to_string(), u64::MAX));
        let nearest = sizes
            .clone()
            .find(|((_, size), _)| *size >= bytes)
            .or_else(|| sizes.next_back());
        nearest.is_some_and(|(_, t)| t.peerlink_us < t.nccl_us)
    }

    /// Why the measurement cannot decide for a communicator of `ranks` ranks (each a process
    /// where `rank_per_process`, else threads of one), or `None` where it measured that layout.
    pub fn differs_from(&self, ranks: usize, rank_per_process: bool) -> Option<String> {
        let layout = |per_process: bool| {
            if per_process {
                "a process each"
            } else {
                "in one process"
            }
        };
        (self.ranks != ranks || self.rank_per_process != rank_per_process).then(|| {
            format!(
                "{TABLE_VARIABLE}'s measurement is of {} GPUs, {}, and this communicator has {ranks} \
                 ranks, {}: measure its layout (`peerlink workload all-reduce --json`{})",
                self.ranks,
                layout(self.rank_per_process),
                layout(rank_per_process),
                if rank_per_process {
                    " under `peerlink launch`"
                } else {
                    ""
                }
            )
        })
    }

    /// How many sizes it holds, for the log.
    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(contender: &str, bytes: u64, us: f64) -> String {
        format!(
            r#"{{"workload":"all-reduce","contender":"{contender}","bytes":{bytes},"time_us":{us},"dtype":"f32","verified":true}}"#
        )
    }

    #[test]
    fn peerlink_is_faster_only_where_it_beat_every_ncclcontender() {
        let rows = [
            row("peerlink-pick", 1024, 5.0),
            row("nccl", 1024, 9.0),
            row("nccl-symmetric", 1024, 4.0),
            row("peerlink-pick", 1 << 20, 20.0),
            row("nccl", 1 << 20, 30.0),
            row("peerlink", 1 << 20, 1.0),
        ]
        .join(",");
        let table = Table::parse(&format!(r#"{{"rows":[{rows}]}}"#), false).unwrap();
        assert_eq!(table.len(), 2);
        // The symmetric contender won at 1 KiB: NCCL's best is what counts.
        assert!(!table.peerlink_faster("f32", 1024));
        assert!(!table.peerlink_faster("f32", 4));
        assert!(table.peerlink_faster("f32", 2048));
        assert!(table.peerlink_faster("f32", 1 << 30));
        assert!(!table.peerlink_faster("bf16", 2048));
    }

    #[test]
    fn only_calls_on_streams_count_and_only_for_the_layout_measured() {
        let graph_row = |contender: &str, us: f64| {
            row(contender, 1024, us).replace(r#""verified""#, r#""issue":"graphs","verified""#)
        };
        let rows = [
            row("peerlink-pick", 1024, 9.0),
            row("nccl", 1024, 5.0),
            graph_row("peerlink-pick", 1.0),
            graph_row("nccl", 4.0),
        ]
        .join(",");
        let one = format!(r#"{{"devices":[0,1],"rows":[{rows}]}}"#);
        let table = Table::parse(&one, false).unwrap();
        assert!(
            !table.peerlink_faster("f32", 1024),
            "peerlink won only in graphs, which are forwarded"
        );
        assert_eq!(table.differs_from(2, false), None);
        let why = table.differs_from(2, true).unwrap();
        assert!(why.contains("2 GPUs, in one process"), "{why}");
        assert!(why.contains("2 ranks, a process each"), "{why}");
        assert!(table.differs_from(8, false).unwrap().contains("8 ranks"));
        let across =
            format!(r#"{{"devices":[0,1],"process_layout":"rank-per-process","rows":[{rows}]}}"#);
        let table = Table::parse(&across, false).unwrap();
        assert_eq!(table.differs_from(2, true), None);
        assert!(table.differs_from(2, false).is_some());
    }

    #[test]
    fn a_document_without_both_sides_is_refused_in_a_sentence() {
        let only = format!(r#"{{"rows":[{}]}}"#, row("nccl", 4, 1.0));
        assert!(Table::parse(&only, false)
            .unwrap_err()
            .contains("holds no all-reduce size"));
        assert!(Table::parse("[]", false)
            .unwrap_err()
            .contains("has no rows"));
        assert!(Table::parse("{", false)
            .unwrap_err()
            .contains("not a JSON document"));
    }

    #[test]
    fn the_simulators_document_decides_only_on_the_simulator() {
        let rows = [row("peerlink-pick", 4, 1.0), row("nccl", 4, 2.0)].join(",");
        let simulated = format!(r#"{{"simulated":true,"rows":[{rows}]}}"#);
        let why = Table::parse(&simulated, false).unwrap_err();
        assert!(why.contains("is the simulator's"), "{why}");
        assert!(Table::parse(&simulated, true)
            .unwrap()
            .peerlink_faster("f32", 4));
    }
}
