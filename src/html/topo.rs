//! A topology document: the GPUs as a graph (an edge per pair, coloured by link class, dashed
//! where there is no P2P) and as the link matrix, with the warnings below.

use super::chart::{blend, draw, font, heading, Chart, INK, MISSING};
use super::plot::{heatmap, Cell, Heatmap, Legend};
use super::Section;
use crate::document::topo::TopoDocument;
use crate::topology::{Link, Pair};
use crate::Result;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// The colour of a link class: NVLink green (darker with more links), PCIe from blue (one
/// switch) to red (across the CPU sockets).
pub fn link_colour(link: Link) -> RGBColor {
    match link {
        Link::NvLink(n) => blend(
            RGBColor(161, 217, 155),
            RGBColor(0, 109, 44),
            (f64::from(n)).ln() / 18f64.ln(),
        ),
        Link::Pix => RGBColor(66, 146, 198),
        Link::Pxb => RGBColor(107, 174, 214),
        Link::Phb => RGBColor(158, 154, 200),
        Link::Node => RGBColor(253, 141, 60),
        Link::Sys => RGBColor(215, 48, 39),
        // Another host: grey, no P2P at all.
        Link::Net => RGBColor(150, 150, 150),
    }
}

/// A pair in words, for a tooltip.
fn describe(p: &Pair) -> String {
    let access = if p.p2p {
        format!(
            "P2P supported, performance rank {}{}",
            p.perf_rank,
            if p.atomics { ", native atomics" } else { "" }
        )
    } else if p.link.crosses_hosts() {
        "no P2P: different hosts, joined by their NICs".to_string()
    } else {
        "no P2P: copies are staged through host memory".to_string()
    };
    format!(
        "GPU{} → GPU{}: {} ({}); {access}",
        p.src,
        p.dst,
        p.link,
        p.link.meaning()
    )
}

pub fn charts(section: &mut Section, doc: &TopoDocument) -> Result<()> {
    let mut classes: Vec<Link> = doc.pairs.iter().map(|p| p.link).collect();
    classes.sort();
    classes.dedup();
    let legend: Vec<(RGBColor, String)> = classes
        .iter()
        .map(|&l| (link_colour(l), format!("{l}: {}", short_meaning(l))))
        .collect();
    section.add("topology-graph", "GPUs and their links", |id, title| {
        graph(id, title, doc, &legend)
    })?;
    let labels: Vec<String> = doc
        .devices
        .iter()
        .map(|d| format!("GPU{}", d.index))
        .collect();
    let cells = doc
        .devices
        .iter()
        .map(|s| {
            doc.devices
                .iter()
                .map(|d| match doc.pair(s.index, d.index) {
                    Some(p) => Cell {
                        fill: link_colour(p.link),
                        text: format!("{}{}", p.link, if p.p2p { "" } else { " ✗" }),
                        tip: describe(p),
                    },
                    None if s.index == d.index => Cell {
                        fill: MISSING,
                        text: "X".into(),
                        tip: format!("GPU{} itself: {}", s.index, s.name),
                    },
                    None => Cell {
                        fill: MISSING,
                        text: "?".into(),
                        tip: "not in the document".into(),
                    },
                })
                .collect()
        })
        .collect();
    let mut matrix_legend = legend.clone();
    matrix_legend.push((MISSING, "X: the GPU itself; ✗: no P2P".into()));
    section.add("topology-matrix", "Link matrix", |id, title| {
        heatmap(
            id,
            title,
            &Heatmap {
                labels,
                cells,
                legend: Legend::Classes(matrix_legend),
            },
        )
    })?;
    section.notes.extend(
        doc.warnings
            .iter()
            .map(|w| format!("[{}] {}", w.code, w.message)),
    );
    Ok(())
}

fn short_meaning(link: Link) -> &'static str {
    match link {
        Link::NvLink(_) => "NVLink (count of bonded links)",
        Link::Pix => "PCIe, one switch",
        Link::Pxb => "PCIe, several switches",
        Link::Phb => "PCIe through a host bridge",
        Link::Node => "PCIe across host bridges",
        Link::Sys => "PCIe across CPU sockets",
        Link::Net => "different hosts, through the network",
    }
}

/// The GPUs on a circle, an edge per pair.
fn graph(
    id: &str,
    title: &str,
    doc: &TopoDocument,
    legend: &[(RGBColor, String)],
) -> Result<Chart> {
    let (width, height) = (640u32, 420u32);
    let centre = (230.0, 225.0);
    let n = doc.devices.len();
    let radius = if n <= 1 { 0.0 } else { 150.0 };
    let at = |i: usize| -> (i32, i32) {
        // The first GPU on the left, then clockwise.
        let angle = std::f64::consts::PI + i as f64 * 2.0 * std::f64::consts::PI / n.max(1) as f64;
        (
            (centre.0 + radius * angle.cos()).round() as i32,
            (centre.1 + radius * angle.sin()).round() as i32,
        )
    };
    draw(id, title, (width, height), |area, tips| {
        heading(area, title)?;
        for (i, s) in doc.devices.iter().enumerate() {
            for (j, d) in doc.devices.iter().enumerate().skip(i + 1) {
                let (there, back) = (doc.pair(s.index, d.index), doc.pair(d.index, s.index));
                let Some(pair) = there.or(back) else { continue };
                let colour = link_colour(pair.link);
                let thickness = match pair.link {
                    Link::NvLink(links) => 2 + links.min(18) / 3,
                    _ => 2,
                };
                let ends = [at(i), at(j)];
                let both_p2p = there.is_none_or(|p| p.p2p) && back.is_none_or(|p| p.p2p);
                if both_p2p {
                    area.draw(&PathElement::new(ends, colour.stroke_width(thickness)))?;
                } else {
                    area.draw(&DashedPathElement::new(
                        ends,
                        8,
                        6,
                        colour.stroke_width(thickness),
                    ))?;
                }
                let middle = ((ends[0].0 + ends[1].0) / 2, (ends[0].1 + ends[1].1) / 2);
                if n <= 4 {
                    let label = pair.link.to_string();
                    let half = 5 * label.len() as i32 + 4;
                    area.draw(&Rectangle::new(
                        [
                            (middle.0 - half, middle.1 - 10),
                            (middle.0 + half, middle.1 + 10),
                        ],
                        WHITE.filled(),
                    ))?;
                    area.draw(&Text::new(
                        label,
                        middle,
                        font(13, INK).pos(Pos::new(HPos::Center, VPos::Center)),
                    ))?;
                }
                let tip: Vec<String> = [there, back].into_iter().flatten().map(describe).collect();
                tips.area(
                    (middle.0 - 14, middle.1 - 10),
                    (middle.0 + 14, middle.1 + 10),
                    tip.join("\n"),
                );
            }
        }
        for (i, device) in doc.devices.iter().enumerate() {
            let (x, y) = at(i);
            area.draw(&Circle::new((x, y), 26, RGBColor(250, 250, 250).filled()))?;
            area.draw(&Circle::new((x, y), 26, INK.stroke_width(2)))?;
            area.draw(&Text::new(
                format!("GPU{}", device.index),
                (x, y),
                font(13, INK).pos(Pos::new(HPos::Center, VPos::Center)),
            ))?;
            tips.point(
                (x, y),
                format!(
                    "GPU{}: {} ({})",
                    device.index, device.name, device.pci_bus_id
                ),
            );
        }
        for (i, (colour, text)) in legend.iter().enumerate() {
            let y = 60 + 22 * i as i32;
            area.draw(&Rectangle::new([(430, y), (452, y + 6)], colour.filled()))?;
            area.draw(&Text::new(
                text.clone(),
                (458, y + 3),
                font(11, INK).pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
        }
        let y = 60 + 22 * legend.len() as i32;
        area.draw(&DashedPathElement::new(
            [(430, y + 3), (452, y + 3)],
            4,
            3,
            INK.stroke_width(2),
        ))?;
        area.draw(&Text::new(
            "no P2P (staged)",
            (458, y + 3),
            font(11, INK).pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
        Ok(())
    })
}
