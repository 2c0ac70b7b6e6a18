//! Wire details real clients trip on, against `flotilla up`: the Python `kubernetes` client
//! (from PyPI, into a virtualenv kept outside the clone) watching ConfigMaps with
//! `watch.Watch().stream()` sees ADDED, MODIFIED and DELETED — it sends `watch=True`, which
//! the server must read as Go's `strconv.ParseBool` does; `kubectl get cs` lists the
//! store, scheduler and controller manager with upstream's deprecation warning.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, ensure};
use flotilla_e2e::{Backend, Flotilla, python_venv};

/// The Python client's version the test installs.
const PYTHON_CLIENT: &str = "kubernetes==37.0.3";

const WATCH_SCRIPT: &str = r#"
import json, sys, threading
from kubernetes import client, config, watch

config.load_kube_config(sys.argv[1])
v1 = client.CoreV1Api()
events = []
started = threading.Event()

def follow():
    w = watch.Watch()
    since = v1.list_namespaced_config_map("default").metadata.resource_version
    started.set()
    for event in w.stream(v1.list_namespaced_config_map, "default",
                          resource_version=since, timeout_seconds=30):
        if event["object"].metadata.name != "py-watched":
            continue
        events.append(event["type"])
        if event["type"] == "DELETED":
            w.stop()

follower = threading.Thread(target=follow)
follower.start()
started.wait(30)
v1.create_namespaced_config_map("default", {"metadata": {"name": "py-watched"}, "data": {"a": "1"}})
v1.patch_namespaced_config_map("py-watched", "default", {"data": {"a": "2"}})
v1.delete_namespaced_config_map("py-watched", "default")
follower.join(40)
print(json.dumps(events))
"#;

/// A Python with the client installed: `FLOTILLA_PYTHON_VENV`, or a virtualenv under
/// `/var/cache` made once.
fn python_with_client() -> anyhow::Result<PathBuf> {
    let venv = python_venv(
        "FLOTILLA_PYTHON_VENV",
        "/var/cache/flotilla-python",
        PYTHON_CLIENT,
        |venv| {
            Command::new(venv.join("bin/python"))
                .args(["-c", "import kubernetes"])
                .output()
                .is_ok_and(|out| out.status.success())
        },
    )?;
    Ok(venv.join("bin/python"))
}

#[test]
fn the_python_clients_watch_streams_added_modified_and_deleted() -> anyhow::Result<()> {
    let python = python_with_client()?;
    let f = Flotilla::up(Backend::Embedded)?;
    let out = Command::new(&python)
        .args(["-c", WATCH_SCRIPT])
        .arg(f.data_dir().join("kubeconfig"))
        .output()
        .context("run the Python client")?;
    ensure!(
        out.status.success(),
        "the Python client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = String::from_utf8_lossy(&out.stdout);
    ensure!(
        events.trim() == r#"["ADDED", "MODIFIED", "DELETED"]"#,
        "the Python client's watch saw {events}"
    );
    Ok(())
}

#[test]
fn componentstatuses_report_the_store_the_scheduler_and_the_controller_manager()
-> anyhow::Result<()> {
    let f = Flotilla::up(Backend::Embedded)?;
    let kubectl = f.kubectl();
    let get = || -> anyhow::Result<(Vec<Vec<String>>, std::process::Output)> {
        let out = kubectl.run(&["get", "cs", "--no-headers"], None, &[])?;
        ensure!(
            out.status.success(),
            "kubectl get cs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect();
        Ok((rows, out))
    };
    // The control loops connect within moments of the start.
    flotilla_e2e::until(
        "every component is healthy",
        std::time::Duration::from_secs(30),
        || {
            Ok(get()?
                .0
                .iter()
                .all(|r| r.get(1).map(String::as_str) == Some("Healthy")))
        },
    )?;
    let (rows, out) = get()?;
    let names: Vec<&str> = rows
        .iter()
        .filter_map(|r| r.first().map(String::as_str))
        .collect();
    ensure!(
        names == ["scheduler", "controller-manager", "etcd-0"],
        "components: {names:?}"
    );
    ensure!(
        String::from_utf8_lossy(&out.stderr)
            .contains("Warning: v1 ComponentStatus is deprecated in v1.19+"),
        "no deprecation warning: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
