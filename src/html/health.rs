//! The health documents: `doctor` (each check's verdict and finding in the notes, the checks as a
//! table) and `check` (a chart per unit, a pair of bars — expected, measured — per figure, the
//! regressed ones named).

use super::plot::{bars, figure, Axis, Bar, Bars, Scale};
use super::Section;
use crate::bench::result::Unit;
use crate::check::document::CheckDocument;
use crate::doctor::document::DoctorDocument;
use crate::Result;

pub fn doctor_notes(section: &mut Section, doc: &DoctorDocument) {
    let s = &doc.summary;
    section.notes.push(format!(
        "{} fail, {} warn, {} info, {} ok",
        s.fail, s.warn, s.info, s.ok
    ));
    section.notes.extend(doc.checks.iter().map(|c| {
        let fix = c
            .fix
            .as_deref()
            .map_or(String::new(), |f| format!(" — fix: {f}"));
        format!(
            "{} {} ({}): {}{fix}",
            c.verdict.name().to_uppercase(),
            c.check,
            c.subject,
            c.finding
        )
    }));
}

pub fn check_charts(section: &mut Section, doc: &CheckDocument) -> Result<()> {
    let report = &doc.report;
    for unit in [Unit::Gbps, Unit::Micros, Unit::Nanos] {
        let figures: Vec<_> = report.figures.iter().filter(|f| f.unit == unit).collect();
        if figures.is_empty() {
            continue;
        }
        let bar = |value: f64, what: &str, f: &crate::check::CheckedFigure| {
            Some(Bar {
                value,
                tip: format!(
                    "{} {} ({what}): {} {}; {} slower than expected, tolerance {}%",
                    f.test,
                    f.place,
                    figure(value),
                    unit.symbol(),
                    format_args!("{}%", figure(f.slower_pct)),
                    figure(f.tolerance_pct)
                ),
                mark: None,
            })
        };
        let b = Bars {
            y: Axis::new(unit.symbol(), Scale::Log),
            series: vec!["expected".to_string(), "measured".to_string()],
            groups: figures
                .iter()
                .map(|f| {
                    (
                        format!("{} {}", f.test, f.place),
                        vec![
                            bar(f.expected, "expected", f),
                            bar(f.measured, "measured", f),
                        ],
                    )
                })
                .collect(),
        };
        let title = format!("health check, {}", unit.symbol());
        section.add(&format!("check-{}", unit.name()), &title, |id, title| {
            bars(id, title, &b)
        })?;
    }
    section.notes.push(match report.healthy {
        true => "HEALTHY: every figure within its tolerance".to_string(),
        false => format!("REGRESSED: {}", report.regressed.join(", ")),
    });
    Ok(())
}
