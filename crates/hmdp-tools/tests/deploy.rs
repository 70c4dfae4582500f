//! The Docker deployment, checked without a Docker engine: docker-compose.yml
//! parses, has the services, health checks and start order a working deployment
//! needs, and nginx.conf's upstreams are exactly the app services. Beside it,
//! the Kubernetes manifests against the API's schemas, the alert rules with
//! promtool, and the Grafana dashboard: its queries parse and read only
//! metrics the nodes export or the rules record.

use std::collections::BTreeSet;

use hmdp_tools::nodes::nginx;
use serde_yaml::Value;

const APP_SERVICES: [&str; 2] = ["app1", "app2"];

fn compose() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docker-compose.yml"
    ))
    .expect("docker-compose.yml exists");
    let mut compose: Value = serde_yaml::from_str(&text).expect("docker-compose.yml parses");
    // Compose applies `<<` merge keys; so must we before reading the services.
    compose.apply_merge().expect("merge keys resolve");
    compose
}

fn service<'a>(compose: &'a Value, name: &str) -> &'a Value {
    compose["services"]
        .get(name)
        .unwrap_or_else(|| panic!("service {name} is missing"))
}

fn str_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("expected a scalar, got {other:?}"),
    }
}

fn env(service: &Value, key: &str) -> String {
    str_of(
        service["environment"]
            .get(key)
            .unwrap_or_else(|| panic!("{key} not set")),
    )
}

fn ports(service: &Value) -> Vec<String> {
    service["ports"]
        .as_sequence()
        .map(|ports| ports.iter().map(str_of).collect())
        .unwrap_or_default()
}

fn healthy_dependencies(service: &Value) -> BTreeSet<String> {
    let Some(depends_on) = service["depends_on"].as_mapping() else {
        return BTreeSet::new();
    };
    depends_on
        .iter()
        .map(|(name, condition)| {
            assert_eq!(
                condition["condition"], "service_healthy",
                "{name:?} must be waited for until healthy"
            );
            str_of(name)
        })
        .collect()
}

#[test]
fn compose_has_the_five_services_with_health_checks() {
    let compose = compose();
    let names: BTreeSet<String> = compose["services"]
        .as_mapping()
        .expect("services")
        .keys()
        .map(str_of)
        .collect();
    let expected: BTreeSet<String> = ["mysql", "redis", "app1", "app2", "nginx"]
        .map(String::from)
        .into();
    assert_eq!(names, expected);
    for name in &names {
        let test = &service(&compose, name)["healthcheck"]["test"];
        assert!(test.as_sequence().is_some(), "{name} has no health check");
    }
    assert!(str_of(&service(&compose, "mysql")["image"]).starts_with("mysql:8"));
    // sqlx is built without TLS and RSA, so caching_sha2_password cannot log in.
    let mysql_command = format!("{:?}", service(&compose, "mysql")["command"]);
    assert!(
        mysql_command.contains("mysql_native_password"),
        "{mysql_command}"
    );
    assert!(str_of(&service(&compose, "redis")["image"]).starts_with("redis:7"));
}

#[test]
fn app_nodes_listen_on_all_interfaces_after_mysql_and_redis_are_healthy() {
    let compose = compose();
    for name in APP_SERVICES {
        let app = service(&compose, name);
        assert_eq!(env(app, "HMDP_HOST"), "0.0.0.0", "{name}");
        assert_eq!(env(app, "HMDP_NODE_ID"), name);
        assert!(env(app, "DATABASE_URL").contains("@mysql:3306/"), "{name}");
        assert!(
            env(app, "REDIS_URL").starts_with("redis://redis:6379"),
            "{name}"
        );
        assert!(
            app.get("build").is_some(),
            "{name} is built from the Dockerfile"
        );
        assert!(
            env(app, "HMDP_ADMIN_TOKEN").starts_with("${HMDP_ADMIN_TOKEN:?"),
            "{name}: compose must refuse to start without an admin token, not default one"
        );
        let dependencies = healthy_dependencies(app);
        assert!(dependencies.contains("mysql") && dependencies.contains("redis"));
        let health = format!("{:?}", app["healthcheck"]["test"]);
        assert!(
            health.contains(&format!(":{}/ready", env(app, "HMDP_PORT"))),
            "{name}'s health check asks its own /ready: {health}"
        );
    }
}

#[test]
fn nginx_publishes_8080_mounts_nginx_conf_and_waits_for_both_nodes() {
    let compose = compose();
    let proxy = service(&compose, "nginx");
    let listen = nginx::listen_port(nginx::TEMPLATE).unwrap();
    assert_eq!(ports(proxy), [format!("8080:{listen}")]);
    let volumes: Vec<String> = proxy["volumes"]
        .as_sequence()
        .expect("volumes")
        .iter()
        .map(str_of)
        .collect();
    assert!(
        volumes.contains(&"./nginx.conf:/etc/nginx/nginx.conf:ro".to_owned()),
        "{volumes:?}"
    );
    let expected: BTreeSet<String> = APP_SERVICES.map(String::from).into();
    assert_eq!(healthy_dependencies(proxy), expected);
}

#[test]
fn nginx_upstreams_are_the_app_services_on_their_ports() {
    let compose = compose();
    let upstreams: BTreeSet<(String, u16)> = nginx::upstream_servers(nginx::TEMPLATE)
        .unwrap()
        .into_iter()
        .map(|server| (server.host, server.port))
        .collect();
    let apps: BTreeSet<(String, u16)> = APP_SERVICES
        .iter()
        .map(|name| {
            let port = env(service(&compose, name), "HMDP_PORT").parse().unwrap();
            (name.to_string(), port)
        })
        .collect();
    assert_eq!(upstreams, apps);
}

#[test]
fn the_dockerfile_is_multi_stage_and_runs_the_products_node_binary() {
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Dockerfile"))
            .expect("Dockerfile exists");
    let stages = dockerfile
        .lines()
        .filter(|line| line.starts_with("FROM "))
        .count();
    assert_eq!(stages, 2, "a build stage and a slim runtime stage");
    assert!(dockerfile.contains("COPY --from=build"));
    assert!(dockerfile.contains("HMDP_HOST=0.0.0.0"));
    assert!(dockerfile.contains(r#"CMD ["serve"]"#));
    // The node's own binary, from the product's package: no tools, no test kit.
    assert!(dockerfile.contains("cargo build --release --locked -p hmdp --bin hmdp-server"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["hmdp-server"]"#));
}

/// Runs `promtool` (Debian's prometheus package, installed by
/// scripts/services.sh) with `args` in deploy/prometheus; its output.
fn promtool(args: &[&str]) -> String {
    let output = std::process::Command::new("promtool")
        .args(args)
        .current_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/prometheus"
        ))
        .output()
        .expect("promtool runs (scripts/services.sh installs it)");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{printed}");
    printed
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let checked = promtool(&["check", "rules", "alerts.yml"]);
    assert!(checked.contains("SUCCESS: 13 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_has_a_runbook_entry() {
    let runbook = read_repo_file("docs/operations.md");
    let alerts: Vec<String> = rules()
        .into_iter()
        .filter_map(|(_, alert, _)| alert)
        .collect();
    assert_eq!(alerts.len(), 11, "{alerts:?}");
    for alert in alerts {
        assert!(
            runbook.contains(&format!("- **{alert}** —")),
            "{alert} has no entry in docs/operations.md"
        );
    }
}

#[test]
fn the_kubernetes_manifests_validate_against_the_api_schemas() {
    let output = std::process::Command::new("kubernetes-validate")
        .args(["--strict", "hmdp.yaml"])
        .current_dir(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/kubernetes"
        ))
        .output()
        .expect("kubernetes-validate runs (scripts/services.sh installs it)");
    let printed = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{printed}");
    for kind in [
        "deployment/hmdp",
        "service/hmdp",
        "poddisruptionbudget/hmdp",
        "horizontalpodautoscaler/hmdp",
        "secret/hmdp",
        "job/hmdp-migrate",
    ] {
        assert!(
            printed.contains(&format!("passed for resource {kind}")),
            "{kind}: {printed}"
        );
    }
}

fn read_repo_file(path: &str) -> String {
    let full = format!("{}/../../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|error| panic!("{full}: {error}"))
}

/// The metrics a node exports: the name each registration in
/// src/metrics.rs gives, and a histogram's `_bucket`, `_sum` and `_count`.
fn exported_metrics() -> BTreeSet<String> {
    let source = read_repo_file("src/metrics.rs");
    let mut names = BTreeSet::new();
    for (at, call) in source.match_indices("_with_registry(") {
        let mut words = source[..at].rsplit(|c: char| !c.is_alphanumeric() && c != '_');
        let is_histogram = words.next().unwrap().contains("histogram");
        let name = source[at + call.len()..].split('"').nth(1).unwrap();
        if is_histogram {
            names.extend(["_bucket", "_sum", "_count"].map(|suffix| format!("{name}{suffix}")));
        } else {
            names.insert(name.to_owned());
        }
    }
    assert!(names.contains("http_requests_total"), "{names:?}");
    names
}

/// deploy/prometheus/alerts.yml's rules: (record, alert, expr) of each.
fn rules() -> Vec<(Option<String>, Option<String>, String)> {
    let rules: Value =
        serde_yaml::from_str(&read_repo_file("deploy/prometheus/alerts.yml")).unwrap();
    (rules["groups"].as_sequence().unwrap().iter())
        .flat_map(|group| group["rules"].as_sequence().unwrap())
        .map(|rule| {
            let name = |key: &str| rule[key].as_str().map(str::to_owned);
            (name("record"), name("alert"), str_of(&rule["expr"]))
        })
        .collect()
}

/// PromQL's words before a list of labels.
const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// PromQL's words that name no metric and need not be followed by `(`:
/// binary operators, modifiers, and aggregations written `sum by (x) (...)`.
const KEYWORDS: [&str; 17] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
];

/// The metric names a PromQL expression reads: what is left once label
/// matchers, ranges, strings, functions, grouping labels and keywords are
/// set aside.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut bare = String::new();
    let (mut closing, mut in_string) = (None, false);
    for c in expr.chars() {
        match (in_string, closing, c) {
            (true, _, '"') => in_string = false,
            (true, _, _) => {}
            (false, _, '"') => in_string = true,
            (false, Some(end), c) if c == end => closing = None,
            (false, Some(_), _) => {}
            (false, None, '{') => closing = Some('}'),
            (false, None, '[') => closing = Some(']'),
            (false, None, c) => bare.push(c),
        }
    }
    let mut names = BTreeSet::new();
    let mut rest = bare.as_str();
    while let Some(start) = rest.find(|c: char| c.is_ascii_alphanumeric() || "_:.".contains(c)) {
        rest = &rest[start..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || "_:.".contains(c)))
            .unwrap_or(rest.len());
        let word = &rest[..end];
        rest = rest[end..].trim_start();
        if GROUPING.contains(&word) && rest.starts_with('(') {
            rest = &rest[rest.find(')').unwrap() + 1..];
        } else if !(word.starts_with(|c: char| c.is_ascii_digit() || c == '.')
            || rest.starts_with('(')
            || KEYWORDS.contains(&word))
        {
            names.insert(word.to_owned());
        }
    }
    names
}

#[test]
fn promql_names_are_read_off_expressions() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(x_bucket{route="/a/{id}"}[5m])))
        + max without (mode) (z) + count(w) by (le)
        / on (instance) group_left () hmdp:y:ratio > bool 0.5 and up offset 1m"#;
    let expected: BTreeSet<String> = ["x_bucket", "z", "w", "hmdp:y:ratio", "up"]
        .map(String::from)
        .into();
    assert_eq!(metric_names(expr), expected);
}

/// Every panel of deploy/grafana/hmdp.json with a query: (title, exprs).
fn dashboard_panels() -> Vec<(String, Vec<String>)> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read_repo_file("deploy/grafana/hmdp.json"))
            .expect("deploy/grafana/hmdp.json parses");
    assert_eq!(dashboard["uid"], "hmdp");
    let panels = dashboard["panels"].as_array().expect("panels");
    let ids: BTreeSet<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "each panel has an id of its own");
    (panels.iter())
        .filter(|panel| panel["type"] != "row")
        .map(|panel| {
            let title = panel["title"].as_str().expect("a title").to_owned();
            let grid = &panel["gridPos"];
            let right = grid["x"].as_u64().unwrap() + grid["w"].as_u64().unwrap();
            assert!(right <= 24, "{title}: past the grid's 24 columns");
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
            let targets = panel["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{title} queries nothing");
            let exprs = (targets.iter())
                .map(|target| target["expr"].as_str().expect("an expr").to_owned())
                .collect();
            (title, exprs)
        })
        .collect()
}

#[test]
fn the_dashboard_queries_parse_and_read_only_what_the_nodes_and_rules_give() {
    let mut known = exported_metrics();
    let rules = rules();
    known.extend(rules.iter().filter_map(|(record, _, _)| record.clone()));
    // Prometheus' own series for each target: 1 when its scrape answered.
    known.insert("up".to_owned());

    let panels = dashboard_panels();
    let mut checked = Vec::new();
    for (title, exprs) in &panels {
        for expr in exprs {
            for name in metric_names(expr) {
                assert!(known.contains(&name), "{title}: no metric {name} in {expr}");
            }
            // Grafana's interval variable, for promtool to parse.
            let expr = expr.replace("$__rate_interval", "1m");
            let record = format!("panel_{}", checked.len());
            checked.push(serde_json::json!({"record": record, "expr": expr}));
        }
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    let groups = serde_json::json!({"groups": [{"name": "dashboard", "rules": checked}]});
    std::fs::write(file.path(), groups.to_string()).unwrap();
    let path = file.path().to_str().unwrap();
    let parsed = promtool(&["check", "rules", path]);
    assert!(
        parsed.contains(&format!("SUCCESS: {} rules found", checked.len())),
        "{parsed}"
    );

    // Each alert has a panel showing what it watches.
    let shown: BTreeSet<String> = (panels.iter())
        .flat_map(|(_, exprs)| exprs.iter().flat_map(|expr| metric_names(expr)))
        .collect();
    for (_, alert, expr) in rules {
        let Some(alert) = alert else { continue };
        assert!(
            metric_names(&expr).iter().any(|name| shown.contains(name)),
            "{alert}: no panel shows {expr}"
        );
    }
}
