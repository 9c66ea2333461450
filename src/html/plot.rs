//! The report's four kinds of chart, each from plain data: a [`Heatmap`] (a GPU-by-GPU matrix),
//! [`Bars`] (grouped, a bar per series), [`Curves`] (lines over an axis of sizes) and a
//! [`waterfall`]. Every figure they show has a tooltip.
//!
//! Axes are linear or logarithmic ([`Axis`]); a logarithmic one is drawn as a linear axis of
//! log₁₀ values with its own tick marks, so the four kinds share one coordinate type.

use super::chart::{blend, draw, font, heading, series_colour, text_on, Area, Chart, Painted, INK};
use crate::units::format_bytes;
use crate::Result;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A chart's width and height when nothing asks for more.
const WIDTH: u32 = 720;
const HEIGHT: u32 = 380;

/// How an axis maps values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    Linear,
    /// Logarithmic, ticks at powers of ten (and 2 and 5 between them over a short span).
    Log,
    /// Logarithmic over byte sizes, ticks at powers of four or more, labelled `4 KiB`.
    LogBytes,
}

/// An axis: what it shows and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    pub label: String,
    pub scale: Scale,
}

impl Axis {
    pub fn new(label: impl Into<String>, scale: Scale) -> Axis {
        Axis {
            label: label.into(),
            scale,
        }
    }

    /// Whether a value can be placed on the axis (a log axis has no place for 0).
    fn holds(&self, v: f64) -> bool {
        v.is_finite() && (self.scale == Scale::Linear || v > 0.0)
    }

    /// A value's position along the axis.
    fn to(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear => v,
            Scale::Log | Scale::LogBytes => v.log10(),
        }
    }

    fn from(&self, position: f64) -> f64 {
        match self.scale {
            Scale::Linear => position,
            Scale::Log | Scale::LogBytes => 10f64.powf(position),
        }
    }

    /// The span of positions that shows `values` with a margin; a linear axis starts at 0.
    fn span(&self, values: impl Iterator<Item = f64>) -> (f64, f64) {
        let positions: Vec<f64> = values
            .filter(|&v| self.holds(v))
            .map(|v| self.to(v))
            .collect();
        let low = positions.iter().copied().fold(f64::INFINITY, f64::min);
        let high = positions.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        match self.scale {
            _ if positions.is_empty() => (0.0, 1.0),
            Scale::Linear => (low.min(0.0), if high > 0.0 { high * 1.12 } else { 1.0 }),
            Scale::Log | Scale::LogBytes => {
                let pad = ((high - low) * 0.06).max(0.15);
                (low - pad, high + pad)
            }
        }
    }

    /// Tick positions within `span`: plotters' own for a linear axis.
    fn ticks(&self, (low, high): (f64, f64)) -> Option<Vec<f64>> {
        let steps = |step: f64| -> Vec<f64> {
            let first = (low / step).ceil() as i64;
            let last = (high / step).floor() as i64;
            (first..=last).map(|k| k as f64 * step).collect()
        };
        match self.scale {
            Scale::Linear => None,
            Scale::Log => {
                let decades = steps(1.0);
                if high - low > 2.5 {
                    return Some(decades);
                }
                let mut ticks: Vec<f64> = (low.floor() as i64..=high.ceil() as i64)
                    .flat_map(|k| [1.0, 2.0, 5.0].map(|m: f64| k as f64 + m.log10()))
                    .filter(|t| (low..=high).contains(t))
                    .collect();
                ticks.dedup();
                Some(ticks)
            }
            Scale::LogBytes => {
                // Powers of 4, 16 or 1024 bytes: about eight ticks whatever the span.
                let quarter = 4f64.log10();
                let per = [1.0, 2.0, 5.0]
                    .into_iter()
                    .find(|k| (high - low) / (quarter * k) <= 9.0)
                    .unwrap_or(5.0);
                Some(steps(quarter * per))
            }
        }
    }

    /// A tick's label.
    fn label_of(&self, position: f64) -> String {
        let v = self.from(position);
        match self.scale {
            Scale::LogBytes => format_bytes(v.round() as u64),
            Scale::Linear | Scale::Log => figure(v),
        }
    }
}

/// A number in three significant figures, without trailing zeros: `0.000587`, `12.3`, `4010`;
/// one too small for nine decimals in scientific notation (`8.9e-16`), so that no tick of a tiny
/// axis reads `0`.
pub fn figure(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    if v.abs() < 1e-6 {
        let text = format!("{v:.2e}");
        let (digits, exponent) = text.split_once('e').unwrap_or((&text, "0"));
        let digits = digits.trim_end_matches('0').trim_end_matches('.');
        return format!("{digits}e{exponent}");
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 9) as usize;
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A linear axis of positions whose ticks are the ones given, plotters' own where none are.
#[derive(Clone)]
struct Ticked {
    inner: RangedCoordf64,
    ticks: Option<Vec<f64>>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        self.ticks
            .clone()
            .unwrap_or_else(|| self.inner.key_points(hint))
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.inner.range()
    }
}

/// The plotting area of a chart.
type Plane<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<Ticked, Ticked>>;

/// Builds the plotting area for `x` over `xs` and `y` over `ys` on `root`, its mesh drawn.
fn plane<'a, 'b>(
    root: &'a Area<'b>,
    title: &str,
    (x, xs): (&Axis, (f64, f64)),
    (y, ys): (&Axis, (f64, f64)),
    x_labels: bool,
) -> std::result::Result<Plane<'a, 'b>, Box<dyn std::error::Error>> {
    let ticked = |axis: &Axis, span: (f64, f64)| Ticked {
        inner: (span.0..span.1).into(),
        ticks: axis.ticks(span),
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, font(15, INK))
        .margin(12)
        .margin_right(24)
        .x_label_area_size(if x_labels { 40 } else { 56 })
        .y_label_area_size(70)
        .build_cartesian_2d(ticked(x, xs), ticked(y, ys))?;
    let x_label = |v: &f64| x.label_of(*v);
    let y_label = |v: &f64| y.label_of(*v);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(x.label.as_str())
        .y_desc(y.label.as_str())
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .axis_desc_style(font(13, INK))
        .label_style(font(11, INK))
        .light_line_style(WHITE)
        .bold_line_style(RGBColor(232, 232, 232));
    if !x_labels {
        mesh.disable_x_mesh().x_labels(0);
    }
    mesh.draw()?;
    Ok(chart)
}

/// One cell of a [`Heatmap`].
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub fill: RGBColor,
    pub text: String,
    pub tip: String,
}

/// What a heatmap's colours mean.
#[derive(Clone, Debug, PartialEq)]
pub enum Legend {
    /// A scale from `low` to `high`, the figures at its ends.
    Scale {
        low: RGBColor,
        high: RGBColor,
        from: String,
        to: String,
    },
    /// A colour per class.
    Classes(Vec<(RGBColor, String)>),
}

/// A matrix: rows are sources, columns destinations.
#[derive(Clone, Debug, PartialEq)]
pub struct Heatmap {
    pub labels: Vec<String>,
    /// `cells[row][column]`.
    pub cells: Vec<Vec<Cell>>,
    pub legend: Legend,
}

/// A heatmap's geometry: cell size and where the matrix starts.
const CELL: (i32, i32) = (76, 40);
const MATRIX_AT: (i32, i32) = (74, 64);

pub fn heatmap(id: &str, title: &str, map: &Heatmap) -> Result<Chart> {
    let n = map.labels.len() as i32;
    let legend_rows = match &map.legend {
        Legend::Scale { .. } => 3,
        Legend::Classes(classes) => classes.len() as i32,
    };
    let matrix_right = MATRIX_AT.0 + n * CELL.0;
    let width = (matrix_right + 250).max(420);
    let height = (MATRIX_AT.1 + n * CELL.1).max(MATRIX_AT.1 + legend_rows * 22) + 24;
    draw(id, title, (width as u32, height as u32), |area, tips| {
        heading(area, title)?;
        let label = font(12, INK);
        area.draw(&Text::new(
            "row → column",
            (MATRIX_AT.0, MATRIX_AT.1 - 34),
            font(11, RGBColor(110, 110, 110)),
        ))?;
        for (i, name) in map.labels.iter().enumerate() {
            let i = i as i32;
            let centre = MATRIX_AT.0 + i * CELL.0 + CELL.0 / 2;
            area.draw(&Text::new(
                name.clone(),
                (centre, MATRIX_AT.1 - 8),
                label.pos(Pos::new(HPos::Center, VPos::Bottom)),
            ))?;
            area.draw(&Text::new(
                name.clone(),
                (MATRIX_AT.0 - 8, MATRIX_AT.1 + i * CELL.1 + CELL.1 / 2),
                label.pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
        }
        for (r, row) in map.cells.iter().enumerate() {
            for (c, cell) in row.iter().enumerate() {
                let at = (
                    MATRIX_AT.0 + c as i32 * CELL.0,
                    MATRIX_AT.1 + r as i32 * CELL.1,
                );
                let end = (at.0 + CELL.0 - 2, at.1 + CELL.1 - 2);
                area.draw(&Rectangle::new([at, end], cell.fill.filled()))?;
                area.draw(&Text::new(
                    cell.text.clone(),
                    (at.0 + CELL.0 / 2 - 1, at.1 + CELL.1 / 2 - 1),
                    font(12, text_on(cell.fill)).pos(Pos::new(HPos::Center, VPos::Center)),
                ))?;
                tips.area(at, end, cell.tip.clone());
            }
        }
        legend(area, &map.legend, (matrix_right + 24, MATRIX_AT.1))
    })
}

/// Draws a heatmap's legend with its top left at `at`.
fn legend(area: &Area<'_>, legend: &Legend, at: (i32, i32)) -> Painted {
    let swatch = |i: i32, colour: RGBColor, text: &str| -> Painted {
        let y = at.1 + i * 22;
        area.draw(&Rectangle::new(
            [(at.0, y), (at.0 + 16, y + 14)],
            colour.filled(),
        ))?;
        area.draw(&Text::new(
            text.to_string(),
            (at.0 + 22, y + 7),
            font(11, INK).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        Ok(())
    };
    match legend {
        Legend::Classes(classes) => {
            for (i, (colour, text)) in classes.iter().enumerate() {
                swatch(i as i32, *colour, text)?;
            }
        }
        Legend::Scale {
            low,
            high,
            from,
            to,
        } => {
            swatch(0, *low, from)?;
            swatch(1, blend(*low, *high, 0.5), "")?;
            swatch(2, *high, to)?;
        }
    }
    Ok(())
}

/// A bar of [`Bars`].
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub value: f64,
    pub tip: String,
    /// Outlined and labelled `mark` (the planner's pick, say).
    pub mark: Option<String>,
}

/// Bars side by side in each group, one per series.
#[derive(Clone, Debug, PartialEq)]
pub struct Bars {
    pub y: Axis,
    pub series: Vec<String>,
    /// (group label, a bar per series where there is one).
    pub groups: Vec<(String, Vec<Option<Bar>>)>,
}

pub fn bars(id: &str, title: &str, b: &Bars) -> Result<Chart> {
    let n = b.groups.len().max(1);
    // Room for a bar per series, and for the group's label (wrapped at 16 characters).
    let label = b
        .groups
        .iter()
        .flat_map(|(label, _)| wrap(label, 16))
        .map(|line| line.chars().count())
        .max()
        .unwrap_or(0);
    let per_group = (24 * b.series.len()).max(7 * label + 12).max(60) as u32;
    // Room for the legend's longest name too (a name past LEGEND_CHARS is cut), so that it stays
    // inside the chart's box.
    let names: Vec<String> = b
        .series
        .iter()
        .map(|name| shortened(name, LEGEND_CHARS))
        .collect();
    let legend = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) as u32;
    let legend_width = match b.series.len() > 1 {
        true => 7 * legend + 140,
        false => 0,
    };
    let width = (120 + n as u32 * per_group)
        .max(legend_width)
        .clamp(WIDTH / 2 + 60, 1500);
    let values = b
        .groups
        .iter()
        .flat_map(|(_, bars)| bars.iter().flatten().map(|bar| bar.value));
    let ys = b.y.span(values);
    let xs = (-0.5, n as f64 - 0.5);
    let x = Axis::new("", Scale::Linear);
    draw(id, title, (width, HEIGHT), |area, tips| {
        let mut chart = plane(area, title, (&x, xs), (&b.y, ys), false)?;
        let width = 0.8 / b.series.len().max(1) as f64;
        for (s, name) in names.iter().enumerate() {
            let colour = series_colour(s);
            let mut rects = Vec::new();
            for (g, (_, bars)) in b.groups.iter().enumerate() {
                let Some(bar) = bars.get(s).and_then(Option::as_ref) else {
                    continue;
                };
                if !b.y.holds(bar.value) {
                    continue;
                }
                let left = g as f64 - 0.4 + s as f64 * width;
                let corners = [(left, ys.0), (left + width * 0.92, b.y.to(bar.value))];
                tips.area(
                    chart.backend_coord(&corners[0]),
                    chart.backend_coord(&corners[1]),
                    bar.tip.clone(),
                );
                rects.push(Rectangle::new(corners, colour.filled()));
                if let Some(mark) = &bar.mark {
                    rects.push(Rectangle::new(corners, INK.stroke_width(2)));
                    let (px, py) = chart.backend_coord(&(left + width * 0.46, corners[1].1));
                    area.draw(&Text::new(
                        mark.clone(),
                        (px, py - 4),
                        font(11, INK).pos(Pos::new(HPos::Center, VPos::Bottom)),
                    ))?;
                }
            }
            let drawn = chart.draw_series(rects)?;
            if b.series.len() > 1 {
                drawn.label(name.as_str()).legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
            }
        }
        let right = area.dim_in_pixel().0 as i32;
        for (g, (label, _)) in b.groups.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(g as f64, ys.0));
            for (i, line) in wrap(label, 16).iter().enumerate() {
                // A dense chart's outermost labels are moved in to stay inside its box (half a
                // label of 11 px characters, with a margin).
                let half = 4 * line.chars().count() as i32;
                area.draw(&Text::new(
                    line.clone(),
                    (
                        px.clamp(half, (right - half).max(half)),
                        py + 8 + 13 * i as i32,
                    ),
                    font(11, INK).pos(Pos::new(HPos::Center, VPos::Top)),
                ))?;
            }
        }
        if b.series.len() > 1 {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.9))
                .border_style(INK.mix(0.3))
                .label_font(font(12, INK))
                .draw()?;
        }
        Ok(())
    })
}

/// The most characters of a series' name a legend shows.
const LEGEND_CHARS: usize = 96;

/// `text` cut to `chars` characters, an ellipsis saying it was.
fn shortened(text: &str, chars: usize) -> String {
    match text.chars().count() > chars {
        true => format!("{}…", text.chars().take(chars - 1).collect::<String>()),
        false => text.to_string(),
    }
}

/// `text` in lines of about `width` characters, at most three.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= width => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines.truncate(3);
    lines
}

/// A point of a [`Series`].
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
    pub tip: String,
    /// Circled (the planner's pick at that size, say).
    pub ringed: bool,
}

impl Point {
    pub fn new(x: f64, y: f64, tip: impl Into<String>) -> Point {
        Point {
            x,
            y,
            tip: tip.into(),
            ringed: false,
        }
    }
}

/// A line through points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub colour: RGBColor,
    /// A model's line (a fit, a prediction) rather than measurements.
    pub dashed: bool,
    /// Dots at the points (and so tooltips on them).
    pub dots: bool,
    pub points: Vec<Point>,
}

/// A vertical line across the plot at `x`, labelled.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub x: f64,
    pub label: String,
}

/// Lines over a common x axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Curves {
    pub x: Axis,
    pub y: Axis,
    pub series: Vec<Series>,
    pub marks: Vec<Mark>,
}

pub fn curves(id: &str, title: &str, c: &Curves) -> Result<Chart> {
    let points = || c.series.iter().flat_map(|s| s.points.iter());
    let xs =
        c.x.span(points().map(|p| p.x).chain(c.marks.iter().map(|m| m.x)));
    let ys = c.y.span(points().map(|p| p.y));
    draw(id, title, (WIDTH, HEIGHT), |area, tips| {
        let mut chart = plane(area, title, (&c.x, xs), (&c.y, ys), true)?;
        for (i, mark) in c.marks.iter().filter(|m| c.x.holds(m.x)).enumerate() {
            let x = c.x.to(mark.x);
            let grey = RGBColor(120, 120, 120);
            chart.draw_series(DashedLineSeries::new(
                [(x, ys.0), (x, ys.1)],
                3,
                3,
                grey.stroke_width(1),
            ))?;
            let (px, py) = chart.backend_coord(&(x, ys.1));
            area.draw(&Text::new(
                mark.label.clone(),
                (px + 4, py + 4 + 14 * i as i32),
                font(11, grey),
            ))?;
        }
        for s in &c.series {
            let placed: Vec<(f64, f64, &Point)> = s
                .points
                .iter()
                .filter(|p| c.x.holds(p.x) && c.y.holds(p.y))
                .map(|p| (c.x.to(p.x), c.y.to(p.y), p))
                .collect();
            let line: Vec<(f64, f64)> = placed.iter().map(|&(x, y, _)| (x, y)).collect();
            let colour = s.colour;
            let style = colour.stroke_width(2);
            let drawn = if s.dashed {
                chart.draw_series(DashedLineSeries::new(line, 6, 4, style))?
            } else {
                chart.draw_series(LineSeries::new(line, style))?
            };
            drawn
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
            if s.dots {
                chart.draw_series(
                    placed
                        .iter()
                        .map(|&(x, y, _)| Circle::new((x, y), 3, colour.filled())),
                )?;
            }
            chart.draw_series(
                placed
                    .iter()
                    .filter(|(_, _, p)| p.ringed)
                    .map(|&(x, y, _)| Circle::new((x, y), 7, INK.stroke_width(2))),
            )?;
            for &(x, y, p) in placed.iter().filter(|_| s.dots) {
                tips.point(chart.backend_coord(&(x, y)), p.tip.clone());
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(INK.mix(0.3))
            .label_font(font(12, INK))
            .draw()?;
        Ok(())
    })
}

/// A step of a [`waterfall`]: a bar from `start` to `end`.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: String,
    pub start: f64,
    pub end: f64,
    pub colour: RGBColor,
    pub tip: String,
}

/// Horizontal bars, the first at the top, each starting where its step starts: parts adding up
/// to a total.
pub fn waterfall(id: &str, title: &str, x_label: &str, steps: &[Step]) -> Result<Chart> {
    let n = steps.len().max(1);
    let x = Axis::new(x_label, Scale::Linear);
    let xs = x.span(steps.iter().map(|s| s.end.max(s.start)));
    let ys = (0.0, n as f64);
    let height = (90 + 44 * n as u32).max(220);
    draw(id, title, (WIDTH, height), |area, tips| {
        let mut chart = ChartBuilder::on(area)
            .caption(title, font(15, INK))
            .margin(12)
            .margin_right(24)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d(xs.0..xs.1, ys.0..ys.1)?;
        chart
            .configure_mesh()
            .x_desc(x.label.as_str())
            .y_labels(0)
            .disable_y_mesh()
            .axis_desc_style(font(13, INK))
            .label_style(font(11, INK))
            .light_line_style(WHITE)
            .bold_line_style(RGBColor(232, 232, 232))
            .draw()?;
        for (i, step) in steps.iter().enumerate() {
            let row = (n - 1 - i) as f64;
            let corners = [(step.start, row + 0.2), (step.end, row + 0.8)];
            chart.draw_series([Rectangle::new(corners, step.colour.filled())])?;
            tips.area(
                chart.backend_coord(&corners[0]),
                chart.backend_coord(&corners[1]),
                step.tip.clone(),
            );
            let (left, middle) = chart.backend_coord(&(xs.0, row + 0.5));
            area.draw(&Text::new(
                step.name.clone(),
                (left - 8, middle),
                font(12, INK).pos(Pos::new(HPos::Right, VPos::Center)),
            ))?;
            let (end, _) = chart.backend_coord(&(step.end.max(step.start), row));
            area.draw(&Text::new(
                figure(step.end - step.start),
                (end + 6, middle),
                font(11, INK).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_keep_three_significant_digits() {
        assert_eq!(figure(0.000587268), "0.000587");
        assert_eq!(figure(12.3456), "12.3");
        assert_eq!(figure(391.86), "392");
        assert_eq!(figure(4010.0), "4010");
        assert_eq!(figure(2.0), "2");
        assert_eq!(figure(0.0), "0");
        assert_eq!(figure(8.9e-16), "8.9e-16");
        assert_eq!(figure(-2.5e-7), "-2.5e-7");
    }

    /// Every text and shape of `svg` inside its width and height (a text's extent estimated from
    /// its characters and font size).
    fn within_bounds(svg: &str) -> Result<(), String> {
        let number = |tag: &str, name: &str| -> Option<f64> {
            let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            tag[at..].split('"').next()?.parse().ok()
        };
        let root = &svg[svg.find("<svg").unwrap()..];
        let (width, height) = (
            number(root, "width").unwrap(),
            number(root, "height").unwrap(),
        );
        for piece in svg.split('<').skip(1) {
            let (tag, text) = piece.split_once('>').unwrap_or((piece, ""));
            if tag.starts_with("text") && !tag.contains("rotate") {
                let (x, size) = (number(tag, "x").unwrap(), number(tag, "font-size").unwrap());
                let extent = text.chars().count() as f64 * size * 0.55;
                let left = match () {
                    _ if tag.contains("text-anchor=\"middle\"") => x - extent / 2.0,
                    _ if tag.contains("text-anchor=\"end\"") => x - extent,
                    _ => x,
                };
                if left < 0.0 || left + extent > width {
                    return Err(format!(
                        "text {text:?} spans {left}..{} of {width}",
                        left + extent
                    ));
                }
            }
            if tag.starts_with("rect") {
                let (x, y) = (number(tag, "x").unwrap(), number(tag, "y").unwrap());
                let (w, h) = (
                    number(tag, "width").unwrap(),
                    number(tag, "height").unwrap(),
                );
                if x < 0.0 || y < 0.0 || x + w > width || y + h > height {
                    return Err(format!(
                        "a rectangle at {x},{y} of {w}×{h} is outside {width}×{height}"
                    ));
                }
            }
        }
        Ok(())
    }

    #[test]
    fn a_tiny_axis_labels_its_ticks_and_a_part_below_resolution_is_said() {
        let b = Bars {
            y: Axis::new("µs, once", Scale::Linear),
            series: vec!["setup".into()],
            groups: vec![
                (
                    "first transfer".into(),
                    vec![Some(Bar {
                        value: 8.9e-16,
                        tip: "t".into(),
                        mark: None,
                    })],
                ),
                (
                    "peer access enable".into(),
                    vec![Some(Bar {
                        value: 0.0,
                        tip: "p".into(),
                        mark: Some("below resolution".into()),
                    })],
                ),
            ],
        };
        let svg = bars("setup", "Setup", &b).unwrap().svg;
        let ticks: Vec<&str> = svg
            .split("</text>")
            .filter_map(|t| t.rsplit('>').next())
            .filter(|t| t.contains("e-1"))
            .collect();
        assert!(ticks.len() >= 2, "{ticks:?}");
        assert!(ticks.windows(2).all(|w| w[0] != w[1]), "{ticks:?}");
        assert!(svg.contains("below resolution"));
        within_bounds(&svg).unwrap();
    }

    #[test]
    fn a_compare_chart_of_many_long_figures_fits_its_box() {
        let group = |i: usize| {
            let bar = |v: f64| {
                Some(Bar {
                    value: v,
                    tip: "tip".into(),
                    mark: None,
                })
            };
            (
                format!("pointer-chase-resident 512 MiB {i}→{}", i + 1),
                vec![bar(1e-3 * (i + 1) as f64), bar(3e5)],
            )
        };
        for groups in [1, 3, 20, 112] {
            let b = Bars {
                y: Axis::new("GB/s", Scale::Log),
                series: vec![
                    format!("base: sim:{}", "p".repeat(64)),
                    format!("other: sim:{}", "q".repeat(64)),
                ],
                groups: (0..groups).map(group).collect(),
            };
            let svg = bars("compare-gb-s", "q against p, GB/s", &b).unwrap().svg;
            within_bounds(&svg).unwrap_or_else(|why| panic!("{groups} groups: {why}"));
        }
    }

    #[test]
    fn log_axes_tick_at_round_values() {
        let bytes = Axis::new("bytes", Scale::LogBytes);
        let span = bytes.span([4.0, 1073741824.0].into_iter());
        let ticks = bytes.ticks(span).unwrap();
        assert!(ticks.len() <= 10, "{ticks:?}");
        let labels: Vec<String> = ticks.iter().map(|&t| bytes.label_of(t)).collect();
        assert_eq!(
            labels,
            ["16 B", "256 B", "4 KiB", "64 KiB", "1 MiB", "16 MiB", "256 MiB"],
            "powers of 16 over 4 B–1 GiB"
        );

        let short = Axis::new("GB/s", Scale::Log);
        let ticks = short.ticks(short.span([30.0, 400.0].into_iter())).unwrap();
        let labels: Vec<String> = ticks.iter().map(|&t| short.label_of(t)).collect();
        assert_eq!(
            labels,
            ["50", "100", "200", "500"],
            "1, 2 and 5 over a short span"
        );
        assert!(!short.holds(0.0) && Axis::new("", Scale::Linear).holds(0.0));
    }

    #[test]
    fn every_kind_draws_with_a_tooltip_per_figure() {
        let tips = |chart: &Chart| chart.svg.matches("<title>").count() - 1;
        let cell = |text: &str| Cell {
            fill: RGBColor(10, 20, 200),
            text: text.into(),
            tip: format!("tip {text}"),
        };
        let map = Heatmap {
            labels: vec!["GPU0".into(), "GPU1".into()],
            cells: vec![vec![cell("X"), cell("1")], vec![cell("2"), cell("X")]],
            legend: Legend::Classes(vec![(RGBColor(1, 2, 3), "NV18".into())]),
        };
        assert_eq!(tips(&heatmap("h", "map", &map).unwrap()), 4);

        let bar = |v: f64, mark: Option<&str>| {
            Some(Bar {
                value: v,
                tip: format!("{v}"),
                mark: mark.map(String::from),
            })
        };
        let b = Bars {
            y: Axis::new("µs", Scale::Log),
            series: vec!["predicted".into(), "measured".into()],
            groups: vec![
                (
                    "direct-ce".into(),
                    vec![bar(5.0, Some("pick")), bar(6.0, None)],
                ),
                ("staged".into(), vec![bar(8.0, None), None]),
            ],
        };
        let chart = bars("b", "bars", &b).unwrap();
        assert_eq!(tips(&chart), 3);
        assert!(chart.svg.contains("pick\n</text>"), "{}", chart.svg);

        let c = Curves {
            x: Axis::new("bytes", Scale::LogBytes),
            y: Axis::new("GB/s", Scale::Log),
            series: vec![Series {
                name: "0→1".into(),
                colour: series_colour(0),
                dashed: false,
                dots: true,
                points: vec![
                    Point::new(4.0, 0.001, "a"),
                    Point::new(4096.0, 1.0, "b"),
                    Point::new(0.0, 1.0, "not on a log axis"),
                ],
            }],
            marks: vec![Mark {
                x: 1024.0,
                label: "50%".into(),
            }],
        };
        assert_eq!(tips(&curves("c", "curves", &c).unwrap()), 2);

        let steps = [Step {
            name: "launch".into(),
            start: 0.0,
            end: 3.0,
            colour: series_colour(1),
            tip: "3 µs".into(),
        }];
        assert_eq!(tips(&waterfall("w", "fall", "µs", &steps).unwrap()), 1);
    }

    #[test]
    fn labels_wrap_into_at_most_three_lines() {
        assert_eq!(wrap("engine, one call", 16), ["engine, one call"]);
        assert_eq!(
            wrap("columns packed by a copy kernel; grouped", 12),
            ["columns", "packed by a", "copy kernel;"]
        );
    }
}
