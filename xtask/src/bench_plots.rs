//! SVG figures of `cargo xtask bench plan`: live bytes over a plan, and its R and S matrices.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

const GIB: f64 = (1u64 << 30) as f64;

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow!("drawing: {e}")
}

/// One line per plan: live bytes after each step (x: step index); `budget` as a dashed line.
pub fn timeline(
    path: &Path,
    title: &str,
    lines: &[(String, Vec<f64>)],
    budget: Option<f64>,
) -> Result<()> {
    let x_hi = lines.iter().map(|l| l.1.len()).max().unwrap_or(1).max(1) as f64;
    let y_hi = lines
        .iter()
        .flat_map(|l| l.1.iter().copied())
        .chain(budget)
        .fold(0.0f64, f64::max)
        / GIB
        * 1.08
        + 1e-9;
    let root = SVGBackend::new(path, (960, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_hi, 0.0..y_hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("plan step")
        .y_desc("live activation bytes (GiB)")
        .draw()
        .map_err(err)?;
    for (k, (name, tl)) in lines.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(
                tl.iter().enumerate().map(|(i, &b)| (i as f64, b / GIB)),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    if let Some(b) = budget {
        let y = b / GIB;
        let dashes: Vec<_> = (0..(x_hi as usize / 4).max(1))
            .map(|k| {
                let x0 = k as f64 * 4.0;
                PathElement::new(
                    vec![(x0, y), ((x0 + 2.0).min(x_hi), y)],
                    BLACK.stroke_width(1),
                )
            })
            .collect();
        chart
            .draw_series(dashes)
            .map_err(err)?
            .label("activation budget")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(1)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// R (left) and S (right) as filled cells: row t = stage t (top to bottom), column i = node i.
pub fn matrices(path: &Path, r: &[Vec<bool>], s: &[Vec<bool>]) -> Result<()> {
    let n = r.len().max(1);
    let root = SVGBackend::new(path, (1100, 580)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(550);
    let panels = [
        (
            left,
            "R[t,i]: compute node i in stage t",
            r,
            RGBColor(31, 119, 180),
        ),
        (
            right,
            "S[t,i]: tensor i kept into stage t",
            s,
            RGBColor(214, 39, 40),
        ),
    ];
    for (area, title, m, color) in panels {
        let nf = n as f64;
        let mut chart = ChartBuilder::on(&area)
            .caption(title, ("sans-serif", 18))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(45)
            .build_cartesian_2d(0.0..nf, 0.0..nf)
            .map_err(err)?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc("node i")
            .y_desc("stage t")
            .y_label_formatter(&|y| format!("{:.0}", nf - y))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(err)?;
        // The frontier (t = i) in light grey, then the cells.
        chart
            .draw_series((0..n).map(|t| {
                let y = nf - t as f64;
                Rectangle::new(
                    [(t as f64, y - 1.0), (t as f64 + 1.0, y)],
                    RGBColor(230, 230, 230).filled(),
                )
            }))
            .map_err(err)?;
        chart
            .draw_series(m.iter().enumerate().flat_map(|(t, row)| {
                let y = nf - t as f64;
                row.iter()
                    .enumerate()
                    .filter(|&(_, &on)| on)
                    .map(move |(i, _)| {
                        Rectangle::new(
                            [(i as f64 + 0.05, y - 0.95), (i as f64 + 0.95, y - 0.05)],
                            color.filled(),
                        )
                    })
            }))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
