//! `hmdp check` proves that it sees: a real small sale (two `stream` nodes,
//! a storm of purchases, payments and cancels) passes untouched, and each of
//! a dozen corruptions of its history or of MySQL is named by the check it
//! breaks; `hmdp audit` names each it can see from the stores alone and
//! holds on the others. The table of corruptions and what named them is
//! printed (`--nocapture`).

#[path = "../common/mod.rs"]
mod common;
mod corruption;
mod fixture;

use corruption::{lose_before_a_restart, Corruption};
use fixture::Run;

/// The names after `verdict: BROKEN: ` in an output, or `holds`.
fn verdict_of(out: &str) -> String {
    let line = (out.lines())
        .find(|line| line.starts_with("verdict: "))
        .unwrap_or_else(|| panic!("no verdict in {out}"));
    match line.strip_prefix("verdict: BROKEN: ") {
        Some(broken) => broken.to_owned(),
        None => line.trim_start_matches("verdict: ").to_owned(),
    }
}

/// Whether `out` (a check's report) says `check` is broken with a break
/// containing `says`.
fn names(out: &str, check: &str, says: &str) -> bool {
    let mut lines = out.lines().skip_while(|line| {
        let line = line.trim_start();
        !(line.starts_with(check) && line.contains("BROKEN"))
    });
    lines.next().is_some()
        && lines
            .take_while(|line| line.starts_with("    - "))
            .any(|line| line.contains(says))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_names_every_corruption_of_a_real_run_and_passes_it_untouched() {
    let run = Run::record().await;

    let (code, out) = run.check(&[]);
    assert_eq!(code, 0, "the untouched run passes: {out}");
    assert!(out.contains("verdict: every check holds"), "{out}");
    assert!(out.contains("success answers (purchases) 10"), "{out}");
    assert!(out.contains("paid, cancelled (told)      3, 2"), "{out}");
    let (code, out) = run.audit();
    assert_eq!(code, 0, "the untouched run's audit holds: {out}");

    let mut table = vec![(
        "(untouched)".to_owned(),
        "every check holds".to_owned(),
        "every check holds".to_owned(),
    )];
    let mut missed = Vec::new();
    for corruption in Corruption::ALL {
        let mut events = run.events.clone();
        corruption.apply(&run, &mut events).await;
        run.write_history(&events);
        let expected = corruption.expected();
        let (code, check_out) = run.check(corruption.check_args());
        let (audit_code, audit_out) = run.audit();
        let (checked, audited) = (verdict_of(&check_out), verdict_of(&audit_out));
        let seen = code == 1 && names(&check_out, expected.check, expected.says);
        let audit_right = match expected.audit {
            Some(check) => audit_code == 1 && audited.split(", ").any(|name| name == check),
            None => audit_code == 0,
        };
        if !seen || !audit_right {
            missed.push(format!(
                "{}: expected {} ({:?}) and audit {:?}\n{check_out}\n{audit_out}",
                corruption.describe(),
                expected.check,
                expected.says,
                expected.audit
            ));
        }
        let audited = match expected.audit {
            Some(_) => format!("BROKEN: {audited}"),
            None => format!("{audited} (cannot see it)"),
        };
        table.push((corruption.describe().to_owned(), checked, audited));
        run.restore().await;
    }

    // A loss within the writers' lag before a Redis restart is the one
    // the configuration allows: counted, and passing.
    let mut events = run.events.clone();
    lose_before_a_restart(&run, &mut events, 1_000).await;
    run.write_history(&events);
    let (code, out) = run.check(&["--allow-loss=redis-restart"]);
    table.push((
        "(control) a loss 1 s before a Redis restart, allowed".to_owned(),
        verdict_of(&out),
        "-".to_owned(),
    ));
    if code != 0 || !out.contains("lost as allowed (redis-restart  ) 1") {
        missed.push(format!("the allowed loss did not pass:\n{out}"));
    }
    run.restore().await;
    let (code, out) = run.check(&[]);
    assert_eq!(code, 0, "restored, the run passes again: {out}");

    println!("\n| corruption | hmdp check: broken | hmdp audit |");
    println!("|---|---|---|");
    for (corruption, checked, audited) in &table {
        println!("| {corruption} | {checked} | {audited} |");
    }
    assert!(missed.is_empty(), "{}", missed.join("\n\n"));
}
