//! Plain-text tables in the style of `nvidia-smi topo -m`: no borders, aligned columns.

use comfy_table::{presets, CellAlignment, ContentArrangement, Table};

/// A borderless table with a header row.
pub fn plain(header: Vec<String>) -> Table {
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header);
    table
}

/// A device-by-device matrix: rows and columns labelled `GPU<i>`, `cell(src, dst)` for each entry,
/// `X` on the diagonal unless `diagonal` is true (then `cell` fills it too).
pub fn matrix(
    devices: &[usize],
    diagonal: bool,
    mut cell: impl FnMut(usize, usize) -> String,
) -> Table {
    let mut header = vec![String::new()];
    header.extend(devices.iter().map(|d| format!("GPU{d}")));
    let mut table = plain(header);
    for &src in devices {
        let mut row = vec![format!("GPU{src}")];
        for &dst in devices {
            row.push(if src == dst && !diagonal {
                "X".to_string()
            } else {
                cell(src, dst)
            });
        }
        table.add_row(row);
    }
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrix_labels_rows_and_columns_and_marks_the_diagonal() {
        let text = matrix(&[0, 2], false, |s, d| format!("{s}{d}")).to_string();
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[0].contains("GPU0") && lines[0].contains("GPU2"),
            "{text}"
        );
        let row0: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(row0, ["GPU0", "X", "02"]);
        let row2: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(row2, ["GPU2", "20", "X"]);
    }

    #[test]
    fn diagonal_can_be_filled() {
        let text = matrix(&[0], true, |_, _| "7".into()).to_string();
        assert!(text
            .lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .any(|c| c == "7"));
    }
}
