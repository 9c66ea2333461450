//! The HTML page around the charts: one file, its style inline, nothing to fetch and no script (a
//! Content-Security-Policy says so to the browser), readable without the charts too.

use super::chart::escape;
use super::Section;
use crate::document::{rfc3339, COMMIT, PEERLINK_VERSION};
use crate::report::export::{header_fields, Records};
use std::fmt::Write;

const STYLE: &str = "
body { font-family: sans-serif; color: #282828; margin: 0 auto; max-width: 1560px; padding: 16px 24px; }
h1 { font-size: 24px; margin: 8px 0; }
h2 { font-size: 19px; margin: 28px 0 6px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h2 .what { font-weight: normal; color: #666; font-size: 15px; }
.badge { background: #b3261e; color: white; font-size: 12px; padding: 2px 6px; border-radius: 3px; vertical-align: middle; }
.sim { color: #b3261e; font-weight: bold; }
p.facts { font-size: 12px; margin: 4px 0 8px; color: #444; }
p.facts span { margin-right: 14px; display: inline-block; }
p.facts b { color: #777; font-weight: normal; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #e4e4e4; }
figure svg { display: block; }
ul.notes { font-size: 13px; color: #444; }
details { margin: 8px 0; font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
th { background: #f4f4f4; }
";

/// The whole page: a table of contents, then each section.
pub fn page(sections: &[Section]) -> String {
    let charts: usize = sections.iter().map(|s| s.charts.len()).sum();
    let simulated = sections.iter().filter(|s| s.header.simulated).count();
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'\">\n<title>peerlink report</title>\n",
    );
    let _ = writeln!(out, "<style>{STYLE}</style>\n</head>\n<body>");
    let _ = writeln!(
        out,
        "<h1>peerlink report</h1>\n<p>{} document{}, {charts} chart{}; made by peerlink \
         {PEERLINK_VERSION} ({}) at {}. Hover over a figure for its value.</p>",
        sections.len(),
        plural(sections.len()),
        plural(charts),
        escape(COMMIT),
        rfc3339(std::time::SystemTime::now())
    );
    if simulated > 0 {
        let _ = writeln!(
            out,
            "<p class=\"sim\">{simulated} of them SIMULATED: their figures come from a \
             simulator preset's model, not from hardware.</p>"
        );
    }
    out.push_str("<nav><ol>\n");
    for s in sections {
        let _ = writeln!(
            out,
            "<li><a href=\"#{}\">{}</a> — {}{}</li>",
            s.id,
            escape(&s.name),
            escape(&s.what),
            badge(s.header.simulated)
        );
    }
    out.push_str("</ol></nav>\n");
    for s in sections {
        section(&mut out, s);
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// The SIMULATED badge after a simulated document's name.
fn badge(simulated: bool) -> &'static str {
    if simulated {
        " <span class=\"badge\">SIMULATED</span>"
    } else {
        ""
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn section(out: &mut String, s: &Section) {
    let _ = writeln!(
        out,
        "<section id=\"{}\">\n<h2>{} <span class=\"what\">{}</span>{}</h2>",
        s.id,
        escape(&s.name),
        escape(&s.what),
        badge(s.header.simulated)
    );
    if let Some(banner) = crate::report::simulated_banner(&s.header.source) {
        let _ = writeln!(
            out,
            "<p class=\"sim\">{}</p>",
            escape(banner.trim_matches('*').trim())
        );
    }
    out.push_str("<p class=\"facts\">");
    for (name, value) in header_fields(&s.header) {
        let _ = write!(out, "<span><b>{name}</b> {}</span>", escape(&value));
    }
    out.push_str("</p>\n<div class=\"charts\">\n");
    for chart in &s.charts {
        let _ = writeln!(
            out,
            "<figure id=\"{}\">\n{}\n</figure>",
            chart.id, chart.svg
        );
    }
    out.push_str("</div>\n");
    if !s.notes.is_empty() {
        out.push_str("<ul class=\"notes\">\n");
        for note in &s.notes {
            let _ = writeln!(out, "<li>{}</li>", escape(note));
        }
        out.push_str("</ul>\n");
    }
    if !s.tables.is_empty() {
        out.push_str("<details><summary>Tables (as --export-csv writes them)</summary>\n");
        for table in &s.tables {
            records(out, table);
        }
        out.push_str("</details>\n");
    }
    out.push_str("</section>\n");
}

/// A table of records, named.
fn records(out: &mut String, table: &Records) {
    let _ = writeln!(out, "<p><b>{}</b></p>", escape(&table.name));
    if table.columns.is_empty() {
        out.push_str("<p>(none)</p>\n");
        return;
    }
    out.push_str("<table>\n<tr>");
    for column in &table.columns {
        let _ = write!(out, "<th>{}</th>", escape(column));
    }
    out.push_str("</tr>\n");
    for row in &table.rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", escape(cell));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}
