//! The A/B report as one self-contained HTML page: the numbers of the terminal report and an
//! inline SVG chart of each variant's latency distribution (CDF). No scripts, no external files.

use super::report::{Report, fmt_p, pct_confidence, quantile, split_text, stickiness_text};

const COLORS: [&str; 2] = ["#1f77b4", "#d62728"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A "nice" axis step (1, 2 or 5 × 10^k) giving about `ticks` ticks up to `max`.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    mag * if r <= 1.0 { 1.0 } else if r <= 2.0 { 2.0 } else if r <= 5.0 { 5.0 } else { 10.0 }
}

/// The latency CDF of both variants, up to the larger p99.5.
pub fn latency_chart(r: &Report) -> String {
    let (w, h, left, right, top, bottom) = (720.0, 360.0, 60.0, 20.0, 20.0, 50.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let xmax = r
        .arms
        .iter()
        .filter(|a| !a.sorted_ms.is_empty())
        .map(|a| quantile(&a.sorted_ms, 0.995))
        .fold(0.0f64, f64::max)
        .max(1.0);
    let step = nice_step(xmax, 6.0);
    let xmax = (xmax / step).ceil() * step;
    let x = |v: f64| left + pw * (v / xmax).min(1.0);
    let y = |q: f64| top + ph * (1.0 - q);
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    s += &format!(r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>"##);
    let mut t = 0.0;
    while t <= xmax + 1e-9 {
        s += &format!(
            r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{3}</text>"##,
            x(t),
            top + ph,
            top + ph + 16.0,
            t
        );
        t += step;
    }
    for q in [0.0, 0.25, 0.5, 0.75, 0.95, 1.0] {
        s += &format!(
            r##"<line x1="{left}" y1="{0:.1}" x2="{1:.1}" y2="{0:.1}" stroke="#eee"/><text x="{2:.1}" y="{3:.1}" text-anchor="end">{q}</text>"##,
            y(q),
            left + pw,
            left - 6.0,
            y(q) + 4.0
        );
    }
    s += &format!(
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">latency (ms)</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">fraction of requests ≤ latency</text>"#,
        left + pw / 2.0,
        h - 10.0,
        top + ph / 2.0
    );
    for (i, arm) in r.arms.iter().enumerate() {
        if arm.sorted_ms.is_empty() {
            continue;
        }
        let points: Vec<String> = (0..=400)
            .map(|k| {
                let q = k as f64 / 400.0;
                format!("{:.1},{:.1}", x(quantile(&arm.sorted_ms, q)), y(q))
            })
            .collect();
        s += &format!(r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#, COLORS[i], points.join(" "));
        let (lx, ly) = (left + pw - 150.0, top + ph - 50.0 + 20.0 * i as f64);
        s += &format!(
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">variant {}</text>"#,
            lx + 24.0,
            COLORS[i],
            lx + 30.0,
            ly + 4.0,
            esc(&arm.name)
        );
    }
    s + "</svg>"
}

/// The whole page.
pub fn render(r: &Report, setup: &str) -> String {
    let mut rows = String::new();
    for (i, a) in r.arms.iter().enumerate() {
        let p = |k: usize| {
            let p = &a.latency[k];
            format!("{:.1} <small>[{:.1}, {:.1}]</small>", p.value, p.lo, p.hi)
        };
        rows += &format!(
            r#"<tr><td style="color:{}"><b>{}</b></td><td>{}</td><td>{}</td><td>{:.2}% <small>[{:.2}, {:.2}]</small></td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            COLORS[i],
            esc(&a.name),
            a.requests,
            a.errors,
            100.0 * a.error_rate(),
            100.0 * a.error_ci.0,
            100.0 * a.error_ci.1,
            p(0),
            p(1),
            p(2)
        );
    }
    let (a, b) = (esc(&r.arms[0].name), esc(&r.arms[1].name));
    let total: u64 = r.arms.iter().map(|a| a.requests).sum();
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>weft demo: A/B report for {exp}</title>
<style>
body {{ font-family: sans-serif; max-width: 980px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} small {{ color: #777; }}
.verdict {{ font-size: 1.2em; padding: 0.6em 1em; background: #f3f7fb; border-left: 4px solid #1f77b4; }}
.bad {{ color: #b00; font-weight: bold; }}
</style></head><body>
<h1>A/B report: experiment <code>{exp}</code></h1>
<p>{setup}</p>
<p class="verdict">Verdict: {verdict}</p>
<p>{total} requests measured; {excluded} sent in the first {warmup:.0} s (warm-up) are excluded.
Latency is that of successful requests as the client saw them through both sidecars; intervals are 95%
(order statistics for percentiles, Wilson for error rates).</p>
<table><tr><th>variant</th><th>requests</th><th>errors</th><th>error rate</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th></tr>
{rows}</table>
<h2>Latency distribution</h2>
{chart}
<h2>Checks and comparisons</h2>
<ul>
<li>Sample ratio (expected 50/50): {split}; chi² = {chi2:.2}, p = {srm_p:.3} — {srm}</li>
<li>Stickiness: {sticky}</li>
<li>Latency: P({a} faster than {b}) = {prob:.3}; Mann-Whitney z = {lz:.2}, p: {lp}; {lat_better} faster with confidence {lconf}</li>
<li>Error rate: {a} {ra:.2}% vs {b} {rb:.2}%; two-proportion z = {ez:.2}, p: {ep}; {err_better} lower with confidence {econf}</li>
</ul>
<p><small>Confidence = 1 − one-sided p-value in the observed direction. Generated by <code>weft demo</code>.</small></p>
</body></html>
"#,
        exp = esc(&r.experiment),
        setup = esc(setup),
        verdict = esc(&r.verdict),
        excluded = r.excluded,
        warmup = r.warmup_s,
        chart = latency_chart(r),
        split = esc(&split_text(r)),
        sticky = esc(&stickiness_text(r)),
        chi2 = r.srm.chi2,
        srm_p = r.srm.p,
        srm = if r.srm.ok { "ok".to_string() } else { r#"<span class="bad">MISMATCH: the split is broken</span>"#.to_string() },
        prob = r.latency.prob_a_faster,
        lz = r.latency.z,
        lp = esc(&fmt_p(r.latency.p_two_sided)),
        lat_better = esc(&r.arms[r.latency_lean.better].name),
        lconf = pct_confidence(r.latency_lean.confidence),
        ra = 100.0 * r.errors.rate_a,
        rb = 100.0 * r.errors.rate_b,
        ez = r.errors.z,
        ep = esc(&fmt_p(r.errors.p_two_sided)),
        err_better = esc(&r.arms[r.errors_lean.better].name),
        econf = pct_confidence(r.errors_lean.confidence),
    )
}

#[cfg(test)]
mod tests {
    use super::super::report::{Sample, analyze};
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(60.0, 6.0), 10.0);
        assert_eq!(nice_step(47.0, 6.0), 10.0);
        assert_eq!(nice_step(11.0, 6.0), 2.0);
        assert_eq!(nice_step(300.0, 6.0), 50.0);
    }

    #[test]
    fn the_page_has_the_numbers_and_a_chart_per_variant() {
        let s = |ms: f64| (0..500).map(|i| Sample { at_s: 1.0, unit: (ms as u64) << 20 | i, latency_ms: ms + (i % 7) as f64, ok: i % 50 != 0 }).collect::<Vec<_>>();
        let r = analyze("ranker-ab", ["a", "b<x>"], &s(20.0), &s(26.0), 0.0);
        let page = render(&r, "two variants");
        assert!(page.starts_with("<!doctype html>"));
        assert!(page.contains("<svg") && page.contains("</svg>"));
        assert_eq!(page.matches("<polyline").count(), 2);
        assert!(page.contains("variant b&lt;x&gt;") && !page.contains("b<x>"));
        assert!(page.contains("Verdict: variant a is better"), "{}", r.verdict);
    }
}
