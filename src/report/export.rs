//! Exports in hyperfine's manner (`--export-json`, `--export-csv`, `--export-markdown`): the same
//! document as a file beside what a verb prints, its header (source, simulated, version) carried
//! along — JSON as the document itself, CSV as leading `#` comment lines, Markdown as a list.
//!
//! A document hands its tables over as [`Records`] ([`Tables`], implemented in the report's file
//! of each verb); the writers here know nothing of any verb, so a new verb gets its exports by
//! naming its tables.

use crate::document::{Document, Header};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write;

/// A document's tables, for `--export-csv` and `--export-markdown`: every document has some.
pub trait Tables: Document {
    fn tables(&self) -> Vec<Records>;
}

/// One table of a document: named columns, and rows of cells as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Records {
    /// What the rows are (`pairs`, `rows`, `figures`): a CSV comment and a Markdown heading.
    pub name: String,
    pub columns: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Records {
    /// An empty table with these columns.
    pub fn new(name: &str, columns: &[&str]) -> Records {
        Records {
            name: name.to_string(),
            columns: columns.iter().map(|c| c.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// A row per item, a column per field as the item serialises: nested objects flattened into
    /// `outer.inner` columns, lists joined by spaces, `null` left empty. Columns come in the order
    /// they first appear, so an optional field absent from the first item still gets one. Items
    /// that are not objects fill one column, `value`.
    pub fn of<T: Serialize>(name: &str, items: &[T]) -> Records {
        let flat: Vec<Vec<(String, String)>> = items.iter().map(fields).collect();
        let mut columns: Vec<String> = Vec::new();
        for (key, _) in flat.iter().flatten() {
            if !columns.contains(key) {
                columns.push(key.clone());
            }
        }
        let rows = flat
            .iter()
            .map(|fields| {
                columns
                    .iter()
                    .map(|c| {
                        fields
                            .iter()
                            .find(|(key, _)| key == c)
                            .map_or_else(String::new, |(_, value)| value.clone())
                    })
                    .collect()
            })
            .collect();
        Records {
            name: name.to_string(),
            columns,
            rows,
        }
    }

    /// The table as CSV (RFC 4180): a header line, then a line per row; nothing for a table of
    /// no rows, whose columns nothing names.
    pub fn csv(&self) -> String {
        let mut out = String::new();
        if self.columns.is_empty() {
            return out;
        }
        for line in std::iter::once(&self.columns).chain(&self.rows) {
            let fields: Vec<String> = line.iter().map(|f| csv_field(f)).collect();
            let _ = writeln!(out, "{}", fields.join(","));
        }
        out
    }

    /// The table as a GitHub-flavoured Markdown table, or a line saying it has no rows. A figure
    /// is shown as the text output shows it ([`rounded_figure`]); the CSV keeps every digit.
    pub fn markdown(&self) -> String {
        if self.columns.is_empty() {
            return "(none)\n".to_string();
        }
        let line = |cells: &[String]| {
            let cells: Vec<String> = cells
                .iter()
                .map(|c| markdown_cell(&rounded_figure(c)))
                .collect();
            format!("| {} |\n", cells.join(" | "))
        };
        let mut out = line(&self.columns);
        out.push_str(&line(&vec!["---".to_string(); self.columns.len()]));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// An item's scalars as (column, text) in the order it serialises them, nested keys joined by
/// dots. (A `serde_json::Value` would sort the keys.)
fn fields<T: Serialize>(item: &T) -> Vec<(String, String)> {
    let json = serde_json::to_string(item).expect("documents always serialise");
    let mut out = Vec::new();
    let mut reader = serde_json::Deserializer::from_str(&json);
    Flatten {
        prefix: String::new(),
        out: &mut out,
    }
    .deserialize(&mut reader)
    .expect("serde_json reads what it wrote");
    out
}

/// Reads a JSON value into `out` as (column, text): an object's fields under `prefix.key`, a
/// scalar or a list under `prefix` (`value` at the top).
struct Flatten<'a> {
    prefix: String,
    out: &'a mut Vec<(String, String)>,
}

impl Flatten<'_> {
    fn push(self, text: String) {
        let column = if self.prefix.is_empty() {
            "value".to_string()
        } else {
            self.prefix
        };
        self.out.push((column, text));
    }
}

impl<'de> DeserializeSeed<'de> for Flatten<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Flatten<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            let prefix = if self.prefix.is_empty() {
                key
            } else {
                format!("{}.{key}", self.prefix)
            };
            map.next_value_seed(Flatten {
                prefix,
                out: &mut *self.out,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(match item {
                Value::String(s) => s,
                other => other.to_string(),
            });
        }
        self.push(items.join(" "));
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.push(String::new());
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.push(v.to_string());
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.push(v.to_string());
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.push(v.to_string());
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.push(Value::from(v).to_string());
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.push(v.to_string());
        Ok(())
    }
}

/// A CSV field, quoted where it holds a comma, a quote or a line break.
pub fn csv_field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_string()
    }
}

/// A cell holding a figure with more digits than were measured (`5.520615384615388`,
/// `1.7763568394002505e-15`: a float as JSON writes it) as the text output shows figures: two
/// decimals, or three significant digits below 0.1; any other cell as it is.
pub fn rounded_figure(cell: &str) -> std::borrow::Cow<'_, str> {
    let digits_after_point = cell.split_once('.').map_or(0, |(_, after)| {
        after.bytes().take_while(u8::is_ascii_digit).count()
    });
    let long = digits_after_point > 4 || (cell.contains('e') && cell.contains('.'));
    match cell.parse::<f64>() {
        Ok(v) if long && v.is_finite() => std::borrow::Cow::Owned(match v.abs() {
            a if a >= 0.1 => format!("{v:.2}"),
            a if a >= 1e-4 => {
                let decimals = (2 - a.log10().floor() as i32) as usize;
                let text = format!("{v:.decimals$}");
                text.trim_end_matches('0').trim_end_matches('.').to_string()
            }
            _ => format!("{v:.2e}"),
        }),
        _ => std::borrow::Cow::Borrowed(cell),
    }
}

fn markdown_cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// The header's fields as (name, text), in the document's order: who wrote it, where the figures
/// come from, and on what GPUs. `partial` only where the run was interrupted.
pub fn header_fields(header: &Header) -> Vec<(&'static str, String)> {
    let known = |value: &Option<String>| value.clone().unwrap_or_else(|| "unknown".to_string());
    let gpus: Vec<String> = header
        .host_gpus
        .iter()
        .map(|g| format!("{} {} ({}, {})", g.index, g.name, g.uuid, g.pci_bus_id))
        .collect();
    let mut fields = vec![
        ("schema", header.schema.clone()),
        ("source", header.source.to_string()),
        ("simulated", header.simulated.to_string()),
        ("peerlink_version", known(&header.peerlink_version)),
        ("commit", known(&header.commit)),
        ("time", known(&header.time)),
        ("host", known(&header.host)),
        ("driver_version", known(&header.driver_version)),
        ("cuda_version", known(&header.cuda_version)),
        ("host_gpus", gpus.join("; ")),
    ];
    if header.partial {
        fields.push(("partial", "true".to_string()));
    }
    fields
}

/// A document's tables as one CSV file: the header as `# name: value` lines, then each table after
/// a `# table: NAME` line (and nothing more where it has no rows), tables apart by a blank line (read one with a CSV reader that skips
/// `#` comments, e.g. pandas' `comment="#"` after splitting at blank lines).
pub fn csv(header: &Header, tables: &[Records]) -> String {
    let mut out = String::new();
    for (name, value) in header_fields(header) {
        let _ = writeln!(out, "# {name}: {value}");
    }
    if let Some(banner) = super::simulated_banner(&header.source) {
        let _ = writeln!(out, "# {banner}");
    }
    for table in tables {
        let _ = write!(out, "\n# table: {}\n{}", table.name, table.csv());
    }
    out
}

/// A document as Markdown: a title, the header as a list, then its tables; a document without
/// tables shows `text` (what the verb prints) in a code block instead.
pub fn markdown(header: &Header, tables: &[Records], text: &str) -> String {
    let mut out = format!("# peerlink: {}\n\n", header.schema);
    if let Some(banner) = super::simulated_banner(&header.source) {
        let _ = writeln!(out, "**{}**\n", banner.trim_matches('*').trim());
    }
    for (name, value) in header_fields(header) {
        let _ = writeln!(out, "- {name}: {}", markdown_cell(&value));
    }
    for table in tables {
        let _ = write!(out, "\n## {}\n\n{}", table.name, table.markdown());
    }
    if tables.is_empty() {
        let _ = write!(out, "\n```\n{}\n```\n", text.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Source;
    use serde_json::json;

    fn header(source: Source) -> Header {
        Header {
            schema: "peerlink.test/1".into(),
            simulated: source.is_simulated(),
            source,
            peerlink_version: Some("0.1.0".into()),
            commit: None,
            time: Some("2026-11-30T06:00:00Z".into()),
            host: Some("box".into()),
            driver_version: None,
            cuda_version: None,
            host_gpus: Vec::new(),
            partial: false,
        }
    }

    #[test]
    fn items_become_rows_with_flattened_columns_in_first_seen_order() {
        let items = [
            json!({"a": 1, "b": {"c": "x,y"}, "d": null}),
            json!({"a": 2.5, "e": [0, 5], "b": {"c": "q\"r"}}),
        ];
        let t = Records::of("things", &items);
        assert_eq!(t.columns, ["a", "b.c", "d", "e"]);
        assert_eq!(t.rows[0], ["1", "x,y", "", ""]);
        assert_eq!(t.rows[1], ["2.5", "q\"r", "", "0 5"]);
        assert_eq!(
            t.csv(),
            "a,b.c,d,e\n1,\"x,y\",,\n2.5,\"q\"\"r\",,0 5\n",
            "quoted where needed"
        );
        let md = t.markdown();
        assert!(md.starts_with("| a | b.c | d | e |\n| --- | --- | --- | --- |\n"));
        assert_eq!(md.lines().count(), 4);
    }

    #[test]
    fn csv_and_markdown_carry_the_header_and_say_simulated() {
        let mut t = Records::new("pairs", &["src", "dst"]);
        t.rows.push(vec!["0".into(), "a|b".into()]);
        let csv = csv(&header(Source::Sim("dgx1-v100".into())), &[t.clone()]);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "# schema: peerlink.test/1");
        assert_eq!(lines[1], "# source: sim:dgx1-v100");
        assert_eq!(lines[2], "# simulated: true");
        assert_eq!(lines[3], "# peerlink_version: 0.1.0");
        assert!(csv.contains("# *** SIMULATED host `dgx1-v100`"), "{csv}");
        assert!(csv.ends_with("\n# table: pairs\nsrc,dst\n0,a|b\n"), "{csv}");

        let md = markdown(&header(Source::Cuda), &[t], "unused");
        assert!(md.starts_with("# peerlink: peerlink.test/1\n"), "{md}");
        assert!(md.contains("- simulated: false\n- peerlink_version: 0.1.0\n"));
        assert!(md.contains("## pairs\n\n| src | dst |\n| --- | --- |\n| 0 | a\\|b |\n"));
        assert!(!md.contains("SIMULATED") && !md.contains("unused"), "{md}");
    }

    #[test]
    fn markdown_shows_figures_as_measured_and_csv_keeps_every_digit() {
        assert_eq!(rounded_figure("5.520615384615388"), "5.52");
        assert_eq!(rounded_figure("1.7763568394002505e-15"), "1.78e-15");
        assert_eq!(rounded_figure("0.0012345678"), "0.00123");
        assert_eq!(rounded_figure("0.00020000001"), "0.0002");
        for kept in ["9.0", "26.5", "64", "0→1", "ce-write", "1.2.3.4.5"] {
            assert_eq!(rounded_figure(kept), kept);
        }
        let table = Records::of("parts", &[json!({"us": 5.520615384615388, "cc": "9.0"})]);
        assert!(
            table.markdown().contains("| 9.0 | 5.52 |"),
            "{}",
            table.markdown()
        );
        assert!(table.csv().contains("5.520615384615388"));
    }

    #[test]
    fn markdown_without_tables_shows_the_text() {
        let md = markdown(&header(Source::Cuda), &[], "line one\n");
        assert!(md.ends_with("\n```\nline one\n```\n"), "{md}");
    }
}
