//! The picture of a demo run (`hmdp demo --report FILE.html`): the finished
//! runs as one self-contained HTML page — inline CSS and SVG, no script,
//! nothing fetched (its Content-Security-Policy forbids every load) — so a
//! run can be attached to an issue, mailed, and put beside another.
//!
//! Per run: the verdict in words and colour (HELD / BROKE: did every user
//! end up with at most one order, and did the stock balance), the audit's
//! orders, users with two orders and oversell, requests/s, the latency at
//! every percentile on one log scale shared by all runs, and how nginx split
//! the requests over the two nodes (the `x-served-by` the load test counts).
//! Above them the tally, the settings, the date and the machine's core count.
//! With `--payers`, below them each run's life after the sale: what the
//! buyers did, what the second wave sold again, the final balance, and the
//! orders' states over time as a small line chart.
//!
//! It only renders: it reads the demo's finished runs and runs nothing, so
//! its tests render fixed results, and one opens them in headless Chromium.

use std::collections::BTreeMap;
use std::fmt::{self, Display, Write as _};

use chrono::{DateTime, FixedOffset, Local};
use hdrhistogram::Histogram;
use hmdp::config::SeckillMode;

use super::after_sale::{AfterSale, States};
use super::{drain_ms, DemoSettings, ModeRun, Run};
use crate::latency::Latency;
use crate::loadtest::crowd::CrowdReport;
use crate::nodes::NODE_IDS;

/// The latency distribution of one run as the picture draws it: the latency
/// at quantiles from 0 to 99.9 %, then the maximum.
pub(super) struct LatencyCurve {
    /// (quantile, milliseconds), by quantile; the maximum at quantile 1.
    points: Vec<(f64, f64)>,
}

/// The curve's horizontal axis counts nines (0.9 is one, 0.99 two), which
/// gives the tail as much room as the body. It stops at three: past 99.9 %
/// a demo's few thousand requests leave a handful of samples, so only the
/// maximum is drawn beyond it, at `MAX_AT`.
const NINES: f64 = 3.0;
const MAX_AT: f64 = NINES + 0.5;

/// The nines of a quantile: 0 for 0 %, 1 for 90 %, 2 for 99 %...
fn nines(quantile: f64) -> f64 {
    if quantile >= 1.0 {
        MAX_AT
    } else {
        (-(1.0 - quantile).log10()).clamp(0.0, NINES)
    }
}

impl LatencyCurve {
    /// Four points per nine, the median among them, and the maximum.
    pub(super) fn of(histogram: &Histogram<u64>) -> LatencyCurve {
        let ms = |us: u64| us as f64 / 1000.0;
        let steps = (NINES * 4.0) as i32;
        let mut quantiles: Vec<f64> = (0..=steps)
            .map(|k| 1.0 - 10f64.powf(-f64::from(k) / 4.0))
            .chain([0.5])
            .collect();
        quantiles.sort_by(f64::total_cmp);
        let mut points: Vec<(f64, f64)> = quantiles
            .into_iter()
            .map(|q| (q, ms(histogram.value_at_quantile(q))))
            .collect();
        points.push((1.0, ms(histogram.max())));
        LatencyCurve { points }
    }
}

/// When and on what the demo ran, for the picture's header; given from
/// outside so that a test renders a fixed one.
pub(super) struct Occasion {
    pub(super) at: DateTime<FixedOffset>,
    /// The cores the machine offers: the load generator, nginx, both nodes,
    /// MySQL and Redis all share them, which bounds every requests/s figure.
    pub(super) cores: usize,
}

impl Occasion {
    pub(super) fn now() -> Occasion {
        Occasion {
            at: Local::now().fixed_offset(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// What the picture says of a run, in words as well as colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// One order per user, and the stock balanced (and drained, if async).
    Held,
    /// A user with two orders, or a broken stock invariant.
    Broke,
    DidNotRun,
}

impl Verdict {
    fn of(run: &ModeRun) -> Verdict {
        match &run.result {
            Ok(Run { report, .. })
                if report.duplicate_users == Some(0) && report.violations.is_empty() =>
            {
                Verdict::Held
            }
            Ok(_) => Verdict::Broke,
            Err(_) => Verdict::DidNotRun,
        }
    }

    /// A mark and a word, so that the verdict reads without its colour.
    fn text(self) -> &'static str {
        match self {
            Verdict::Held => "✓ HELD",
            Verdict::Broke => "✗ BROKE",
            Verdict::DidNotRun => "– DID NOT RUN",
        }
    }

    /// The CSS class that colours it.
    fn class(self) -> &'static str {
        match self {
            Verdict::Held => "held",
            Verdict::Broke => "broke",
            Verdict::DidNotRun => "absent",
        }
    }
}

/// Text made safe for HTML content and for quoted attribute values: every
/// string from outside the page (verdicts, error messages, mode names)
/// goes through it.
struct Escaped<'a>(&'a str);

impl Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            match c {
                '&' => f.write_str("&amp;")?,
                '<' => f.write_str("&lt;")?,
                '>' => f.write_str("&gt;")?,
                '"' => f.write_str("&quot;")?,
                '\'' => f.write_str("&#39;")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// Every run's latency curve is drawn on this one log scale, so that the
/// curves compare at a glance: from the lowest latency of all runs to the
/// highest, widened to the nearest 1-2-5 steps.
#[derive(Debug, PartialEq)]
struct LogScale {
    lo: f64,
    hi: f64,
}

/// 1-2-5 steps: the round numbers a log axis is labelled with.
fn steps_around(lo: f64, hi: f64) -> impl Iterator<Item = f64> {
    let first = lo.log10().floor() as i32 - 1;
    let last = hi.log10().ceil() as i32 + 1;
    (first..=last).flat_map(|decade| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(decade)))
}

impl LogScale {
    fn over<'a>(curves: impl Iterator<Item = &'a LatencyCurve>) -> LogScale {
        // Below a microsecond nothing was measured (the histogram's floor).
        let values: Vec<f64> = curves
            .flat_map(|curve| curve.points.iter().map(|&(_, ms)| ms.max(0.001)))
            .collect();
        if values.is_empty() {
            return LogScale { lo: 1.0, hi: 10.0 };
        }
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(0.0, f64::max);
        let lo = steps_around(lo, hi)
            .filter(|&s| s <= lo)
            .last()
            .unwrap_or(lo);
        let hi = steps_around(lo, hi)
            .find(|&s| s >= hi && s > lo)
            .unwrap_or(hi);
        LogScale { lo, hi }
    }

    /// Where `ms` sits: 0 at the bottom of the scale, 1 at the top.
    fn fraction(&self, ms: f64) -> f64 {
        ((ms.max(self.lo).ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())).clamp(0.0, 1.0)
    }

    /// The values to label: the 1-2-5 steps in range, or only the powers of
    /// ten when the steps would crowd a small chart.
    fn ticks(&self) -> Vec<f64> {
        // A hair of slack: 10^k computed is not always exactly the bound.
        let inside = |s: &f64| *s >= self.lo * 0.999 && *s <= self.hi * 1.001;
        let all: Vec<f64> = steps_around(self.lo, self.hi).filter(inside).collect();
        if all.len() <= 4 {
            return all;
        }
        let decades: Vec<f64> = all
            .iter()
            .copied()
            .filter(|s| (s.log10() - s.log10().round()).abs() < 1e-9)
            .collect();
        if decades.len() >= 2 {
            decades
        } else {
            all.into_iter().step_by(2).collect()
        }
    }
}

/// What each purchase path does, for the picture's group headings.
fn path_heading(seckill: SeckillMode) -> &'static str {
    match seckill {
        SeckillMode::Sync => "the per-user lock around the SQL transaction, inside the request",
        SeckillMode::Queue => {
            "admitted in Redis by lua/seckill.lua, written to MySQL by an in-process queue"
        }
        SeckillMode::Stream => {
            "admitted in Redis by lua/seckill.lua, written to MySQL by a Redis Stream consumer group"
        }
    }
}

const STYLE: &str = r#"
:root { font: 15px/1.45 "DejaVu Sans", "Liberation Sans", system-ui, sans-serif; color: #1f2328; background: #fff; }
body { max-width: 1240px; margin: 20px auto; padding: 0 16px; }
h1 { font-size: 24px; margin: 0 0 4px; }
p { margin: 2px 0; }
.muted { color: #57606a; }
code { font-family: "DejaVu Sans Mono", monospace; }
.tally { display: flex; flex-wrap: wrap; gap: 10px; margin: 14px 0 6px; }
.tally div { padding: 6px 12px; border: 2px solid; border-radius: 6px; font-weight: 700; }
.held { background: #dafbe1; color: #116329; border-color: #1a7f37; }
.broke { background: #ffebe9; color: #a40e26; border-color: #cf222e; }
.absent { background: #eaeef2; color: #57606a; border-color: #8c959f; }
.expectation { margin: 6px 0 16px; }
.unexpected { color: #a40e26; font-weight: 700; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 8px 6px; border-bottom: 1px solid #d0d7de; vertical-align: middle; text-align: right; }
thead th { white-space: nowrap; font-size: 12px; color: #57606a; font-weight: 600; border-bottom: 2px solid #8c959f; vertical-align: bottom; }
th.path { text-align: left; background: #f6f8fa; font-size: 14px; color: #1f2328; }
.left { text-align: left; }
.badge { display: inline-block; min-width: 92px; text-align: center; font-weight: 700; padding: 5px 6px; border: 2px solid; border-radius: 6px; }
.note { font-size: 11px; margin-top: 3px; text-align: center; }
.mode code { font-size: 17px; font-weight: 700; }
.why { font-size: 12px; color: #57606a; max-width: 230px; }
.num { font-size: 18px; font-variant-numeric: tabular-nums; }
.num.bad { color: #cf222e; font-weight: 700; }
.sub { font-size: 11px; color: #57606a; white-space: nowrap; }
.lat svg { display: block; }
.lat .sub { text-align: left; }
.split { width: 170px; }
.bar { display: flex; height: 16px; border-radius: 3px; overflow: hidden; background: #eaeef2; }
.node-a { background: #0969da; } .node-b { background: #e16f24; } .other { background: #8c959f; }
.legend { font-size: 11px; color: #57606a; text-align: left; margin-top: 3px; }
.swatch { display: inline-block; width: 9px; height: 9px; margin-right: 3px; border-radius: 2px; }
.error { text-align: left; color: #a40e26; }
/* A broken run's whole row is tinted, so it stands out before it is read. */
tr.run-broke td { background: #fff5f4; }
tr.run-broke td:first-child { box-shadow: inset 5px 0 #cf222e; }
tr.run-held td:first-child { box-shadow: inset 5px 0 #1a7f37; }
.st-unpaid { background: #e16f24; } .st-paid { background: #1a7f37; } .st-closed { background: #8c959f; }
.nowrap { white-space: nowrap; }
h2 { font-size: 19px; margin: 22px 0 4px; }
footer { margin-top: 16px; font-size: 12px; color: #57606a; }
"#;

/// The page for the finished `runs` of a demo run with `settings`.
pub(super) fn render(
    settings: &DemoSettings,
    runs: &[ModeRun],
    crowd: Option<&CrowdReport>,
    occasion: &Occasion,
) -> String {
    let verdicts: Vec<Verdict> = runs.iter().map(Verdict::of).collect();
    let broke = verdicts.iter().filter(|&&v| v == Verdict::Broke).count();
    let mut page = String::new();
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>hmdp demo: {broke} of {} broke · {}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        runs.len(),
        occasion.at.format("%Y-%m-%d %H:%M"),
    );
    header(&mut page, settings, occasion);
    tally(&mut page, runs, &verdicts);
    table(&mut page, settings, runs, &verdicts);
    after_sale_section(&mut page, settings, runs);
    crowd_section(&mut page, crowd);
    page.push_str(
        "<footer>HELD: every user ended with at most one order and the stock balanced \
         (orders + stock left = initial stock, none below zero, every admitted order written). \
         BROKE: a user got two orders, or the stock did not balance. Counts are read from MySQL \
         after each run. Latency: from sending a purchase to its whole answer, at each \
         percentile up to 99.9 % and the maximum, on one log scale for every run. \
         Served by: the node that answered (nginx spreads requests round-robin).</footer>\n\
         </body>\n</html>\n",
    );
    page
}

fn header(page: &mut String, settings: &DemoSettings, occasion: &Occasion) {
    let list = |items: Vec<String>| Escaped(&items.join(", ")).to_string();
    let _ = write!(
        page,
        "<h1>hmdp demo: one order per user, two nodes behind nginx</h1>\n\
         <p><b>{}</b> users × <b>{}</b> purchases at once · stock <b>{}</b> · \
         concurrency {} · chaos hold <b>{} ms</b> inside the critical section</p>\n\
         <p>lock modes <code>{}</code> · purchase paths <code>{}</code></p>\n\
         <p class=\"muted\">run {} · machine with {} cores</p>\n",
        settings.users,
        settings.per_user,
        settings.stock,
        settings.concurrency,
        settings.chaos_hold_ms,
        list(settings.modes.iter().map(ToString::to_string).collect()),
        list(settings.seckill.iter().map(ToString::to_string).collect()),
        occasion.at.format("%Y-%m-%d %H:%M %:z"),
        occasion.cores,
    );
}

/// Which runs broke and which held, in one line above the details, and
/// whether that is what the course predicts (the demo's exit status).
fn tally(page: &mut String, runs: &[ModeRun], verdicts: &[Verdict]) {
    page.push_str("<div class=\"tally\">");
    for verdict in [Verdict::Broke, Verdict::Held, Verdict::DidNotRun] {
        let labels: Vec<String> = runs
            .iter()
            .zip(verdicts)
            .filter(|(_, v)| **v == verdict)
            .map(|(run, _)| run.label())
            .collect();
        if !labels.is_empty() {
            let _ = write!(
                page,
                "<div class=\"{}\">{} {}: {}</div>",
                verdict.class(),
                verdict.text(),
                labels.len(),
                Escaped(&labels.join(", ")),
            );
        }
    }
    page.push_str("</div>\n");
    let unexpected: Vec<String> = runs
        .iter()
        .filter(|run| !run.as_expected())
        .map(ModeRun::label)
        .collect();
    if unexpected.is_empty() {
        page.push_str(
            "<p class=\"expectation\">Every run came out as the course predicts: \
             on the synchronous path no lock and a process-local lock break on two \
             nodes; every other run holds.</p>\n",
        );
    } else {
        let _ = writeln!(
            page,
            "<p class=\"expectation unexpected\">Not as the course predicts: {}</p>",
            Escaped(&unexpected.join(", ")),
        );
    }
}

fn table(page: &mut String, settings: &DemoSettings, runs: &[ModeRun], verdicts: &[Verdict]) {
    let with_paths = settings.with_paths();
    let columns = if with_paths { 9 } else { 8 };
    let scale = LogScale::over(runs.iter().filter_map(|run| match &run.result {
        Ok(Run { latency, .. }) => Some(latency),
        Err(_) => None,
    }));
    let _ = write!(
        page,
        "<table>\n<thead><tr><th class=\"left\">verdict</th><th class=\"left\">lock mode</th>\
         <th>orders<br>of stock</th><th>users with<br>two orders</th><th>oversold</th>\
         <th>requests/s</th>{}<th class=\"left\">latency ms by percentile (log scale)</th>\
         <th class=\"left\">served by</th></tr></thead>\n<tbody>\n",
        if with_paths { "<th>drain ms</th>" } else { "" },
    );
    let mut path = None;
    for (run, &verdict) in runs.iter().zip(verdicts) {
        if with_paths && path != Some(run.seckill) {
            path = Some(run.seckill);
            let _ = writeln!(
                page,
                "<tr><th class=\"path\" colspan=\"{columns}\"><code>{}</code> — {}</th></tr>",
                Escaped(&run.seckill.to_string()),
                path_heading(run.seckill),
            );
        }
        row(page, run, verdict, &scale, with_paths, columns);
    }
    page.push_str("</tbody>\n</table>\n");
}

/// One run's row: `data-run` names it, for readers of the DOM (the test).
fn row(
    page: &mut String,
    run: &ModeRun,
    verdict: Verdict,
    scale: &LogScale,
    with_paths: bool,
    columns: usize,
) {
    let label = run.label();
    // The verdict line repeats the label, which the row shows already.
    let line = run.verdict();
    let why = line
        .strip_prefix(&format!("{label}: "))
        .unwrap_or(&line)
        .to_owned();
    let expectation = if run.as_expected() {
        "<div class=\"note muted\">as expected</div>"
    } else {
        "<div class=\"note unexpected\">NOT as expected</div>"
    };
    let _ = write!(
        page,
        "<tr data-run=\"{}\" class=\"run-{}\"><td class=\"left\"><span class=\"badge {}\">{}</span>{expectation}</td>\
         <td class=\"left mode\"><code>{}</code>",
        Escaped(&label),
        verdict.class(),
        verdict.class(),
        verdict.text(),
        Escaped(&run.mode.to_string()),
    );
    let Ok(Run {
        report,
        drain,
        latency,
        ..
    }) = &run.result
    else {
        let _ = writeln!(
            page,
            "</td><td class=\"error\" colspan=\"{}\">{}</td></tr>",
            columns - 2,
            Escaped(&why),
        );
        return;
    };
    let duplicates = report.duplicate_users.unwrap_or(0);
    let oversold = report.oversold.unwrap_or(0);
    let bad = |n: i64| if n > 0 { " bad" } else { "" };
    let _ = write!(
        page,
        "<div class=\"why\">{}</div></td>\
         <td><span class=\"num\">{}</span><div class=\"sub\">of {}</div></td>\
         <td><span class=\"num{}\">{duplicates}</span>{}</td>\
         <td><span class=\"num{}\">{oversold}</span></td>\
         <td><span class=\"num\">{:.0}</span><div class=\"sub\">{} requests</div></td>",
        Escaped(&why),
        report.orders.unwrap_or(0),
        report.initial_stock.unwrap_or(0),
        bad(duplicates),
        match report.extra_orders.unwrap_or(0) {
            0 => String::new(),
            extra => format!("<div class=\"sub\">{extra} extra orders</div>"),
        },
        bad(oversold),
        report.rps,
        report.requests,
    );
    if with_paths {
        let _ = write!(
            page,
            "<td><span class=\"num\">{}</span></td>",
            Escaped(&drain_ms(run.seckill, *drain))
        );
    }
    page.push_str("<td class=\"lat\">");
    latency_chart(page, &label, latency, &report.latency_ms, scale);
    page.push_str("</td><td class=\"split\">");
    served_split(page, &report.served_by);
    page.push_str("</td></tr>\n");
}

/// Chart size in pixels, and the plot area inside it (room for the labels).
const CHART_W: f64 = 260.0;
const CHART_H: f64 = 100.0;
const PLOT_LEFT: f64 = 34.0;
const PLOT_RIGHT: f64 = CHART_W - 12.0;
const PLOT_TOP: f64 = 5.0;
const PLOT_BOTTOM: f64 = CHART_H - 15.0;

/// The labelled percentiles: marked on the curve and written under it.
const MARKS: [(f64, &str); 4] = [(0.5, "p50"), (0.9, "p90"), (0.99, "p99"), (1.0, "max")];

/// A small SVG of latency by percentile, on the shared `scale`, with the
/// report's p50/p90/p99/max marked and written out under it.
fn latency_chart(
    page: &mut String,
    label: &str,
    curve: &LatencyCurve,
    latency: &Latency,
    scale: &LogScale,
) {
    let x = |q: f64| PLOT_LEFT + nines(q) / MAX_AT * (PLOT_RIGHT - PLOT_LEFT);
    let y = |ms: f64| PLOT_BOTTOM - scale.fraction(ms) * (PLOT_BOTTOM - PLOT_TOP);
    let marked = [
        latency.p50_ms,
        latency.p90_ms,
        latency.p99_ms,
        latency.max_ms,
    ];
    let summary = MARKS
        .iter()
        .zip(marked)
        .map(|((_, name), ms)| format!("{name} {ms:.1}"))
        .collect::<Vec<_>>()
        .join(" · ");
    let _ = write!(
        page,
        "<svg width=\"{CHART_W}\" height=\"{CHART_H}\" viewBox=\"0 0 {CHART_W} {CHART_H}\" \
         role=\"img\" aria-label=\"latency of {0}: {1} ms\"><title>latency of {0}: {1} ms</title>",
        Escaped(label),
        Escaped(&summary),
    );
    for tick in scale.ticks() {
        let _ = write!(
            page,
            "<line x1=\"{PLOT_LEFT}\" x2=\"{PLOT_RIGHT}\" y1=\"{0:.1}\" y2=\"{0:.1}\" stroke=\"#d0d7de\"/>\
             <text x=\"{1}\" y=\"{0:.1}\" dy=\"3\" font-size=\"9\" text-anchor=\"end\" fill=\"#57606a\">{tick}</text>",
            y(tick),
            PLOT_LEFT - 3.0,
        );
    }
    for (q, name) in MARKS {
        let _ = write!(
            page,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{PLOT_TOP}\" y2=\"{PLOT_BOTTOM}\" stroke=\"#eaeef2\"/>\
             <text x=\"{0:.1}\" y=\"{1}\" font-size=\"9\" text-anchor=\"middle\" fill=\"#57606a\">{name}</text>",
            x(q),
            CHART_H - 3.0,
        );
    }
    let points: Vec<String> = curve
        .points
        .iter()
        .map(|&(q, ms)| format!("{:.1},{:.1}", x(q), y(ms)))
        .collect();
    let _ = write!(
        page,
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#0969da\" stroke-width=\"2\"/>",
        points.join(" "),
    );
    for ((q, _), ms) in MARKS.iter().zip(marked) {
        let _ = write!(
            page,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"#0969da\"/>",
            x(*q),
            y(ms),
        );
    }
    let _ = write!(page, "</svg><div class=\"sub\">{}</div>", Escaped(&summary));
}

/// How the answers split over the nodes: node1, node2, then anything else
/// (`-`: no node answered, e.g. a 502 from nginx).
fn served_split(page: &mut String, served_by: &BTreeMap<String, u64>) {
    let total: u64 = served_by.values().sum();
    let mut parts: Vec<(&str, u64, &str)> = NODE_IDS
        .iter()
        .zip(["node-a", "node-b"])
        .map(|(&node, class)| (node, served_by.get(node).copied().unwrap_or(0), class))
        .collect();
    parts.extend(
        served_by
            .iter()
            .filter(|(node, _)| !NODE_IDS.contains(&node.as_str()))
            .map(|(node, &n)| {
                let name = if node == "-" {
                    "no node"
                } else {
                    node.as_str()
                };
                (name, n, "other")
            }),
    );
    let share = |n: u64| 100.0 * n as f64 / total.max(1) as f64;
    page.push_str("<div class=\"bar\">");
    for (_, n, class) in &parts {
        let _ = write!(
            page,
            "<span class=\"{class}\" style=\"width:{:.2}%\"></span>",
            share(*n)
        );
    }
    page.push_str("</div>");
    for (name, n, class) in &parts {
        let _ = write!(
            page,
            "<div class=\"legend\"><span class=\"swatch {class}\"></span>{} {n} ({:.0} %)</div>",
            Escaped(name),
            share(*n),
        );
    }
}

/// The crowd: honest buyers against bots, a row per class, and the share
/// of the units each got against its share of the buyers as two bars.
fn crowd_section(page: &mut String, crowd: Option<&CrowdReport>) {
    let Some(crowd) = crowd else {
        return;
    };
    let _ = write!(
        page,
        "<h2>The crowd, with the request limits on</h2>\n<p>{} honest buyers, each from an \
         address of their own, send one purchase (and one retry after a failure), spread over \
         {} ms; {} bots from {} addresses send purchase after purchase until the buyers are \
         done. Stock {}.</p>\n<table>\n<thead><tr><th class=\"left\">class</th><th>buyers</th>\
         <th>requests</th><th>429</th><th>503</th><th>units won</th><th>most by one</th>\
         <th>p50 ms</th><th>p99 ms</th><th class=\"left\">share of the units · of the buyers</th>\
         </tr></thead>\n<tbody>\n",
        crowd.humans.buyers, crowd.spread_ms, crowd.bots.buyers, crowd.bot_addresses, crowd.stock,
    );
    let sold = (crowd.humans.units_won + crowd.bots.units_won).max(1) as f64;
    let buyers = (crowd.humans.buyers + crowd.bots.buyers).max(1) as f64;
    for (name, class) in [("honest buyers", &crowd.humans), ("bots", &crowd.bots)] {
        let units = 100.0 * class.units_won as f64 / sold;
        let people = 100.0 * class.buyers as f64 / buyers;
        let _ = writeln!(
            page,
            "<tr data-crowd=\"{name}\"><td class=\"left mode\">{name}</td>\
             <td><span class=\"num\">{}</span></td><td><span class=\"num\">{}</span></td>\
             <td><span class=\"num\">{}</span></td><td><span class=\"num\">{}</span></td>\
             <td><span class=\"num\">{}</span></td><td><span class=\"num\">{}</span></td>\
             <td><span class=\"num\">{:.1}</span></td><td><span class=\"num\">{:.1}</span></td>\
             <td class=\"left\"><svg width=\"220\" height=\"28\" role=\"img\">\
             <rect x=\"0\" y=\"2\" width=\"{:.1}\" height=\"10\" fill=\"#1a7f37\"/>\
             <rect x=\"0\" y=\"16\" width=\"{:.1}\" height=\"10\" fill=\"#8c959f\"/></svg>\
             <div class=\"sub\">{units:.1} % of the units · {people:.1} % of the buyers</div></td></tr>",
            class.buyers,
            class.requests,
            class.refused_429,
            class.refused_503,
            class.units_won,
            class.most_won_by_one,
            class.p50_ms,
            class.p99_ms,
            2.2 * units,
            2.2 * people,
        );
    }
    let _ = writeln!(
        page,
        "</tbody>\n</table>\n<p class=\"muted\">Honest buyers answered 429 on their first \
         purchase: {}.</p>",
        crowd.humans_429_on_first_purchase
    );
}

/// An order state the after-sale chart draws: name, CSS class (its legend
/// swatch), colour, and the count in a sample.
type Series = (&'static str, &'static str, &'static str, fn(&States) -> i64);

const STATE_SERIES: [Series; 3] = [
    ("unpaid", "st-unpaid", "#e16f24", |s| s.unpaid),
    ("paid + used", "st-paid", "#1a7f37", |s| s.paid + s.used),
    ("closed", "st-closed", "#8c959f", |s| s.closed),
];

/// With --payers: a row per run with its after-sale figures, the final
/// balance and the orders' states over time.
fn after_sale_section(page: &mut String, settings: &DemoSettings, runs: &[ModeRun]) {
    let Some(payers) = settings.payers else {
        return;
    };
    let _ = write!(
        page,
        "<h2>After the sale</h2>\n<p>{payers} of the buyers told success pay, a tenth of the \
         rest (at least one) cancel, the others leave their orders unpaid until a node closes \
         them ({} s pay timeout). Once none is left unpaid, every user without a paid unit \
         buys again; whoever gets one of the units that came back pays at once.</p>\n\
         <table>\n<thead><tr><th class=\"left\">verdict</th><th class=\"left\">run</th>\
         <th>paid</th><th>cancelled</th><th>timed out</th><th>second wave<br>got of returned</th>\
         <th>paid + used + unpaid<br>+ stock = initial</th><th>users with two<br>active orders</th>\
         <th>paid and<br>closed</th><th class=\"left\">orders by state over time</th></tr></thead>\n<tbody>\n",
        settings.pay_timeout_secs,
    );
    for run in runs {
        let Ok(Run {
            after_sale: Some(after),
            ..
        }) = &run.result
        else {
            continue;
        };
        let label = run.label();
        let verdict = if after.held() {
            Verdict::Held
        } else {
            Verdict::Broke
        };
        let bad = |broken: bool| if broken { " bad" } else { "" };
        let audit = &after.audit;
        let end = &after.end;
        let _ = write!(
            page,
            "<tr data-after=\"{}\" class=\"run-{}\"><td class=\"left\"><span class=\"badge {}\">{}</span></td>\
             <td class=\"left mode\"><code>{}</code><div class=\"why\">{}</div></td>\
             <td><span class=\"num\">{}</span></td><td><span class=\"num\">{}</span></td>\
             <td><span class=\"num\">{}</span></td>\
             <td><span class=\"num\">{}</span><div class=\"sub\">of {} · {} tried</div></td>\
             <td><span class=\"num nowrap{}\">{} + {} + {} = {}</span><div class=\"sub\">initial {}</div></td>\
             <td><span class=\"num{}\">{}</span></td><td><span class=\"num{}\">{}</span></td>\
             <td class=\"lat\">",
            Escaped(&label),
            verdict.class(),
            verdict.class(),
            verdict.text(),
            Escaped(&label),
            Escaped(&after.violations.join("; ")),
            after.paid,
            after.cancelled,
            after.timed_out,
            after.second_wave,
            after.returned,
            after.second_wave_buyers,
            bad(!audit.stock_balances(after.initial_stock)),
            end.paid + end.used,
            end.unpaid,
            audit.stock_left,
            end.paid + end.used + end.unpaid + audit.stock_left,
            after.initial_stock,
            bad(audit.duplicate_users > 0),
            audit.duplicate_users,
            bad(audit.paid_and_closed > 0),
            audit.paid_and_closed,
        );
        states_chart(page, &label, after);
        page.push_str("</td></tr>\n");
    }
    page.push_str("</tbody>\n</table>\n");
}

/// A small SVG of the orders' states over the after-sale phase, one line
/// per state, the second wave's start dashed.
fn states_chart(page: &mut String, label: &str, after: &AfterSale) {
    const W: f64 = 280.0;
    const H: f64 = 110.0;
    const LEFT: f64 = 34.0;
    const RIGHT: f64 = W - 10.0;
    const TOP: f64 = 5.0;
    const BOTTOM: f64 = H - 15.0;
    let last_ms = after.samples.last().map_or(1, |s| s.at_ms.max(1));
    let highest = after
        .samples
        .iter()
        .flat_map(|s| STATE_SERIES.map(|(_, _, _, count)| count(&s.states)))
        .max()
        .unwrap_or(0)
        .max(1);
    let x = |ms: u64| LEFT + ms as f64 / last_ms as f64 * (RIGHT - LEFT);
    let y = |n: i64| BOTTOM - n as f64 / highest as f64 * (BOTTOM - TOP);
    let seconds = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
    let _ = write!(
        page,
        "<svg width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" role=\"img\" \
         aria-label=\"orders of {0} by state over time\"><title>orders of {0} by state over time</title>\
         <line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{BOTTOM}\" y2=\"{BOTTOM}\" stroke=\"#8c959f\"/>\
         <line x1=\"{LEFT}\" x2=\"{RIGHT}\" y1=\"{TOP}\" y2=\"{TOP}\" stroke=\"#d0d7de\"/>\
         <text x=\"{1}\" y=\"{TOP}\" dy=\"3\" font-size=\"9\" text-anchor=\"end\" fill=\"#57606a\">{highest}</text>\
         <text x=\"{1}\" y=\"{BOTTOM}\" dy=\"3\" font-size=\"9\" text-anchor=\"end\" fill=\"#57606a\">0</text>\
         <text x=\"{LEFT}\" y=\"{2}\" font-size=\"9\" fill=\"#57606a\">0 s</text>\
         <text x=\"{RIGHT}\" y=\"{2}\" font-size=\"9\" text-anchor=\"end\" fill=\"#57606a\">{3}</text>",
        Escaped(label),
        LEFT - 3.0,
        H - 3.0,
        seconds(last_ms),
    );
    let wave = x(after.second_wave_at_ms);
    let _ = write!(
        page,
        "<line x1=\"{wave:.1}\" x2=\"{wave:.1}\" y1=\"{TOP}\" y2=\"{BOTTOM}\" stroke=\"#57606a\" \
         stroke-dasharray=\"3 3\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"9\" text-anchor=\"end\" fill=\"#57606a\">\
         second wave {}</text>",
        wave - 3.0,
        TOP + 9.0,
        seconds(after.second_wave_at_ms),
    );
    for (_, _, colour, count) in STATE_SERIES {
        let points: Vec<String> = after
            .samples
            .iter()
            .map(|s| format!("{:.1},{:.1}", x(s.at_ms), y(count(&s.states))))
            .collect();
        let _ = write!(
            page,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            points.join(" "),
        );
    }
    page.push_str("</svg>");
    for (name, class, _, count) in STATE_SERIES {
        let _ = write!(
            page,
            "<span class=\"legend\"><span class=\"swatch {class}\"></span>{name} {} </span>",
            count(&after.end),
        );
    }
}

#[cfg(test)]
mod tests;
