//! The Docker deployment, checked without a Docker engine: docker-compose.yml
//! parses, has the services, health checks and start order a working cluster
//! needs, and nginx.conf's upstreams are exactly the app services.

use std::collections::BTreeSet;

use hmdp_tools::cluster::nginx;
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
    assert!(checked.contains("SUCCESS: 11 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_has_a_runbook_entry() {
    let rules: Value = serde_yaml::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/prometheus/alerts.yml"
        ))
        .unwrap(),
    )
    .unwrap();
    let runbook = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/operations.md"
    ))
    .unwrap();
    let alerts: Vec<String> = (rules["groups"].as_sequence().unwrap().iter())
        .flat_map(|group| group["rules"].as_sequence().unwrap())
        .filter_map(|rule| rule["alert"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(alerts.len(), 9, "{alerts:?}");
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
