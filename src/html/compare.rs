//! A compare document: the two runs side by side, a chart per unit, a pair of bars (base, other)
//! per figure, and the median ratio of each test in the notes.

use super::plot::{bars, figure, Axis, Bar, Bars, Scale};
use super::Section;
use crate::bench::compare::CompareDocument;
use crate::bench::result::Unit;
use crate::Result;

pub fn charts(section: &mut Section, doc: &CompareDocument) -> Result<()> {
    let (base, other) = (doc.base_source.to_string(), doc.header.source.to_string());
    for unit in [Unit::Gbps, Unit::Micros, Unit::Nanos] {
        let pairs: Vec<_> = doc.pairs.iter().filter(|p| p.unit == unit).collect();
        if pairs.is_empty() {
            continue;
        }
        let bar = |value: f64, run: &str, p: &crate::bench::compare::Pair| {
            Some(Bar {
                value,
                tip: format!(
                    "{} {} ({run}): {} {}; other / base = {}",
                    p.test,
                    p.place,
                    figure(value),
                    unit.symbol(),
                    figure(p.ratio)
                ),
                mark: None,
            })
        };
        let b = Bars {
            y: Axis::new(unit.symbol(), Scale::Log),
            series: vec![format!("base: {base}"), format!("other: {other}")],
            groups: pairs
                .iter()
                .map(|p| {
                    (
                        format!("{} {}", p.test, p.place),
                        vec![bar(p.base, &base, p), bar(p.other, &other, p)],
                    )
                })
                .collect(),
        };
        let title = format!("{other} against {base}, {}", unit.symbol());
        section.add(&format!("compare-{}", unit.name()), &title, |id, title| {
            bars(id, title, &b)
        })?;
    }
    section.notes.extend(doc.tests.iter().map(|t| {
        format!(
            "{}: {} figures, median other / base {}; furthest {} ({} against {}, ratio {})",
            t.test,
            t.paired,
            figure(t.median_ratio),
            t.worst.place,
            figure(t.worst.base),
            figure(t.worst.other),
            figure(t.worst.ratio)
        )
    }));
    if !doc.unmatched.is_empty() {
        section
            .notes
            .push(format!("not compared: {}", doc.unmatched.join(", ")));
    }
    Ok(())
}
