//! Bench and explain documents: a heatmap per matrix test (bandwidth blue, times orange), bars
//! per GPU for the per-GPU tests, a log-log curve per size sweep with its α–β fit and the sizes
//! that reach 50% and 90% of β, and the latency of one transfer as a waterfall.

use super::chart::{series_colour, INK, MISSING};
use super::plot::{
    bars, curves, figure, heatmap, waterfall, Axis, Bar, Bars, Cell, Curves, Heatmap, Legend, Mark,
    Point, Scale, Series, Step,
};
use super::Section;
use crate::bench::document::{BenchDocument, ExplainDocument};
use crate::bench::explain::BELOW_RESOLUTION;
use crate::bench::result::{Place, Sweep, TestResult, Unit};
use crate::units::format_bytes;
use crate::Result;
use plotters::style::RGBColor;

/// The ends of a test's colour scale: blue for bandwidth, orange for times.
fn scale(unit: Unit) -> (RGBColor, RGBColor) {
    match unit {
        Unit::Gbps => (RGBColor(222, 235, 247), RGBColor(8, 81, 156)),
        Unit::Micros | Unit::Nanos => (RGBColor(254, 230, 206), RGBColor(166, 54, 3)),
    }
}

/// A figure with its unit, `392 GB/s`.
fn with_unit(value: f64, unit: Unit) -> String {
    format!("{} {}", figure(value), unit.symbol())
}

/// A measured cell in words: the figure, its spread, what it measures.
fn cell_tip(test: &TestResult, place: Place) -> String {
    let at = match place {
        Place::Pair { src, dst } => format!("GPU{src} → GPU{dst}"),
        Place::Device { device } => format!("GPU{device}"),
    };
    match (test.cell(place), test.reason(place)) {
        (Some(c), _) => format!(
            "{} {at}: {}{}; {} per operation (median of {}, p99 {}, cv {:.1}%); {}",
            test.name,
            with_unit(c.value, test.unit),
            c.total.map_or_else(String::new, |t| format!(
                ", both directions {}",
                with_unit(t, test.unit)
            )),
            with_unit(c.time_us.median, Unit::Micros),
            c.time_us.samples,
            with_unit(c.time_us.p99, Unit::Micros),
            c.time_us.cv * 100.0,
            test.measures
        ),
        (None, Some(reason)) => format!("{} {at}: not measured: {reason}", test.name),
        (None, None) => format!("{} {at}: not measured", test.name),
    }
}

pub fn charts(section: &mut Section, doc: &BenchDocument) -> Result<()> {
    let devices = &doc.results.devices;
    for test in &doc.results.tests {
        let title = format!(
            "{} — {} per message, {}",
            test.name,
            format_bytes(test.size_bytes),
            test.unit.symbol()
        );
        if let Some(matrix) = &test.matrix {
            // From 0, so that figures a few percent apart look alike.
            let high = test.cells.iter().map(|c| c.value).fold(0.0, f64::max);
            let (light, dark) = scale(test.unit);
            let cells = devices
                .iter()
                .map(|&s| {
                    devices
                        .iter()
                        .map(|&d| {
                            let tip = cell_tip(test, Place::Pair { src: s, dst: d });
                            match matrix.get(s).and_then(|row| row.get(d)).copied().flatten() {
                                Some(v) => Cell {
                                    fill: super::chart::blend(
                                        light,
                                        dark,
                                        if high > 0.0 { v / high } else { 1.0 },
                                    ),
                                    text: figure(v),
                                    tip,
                                },
                                None => Cell {
                                    fill: MISSING,
                                    text: if s == d { "X" } else { "N/A" }.into(),
                                    tip,
                                },
                            }
                        })
                        .collect()
                })
                .collect();
            let map = Heatmap {
                labels: devices.iter().map(|d| format!("GPU{d}")).collect(),
                cells,
                legend: Legend::Scale {
                    low: light,
                    high: dark,
                    from: with_unit(0.0, test.unit),
                    to: with_unit(high, test.unit),
                },
            };
            section.add(&test.name, &title, |id, title| heatmap(id, title, &map))?;
        } else if let Some(values) = &test.values {
            let groups = devices
                .iter()
                .map(|&d| {
                    let bar = values.get(d).copied().flatten().map(|v| Bar {
                        value: v,
                        tip: cell_tip(test, Place::Device { device: d }),
                        mark: None,
                    });
                    (format!("GPU{d}"), vec![bar])
                })
                .collect();
            let b = Bars {
                y: Axis::new(test.unit.symbol(), Scale::Linear),
                series: vec![test.name.clone()],
                groups,
            };
            section.add(&test.name, &title, |id, title| bars(id, title, &b))?;
        }
        section
            .notes
            .extend(test.notes.iter().map(|n| format!("{}: {n}", test.name)));
    }
    for sweep in &doc.results.sweeps {
        sweep_chart(section, sweep)?;
    }
    Ok(())
}

/// A size sweep: GB/s against size, both logarithmic, with the fit's curve and its 50% and 90%
/// sizes.
fn sweep_chart(section: &mut Section, sweep: &Sweep) -> Result<()> {
    let name = format!("{} sweep GPU{} → GPU{}", sweep.test, sweep.src, sweep.dst);
    if let Some(reason) = &sweep.not_measured {
        section
            .notes
            .push(format!("{name}: not measured: {reason}"));
        return Ok(());
    }
    let measured = Series {
        name: "measured (median)".into(),
        colour: series_colour(0),
        dashed: false,
        dots: true,
        points: sweep
            .points
            .iter()
            .map(|p| {
                Point::new(
                    p.bytes as f64,
                    p.gbps,
                    format!(
                        "{}: {} GB/s; {} µs per message (median), p99 {} µs",
                        format_bytes(p.bytes),
                        figure(p.gbps),
                        figure(p.median_us),
                        figure(p.p99_us)
                    ),
                )
            })
            .collect(),
    };
    let mut c = Curves {
        x: Axis::new("message size", Scale::LogBytes),
        y: Axis::new("GB/s", Scale::Log),
        series: vec![measured],
        marks: Vec::new(),
    };
    if let Some(fit) = &sweep.fit {
        let (first, last) = (
            sweep.points.first().map_or(1, |p| p.bytes) as f64,
            sweep.points.last().map_or(1, |p| p.bytes) as f64,
        );
        let sizes = (0..=48).map(|i| first * (last / first).powf(f64::from(i) / 48.0));
        c.series.push(Series {
            name: format!(
                "fit: α = {} µs, β = {} GB/s",
                figure(fit.alpha_us),
                figure(fit.beta_gbps)
            ),
            colour: INK,
            dashed: true,
            dots: false,
            points: sizes
                .map(|b| Point::new(b, b / (fit.alpha_us + b / (fit.beta_gbps * 1e3)) / 1e3, ""))
                .collect(),
        });
        c.marks = vec![
            Mark {
                x: fit.half_beta_bytes,
                label: format!(
                    "50% of β at {}",
                    format_bytes(fit.half_beta_bytes.round() as u64)
                ),
            },
            Mark {
                x: fit.ninety_beta_bytes,
                label: format!(
                    "90% at {}",
                    format_bytes(fit.ninety_beta_bytes.round() as u64)
                ),
            },
        ];
    }
    section.add(&name, &name, |id, title| curves(id, title, &c))
}

pub fn explain_charts(section: &mut Section, doc: &ExplainDocument) -> Result<()> {
    let e = &doc.explanation;
    let mut steps = Vec::new();
    let mut at = 0.0;
    for (i, part) in e.parts.iter().enumerate() {
        steps.push(Step {
            name: part.name.clone(),
            start: at,
            end: at + part.us,
            colour: series_colour(i),
            tip: format!(
                "{}: {} µs ({:.0}% of the sum); measured by {}",
                part.name,
                figure(part.us),
                part.us / e.sum_us * 100.0,
                part.measured_by
            ),
        });
        at += part.us;
    }
    steps.push(Step {
        name: "sum of parts".into(),
        start: 0.0,
        end: e.sum_us,
        colour: RGBColor(150, 150, 150),
        tip: format!("sum of parts: {} µs", figure(e.sum_us)),
    });
    steps.push(Step {
        name: "measured end to end".into(),
        start: 0.0,
        end: e.measured_us,
        colour: INK,
        tip: format!(
            "measured end to end: {} µs (median of {}, p99 {} µs); gap {} µs ({:.1}%)",
            figure(e.measured_us),
            e.measured.samples,
            figure(e.measured.p99),
            crate::report::bench::signed_hundredths(e.gap_us),
            e.gap_percent
        ),
    });
    let title = format!(
        "Where the time goes: {} GPU{} → GPU{}",
        format_bytes(e.size_bytes),
        e.src,
        e.dst
    );
    section.add("waterfall", &title, |id, title| {
        waterfall(id, title, "µs per transfer", &steps)
    })?;
    let setup = Bars {
        y: Axis::new("µs, once", Scale::Linear),
        series: vec!["setup".into()],
        groups: e
            .setup
            .iter()
            .map(|p| {
                let bar = Bar {
                    value: p.us,
                    tip: format!("{}: {} µs; {}", p.name, figure(p.us), p.measured_by),
                    // No bar is drawn for it: say why at its place.
                    mark: p.below_resolution().then(|| BELOW_RESOLUTION.to_string()),
                };
                (p.name.clone(), vec![Some(bar)])
            })
            .collect(),
    };
    section.add(
        "setup",
        "Setup, once before the first transfer",
        |id, title| bars(id, title, &setup),
    )?;
    sweep_chart(section, &e.sweep)?;
    section.notes.push(format!("route: {}", e.route));
    section.notes.extend(e.fixes.iter().map(|f| {
        format!(
            "[{}] {} — saves {} µs ({})",
            f.part,
            f.fix,
            figure(f.saves_us),
            f.computed_from
        )
    }));
    section.notes.extend(e.notes.iter().cloned());
    Ok(())
}
