//! The top-level `nginx.conf`, read as a template: its upstream servers and
//! listen port are parsed (the compose test checks them against the app
//! services) and replaced with local ports for a private nginx run.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use hmdp_test_support::{free_ports, moving_if_taken, ChildProcess, Stdout};
use tokio::process::Command;

/// The repository's `nginx.conf`, built in so the demo runs from any directory
/// with exactly the configuration docker-compose mounts.
pub const TEMPLATE: &str = include_str!("../../../../nginx.conf");

/// Where nginx is looked for when it is not on `PATH` (Debian installs it in
/// sbin, which a non-root `PATH` often lacks).
const SBIN_NGINX: &str = "/usr/sbin/nginx";

/// The nginx executable: `nginx` on `PATH`, else `/usr/sbin/nginx`.
pub fn find() -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nginx"))
            .find(|candidate| candidate.is_file())
    });
    match on_path {
        Some(path) => Ok(path),
        None if Path::new(SBIN_NGINX).is_file() => Ok(SBIN_NGINX.into()),
        None => bail!(
            "nginx not found (neither on PATH nor at {SBIN_NGINX}): run scripts/services.sh to install it"
        ),
    }
}

/// A `server host:port ...;` line of the `upstream` block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    pub host: String,
    pub port: u16,
}

/// The directives of a line without its comment, trimmed.
fn code(line: &str) -> &str {
    line.split('#').next().unwrap_or("").trim()
}

/// Visits the config's lines, telling which are upstream `server` lines.
fn upstream_lines(conf: &str) -> impl Iterator<Item = (bool, &str)> {
    let mut in_upstream = false;
    conf.lines().map(move |line| {
        let directive = code(line);
        if directive.starts_with("upstream ") && directive.ends_with('{') {
            in_upstream = true;
        } else if in_upstream && directive == "}" {
            in_upstream = false;
        }
        (in_upstream && directive.starts_with("server "), line)
    })
}

fn parse_address(server_line: &str) -> anyhow::Result<UpstreamServer> {
    let address = code(server_line)
        .split_whitespace()
        .nth(1)
        .map(|token| token.trim_end_matches(';'))
        .context("an upstream `server` line without an address")?;
    let (host, port) = address
        .rsplit_once(':')
        .with_context(|| format!("upstream server `{address}` has no port"))?;
    Ok(UpstreamServer {
        host: host.to_owned(),
        port: port
            .parse()
            .with_context(|| format!("upstream server `{address}` has a bad port"))?,
    })
}

/// The servers of the config's `upstream` block, in order.
pub fn upstream_servers(conf: &str) -> anyhow::Result<Vec<UpstreamServer>> {
    upstream_lines(conf)
        .filter(|(is_server, _)| *is_server)
        .map(|(_, line)| parse_address(line))
        .collect()
}

/// The port of the config's one `listen` directive.
pub fn listen_port(conf: &str) -> anyhow::Result<u16> {
    let listens: Vec<&str> = conf
        .lines()
        .map(code)
        .filter(|directive| directive.starts_with("listen "))
        .collect();
    let [listen] = listens.as_slice() else {
        bail!("expected one `listen` directive, found {}", listens.len());
    };
    let value = listen["listen ".len()..].trim_end_matches(';').trim();
    let port = value.rsplit(':').next().unwrap_or(value);
    port.parse()
        .with_context(|| format!("`listen {value}` is not a port"))
}

/// The config with nginx listening on `127.0.0.1:{listen}` and the upstream
/// servers, in order, at `127.0.0.1:{node_ports[i]}`; every other line and
/// every server parameter (`max_fails`, ...) is kept.
pub fn render(conf: &str, listen: u16, node_ports: &[u16]) -> anyhow::Result<String> {
    let servers = upstream_servers(conf)?.len();
    if servers != node_ports.len() {
        bail!(
            "nginx.conf's upstream has {servers} servers, but {} nodes run",
            node_ports.len()
        );
    }
    listen_port(conf)?;
    let mut ports = node_ports.iter();
    let mut out = String::with_capacity(conf.len());
    for (is_server, line) in upstream_lines(conf) {
        let directive = code(line);
        let indent = &line[..line.len() - line.trim_start().len()];
        if is_server {
            let port = ports.next().expect("counted above");
            let rest: Vec<&str> = directive.split_whitespace().skip(2).collect();
            let params = rest.join(" ");
            let params = params.trim_end_matches(';').trim();
            let params = if params.is_empty() {
                String::new()
            } else {
                format!(" {params}")
            };
            out.push_str(&format!("{indent}server 127.0.0.1:{port}{params};\n"));
        } else if directive.starts_with("listen ") {
            out.push_str(&format!("{indent}listen 127.0.0.1:{listen};\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// nginx rendered from [`TEMPLATE`] in front of the nodes on `node_ports`,
/// its prefix (config, pid, temp files, log) in `prefix`, listening on a port
/// found free — another should that one be taken before nginx bound it;
/// returns once it answers, with its port.
pub async fn start(
    nginx: &Path,
    prefix: &Path,
    node_ports: &[u16],
) -> anyhow::Result<(ChildProcess, u16)> {
    let conf_file = prefix.join("nginx.conf");
    let log = prefix.join("nginx.log");
    let [port] = free_ports().context("no free local port")?;
    moving_if_taken(&log, port, async |port| {
        let conf = render(TEMPLATE, port, node_ports)?;
        std::fs::write(&conf_file, conf).context("writing nginx.conf")?;
        let mut process = spawn(nginx, prefix, &conf_file, &log)?;
        let health = format!("http://127.0.0.1:{port}/nginx-health");
        process
            .wait_until_answers(&health, Duration::from_secs(10))
            .await?;
        Ok((process, port))
    })
    .await
}

/// Starts nginx on `conf_file` with `prefix` as its private prefix: in the
/// foreground (`daemon off`) so it is our child, and as one process
/// (`master_process off`) so killing that child leaves no orphaned worker
/// holding the port. Its error log goes to `log`; its access log (stdout) is
/// discarded, where it costs nothing.
fn spawn(
    nginx: &Path,
    prefix: &Path,
    conf_file: &Path,
    log: &Path,
) -> anyhow::Result<ChildProcess> {
    let mut command = Command::new(nginx);
    command
        .arg("-p")
        .arg(prefix)
        .arg("-c")
        .arg(conf_file)
        .args(["-e", "stderr", "-g", "daemon off; master_process off;"]);
    ChildProcess::spawn("nginx", command, log, Stdout::Discard)
}

#[cfg(test)]
mod tests {
    use hmdp_test_support::port_was_taken;

    use super::*;

    /// What [`start`] retries on: nginx on a port another process holds
    /// exits, and its log says why; one that started says nothing of it.
    #[tokio::test]
    async fn nginx_on_a_taken_port_says_so_in_its_log() {
        let nginx = find().expect("nginx (scripts/services.sh installs it)");
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let taken = holder.local_addr().unwrap().port();
        let prefix = tempfile::tempdir().unwrap();
        let [node1, node2] = free_ports().unwrap();
        let conf_file = prefix.path().join("nginx.conf");
        let log = prefix.path().join("nginx.log");
        std::fs::write(
            &conf_file,
            render(TEMPLATE, taken, &[node1, node2]).unwrap(),
        )
        .unwrap();

        let mut process = spawn(&nginx, prefix.path(), &conf_file, &log).unwrap();
        let health = format!("http://127.0.0.1:{taken}/nginx-health");
        let refused = process
            .wait_until_answers(&health, Duration::from_secs(30))
            .await;

        assert!(refused.is_err(), "nginx answered on a taken port");
        assert!(
            port_was_taken(&log),
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        let (_nginx, port) = start(&nginx, prefix.path(), &[node1, node2]).await.unwrap();
        assert_ne!(port, taken);
        assert!(
            !port_was_taken(&log),
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
    }

    #[test]
    fn the_template_names_the_two_app_services() {
        let servers = upstream_servers(TEMPLATE).unwrap();
        let names: Vec<_> = servers.iter().map(|s| (s.host.as_str(), s.port)).collect();
        assert_eq!(names, [("app1", 8081), ("app2", 8082)]);
        assert_eq!(listen_port(TEMPLATE).unwrap(), 8080);
    }

    #[test]
    fn rendering_replaces_addresses_and_keeps_parameters() {
        let rendered = render(TEMPLATE, 18080, &[18081, 18082]).unwrap();
        assert!(rendered.contains("listen 127.0.0.1:18080;"), "{rendered}");
        let servers = upstream_servers(&rendered).unwrap();
        assert_eq!(
            servers,
            [
                UpstreamServer {
                    host: "127.0.0.1".into(),
                    port: 18081
                },
                UpstreamServer {
                    host: "127.0.0.1".into(),
                    port: 18082
                }
            ]
        );
        assert!(rendered.contains("server 127.0.0.1:18081 max_fails=1 fail_timeout=5s;"));
        assert!(!rendered.contains("app1"));
        assert_eq!(rendered.lines().count(), TEMPLATE.lines().count());
    }

    #[test]
    fn rendering_refuses_a_node_count_the_upstream_does_not_have() {
        assert!(render(TEMPLATE, 18080, &[18081]).is_err());
    }

    #[test]
    fn a_post_is_never_passed_to_the_next_node() {
        let directives: Vec<&str> = TEMPLATE.lines().map(code).collect();
        assert!(directives.contains(&"proxy_next_upstream error timeout;"));
        assert!(!directives.iter().any(|d| d.contains("non_idempotent")));
    }
}
