//! One chart: an SVG drawn with plotters into a string, a tooltip (an SVG `<title>`) over every
//! point, bar and cell, and the marks the report and its test find it by (`data-chart`).
//!
//! Plotters draws shapes but has no tooltips, so each chart collects [`Tips`] — areas in the
//! drawing's pixels with their text — while it draws, and they are laid over it afterwards as
//! transparent rectangles that hold a `<title>`: a browser shows it on hover, no script needed.

use crate::{Error, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::fmt::Write;

/// A drawn chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    /// Unique within a report; also the file stem of `--svg DIR`.
    pub id: String,
    pub title: String,
    /// A whole `<svg>` element, valid alone as an SVG file.
    pub svg: String,
}

/// The drawing area a chart paints on.
pub type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// What painting returns: plotters' errors, boxed.
pub type Painted = std::result::Result<(), Box<dyn std::error::Error>>;

/// Tooltip areas, in the drawing's pixels.
#[derive(Default)]
pub struct Tips(Vec<(i32, i32, i32, i32, String)>);

impl Tips {
    /// A tooltip over the rectangle between two corners.
    pub fn area(&mut self, (x0, y0): (i32, i32), (x1, y1): (i32, i32), text: impl Into<String>) {
        let (left, top) = (x0.min(x1), y0.min(y1));
        let (width, height) = ((x1 - x0).abs().max(1), (y1 - y0).abs().max(1));
        self.0.push((left, top, width, height, text.into()));
    }

    /// A tooltip over a point: a square of 12 px around it.
    pub fn point(&mut self, (x, y): (i32, i32), text: impl Into<String>) {
        self.area((x - 6, y - 6), (x + 6, y + 6), text);
    }
}

/// Draws a chart of `size` pixels: `paint` draws on a white area and collects tooltips; the SVG
/// is then marked with `id` (`data-chart`) and `title` (its `<title>`, for screen readers and
/// files opened alone).
pub fn draw(
    id: &str,
    title: &str,
    size: (u32, u32),
    paint: impl FnOnce(&Area<'_>, &mut Tips) -> Painted,
) -> Result<Chart> {
    let mut svg = String::new();
    let mut tips = Tips::default();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        let painted = root
            .fill(&WHITE)
            .map_err(|e| e.into())
            .and_then(|()| paint(&root, &mut tips))
            .and_then(|()| root.present().map_err(|e| e.into()));
        painted.map_err(|e| Error::Draw(format!("the chart `{title}`: {e}")))?;
    }
    let mut overlay = String::from("<g class=\"tips\">\n");
    for (x, y, w, h, text) in &tips.0 {
        let _ = writeln!(
            overlay,
            "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"transparent\" \
             pointer-events=\"all\"><title>{}</title></rect>",
            escape(text)
        );
    }
    overlay.push_str("</g>\n</svg>");
    let end = svg.rfind("</svg>").unwrap_or(svg.len());
    svg.replace_range(end.., &overlay);
    let open = svg.find('>').map_or(0, |i| i + 1);
    svg.insert_str(open, &format!("\n<title>{}</title>", escape(title)));
    let svg = svg.replacen(
        "<svg ",
        &format!(
            "<svg data-chart=\"{}\" role=\"img\" aria-label=\"{}\" ",
            escape(id),
            escape(title)
        ),
        1,
    );
    Ok(Chart {
        id: id.to_string(),
        title: title.to_string(),
        svg,
    })
}

/// Text made safe for XML and HTML, in content and in quoted attributes.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Series colours, distinct and readable on white (Tableau 10).
pub const SERIES: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The colour of the `i`-th series.
pub fn series_colour(i: usize) -> RGBColor {
    SERIES[i % SERIES.len()]
}

/// Grey for what was not measured.
pub const MISSING: RGBColor = RGBColor(225, 225, 225);
/// Text and axes.
pub const INK: RGBColor = RGBColor(40, 40, 40);

/// A colour between `low` and `high`, `t` in 0..=1.
pub fn blend(low: RGBColor, high: RGBColor, t: f64) -> RGBColor {
    let t = t.clamp(0.0, 1.0);
    let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * t).round() as u8;
    RGBColor(mix(low.0, high.0), mix(low.1, high.1), mix(low.2, high.2))
}

/// Text that reads on `fill`: white on dark, ink on light.
pub fn text_on(fill: RGBColor) -> RGBColor {
    let luma = 0.299 * f64::from(fill.0) + 0.587 * f64::from(fill.1) + 0.114 * f64::from(fill.2);
    if luma < 140.0 {
        WHITE
    } else {
        INK
    }
}

/// A text style of `size` px in `colour`.
pub fn font(size: u32, colour: RGBColor) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&colour)
}

/// Draws `title` at the top left of `area`.
pub fn heading(area: &Area<'_>, title: &str) -> Painted {
    area.draw(&Text::new(title.to_string(), (12, 10), font(15, INK)))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_marked_titled_and_carries_its_tooltips() {
        let chart = draw("c-1", "A <b> & \"c\"", (200, 100), |area, tips| {
            area.draw(&Rectangle::new([(10, 10), (50, 50)], BLUE.filled()))?;
            tips.area((10, 10), (50, 50), "bar: 3 < 4");
            tips.point((100, 50), "point");
            Ok(())
        })
        .unwrap();
        let svg = &chart.svg;
        assert!(
            svg.starts_with("<svg data-chart=\"c-1\" role=\"img\""),
            "{svg}"
        );
        assert!(
            svg.contains("<title>A &lt;b&gt; &amp; &quot;c&quot;</title>"),
            "{svg}"
        );
        assert!(svg.contains(
            "<rect x=\"10\" y=\"10\" width=\"40\" height=\"40\" fill=\"transparent\" \
             pointer-events=\"all\"><title>bar: 3 &lt; 4</title></rect>"
        ));
        assert!(
            svg.contains("x=\"94\" y=\"44\" width=\"12\" height=\"12\""),
            "{svg}"
        );
        assert!(svg.trim_end().ends_with("</g>\n</svg>"), "{svg}");
        assert_eq!(svg.matches("<svg").count(), 1);
    }

    #[test]
    fn colours_blend_and_text_reads_on_them() {
        let (white, black) = (RGBColor(255, 255, 255), RGBColor(0, 0, 0));
        assert_eq!(blend(white, black, 0.5), RGBColor(128, 128, 128));
        assert_eq!(blend(white, black, 7.0), black, "clamped");
        assert_eq!(text_on(black), WHITE);
        assert_eq!(text_on(white), INK);
    }
}
