//! A workload document: each contender's bus bandwidth over the sizes, peerlink's against NCCL's
//! (drawn in black), a chart per variant and issue mode.

use super::chart::{series_colour, INK};
use super::plot::{curves, figure, Axis, Curves, Point, Scale, Series};
use super::Section;
use crate::units::format_bytes;
use crate::workload::document::WorkloadDocument;
use crate::workload::kinds::Contender;
use crate::workload::rows::Row;
use crate::Result;

/// A row in words: every figure it holds.
fn tip(r: &Row) -> String {
    let mut tip = format!(
        "{} {} ({}), {}: {} µs per operation, algbw {} GB/s, busbw {} GB/s, verified {}",
        r.contender,
        r.algorithm,
        r.issue.name(),
        format_bytes(r.bytes),
        figure(r.time_us),
        figure(r.algbw_gbps),
        figure(r.busbw_gbps),
        if r.verified { "yes" } else { "NO" }
    );
    if let Some(v) = r.vs_nccl {
        let nccl = if r.simulated {
            "the NCCL model's"
        } else {
            "NCCL's"
        };
        tip.push_str(&format!("; {}× {nccl} speed", figure(v)));
    }
    if let Some(v) = r.vs_nccl_symmetric {
        tip.push_str(&format!(
            "; {}× the speed of NCCL with symmetric windows",
            figure(v)
        ));
    }
    if let Some(exposed) = r.exposed_us {
        tip.push_str(&format!("; {} µs exposed", figure(exposed)));
    }
    tip
}

pub fn charts(section: &mut Section, doc: &WorkloadDocument) -> Result<()> {
    let mut panels: Vec<_> = doc.rows.iter().map(|r| (r.variant, r.issue)).collect();
    panels.dedup();
    panels.sort_by_key(|&(variant, issue)| (variant.map(|v| v.name()), issue.name()));
    panels.dedup();
    let dtype = doc
        .rows
        .iter()
        .find_map(|r| r.dtype)
        .map_or_else(String::new, |d| format!(" ({d})"));
    for (variant, issue) in panels {
        let rows: Vec<&Row> = doc
            .rows
            .iter()
            .filter(|r| r.variant == variant && r.issue == issue)
            .collect();
        let mut contenders: Vec<(Contender, &str)> = rows
            .iter()
            .map(|r| (r.contender, r.algorithm.as_str()))
            .collect();
        contenders.sort_by_key(|&(c, a)| {
            let symmetric = c == Contender::NcclSymmetric;
            (!c.is_peerlink(), symmetric, c == Contender::PeerlinkPick, a)
        });
        contenders.dedup();
        let series = contenders
            .iter()
            .enumerate()
            .map(|(i, &(contender, algorithm))| Series {
                name: match contender == Contender::Nccl && doc.header.simulated {
                    true => format!("{contender} model {algorithm}"),
                    false => format!("{contender} {algorithm}"),
                },
                // NCCL in black: plain drawn solid, with symmetric windows dashed.
                colour: if contender.is_peerlink() {
                    series_colour(i)
                } else {
                    INK
                },
                dashed: contender == Contender::NcclSymmetric,
                dots: true,
                points: rows
                    .iter()
                    .filter(|r| r.contender == contender && r.algorithm == algorithm)
                    .map(|r| Point::new(r.bytes as f64, r.busbw_gbps, tip(r)))
                    .collect(),
            })
            .collect();
        let c = Curves {
            x: Axis::new("size", Scale::LogBytes),
            y: Axis::new("busbw GB/s", Scale::Log),
            series,
            marks: Vec::new(),
        };
        let name = format!(
            "{}{dtype}{}, issued by {}: peerlink against NCCL",
            doc.workload,
            variant.map_or_else(String::new, |v| format!(" {v}")),
            issue.name()
        );
        section.add(&name, &name, |id, title| curves(id, title, &c))?;
    }
    if let Some(regret) = doc.worst_regret {
        section.notes.push(format!(
            "the pick's worst regret (its kernel's time over the faster kernel's − 1): {:.1}%",
            regret * 100.0
        ));
    }
    section
        .notes
        .push(format!("{}; timed {}", doc.busbw_rule, doc.timing));
    section
        .notes
        .extend(crate::report::workload::nccl_model_note(doc));
    section.notes.extend(doc.notices.iter().cloned());
    Ok(())
}
