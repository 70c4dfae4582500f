//! The settings file and `--print-config`: a flag wins over the
//! environment, which wins over the file, which wins over the default;
//! secrets are masked; a key that is no setting is refused.

use std::process::Command;

use crate::helpers::{spawn_app, NodeProcess, NODE_BINARY};

fn settings_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

#[test]
fn print_config_shows_each_setting_with_its_source_and_masks_secrets() {
    let file = settings_file(
        "lock = \"redis-lua\"\nseckill = \"queue\"\nbackend-timeout-ms = 1500\nfencing = true\n\
         database-url = \"mysql://root:secret@db:3306/hmdp\"\n",
    );
    let output = Command::new(NODE_BINARY)
        .args(["--print-config", "--config"])
        .arg(file.path())
        .args(["--lock", "local", "--admin-token", "a-secret-admin-token"])
        .env("HMDP_SECKILL", "stream")
        .env_remove("HMDP_LOCK")
        .env_remove("HMDP_BACKEND_TIMEOUT_MS")
        .env_remove("HMDP_FENCING")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{printed}");
    for line in [
        "lock = \"local\"  # flag",
        "seckill = \"stream\"  # environment",
        "backend-timeout-ms = 1500  # file",
        "fencing = true  # file",
        "database-url = \"mysql://root:***@db:3306/hmdp\"  # file",
        "admin-token = \"***\"  # flag",
        "sync-batch-max = 128  # default",
        "sync-batch-linger-ms = 1  # default",
    ] {
        assert!(
            printed.lines().any(|printed| printed == line),
            "no `{line}` in:\n{printed}"
        );
    }
    assert!(!printed.contains("secret"), "{printed}");
}

/// `--print-config` of a node with the settings `args` and no
/// environment of its own, and the file `config` if given.
fn print_config(config: Option<&std::path::Path>, args: &[&str]) -> String {
    let mut command = Command::new(NODE_BINARY);
    command.arg("--print-config").args(args);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("HMDP_") || name == "DATABASE_URL" {
            command.env_remove(name);
        }
    }
    let output = command.output().unwrap();
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{printed}");
    printed
}

/// The settings without their sources: `key = value` lines.
fn settings(printed: &str) -> Vec<&str> {
    (printed.lines())
        .filter(|line| !line.starts_with('#'))
        .map(|line| line.split("  # ").next().unwrap())
        .collect()
}

#[test]
fn the_print_out_is_a_settings_file_that_gives_the_same_settings() {
    let printed = print_config(
        None,
        &[
            "--lock=redis-lua",
            "--fencing",
            "--backend-timeout-ms=1500",
            "--redis-prefix=007",
            "--node-id=a \"quoted\" name",
        ],
    );
    let table: toml::Table = printed.parse().unwrap_or_else(|error| {
        panic!("the print-out is no TOML ({error}):\n{printed}");
    });
    assert_eq!(table["backend-timeout-ms"], toml::Value::Integer(1500));
    assert_eq!(table["fencing"], toml::Value::Boolean(true));
    assert_eq!(table["redis-prefix"], toml::Value::String("007".into()));
    assert_eq!(table["lock"], toml::Value::String("redis-lua".into()));
    let file = settings_file(&printed);
    let read_back = print_config(Some(file.path()), &[]);
    assert_eq!(settings(&read_back), settings(&printed), "{read_back}");
}

#[test]
fn a_key_that_is_no_setting_is_refused() {
    let file = settings_file("lokc = \"local\"\n");
    let output = Command::new(NODE_BINARY)
        .args(["serve", "--config"])
        .arg(file.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("`lokc` is not a setting of `serve`"),
        "{said}"
    );
}

#[tokio::test]
async fn a_node_runs_with_the_files_settings() {
    let app = spawn_app(|_| {}).await;
    let file = settings_file("node-id = \"named-in-the-file\"\n");
    let config = format!("--config={}", file.path().display());
    let node = NodeProcess::start(&app, &[&config]).await;
    let response = reqwest::get(format!("{}/health", node.address))
        .await
        .unwrap();
    assert_eq!(response.headers()["x-served-by"], "named-in-the-file");
}
