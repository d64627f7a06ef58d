//! SVG pictures of a simulation, drawn here (no plotting crate, like `agent`'s diagram):
//! [`stranded_svg`], the stranded devices over time with one line per policy, and
//! [`metrics_svg`], one bar panel per headline figure.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::policy::Policy;
use super::report::{Metrics, share, time_mean};
use super::{Outcome, Simulation};
use html_escape::encode_double_quoted_attribute as esc;

const FONT: &str = "DejaVu Sans, Helvetica, Arial, sans-serif";
/// Time buckets of the stranded plot: each point is the mean over one bucket.
pub const BUCKETS: usize = 160;

/// The colour of a policy's line and bars.
pub fn color(p: Policy) -> &'static str {
    match p {
        Policy::Fumarole => "#d84315",
        Policy::FumaroleDefrag => "#6d4c41",
        Policy::Binpack => "#1565c0",
        Policy::Spread => "#2e7d32",
        Policy::Random => "#757575",
        Policy::Nvidia => "#8e24aa",
        Policy::VolcanoHard => "#00838f",
        Policy::FirstFit => "#f9a825",
    }
}

/// The dash pattern of a policy's line (`none` = solid), so lines that coincide (binpack and
/// nvidia on an all-NVSwitch node) both stay visible.
pub fn dash(p: Policy) -> &'static str {
    match p {
        Policy::Fumarole | Policy::Binpack | Policy::Spread => "none",
        Policy::Random | Policy::FumaroleDefrag => "2 3",
        Policy::Nvidia => "7 4",
        Policy::VolcanoHard => "5 2",
        Policy::FirstFit => "1 2",
    }
}

/// A round step for about `n` ticks up to `max`.
fn tick_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let r = raw / mag;
    let nice = if r <= 1.0 {
        1.0
    } else if r <= 2.0 {
        2.0
    } else if r <= 2.5 {
        2.5
    } else if r <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn header(o: &mut String, w: f64, h: f64, title: &str, subtitle: &str) {
    let _ = write!(
        o,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0}" height="{h:.0}" viewBox="0 0 {w:.0} {h:.0}" font-family="{FONT}" font-size="12"><rect x="0" y="0" width="{w:.0}" height="{h:.0}" fill="#ffffff"/><text x="20" y="26" font-size="16" font-weight="bold">{}</text><text x="20" y="44" fill="#455a64">{}</text>"##,
        esc(title),
        esc(subtitle)
    );
}

/// Stranded devices over the trace's arrival window, one line per run; each point is the
/// time-weighted mean over one of [`BUCKETS`] equal buckets.
pub fn stranded_svg(sim: &Simulation, runs: &[&Outcome]) -> String {
    let (w, h) = (960.0, 440.0);
    let (left, right, top, bottom) = (70.0, 150.0, 64.0, 54.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let (_, t1) = sim.arrival_window();
    let t1 = t1.max(1);
    let bucket = (t1 as f64 / BUCKETS as f64).max(1.0);
    let lines: Vec<(Policy, Vec<(f64, f64)>)> = runs
        .iter()
        .map(|o| {
            let pts = (0..BUCKETS)
                .map(|i| {
                    let a = (i as f64 * bucket) as u64;
                    let b = (((i + 1) as f64 * bucket) as u64).min(t1);
                    ((a + b) as f64 / 2.0 / 3600.0, time_mean(&o.stranded, a, b))
                })
                .collect();
            (o.policy, pts)
        })
        .collect();
    let ymax_data = lines
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, v)| *v))
        .fold(0.0, f64::max);
    let ystep = tick_step(ymax_data.max(1.0), 5.0);
    let ymax = (ymax_data / ystep).ceil().max(1.0) * ystep;
    let xmax = t1 as f64 / 3600.0;
    let xstep = tick_step(xmax, 10.0);
    let x = |hours: f64| left + hours / xmax * pw;
    let y = |v: f64| top + ph - v / ymax * ph;
    let mut o = String::new();
    header(
        &mut o,
        w,
        h,
        &format!("Stranded devices over time: {}", sim.trace_name),
        &format!(
            "{} on {} ({} devices); mean per {:.0}-minute bucket; lower is better",
            sim.trace_name,
            sim.cluster.shape,
            sim.cluster.capacity(),
            bucket / 60.0
        ),
    );
    // Grid and axes.
    let mut v = 0.0;
    while v <= ymax + 1e-9 {
        let _ = write!(
            o,
            r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#eceff1"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + pw,
            left - 6.0,
            y(v) + 4.0,
            trim(v),
            yy = y(v),
        );
        v += ystep;
    }
    let mut t = 0.0;
    while t <= xmax + 1e-9 {
        let _ = write!(
            o,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#90a4ae"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            top + ph,
            top + ph + 5.0,
            top + ph + 18.0,
            trim(t),
            xx = x(t),
        );
        t += xstep;
    }
    let _ = write!(
        o,
        r##"<rect x="{left}" y="{top}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#90a4ae"/><text x="{:.1}" y="{:.1}" text-anchor="middle">hours since the start of the trace</text><text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">stranded devices</text>"##,
        left + pw / 2.0,
        h - 14.0,
        top + ph / 2.0,
    );
    for (i, (p, pts)) in lines.iter().enumerate() {
        let points: Vec<String> = pts
            .iter()
            .map(|(hx, v)| format!("{:.1},{:.1}", x(*hx), y(*v)))
            .collect();
        let width = if *p == Policy::Fumarole { 2.6 } else { 1.6 };
        let _ = write!(
            o,
            r##"<polyline class="series" data-policy="{p}" points="{}" fill="none" stroke="{}" stroke-width="{width}" stroke-dasharray="{}" stroke-linejoin="round"/>"##,
            points.join(" "),
            color(*p),
            dash(*p),
        );
        let ly = top + 10.0 + i as f64 * 22.0;
        let _ = write!(
            o,
            r##"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="3" stroke-dasharray="{}"/><text x="{:.1}" y="{:.1}">{p}</text>"##,
            left + pw + 16.0,
            left + pw + 40.0,
            color(*p),
            dash(*p),
            left + pw + 46.0,
            ly + 4.0,
        );
    }
    o.push_str("</svg>\n");
    o
}

/// Writes `<stem>.stranded.svg` and `<stem>.metrics.svg` into `dir` (created when missing);
/// returns their paths.
pub fn write_all(
    dir: &Path,
    stem: &str,
    sim: &Simulation,
    runs: &[Outcome],
    metrics: &[Metrics],
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let refs: Vec<&Outcome> = runs.iter().collect();
    let mut out = Vec::new();
    for (file, svg) in [
        (format!("{stem}.stranded.svg"), stranded_svg(sim, &refs)),
        (format!("{stem}.metrics.svg"), metrics_svg(sim, metrics)),
    ] {
        let path = dir.join(file);
        std::fs::write(&path, svg)?;
        out.push(path);
    }
    Ok(out)
}

fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// One panel per headline figure, a bar per policy, the value above each bar.
pub fn metrics_svg(sim: &Simulation, ms: &[Metrics]) -> String {
    type Figure = (
        &'static str,
        &'static str,
        fn(&Metrics) -> f64,
        &'static str,
    );
    let panels: [Figure; 5] = [
        (
            "Jobs with ideal interconnect",
            "% of placed jobs; higher is better",
            |m| share(m.ideal_jobs, m.placed) * 100.0,
            "%",
        ),
        (
            "Units split across super-nodes",
            "% of multi-pod units; lower is better",
            |m| share(m.units_split, m.units) * 100.0,
            "%",
        ),
        (
            "Atomic parts split (MUST broken)",
            "% of multi-pod parts; lower is better",
            |m| share(m.atomic_split, m.atomic_parts) * 100.0,
            "%",
        ),
        (
            "Stranded devices",
            "mean, % of the cluster; lower is better",
            |m| m.stranded_share * 100.0,
            "%",
        ),
        (
            "Queueing delay",
            "mean, minutes; lower is better",
            |m| m.delay_mean / 60.0,
            "",
        ),
    ];
    let (panel_w, gap) = (236.0, 24.0);
    let (top, plot_h, label_h) = (100.0, 220.0, 70.0);
    let w = 30.0 + panels.len() as f64 * (panel_w + gap);
    let h = top + plot_h + label_h;
    let mut o = String::new();
    header(
        &mut o,
        w,
        h,
        &format!("Placement quality: {}", sim.trace_name),
        &format!(
            "{} jobs on {} ({} devices)",
            sim.jobs.len(),
            sim.cluster.shape,
            sim.cluster.capacity()
        ),
    );
    for (pi, (title, sub, value, unit)) in panels.iter().enumerate() {
        let x0 = 30.0 + pi as f64 * (panel_w + gap);
        let vals: Vec<f64> = ms.iter().map(value).collect();
        let vmax = vals.iter().copied().fold(0.0, f64::max);
        let step = tick_step(vmax.max(1.0), 4.0);
        let top_v = (vmax / step).ceil().max(1.0) * step;
        let _ = write!(
            o,
            r##"<g class="panel"><text x="{x0:.1}" y="72" font-weight="bold">{}</text><text x="{x0:.1}" y="88" font-size="11" fill="#455a64">{}</text><line x1="{x0:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#90a4ae"/>"##,
            esc(title),
            esc(sub),
            top + plot_h,
            x0 + panel_w,
            top + plot_h,
        );
        let slot = panel_w / ms.len().max(1) as f64;
        for (i, (m, v)) in ms.iter().zip(&vals).enumerate() {
            let bh = if top_v > 0.0 {
                v / top_v * (plot_h - 20.0)
            } else {
                0.0
            };
            let bx = x0 + i as f64 * slot + slot * 0.15;
            let bw = slot * 0.7;
            let by = top + plot_h - bh;
            let _ = write!(
                o,
                r##"<rect class="bar" data-policy="{p}" x="{bx:.1}" y="{by:.1}" width="{bw:.1}" height="{bh:.1}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{:.1}{unit}</text><text transform="translate({:.1} {:.1}) rotate(-35)" text-anchor="end" font-size="11">{p}</text>"##,
                color(m.policy),
                bx + bw / 2.0,
                by - 4.0,
                v,
                bx + bw / 2.0 + 4.0,
                top + plot_h + 14.0,
                p = m.policy,
            );
        }
        o.push_str("</g>");
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(100.0, 5.0), 20.0);
        assert_eq!(tick_step(47.0, 10.0), 5.0);
        assert_eq!(tick_step(0.0, 5.0), 1.0);
        assert_eq!(trim(2.50), "2.5");
        assert_eq!(trim(20.0), "20");
        assert_eq!(esc("a<b&"), "a&lt;b&amp;");
    }
}
