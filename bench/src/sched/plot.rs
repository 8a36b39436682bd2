//! A small-multiples line chart as SVG text (no plotting crate: a few hundred bytes of markup
//! per line is all the figure needs).

use std::fmt::Write;

/// One line.
pub struct Series {
    pub label: String,
    pub color: &'static str,
    /// (x, y) points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// One chart of the grid.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

const W: f64 = 330.0;
const H: f64 = 250.0;
const PAD_L: f64 = 44.0;
const PAD_R: f64 = 10.0;
const PAD_T: f64 = 26.0;
const PAD_B: f64 = 34.0;

/// The grid of `panels`, `cols` per row, x clipped to `x_range`; each panel's y range fits its
/// data inside `x_range` (rounded out to 5).
pub fn svg(
    panels: &[Panel],
    x_range: (f64, f64),
    cols: usize,
    x_label: &str,
    y_label: &str,
) -> String {
    let cols = cols.max(1);
    let rows = panels.len().div_ceil(cols);
    let legend_h = 24.0;
    let (width, height) = (W * cols as f64, H * rows as f64 + legend_h);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    // Legend from the first panel.
    if let Some(p) = panels.first() {
        for (i, se) in p.series.iter().enumerate() {
            let x = 10.0 + i as f64 * 110.0;
            let _ = writeln!(
                s,
                r#"<line x1="{x}" y1="12" x2="{}" y2="12" stroke="{}" stroke-width="2.5"/><text x="{}" y="16">{}</text>"#,
                x + 22.0,
                se.color,
                x + 27.0,
                esc(&se.label)
            );
        }
    }
    for (i, p) in panels.iter().enumerate() {
        let (ox, oy) = ((i % cols) as f64 * W, (i / cols) as f64 * H + legend_h);
        panel(&mut s, p, ox, oy, x_range, x_label, y_label);
    }
    s.push_str("</svg>\n");
    s
}

fn panel(
    s: &mut String,
    p: &Panel,
    ox: f64,
    oy: f64,
    (x0, x1): (f64, f64),
    x_label: &str,
    y_label: &str,
) {
    let ys = p
        .series
        .iter()
        .flat_map(|se| se.points.iter())
        .filter(|(x, _)| *x >= x0 && *x <= x1)
        .map(|(_, y)| *y);
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| {
        (a.min(y), b.max(y))
    });
    let (y0, y1) = if lo.is_finite() {
        (
            (lo / 5.0).floor() * 5.0,
            ((hi / 5.0).ceil() * 5.0).max((lo / 5.0).floor() * 5.0 + 5.0),
        )
    } else {
        (0.0, 100.0)
    };
    let (pw, ph) = (W - PAD_L - PAD_R, H - PAD_T - PAD_B);
    let sx = |x: f64| ox + PAD_L + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| oy + PAD_T + (1.0 - (y - y0) / (y1 - y0)) * ph;
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-weight="bold">{}</text>"#,
        ox + PAD_L,
        oy + 16.0,
        esc(&p.title)
    );
    // Grid and ticks.
    let mut y = y0;
    while y <= y1 + 1e-9 {
        let (xa, xb, yy) = (sx(x0), sx(x1), sy(y));
        let _ = writeln!(
            s,
            r##"<line x1="{xa:.1}" y1="{yy:.1}" x2="{xb:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{y}</text>"##,
            xa - 4.0,
            yy + 4.0,
        );
        y += 5.0;
    }
    let step = if x1 - x0 > 60.0 { 20.0 } else { 10.0 };
    let mut x = (x0 / step).ceil() * step;
    while x <= x1 + 1e-9 {
        let (xx, ya, yb) = (sx(x), sy(y0), sy(y1));
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{ya:.1}" x2="{xx:.1}" y2="{yb:.1}" stroke="#eee"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{x}</text>"##,
            ya + 14.0,
        );
        x += step;
    }
    let (lx, ly) = (sx((x0 + x1) / 2.0), oy + H - 6.0);
    let _ = writeln!(
        s,
        r##"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" fill="#444">{}</text>"##,
        esc(x_label)
    );
    let (tx, ty) = (ox + 11.0, sy((y0 + y1) / 2.0));
    let _ = writeln!(
        s,
        r##"<text transform="translate({tx:.1},{ty:.1}) rotate(-90)" text-anchor="middle" fill="#444">{}</text>"##,
        esc(y_label)
    );
    for se in &p.series {
        let pts: Vec<String> = se
            .points
            .iter()
            .filter(|(x, _)| *x >= x0 && *x <= x1)
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y.clamp(y0, y1))))
            .collect();
        if pts.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.6" points="{}"/>"#,
            se.color,
            pts.join(" ")
        );
    }
}

fn esc(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_series_and_escapes_text() {
        let p = Panel {
            title: "a<b".into(),
            series: vec![
                Series {
                    label: "x".into(),
                    color: "red",
                    points: vec![(0.0, 50.0), (10.0, 60.0)],
                },
                Series {
                    label: "y".into(),
                    color: "blue",
                    points: vec![(0.0, 40.0), (10.0, 70.0)],
                },
            ],
        };
        let s = svg(&[p], (0.0, 10.0), 2, "arrived", "alloc");
        assert_eq!(s.matches("<polyline").count(), 2);
        assert!(s.contains("a&lt;b") && s.starts_with("<svg") && s.ends_with("</svg>\n"));
    }
}
