//! The picture rendered from fixed, realistic results (the demo run of docs/demo.md,
//! and the same lock modes on the stream path), read as text, then opened in
//! headless Chromium as a reader opens it: no console message, every run and
//! its verdict on the page, a screenshot taken.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::TimeZone;
use clap::Parser;
use hdrhistogram::Histogram;
use hmdp::store::VoucherAudit;
use hmdp_lock::LockMode;

use super::*;
use crate::loadtest::{Drain, Measured, Plan, Report};
use crate::nodes::demo::DRAIN_DEADLINE;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    demo: DemoSettings,
}

/// `hmdp demo` settings as its command line gives them.
fn settings(args: &[&str]) -> DemoSettings {
    Cli::parse_from(["hmdp"].iter().chain(args)).demo
}

fn occasion() -> Occasion {
    Occasion {
        at: FixedOffset::east_opt(8 * 3600)
            .unwrap()
            .with_ymd_and_hms(2026, 3, 14, 9, 26, 53)
            .unwrap(),
        cores: 2,
    }
}

/// What one run measured, in the figures the demo's table prints.
struct Figures {
    mode: LockMode,
    seckill: SeckillMode,
    duplicates: i64,
    extra: i64,
    rps: f64,
    /// Milliseconds at 0 %, p50, p90, p99 and 100 %.
    latency: [f64; 5],
    node1: u64,
    /// Asynchronous paths: from the last answer until MySQL held every order.
    drain_ms: Option<u64>,
}

/// 1000 users x 4 purchases of a stock of 500, as `hmdp demo` runs them by
/// default: the load test's own report, audited and drained as the demo
/// does it, from a histogram whose percentiles are `figures.latency`.
fn ran(figures: Figures) -> ModeRun {
    let (users, per_user, stock) = (1000, 4, 500);
    let requests = (users * per_user) as u64;
    let plan = Plan {
        target: "http://127.0.0.1:8080".into(),
        voucher: 10,
        tokens: vec!["0123456789abcdef0123456789abcdef".into(); users],
        per_user,
        concurrency: 200,
        addresses: 1,
        progress: indicatif::ProgressBar::hidden(),
    };
    // Duplicates take units of the stock like any order: it still sells out.
    let orders = stock as u64;
    let measured = Measured {
        requests,
        elapsed: Duration::from_secs_f64(requests as f64 / figures.rps),
        latency_us: histogram(requests, figures.latency),
        ordered_latency_us: histogram(orders, figures.latency),
        outcomes: [
            ("OK", orders),
            ("DUPLICATE_REQUEST", 1100),
            ("SOLD_OUT", requests - 1100 - orders),
        ]
        .map(|(outcome, n)| (outcome.to_owned(), n))
        .into(),
        served_by: [
            ("node1".to_owned(), figures.node1),
            ("node2".to_owned(), requests - figures.node1),
        ]
        .into(),
        // The page draws counts; who was told which order is the soak's.
        told: Vec::new(),
        history: Vec::new(),
    };
    let mut report = Report::new(&plan, &measured);
    report.add_audit(
        stock,
        &VoucherAudit {
            active_orders: stock,
            closed_orders: 0,
            paid_and_closed: 0,
            stock_left: 0,
            duplicate_users: figures.duplicates,
            extra_orders: figures.extra,
        },
        false,
    );
    let drain = figures.drain_ms.map(Duration::from_millis);
    if let Some(took) = drain {
        report.add_drain(&Drain::Drained(took), DRAIN_DEADLINE);
    }
    ModeRun {
        mode: figures.mode,
        seckill: figures.seckill,
        shards: 1,
        result: Ok(Run {
            report,
            drain,
            latency: LatencyCurve::of(&measured.latency_us),
            after_sale: None,
            masters: None,
        }),
    }
}

/// `requests` latencies spread so that the histogram's 0 %, p50, p90, p99
/// and 100 % are `ms`, linear in between.
fn histogram(requests: u64, ms: [f64; 5]) -> Histogram<u64> {
    let anchors = [0.0, 0.5, 0.9, 0.99, 1.0].into_iter().zip(ms);
    let anchors: Vec<(f64, f64)> = anchors.collect();
    let mut histogram = Histogram::new_with_bounds(1, 120_000_000, 3).unwrap();
    for i in 0..requests {
        let q = i as f64 / (requests - 1) as f64;
        let segment = anchors.windows(2).find(|w| q <= w[1].0).unwrap();
        let [(q0, ms0), (q1, ms1)] = [segment[0], segment[1]];
        let at = ms0 + (ms1 - ms0) * (q - q0) / (q1 - q0);
        histogram.record((at * 1000.0) as u64).unwrap();
    }
    histogram
}

/// docs/demo.md's run: `none` and `local` let users buy twice, the Redis
/// locks hold.
fn sync_runs() -> Vec<ModeRun> {
    let sync = |mode, duplicates, extra, rps, latency| Figures {
        mode,
        seckill: SeckillMode::Sync,
        duplicates,
        extra,
        rps,
        latency,
        node1: 2000,
        drain_ms: None,
    };
    vec![
        ran(sync(
            LockMode::NoLock,
            127,
            361,
            6028.0,
            [1.2, 10.9, 48.0, 161.5, 240.3],
        )),
        ran(sync(
            LockMode::Local,
            234,
            234,
            6181.0,
            [1.1, 12.5, 41.0, 94.3, 131.0],
        )),
        ran(sync(
            LockMode::RedisLua,
            0,
            0,
            6227.0,
            [0.9, 8.5, 29.0, 61.7, 88.2],
        )),
        ran(sync(
            LockMode::Reentrant,
            0,
            0,
            6120.0,
            [1.0, 10.4, 31.0, 59.3, 97.6],
        )),
    ]
}

/// The same modes on the stream path: admission in Redis holds for all.
fn stream_runs() -> Vec<ModeRun> {
    [
        LockMode::NoLock,
        LockMode::Local,
        LockMode::RedisLua,
        LockMode::Reentrant,
    ]
    .into_iter()
    .zip([388, 412, 405, 431])
    .map(|(mode, drain)| {
        ran(Figures {
            mode,
            seckill: SeckillMode::Stream,
            duplicates: 0,
            extra: 0,
            rps: 9800.0,
            latency: [0.6, 4.1, 11.0, 33.2, 52.0],
            node1: 1998,
            drain_ms: Some(drain),
        })
    })
    .collect()
}

/// The HTML of the row of the run labelled `label`.
fn row_of<'a>(page: &'a str, label: &str) -> &'a str {
    let start = page
        .find(&format!("<tr data-run=\"{}\"", Escaped(label)))
        .unwrap_or_else(|| panic!("no row for {label}:\n{page}"));
    let end = page[start..].find("</tr>").unwrap();
    &page[start..start + end]
}

#[test]
fn every_run_shows_its_verdict_in_words_and_its_figures() {
    let page = render(&settings(&[]), &sync_runs(), None, &occasion());

    for (label, verdict) in [
        ("none", "✗ BROKE"),
        ("local", "✗ BROKE"),
        ("redis-lua", "✓ HELD"),
        ("reentrant", "✓ HELD"),
    ] {
        let row = row_of(&page, label);
        assert!(row.contains(verdict), "{label}: {row}");
        assert!(row.contains("as expected"), "{label}: {row}");
    }
    let none = row_of(&page, "none");
    assert!(none.contains(">127</span>") && none.contains("361 extra orders"));
    assert!(!row_of(&page, "reentrant").contains("extra orders"));
    assert!(none.contains("check-then-insert races even on one node"));
    assert!(
        // The maximum as the histogram keeps it: to three digits.
        none.contains("p50 10.9 · p90 48.0 · p99 161.5 · max 240.4"),
        "{none}"
    );
    assert!(none.contains("node1 2000 (50 %)") && none.contains("node2 2000 (50 %)"));
    assert!(row_of(&page, "reentrant").contains("6120"));
    assert!(
        page.contains("✗ BROKE 2: none, local") && page.contains("✓ HELD 2: redis-lua, reentrant")
    );
    assert!(page.contains("Every run came out as the course predicts"));
    for setting in [
        "<b>1000</b> users × <b>4</b> purchases",
        "stock <b>500</b>",
        "chaos hold <b>20 ms</b>",
        "lock modes <code>none, local, redis-lua, reentrant</code>",
        "purchase paths <code>sync</code>",
        "run 2026-03-14 09:26 +08:00 · machine with 2 cores",
    ] {
        assert!(page.contains(setting), "{setting}");
    }
    assert!(
        !page.contains("drain ms"),
        "no drain column without an async path"
    );
}

#[test]
fn the_paths_group_their_runs_and_add_the_drain() {
    let runs: Vec<ModeRun> = sync_runs().into_iter().chain(stream_runs()).collect();
    let page = render(
        &settings(&["--seckill", "sync,stream"]),
        &runs,
        None,
        &occasion(),
    );

    let sync = page.find("<code>sync</code> — the per-user lock").unwrap();
    let stream = page
        .find("<code>stream</code> — admitted in Redis")
        .unwrap();
    assert!(sync < stream);
    assert!(page.find("data-run=\"none + stream\"").unwrap() > stream);
    assert!(row_of(&page, "local + stream").contains("<span class=\"num\">412</span>"));
    assert!(row_of(&page, "local + stream").contains("✓ HELD"));
    assert!(row_of(&page, "local").contains("<span class=\"num\">-</span>"));
}

#[test]
fn a_run_that_did_not_go_as_the_course_says_is_called_out() {
    let mut runs = sync_runs();
    // A Redis lock letting a user buy twice: the demo's failure exit.
    runs[2] = ran(Figures {
        mode: LockMode::RedisLua,
        seckill: SeckillMode::Sync,
        duplicates: 3,
        extra: 3,
        rps: 6000.0,
        latency: [1.0, 9.0, 30.0, 60.0, 90.0],
        node1: 2000,
        drain_ms: None,
    });
    let page = render(&settings(&[]), &runs, None, &occasion());

    assert!(page.contains("Not as the course predicts: redis-lua"));
    let row = row_of(&page, "redis-lua");
    assert!(
        row.contains("✗ BROKE") && row.contains("NOT as expected"),
        "{row}"
    );
    assert!(row.contains("the lock did not hold"), "{row}");
}

#[test]
fn every_string_from_outside_is_escaped() {
    let mut runs = sync_runs();
    runs.push(ModeRun {
        mode: LockMode::Redlock,
        seckill: SeckillMode::Sync,
        shards: 1,
        result: Err("<img src=x onerror=alert(1)> & \"quoted\" 'too'".into()),
    });
    let page = render(&settings(&[]), &runs, None, &occasion());

    let row = row_of(&page, "redlock");
    assert!(row.contains("– DID NOT RUN"), "{row}");
    assert!(
        row.contains("&lt;img src=x onerror=alert(1)&gt; &amp; &quot;quoted&quot; &#39;too&#39;"),
        "{row}"
    );
    assert!(page.contains("– DID NOT RUN 1: redlock"));
    assert!(!page.contains("<img"));
}

#[test]
fn the_page_holds_everything_it_shows_and_fetches_nothing() {
    let runs: Vec<ModeRun> = sync_runs().into_iter().chain(stream_runs()).collect();
    let page = render(
        &settings(&["--seckill", "sync,stream"]),
        &runs,
        None,
        &occasion(),
    );

    // No script, no URL, nothing to load; the policy makes the browser
    // refuse (and report on the console) any load that slips in.
    assert!(page.contains("content=\"default-src 'none'; style-src 'unsafe-inline'\""));
    for needle in ["<script", "<img", "://", "src=", "href=", "url(", "@import"] {
        assert!(!page.contains(needle), "the page holds {needle:?}");
    }
}

#[test]
fn the_log_scale_spans_every_run_in_round_steps() {
    let runs = sync_runs();
    let curves = runs.iter().map(|run| &run.result.as_ref().unwrap().latency);
    let scale = LogScale::over(curves);

    // 0.9 ms to 240.3 ms, widened to 1-2-5 steps.
    assert_eq!(scale, LogScale { lo: 0.5, hi: 500.0 });
    assert_eq!(scale.fraction(0.5), 0.0);
    assert_eq!(scale.fraction(500.0), 1.0);
    assert!((scale.fraction(15.811) - 0.5).abs() < 1e-3);
    let ticks: Vec<String> = scale.ticks().iter().map(|t| t.to_string()).collect();
    assert_eq!(ticks, ["1", "10", "100"]);
    let narrow = LogScale { lo: 2.0, hi: 20.0 };
    let ticks: Vec<String> = narrow.ticks().iter().map(|t| t.to_string()).collect();
    assert_eq!(ticks, ["2", "5", "10", "20"]);
}

#[test]
fn the_page_opens_in_chromium_without_a_console_message_and_shows_every_run() {
    let runs: Vec<ModeRun> = sync_runs().into_iter().chain(stream_runs()).collect();
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("demo-report.html");
    std::fs::write(
        &page,
        render(
            &settings(&["--seckill", "sync,stream"]),
            &runs,
            None,
            &occasion(),
        ),
    )
    .unwrap();

    let opened = open_in_chromium(&page, dir.path());

    assert_eq!(opened.console, Vec::<String>::new(), "console messages");
    for run in &runs {
        let row = row_of(&opened.dom, &run.label());
        let verdict = Verdict::of(run).text();
        assert!(row.contains(verdict), "{}: {row}", run.label());
    }
    let png = std::fs::metadata(&opened.screenshot).expect("a screenshot");
    assert!(png.len() > 10_000, "a screenshot of {} bytes", png.len());
}

#[test]
fn the_console_check_sees_what_a_broken_page_logs() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("broken.html");
    // The three ways a page shows it broke: a load the policy refused, an
    // error logged, an error thrown.
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" \
         content=\"default-src 'none'; script-src 'unsafe-inline'\"></head>\
         <body><p>broken</p><img src=\"elsewhere.png\">\
         <script>console.error(\"boom\"); undefinedFunction();</script></body></html>",
    )
    .unwrap();

    let opened = open_in_chromium(&page, dir.path());

    let console = opened.console.join("\n");
    assert_eq!(opened.console.len(), 3, "{console}");
    for expected in [
        "violates the following Content Security Policy",
        "\"boom\"",
        "Uncaught ReferenceError: undefinedFunction is not defined",
    ] {
        assert!(console.contains(expected), "{expected}: {console}");
    }
}

/// Debian's Chromium, which scripts/services.sh installs.
const CHROMIUM: &str = "/usr/bin/chromium";

/// What Chromium made of a page.
struct Opened {
    /// The DOM once the page loaded.
    dom: String,
    /// Every console message, uncaught errors included.
    console: Vec<String>,
    screenshot: PathBuf,
}

/// Opens `page` in headless Chromium at 1280 x 2000, screenshot taken into
/// `dir`. Chromium logs each console message on stderr, whatever its level,
/// as `[...:INFO:CONSOLE:7] "message", source: file:///... (7)` (older
/// releases: `INFO:CONSOLE(7)`); a page without a script logs none unless
/// the browser complains about the page itself — a load its policy refused,
/// a file missing — so every such line counts.
fn open_in_chromium(page: &Path, dir: &Path) -> Opened {
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: run scripts/services.sh, which installs Debian's chromium"
    );
    let screenshot = dir.join(format!(
        "{}.png",
        page.file_stem().unwrap().to_string_lossy()
    ));
    let (dom_path, log_path) = (dir.join("dom.html"), dir.join("chromium.log"));
    let mut chromium = Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,2000",
        ])
        // A profile of its own: tests running at once would share one.
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--screenshot={}", screenshot.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdout(File::create(&dom_path).unwrap())
        .stderr(File::create(&log_path).unwrap())
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = chromium.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            chromium.kill().unwrap();
            panic!("chromium still running after 60 s on {}", page.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(&log_path).unwrap();
    assert!(status.success(), "chromium: {status}\n{log}");
    Opened {
        dom: std::fs::read_to_string(&dom_path).unwrap(),
        console: log
            .lines()
            .filter(|line| line.contains(":CONSOLE"))
            .map(str::to_owned)
            .collect(),
        screenshot,
    }
}

#[test]
fn the_crowd_shows_each_class_and_its_share_of_the_units() {
    let class = |buyers, requests, refused_429, units_won| crate::loadtest::crowd::ClassReport {
        buyers,
        requests,
        refused_429,
        refused_503: 0,
        units_won,
        most_won_by_one: 1,
        p50_ms: 40.0,
        p99_ms: 280.0,
        outcomes: Default::default(),
    };
    let crowd = CrowdReport {
        voucher: 7,
        stock: 500,
        spread_ms: 1000,
        bot_addresses: 4,
        humans: class(2000, 3544, 0, 456),
        bots: class(200, 23038, 22961, 44),
        humans_share_of_units: 91.2,
        humans_share_of_buyers: 90.9,
        humans_429_on_first_purchase: 0,
    };
    let page = render(&settings(&[]), &sync_runs(), Some(&crowd), &occasion());
    assert!(
        page.contains("The crowd, with the request limits on"),
        "{page}"
    );
    let row = |marker: &str| {
        let start = page
            .find(marker)
            .unwrap_or_else(|| panic!("no {marker}:\n{page}"));
        let end = page[start..].find("</tr>").unwrap();
        page[start..start + end].to_owned()
    };
    let humans = row("data-crowd=\"honest buyers\"");
    assert!(
        humans.contains("91.2 % of the units · 90.9 % of the buyers"),
        "{humans}"
    );
    let bots = row("data-crowd=\"bots\"");
    assert!(bots.contains(">22961<"), "{bots}");
    assert!(
        bots.contains("8.8 % of the units · 9.1 % of the buyers"),
        "{bots}"
    );
}
