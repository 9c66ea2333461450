//! The engine's documents and tune's profile: the engine sweep's predicted (dashed) against
//! measured (solid) time per strategy with the pick circled at each size; one transfer's
//! strategies; a batch's ways; concurrent traffic alone and together; the profile's hops.

use super::chart::series_colour;
use super::plot::{bars, curves, figure, Axis, Bar, Bars, Curves, Point, Scale, Series};
use super::Section;
use crate::bench::proof::document::{
    MeasuredStrategy, PlanBatchDocument, PlanConcurrentDocument, PlanDocument, PlanSweepDocument,
    SweepPoint,
};
use crate::engine::Strategy;
use crate::model::{Hop, Profile};
use crate::units::format_bytes;
use crate::Result;
use plotters::style::RGBColor;

/// A bar of `value` µs with its tooltip, marked `pick` where `picked`.
fn bar(value: f64, tip: String, picked: bool) -> Option<Bar> {
    Some(Bar {
        value,
        tip,
        mark: picked.then(|| "pick".to_string()),
    })
}

pub fn sweep_charts(section: &mut Section, doc: &PlanSweepDocument) -> Result<()> {
    let mut strategies: Vec<Strategy> = doc
        .points
        .iter()
        .flat_map(|p| p.proof.measured.iter().map(|m| m.strategy))
        .collect();
    strategies.sort_by_key(|s| Strategy::ALL.iter().position(|a| a == s));
    strategies.dedup();
    let mut series = Vec::new();
    for (i, &strategy) in strategies.iter().enumerate() {
        let of = |p| -> Option<(&SweepPoint, &MeasuredStrategy)> {
            let p: &SweepPoint = p;
            p.proof
                .measured
                .iter()
                .find(|m| m.strategy == strategy)
                .map(|m| (p, m))
        };
        let measured = doc
            .points
            .iter()
            .filter_map(of)
            .map(|(p, m)| Point {
                x: p.bytes as f64,
                y: m.measured_us,
                tip: format!(
                    "{strategy} at {}: measured {} µs, predicted {} µs{}",
                    format_bytes(p.bytes),
                    figure(m.measured_us),
                    figure(m.predicted_us),
                    if p.pick == strategy {
                        format!(" — the pick (regret {:.1}%)", p.proof.regret * 100.0)
                    } else {
                        String::new()
                    }
                ),
                ringed: p.pick == strategy,
            })
            .collect();
        let predicted = doc
            .points
            .iter()
            .filter_map(of)
            .map(|(p, m)| Point::new(p.bytes as f64, m.predicted_us, ""))
            .collect();
        series.push(Series {
            name: format!("{strategy} measured"),
            colour: series_colour(i),
            dashed: false,
            dots: true,
            points: measured,
        });
        series.push(Series {
            name: format!("{strategy} predicted"),
            colour: series_colour(i),
            dashed: true,
            dots: false,
            points: predicted,
        });
    }
    series.push(Series {
        name: "plain copy, no engine".into(),
        colour: RGBColor(150, 150, 150),
        dashed: false,
        dots: true,
        points: doc
            .points
            .iter()
            .map(|p| {
                Point::new(
                    p.bytes as f64,
                    p.proof.plain_copy.gpu_us,
                    format!(
                        "plain copy at {}: {} µs GPU time",
                        format_bytes(p.bytes),
                        figure(p.proof.plain_copy.gpu_us)
                    ),
                )
            })
            .collect(),
    });
    let c = Curves {
        x: Axis::new("transfer size", Scale::LogBytes),
        y: Axis::new("µs (GPU time, median)", Scale::Log),
        series,
        marks: Vec::new(),
    };
    let title = format!(
        "Engine GPU{} → GPU{}: predicted (dashed) and measured per strategy, the pick circled",
        doc.src, doc.dst
    );
    section.add("engine-sweep", &title, |id, title| curves(id, title, &c))?;
    section.notes.push(format!(
        "worst regret of the pick over the sweep: {:.1}%; costs: {}",
        doc.worst_regret * 100.0,
        doc.model
    ));
    Ok(())
}

pub fn single_charts(section: &mut Section, doc: &PlanDocument) -> Result<()> {
    let pick = (doc.strategy, doc.predicted_us);
    let rows = std::iter::once(pick).chain(
        doc.alternatives
            .iter()
            .map(|a| (a.strategy, a.predicted_us)),
    );
    let groups = rows
        .map(|(strategy, predicted)| {
            let picked = strategy == doc.strategy;
            let measured = doc
                .proof
                .as_ref()
                .and_then(|p| p.measured.iter().find(|m| m.strategy == strategy))
                .map(|m| m.measured_us);
            let mut bars = vec![bar(
                predicted,
                format!("{strategy}: predicted {} µs", figure(predicted)),
                picked,
            )];
            if doc.proof.is_some() {
                bars.push(measured.and_then(|us| {
                    bar(us, format!("{strategy}: measured {} µs", figure(us)), false)
                }));
            }
            (strategy.to_string(), bars)
        })
        .collect();
    let mut series = vec!["predicted".to_string()];
    if doc.proof.is_some() {
        series.push("measured".into());
    }
    let b = Bars {
        y: Axis::new("µs", Scale::Log),
        series,
        groups,
    };
    let title = format!(
        "{} GPU{} → GPU{}: every strategy, the pick marked",
        format_bytes(doc.bytes),
        doc.src,
        doc.dst
    );
    section.add("plan", &title, |id, title| bars(id, title, &b))?;
    section.notes.extend(
        doc.unusable
            .iter()
            .map(|u| format!("not usable: {} — {}", u.strategy, u.reason)),
    );
    if let Some(proof) = &doc.proof {
        section.notes.push(format!(
            "fastest measured: {}; the pick's regret {:.1}%; the engine against a plain copy: {:+.1}%",
            proof.best,
            proof.regret * 100.0,
            proof.engine_overhead * 100.0
        ));
    }
    Ok(())
}

pub fn batch_charts(section: &mut Section, doc: &PlanBatchDocument) -> Result<()> {
    let what = format!(
        "{} messages of {} GPU{} → GPU{}",
        doc.messages,
        format_bytes(doc.message_bytes),
        doc.src,
        doc.dst
    );
    let predicted = Bars {
        y: Axis::new("µs, predicted for the batch", Scale::Log),
        series: vec!["predicted".into()],
        groups: std::iter::once((doc.strategy, doc.predicted_us))
            .chain(
                doc.alternatives
                    .iter()
                    .map(|a| (a.strategy, a.predicted_us)),
            )
            .map(|(s, us)| {
                let tip = format!("{s}: predicted {} µs", figure(us));
                (s.to_string(), vec![bar(us, tip, s == doc.strategy)])
            })
            .collect(),
    };
    section.add(
        "batch-predicted",
        &format!("{what}: predicted"),
        |id, title| bars(id, title, &predicted),
    )?;
    if let Some(proof) = &doc.proof {
        let ways = [&proof.plain_copies, &proof.engine_one_call]
            .into_iter()
            .chain(&proof.prepared);
        let measured = Bars {
            y: Axis::new("µs per message (host clock)", Scale::Log),
            series: vec!["measured".into()],
            groups: ways
                .map(|w| {
                    let tip = format!(
                        "{}: {} µs per message; prepared once in {} µs",
                        w.name,
                        figure(w.per_message_us),
                        figure(w.prepare_us)
                    );
                    let picked = w.name == proof.pick.name();
                    (w.name.clone(), vec![bar(w.per_message_us, tip, picked)])
                })
                .collect(),
        };
        section.add(
            "batch-measured",
            &format!("{what}: measured"),
            |id, title| bars(id, title, &measured),
        )?;
        section.notes.push(format!(
            "the engine in one call is {:.0}× faster per message than plain copies",
            proof.speedup_over_plain
        ));
    }
    Ok(())
}

pub fn concurrent_charts(section: &mut Section, doc: &PlanConcurrentDocument) -> Result<()> {
    let flows = Bars {
        y: Axis::new("µs (GPU time, median)", Scale::Linear),
        series: if doc.regret.is_some() {
            vec!["alone".into(), "together".into()]
        } else {
            vec!["alone".into()]
        },
        groups: doc
            .flows
            .iter()
            .map(|f| {
                let name = format!("GPU{} → GPU{}", f.src, f.dst);
                let tip =
                    |when: &str, us: f64| format!("{name} ({}) {when}: {} µs", f.pick, figure(us));
                let mut bars = vec![bar(f.alone_us, tip("alone", f.alone_us), false)];
                bars.extend(f.together_us.map(|us| bar(us, tip("together", us), false)));
                (name, bars)
            })
            .collect(),
    };
    let what = format!(
        "{} flows of {} ({})",
        doc.flows.len(),
        format_bytes(doc.bytes),
        doc.traffic
    );
    section.add(
        "concurrent-flows",
        &format!("{what}: each alone and together"),
        |id, title| bars(id, title, &flows),
    )?;
    let ways = Bars {
        y: Axis::new("makespan µs (host clock)", Scale::Linear),
        series: vec!["makespan".into()],
        groups: doc
            .ways
            .iter()
            .map(|w| {
                let name = w
                    .strategy
                    .map_or_else(|| "planner's picks".to_string(), |s| format!("{s} for all"));
                let tip = format!(
                    "{name}: {} µs, {} GB/s end to end",
                    figure(w.makespan_us),
                    figure(w.gbps)
                );
                (name, vec![bar(w.makespan_us, tip, w.strategy.is_none())])
            })
            .collect(),
    };
    // A partial document has no way timed.
    if !ways.groups.is_empty() {
        section.add(
            "concurrent-ways",
            &format!("{what}: every way at once"),
            |id, title| bars(id, title, &ways),
        )?;
    }
    section.notes.push(match (doc.together_gbps, doc.regret) {
        (Some(together), Some(regret)) => format!(
            "aggregate {} GB/s alone, {} GB/s together; the picks' regret {:.1}%",
            figure(doc.alone_gbps),
            figure(together),
            regret * 100.0
        ),
        _ => format!(
            "partial: stopped before every flow ran together; aggregate {} GB/s alone",
            figure(doc.alone_gbps)
        ),
    });
    Ok(())
}

/// A hop as a short label: `peer-ce 0→1`, `host→GPU0 (NUMA 0)`.
fn hop_label(hop: &Hop) -> String {
    let node = |n: &Option<i32>| n.map_or(String::new(), |n| format!(" (NUMA {n})"));
    match hop {
        Hop::PeerCe { src, dst } => format!("peer-ce {src}→{dst}"),
        Hop::PeerSm { src, dst } => format!("peer-sm {src}→{dst}"),
        Hop::Resident { src, dst } => format!("resident {src}→{dst}"),
        Hop::DeviceToHost { device, node: n } => format!("GPU{device}→host{}", node(n)),
        Hop::HostToDevice { device, node: n } => format!("host→GPU{device}{}", node(n)),
        Hop::Local { device } => format!("local GPU{device}"),
        Hop::NetRdma { src, dst } => format!("net-rdma {src}→{dst}"),
        Hop::NetHost { src, dst } => format!("net-host {src}→{dst}"),
    }
}

pub fn profile_charts(section: &mut Section, profile: &Profile) -> Result<()> {
    let groups = profile
        .hops
        .iter()
        .map(|h| {
            let tip = format!(
                "{}: β = {} GB/s, α = {} µs (time = α + bytes / β)",
                hop_label(&h.hop),
                figure(h.cost.beta_gbps),
                figure(h.cost.alpha_us)
            );
            (hop_label(&h.hop), vec![bar(h.cost.beta_gbps, tip, false)])
        })
        .collect();
    let b = Bars {
        y: Axis::new("β GB/s", Scale::Linear),
        series: vec!["β".into()],
        groups,
    };
    section.add(
        "profile-hops",
        "Hop costs: β per hop (α in each tooltip)",
        |id, title| bars(id, title, &b),
    )?;
    section.notes.extend(profile.notes.iter().cloned());
    Ok(())
}
