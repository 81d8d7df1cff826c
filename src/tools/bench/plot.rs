//! The roofline chart of `memwall bench-kernels --plot FILE.svg`, written by hand (no plotting
//! dependency): x = arithmetic intensity (FLOP per byte moved), y = achieved GFLOP/s, both on
//! log scales; each adapter's bandwidth roof `y = probe GB/s * x` (`class="roof bandwidth"`)
//! and its compute roof `y = peak GFLOP/s` (`class="roof compute"`, the fma probe), each drawn
//! up to the ridge point where they meet (`x = peak / probe`), so the two make the roofline;
//! one point (`<circle class="point">`) per result at its arithmetic intensity, coloured by
//! variant, with a legend.

use std::fmt::Write;

use super::kernels::KernelsReport;

const W: f64 = 900.0;
const H: f64 = 560.0;
/// Plot area: left, top, right, bottom margins.
const L: f64 = 80.0;
const T: f64 = 40.0;
const R: f64 = 260.0;
const B: f64 = 60.0;

const COLORS: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];
const DASHES: [&str; 4] = ["", "6,4", "2,3", "10,3,2,3"];

/// `s` with XML's special characters escaped.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Decades [lo, hi] (powers of ten) covering `min..max` (positive).
fn decades(min: f64, max: f64) -> (f64, f64) {
    let lo = min.log10().floor();
    let mut hi = max.log10().ceil();
    if hi <= lo {
        hi = lo + 1.0;
    }
    (lo, hi)
}

/// The adapter's compute roof where it is plottable.
fn compute_roof(a: &super::kernels::AdapterReport) -> Option<f64> {
    (a.peak_gflops > 0.0 && a.peak_gflops.is_finite()).then_some(a.peak_gflops)
}

/// The SVG document. Results with a non-positive or non-finite figure are left out (they have
/// no place on a log scale).
pub fn roofline_svg(rep: &KernelsReport) -> String {
    let points: Vec<(usize, &super::kernels::KernelResult)> = rep
        .adapters
        .iter()
        .enumerate()
        .flat_map(|(i, a)| a.results.iter().map(move |r| (i, r)))
        .filter(|(_, r)| r.gflops.is_finite() && r.gflops > 0.0 && r.bytes > 0 && r.flops > 0)
        .collect();
    let ai = |r: &super::kernels::KernelResult| r.flops as f64 / r.bytes as f64;
    let (mut xmin, mut xmax, mut ymin, mut ymax) = (0.1f64, 10.0f64, 0.1f64, 10.0f64);
    if let Some((_, r)) = points.first() {
        (xmin, xmax, ymin, ymax) = (ai(r), ai(r), r.gflops, r.gflops);
    }
    for (_, r) in &points {
        xmin = xmin.min(ai(r));
        xmax = xmax.max(ai(r));
        ymin = ymin.min(r.gflops);
        ymax = ymax.max(r.gflops);
    }
    // Room for the roofs above the points.
    for a in &rep.adapters {
        if a.probe_gbps > 0.0 && a.probe_gbps.is_finite() {
            ymax = ymax.max(a.probe_gbps * xmax);
        }
        if let Some(c) = compute_roof(a) {
            ymax = ymax.max(c);
            // The ridge point on the chart.
            if a.probe_gbps > 0.0 && a.probe_gbps.is_finite() {
                xmax = xmax.max(c / a.probe_gbps);
            }
        }
    }
    let (x0, x1) = decades(xmin, xmax);
    let (y0, y1) = decades(ymin, ymax);
    let px = |x: f64| L + (x.log10() - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - (y.log10() - y0) / (y1 - y0) * (H - T - B);
    let mut variants: Vec<&str> = Vec::new();
    for (_, r) in &points {
        if !variants.contains(&r.variant.as_str()) {
            variants.push(&r.variant);
        }
    }
    let color = |v: &str| COLORS[variants.iter().position(|x| *x == v).unwrap_or(0) % COLORS.len()];
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">Roofline: memwall bench-kernels</text>"#,
        (W - R + L) / 2.0
    );
    let _ = writeln!(
        s,
        r#"<defs><clipPath id="area"><rect x="{L}" y="{T}" width="{}" height="{}"/></clipPath></defs>"#,
        W - L - R,
        H - T - B
    );
    // Decade grid and labels.
    for d in (x0 as i32)..=(x1 as i32) {
        let x = px(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{T}" x2="{x:.1}" y2="{}" stroke="#ddd"/><text x="{x:.1}" y="{}" text-anchor="middle">1e{d}</text>"##,
            H - B,
            H - B + 16.0
        );
    }
    for d in (y0 as i32)..=(y1 as i32) {
        let y = py(10f64.powi(d));
        let _ = writeln!(
            s,
            r##"<line x1="{L}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">1e{d}</text>"##,
            W - R,
            L - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{L}" y="{T}" width="{}" height="{}" fill="none" stroke="#333"/>"##,
        W - L - R,
        H - T - B
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">arithmetic intensity (FLOP / byte moved)</text>"#,
        (W - R + L) / 2.0,
        H - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text x="18" y="{}" text-anchor="middle" transform="rotate(-90 18 {})">achieved GFLOP/s</text>"#,
        (H - B + T) / 2.0,
        (H - B + T) / 2.0
    );
    // Roofs, clipped to the plot area.
    let _ = writeln!(s, r#"<g clip-path="url(#area)">"#);
    let (ax0, ax1) = (10f64.powf(x0), 10f64.powf(x1));
    for (i, a) in rep.adapters.iter().enumerate() {
        let dash = DASHES[i % DASHES.len()];
        let bw = (a.probe_gbps > 0.0 && a.probe_gbps.is_finite()).then_some(a.probe_gbps);
        let peak = compute_roof(a);
        // Where the roofs meet: the bandwidth roof ends and the compute roof begins there.
        let ridge = match (bw, peak) {
            (Some(b), Some(c)) => Some(c / b),
            _ => None,
        };
        if let Some(b) = bw {
            let x_end = ridge.map_or(ax1, |r| r.min(ax1));
            let _ = writeln!(
                s,
                r##"<line class="roof bandwidth" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#000" stroke-width="1.5" stroke-dasharray="{dash}"/>"##,
                px(ax0),
                py(b * ax0),
                px(x_end),
                py(b * x_end)
            );
        }
        if let Some(c) = peak {
            let x_start = ridge.map_or(ax0, |r| r.max(ax0));
            let _ = writeln!(
                s,
                r##"<line class="roof compute" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#900" stroke-width="1.5" stroke-dasharray="{dash}"/>"##,
                px(x_start),
                py(c),
                px(ax1),
                py(c)
            );
        }
    }
    let _ = writeln!(s, "</g>");
    let _ = writeln!(s, r#"<g clip-path="url(#area)">"#);
    for (i, r) in &points {
        let a = &rep.adapters[*i];
        let _ = writeln!(
            s,
            r#"<circle class="point" cx="{:.1}" cy="{:.1}" r="4" fill="{}" fill-opacity="0.8"><title>{}</title></circle>"#,
            px(ai(r)),
            py(r.gflops),
            color(&r.variant),
            esc(&format!(
                "{} ({}): {} {} [{} x {}] x{}: {:.2} GB/s, {:.2} GFLOP/s",
                a.name, a.backend, r.variant, r.format, r.rows, r.cols, r.n, r.gbps, r.gflops
            ))
        );
    }
    let _ = writeln!(s, "</g>");
    // Legend: variants, then the roofs of each adapter.
    let lx = W - R + 16.0;
    let mut ly = T + 8.0;
    for v in &variants {
        let _ = writeln!(
            s,
            r#"<circle cx="{lx}" cy="{ly}" r="4" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            color(v),
            lx + 10.0,
            ly + 4.0,
            esc(v)
        );
        ly += 18.0;
    }
    ly += 8.0;
    for (i, a) in rep.adapters.iter().enumerate() {
        let dash = DASHES[i % DASHES.len()];
        let _ = writeln!(
            s,
            r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="#000" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"##,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            esc(&format!(
                "{} ({}) read {:.2} GB/s",
                a.name.split(' ').next().unwrap_or(""),
                a.backend,
                a.probe_gbps
            ))
        );
        ly += 18.0;
        if let Some(c) = compute_roof(a) {
            let _ = writeln!(
                s,
                r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="#900" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"##,
                lx + 20.0,
                lx + 26.0,
                ly + 4.0,
                esc(&format!("fma peak {c:.1} GFLOP/s"))
            );
            ly += 18.0;
        }
        let _ = writeln!(
            s,
            r##"<text x="{lx}" y="{}" font-size="11" fill="#555">{}</text>"##,
            ly + 2.0,
            esc(&format!("timed by {}", a.timing))
        );
        ly += 18.0;
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::bench::kernels::{AdapterReport, KernelResult};

    fn result(variant: &str, flops: u64, bytes: u64, gflops: f64) -> KernelResult {
        KernelResult {
            variant: variant.into(),
            format: "Q4_0".into(),
            rows: 4,
            cols: 32,
            n: 1,
            median_us: 1.0,
            launches: 1,
            timing: "wall-clock".into(),
            bytes,
            flops,
            gbps: 1.0,
            gflops,
            frac_bw: 0.5,
            max_err: Some(0.0),
            tol: 1.0,
            ok: true,
        }
    }

    fn adapter(name: &str, results: Vec<KernelResult>, compute: f64) -> AdapterReport {
        AdapterReport {
            name: name.into(),
            backend: "Vulkan".into(),
            driver: "d".into(),
            driver_info: "i".into(),
            device_type: "Cpu".into(),
            timestamp_query: false,
            timing: "wall-clock".into(),
            probe_gbps: 2.0,
            peak_gflops: compute,
            results,
            skipped: Vec::new(),
        }
    }

    #[test]
    fn one_point_per_plottable_result_and_escaped_text() {
        let rep = KernelsReport {
            schema: "s".into(),
            clock: "c".into(),
            reps: 1,
            prefill_tokens: 64,
            adapters: vec![
                adapter(
                    "A&B <gpu>",
                    vec![
                        result("matvec <x>", 256, 100, 1.5),
                        result("matmul", 10_000, 100, 40.0),
                        // No place on a log scale: left out.
                        result("matvec <x>", 256, 100, 0.0),
                    ],
                    // Not measured (NaN): no compute roof drawn.
                    f64::NAN,
                ),
                adapter("C", vec![result("matvec_rows", 256, 80, 0.02)], 100.0),
            ],
        };
        let svg = roofline_svg(&rep);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches(r#"<circle class="point""#).count(), 3);
        // Two bandwidth roofs and one compute roof.
        assert_eq!(svg.matches(r#"class="roof bandwidth""#).count(), 2);
        assert_eq!(svg.matches(r#"class="roof compute""#).count(), 1);
        assert!(svg.contains("fma peak 100.0 GFLOP/s"));
        assert!(svg.contains("matvec &lt;x&gt;") && svg.contains("A&amp;B &lt;gpu&gt;"));
        assert!(!svg.contains("<x>") && !svg.contains("A&B"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
