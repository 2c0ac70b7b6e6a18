//! The web console in a real headless Chromium (chromedriver, WebDriver) against `flotilla up`:
//! sign-in (a bad key, then the right one), live status in the cluster list, the create form
//! (a message beside the field, then a cluster that answers kubectl with the downloaded
//! kubeconfig), pods appearing live, typed-confirmation delete, CSRF and cross-account
//! refusals; node pools on LocalStack (create, nodes appearing, scale, DEGRADED with the AWS
//! reason). Reference screenshots land in `$CARGO_TARGET_DIR/console-screenshots/`.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use fantoccini::Locator;
use flotilla_e2e::browser::Browser;
use flotilla_e2e::{Backend, Flotilla, FlotillaCli, Kubectl};

/// The service's base URL and the account's key, from the client configuration `up` wrote.
fn endpoint_and_key(flotilla: &Flotilla) -> anyhow::Result<(String, String)> {
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        flotilla.data_dir().join("flotilla.json"),
    )?)?;
    Ok((
        config["endpoint"]
            .as_str()
            .context("no endpoint")?
            .trim_end_matches('/')
            .to_string(),
        config["apiKey"].as_str().context("no apiKey")?.to_string(),
    ))
}

async fn fill(browser: &Browser, css: &str, text: &str) -> anyhow::Result<()> {
    browser.fill(css, text).await
}

async fn click(browser: &Browser, css: &str) -> anyhow::Result<()> {
    browser.click(css).await
}

/// Signs in with `key` from the sign-in page.
async fn sign_in(browser: &Browser, base: &str, key: &str) -> anyhow::Result<()> {
    browser.client.goto(&format!("{base}/console/")).await?;
    fill(browser, "#api_key", key).await?;
    click(browser, "form button[type=submit]").await?;
    Ok(())
}

/// `fetch` from the page (its cookie, its origin): the answer's status and text.
async fn page_fetch(
    browser: &Browser,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u64, String)> {
    let answer = browser
        .client
        .execute_async(
            r#"const [method, path, body, done] = arguments;
               fetch(path, {method, body: method === "GET" ? undefined : body, credentials: "same-origin",
                            headers: {"content-type": "application/x-www-form-urlencoded"}})
                 .then(async (r) => done([r.status, await r.text()]))
                 .catch((e) => done([0, String(e)]));"#,
            vec![method.into(), path.into(), body.into()],
        )
        .await?;
    Ok((
        answer[0].as_u64().unwrap_or(0),
        answer[1].as_str().unwrap_or_default().to_string(),
    ))
}

#[test]
fn console_signs_in_creates_watches_and_deletes_clusters() -> anyhow::Result<()> {
    let started = Instant::now();
    let flotilla = Flotilla::up(Backend::Embedded)?;
    let (base, key) = endpoint_and_key(&flotilla)?;
    let cli = FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    };
    let operator = FlotillaCli {
        config: flotilla.data_dir().join("operator.json"),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let browser = Browser::start("signs-in-creates-watches-and-deletes").await?;

        // 1. A bad key: the message beside the field; then the right key: the cluster list.
        browser
            .step("bad key", async {
                sign_in(&browser, &base, "flo_not_a_key").await?;
                browser
                    .wait_for_text("#api_key-error", "That API key is not valid.", Duration::from_secs(10))
                    .await?;
                Ok(())
            })
            .await?;
        browser
            .step("sign in", async {
                sign_in(&browser, &base, &key).await?;
                browser.wait_for_text("#cluster-demo", "ACTIVE", Duration::from_secs(10)).await?;
                let url = browser.client.current_url().await?;
                ensure!(url.path() == "/console/clusters", "signed in at {url}");
                Ok(())
            })
            .await?;

        // Live: a cluster made with the CLI appears and turns ACTIVE without a reload; how long
        // after the API said ACTIVE the page showed it is printed.
        let api_active = std::thread::spawn({
            let config = cli.config.clone();
            move || -> anyhow::Result<Instant> {
                let cli = FlotillaCli { config };
                cli.ok(&["cluster", "create", "live", "--tag", "team=<script>alert(1)</script>"])?;
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let got: serde_json::Value =
                        serde_json::from_str(&cli.ok(&["cluster", "get", "live", "-o", "json"])?)?;
                    if got["status"] == "ACTIVE" {
                        return Ok(Instant::now());
                    }
                    ensure!(Instant::now() < deadline, "live is not ACTIVE: {got}");
                }
            }
        });
        browser
            .step("live status", async {
                browser.wait_for_text("#cluster-live", "ACTIVE", Duration::from_secs(60)).await?;
                let shown = Instant::now();
                let api = api_active.join().map_err(|_| anyhow::anyhow!("the CLI thread panicked"))??;
                eprintln!(
                    "console: a status change reached the open list {} ms after the API reported it",
                    shown.saturating_duration_since(api).as_millis()
                );
                let html = browser.html().await?;
                ensure!(
                    !html.contains("<script>alert(1)") && html.contains("team=&lt;script&gt;alert(1)&lt;/script&gt;"),
                    "a tag is shown as text, never run"
                );
                let shot = browser.screenshot("reference-cluster-list").await?;
                eprintln!("console: reference screenshot {}", shot.display());
                Ok(())
            })
            .await?;

        // 2. The create form: a bad name gets its message beside the field, then a cluster is
        // created, shown CREATING or ACTIVE at once and ACTIVE without a reload.
        browser
            .step("create form", async {
                click(&browser, "a[href='/console/clusters/new']").await?;
                fill(&browser, "#name", "Bad_Name").await?;
                fill(&browser, "#tags", "team=web").await?;
                browser
                    .wait_for_text("#preview", "flotilla cluster create Bad_Name", Duration::from_secs(5))
                    .await?;
                let shot = browser.screenshot("reference-create-form").await?;
                eprintln!("console: reference screenshot {}", shot.display());
                click(&browser, "form.stacked button[type=submit]").await?;
                browser
                    .wait_for_text("#name-error", r#"cluster name "Bad_Name" is invalid"#, Duration::from_secs(10))
                    .await?;
                fill(&browser, "#name", "web").await?;
                // Pod Security defaults chosen in the form show on the cluster's page.
                click(&browser, "#pod_security_enforce option[value=baseline]").await?;
                fill(&browser, "#pod_security_exempt_namespaces", "kube-system").await?;
                click(&browser, "form.stacked button[type=submit]").await?;
                browser.wait_for_text("h1", "Cluster web", Duration::from_secs(10)).await?;
                browser.wait_for_text("#overview", "ACTIVE", Duration::from_secs(60)).await?;
                browser
                    .wait_for_text(
                        "#overview",
                        "enforce baseline:latest; exempt namespaces kube-system",
                        Duration::from_secs(5),
                    )
                    .await?;
                let shot = browser.screenshot("reference-cluster-detail").await?;
                eprintln!("console: reference screenshot {}", shot.display());
                Ok(())
            })
            .await?;

        // The downloaded kubeconfig (through the page's session) answers stock kubectl.
        let kubeconfig = flotilla.data_dir().join("web-console.kubeconfig");
        browser
            .step("kubeconfig", async {
                let (status, text) = page_fetch(&browser, "GET", "/console/clusters/web/kubeconfig?form=certificate", "").await?;
                ensure!(status == 200, "kubeconfig download: {status} {text}");
                std::fs::write(&kubeconfig, text)?;
                let namespaces = Kubectl::new(&kubeconfig).ok(&["get", "namespaces", "-o", "name"])?;
                ensure!(namespaces.contains("namespace/default"), "kubectl: {namespaces}");
                Ok(())
            })
            .await?;

        // 4. A Deployment made with kubectl: its pods appear on the workloads page live.
        browser
            .step("pods live", async {
                click(&browser, "a[href='/console/clusters/web/workloads']").await?;
                browser.wait_for_text("h2", "Nodes", Duration::from_secs(10)).await?;
                Kubectl::new(&kubeconfig).ok(&["create", "deployment", "hello", "--image=busybox", "--replicas=2"])?;
                browser.wait_for_text("#pods", "hello-", Duration::from_secs(30)).await?;
                browser.wait_for_text("#deployments", "hello", Duration::from_secs(30)).await?;
                browser.wait_for_text("#events", "Deployment/hello", Duration::from_secs(30)).await?;
                Ok(())
            })
            .await?;

        // The metrics panel: the cluster's request rate drawn from its own counters.
        browser
            .step("metrics", async {
                click(&browser, "a[href='/console/clusters/web/metrics']").await?;
                browser.wait_for_text("#metrics-panel", "measuring", Duration::from_secs(10)).await?;
                Kubectl::new(&kubeconfig).ok(&["get", "pods", "-A"])?;
                browser.wait_for_text("#metrics-panel figure", " /s", Duration::from_secs(15)).await?;
                ensure!(
                    browser.client.find(Locator::Css("#metrics-panel polyline")).await.is_ok(),
                    "a chart is drawn"
                );
                let shot = browser.screenshot("reference-metrics").await?;
                eprintln!("console: reference screenshot {}", shot.display());
                Ok(())
            })
            .await?;

        // 6. CSRF: a form post without the token is refused.
        browser
            .step("csrf", async {
                let (status, text) = page_fetch(&browser, "POST", "/console/clusters", "name=forged").await?;
                ensure!(status == 403 && text.contains("CSRF token is missing or wrong"), "a post without the token: {status}");
                let listed = cli.ok(&["cluster", "list"])?;
                ensure!(!listed.contains("forged"), "nothing was made: {listed}");
                Ok(())
            })
            .await?;

        // 6. Another account's cluster: not in the list, and its page says only that there
        // is no such cluster (nothing of it in the HTML).
        let other_key = {
            let issued: serde_json::Value = serde_json::from_str(&operator.ok(&["account", "create", "other", "-o", "json"])?)?;
            issued["apiKey"].as_str().context("no key")?.to_string()
        };
        let mut other_config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cli.config)?)?;
        other_config["apiKey"] = other_key.into();
        let other_path = flotilla.data_dir().join("other.json");
        std::fs::write(&other_path, other_config.to_string())?;
        let other = FlotillaCli { config: other_path };
        let secret: serde_json::Value = serde_json::from_str(&other.ok(&["cluster", "create", "secret-b", "--wait", "-o", "json"])?)?;
        let secret_id = secret["id"].as_str().context("no id")?.to_string();
        browser
            .step("other account", async {
                browser.client.goto(&format!("{base}/console/clusters/secret-b")).await?;
                let html = browser.html().await?;
                ensure!(html.contains("no cluster named"), "another account's cluster is not found");
                ensure!(!html.contains(&secret_id), "nothing of it leaks into the page");
                browser.client.goto(&format!("{base}/console/clusters")).await?;
                let html = browser.html().await?;
                ensure!(!html.contains("secret-b"), "nor into the list");
                Ok(())
            })
            .await?;

        // 5. Delete through the typed confirmation: the button waits for the name.
        browser
            .step("typed delete", async {
                browser.client.goto(&format!("{base}/console/clusters/web")).await?;
                let button = browser.client.find(Locator::Css("button.danger")).await?;
                ensure!(button.attr("disabled").await?.is_some(), "disabled until the name is typed");
                fill(&browser, "#confirm", "we").await?;
                ensure!(button.attr("disabled").await?.is_some(), "still disabled for a wrong name");
                fill(&browser, "#confirm", "web").await?;
                ensure!(button.attr("disabled").await?.is_none(), "enabled for the name");
                button.click().await?;
                browser.wait_for_text("h1", "Clusters", Duration::from_secs(10)).await?;
                let deadline = Instant::now() + Duration::from_secs(60);
                while cli.ok(&["cluster", "list"])?.contains("web ") {
                    ensure!(Instant::now() < deadline, "web was not deleted");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                // The open list drops it without a reload.
                let deadline = Instant::now() + Duration::from_secs(10);
                while browser.client.find(Locator::Css("#cluster-web")).await.is_ok() {
                    ensure!(Instant::now() < deadline, "the list still shows web");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(())
            })
            .await?;

        // Sign out: the console asks for a key again.
        browser
            .step("sign out", async {
                click(&browser, "header form button[type=submit]").await?;
                browser.wait_for_text("h1", "Sign in", Duration::from_secs(10)).await?;
                browser.client.goto(&format!("{base}/console/clusters")).await?;
                browser.wait_for_text("h1", "Sign in", Duration::from_secs(10)).await?;
                Ok(())
            })
            .await?;
        browser.close().await
    })?;
    eprintln!(
        "console: suite took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Step 3 of the issue: node pools on a LocalStack-backed cluster; one created through the form, its nodes
/// appearing (the harness's hypervisor boots simulated nodes for the instances), scaled
/// through its row's form, and a pool of an instance type EC2 does not have shown DEGRADED
/// with EC2's reason — each without a reload.
#[test]
fn console_manages_node_pools_on_localstack() -> anyhow::Result<()> {
    use crate::nodepools::{create_cluster, register_node_image};
    let started = Instant::now();
    let aws = flotilla_e2e::LocalStack::start()?;
    let flotilla = Flotilla::up(Backend::Embedded)?;
    let _hypervisor = flotilla_e2e::hypervisor::Hypervisor::start(aws.port)?;
    let (base, key) = endpoint_and_key(&flotilla)?;
    let cli = FlotillaCli {
        config: flotilla.data_dir().join("flotilla.json"),
    };
    register_node_image(&aws, "flotilla-node-1.33", Some("1.33"))?;
    create_cluster(&cli, &aws, flotilla.data_dir())?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let browser = Browser::start("manages-node-pools").await?;
        sign_in(&browser, &base, &key).await?;
        browser
            .wait_for_text("header.top", "Sign out", Duration::from_secs(10))
            .await?;
        browser
            .step("create pool", async {
                browser
                    .client
                    .goto(&format!("{base}/console/clusters/prod/nodepools"))
                    .await?;
                fill(&browser, "#pool_name", "workers").await?;
                fill(&browser, "#instance_types", "t3.medium").await?;
                fill(&browser, "#min", "1").await?;
                fill(&browser, "#desired", "2").await?;
                fill(&browser, "#max", "3").await?;
                click(&browser, "form.stacked button[type=submit]").await?;
                let took = browser
                    .wait_for_text("#pool-workers", "2 / 2", Duration::from_secs(120))
                    .await?;
                eprintln!(
                    "console: pool created → 2 / 2 ready shown after {:.1} s",
                    took.as_secs_f64()
                );
                browser
                    .wait_for_text("#pool-workers", "ACTIVE", Duration::from_secs(60))
                    .await?;
                Ok(())
            })
            .await?;
        browser
            .step("nodes appear", async {
                click(&browser, "a[href='/console/clusters/prod/workloads']").await?;
                browser
                    .wait_for(
                        "#nodes",
                        "two Ready nodes",
                        Duration::from_secs(30),
                        |nodes| nodes.matches("True").count() >= 2,
                    )
                    .await?;
                Ok(())
            })
            .await?;
        browser
            .step("scale", async {
                click(&browser, "a[href='/console/clusters/prod/nodepools']").await?;
                fill(&browser, "#pool-workers input[name=desired]", "3").await?;
                click(&browser, "#pool-workers form.actions button").await?;
                browser
                    .wait_for_text("#pool-workers", "3 / 3", Duration::from_secs(120))
                    .await?;
                Ok(())
            })
            .await?;
        browser
            .step("degraded", async {
                fill(&browser, "#pool_name", "bad").await?;
                fill(&browser, "#instance_types", "m9.huge").await?;
                fill(&browser, "#desired", "1").await?;
                click(&browser, "form.stacked button[type=submit]").await?;
                browser
                    .wait_for_text("#pool-bad", "DEGRADED", Duration::from_secs(60))
                    .await?;
                browser
                    .wait_for_text(
                        "#pool-bad",
                        "Ec2InstanceTypeDoesNotExist",
                        Duration::from_secs(10),
                    )
                    .await?;
                let shot = browser.screenshot("reference-node-pools").await?;
                eprintln!("console: reference screenshot {}", shot.display());
                Ok(())
            })
            .await?;
        browser.close().await
    })?;
    eprintln!(
        "console: node pool suite took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The operator's pages: signed in with the operator token, an account is created (its key
/// shown once), given another key, then its keys rotated (the earlier two stop working); the
/// account signs in with the rotated one and is refused the accounts page; the connection
/// banner comes and goes with the service; a narrow window needs no sideways scrolling; the
/// operator deletes the account after a confirmation.
#[test]
fn console_operator_manages_accounts() -> anyhow::Result<()> {
    let mut flotilla = Flotilla::up(Backend::Embedded)?;
    let (base, _) = endpoint_and_key(&flotilla)?;
    let operator: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        flotilla.data_dir().join("operator.json"),
    )?)?;
    let operator_key = operator["apiKey"]
        .as_str()
        .context("no operator key")?
        .to_string();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let browser = Browser::start("operator-manages-accounts").await?;
        let first_key = browser
            .step("create account", async {
                sign_in(&browser, &base, &operator_key).await?;
                browser
                    .wait_for_text("header.top", "Operator", Duration::from_secs(10))
                    .await?;
                browser
                    .wait_for_text("h1", "Accounts", Duration::from_secs(10))
                    .await?;
                fill(&browser, "#id", "Team_X").await?;
                click(&browser, "form.stacked button[type=submit]").await?;
                browser
                    .wait_for_text("#id-error", "is invalid", Duration::from_secs(10))
                    .await?;
                fill(&browser, "#id", "team-x").await?;
                click(&browser, "form.stacked button[type=submit]").await?;
                browser
                    .wait_for_text("#new-api-key", "flo_", Duration::from_secs(10))
                    .await?;
                browser.text("#new-api-key").await
            })
            .await?;
        let second_key = browser
            .step("new key", async {
                click(&browser, "#account-team-x button.secondary").await?;
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    // The page is being replaced by the answer: not there yet is not an error.
                    let shown = browser.text("#new-api-key").await.unwrap_or_default();
                    if shown != first_key && shown.starts_with("flo_") {
                        return Ok(shown);
                    }
                    ensure!(Instant::now() < deadline, "no new key shown");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await?;
        let rotated_key = browser
            .step("rotate keys", async {
                click(&browser, "#account-team-x button.rotate").await?;
                let question = browser.client.get_alert_text().await?;
                ensure!(
                    question.contains("Rotate team-x's keys?"),
                    "asked: {question}"
                );
                browser.client.accept_alert().await?;
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    // The page is being replaced by the answer: not there yet is not an error.
                    let shown = browser.text("#new-api-key").await.unwrap_or_default();
                    if shown != second_key && shown.starts_with("flo_") {
                        return Ok(shown);
                    }
                    ensure!(Instant::now() < deadline, "no rotated key shown");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await?;
        browser
            .step("account signs in", async {
                click(&browser, "header form button[type=submit]").await?;
                browser
                    .wait_for_text("h1", "Sign in", Duration::from_secs(10))
                    .await?;
                // The keys issued before the rotation no longer work.
                for old in [&first_key, &second_key] {
                    sign_in(&browser, &base, old).await?;
                    browser
                        .wait_for_text(
                            "#api_key-error",
                            "That API key is not valid.",
                            Duration::from_secs(10),
                        )
                        .await?;
                }
                sign_in(&browser, &base, &rotated_key).await?;
                browser
                    .wait_for_text("header.top", "team-x", Duration::from_secs(10))
                    .await?;
                browser
                    .wait_for_text("#clusters", "No clusters yet.", Duration::from_secs(10))
                    .await?;
                browser
                    .client
                    .goto(&format!("{base}/console/accounts"))
                    .await?;
                browser
                    .wait_for_text(
                        "main",
                        "Only the operator manages accounts.",
                        Duration::from_secs(10),
                    )
                    .await?;
                Ok(())
            })
            .await?;
        // The service goes away under an open live page: a banner says so; it comes back
        // (same port, same store): the banner goes and the session still holds.
        browser
            .step("lost connection", async {
                browser
                    .client
                    .goto(&format!("{base}/console/clusters"))
                    .await?;
                browser
                    .wait_for_text("#clusters", "No clusters yet.", Duration::from_secs(10))
                    .await?;
                let banner_shown = || async {
                    let hidden = browser
                        .client
                        .execute(
                            "return document.getElementById('connection-banner').hidden;",
                            vec![],
                        )
                        .await?;
                    anyhow::Ok(hidden == false)
                };
                tokio::time::sleep(Duration::from_millis(500)).await;
                ensure!(!banner_shown().await?, "no banner while connected");
                flotilla.stop(true, Duration::from_secs(1));
                let deadline = Instant::now() + Duration::from_secs(15);
                while !banner_shown().await? {
                    ensure!(
                        Instant::now() < deadline,
                        "no banner after the service went away"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                flotilla.restart(false)?;
                let deadline = Instant::now() + Duration::from_secs(30);
                while banner_shown().await? {
                    ensure!(
                        Instant::now() < deadline,
                        "the banner stayed after the service came back"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                browser
                    .client
                    .goto(&format!("{base}/console/clusters"))
                    .await?;
                browser
                    .wait_for_text("header.top", "team-x", Duration::from_secs(10))
                    .await?;
                Ok(())
            })
            .await?;
        browser
            .step("narrow window", async {
                browser.client.set_window_size(420, 800).await?;
                browser
                    .client
                    .goto(&format!("{base}/console/clusters"))
                    .await?;
                let overflow = browser
                    .client
                    .execute(
                        "return document.documentElement.scrollWidth - window.innerWidth;",
                        vec![],
                    )
                    .await?;
                ensure!(
                    overflow.as_i64().unwrap_or(1) <= 0,
                    "the page scrolls sideways by {overflow} px"
                );
                browser.screenshot("reference-narrow-cluster-list").await?;
                browser.client.set_window_size(1280, 900).await?;
                Ok(())
            })
            .await?;
        browser
            .step("delete account", async {
                click(&browser, "header form button[type=submit]").await?;
                browser
                    .wait_for_text("h1", "Sign in", Duration::from_secs(10))
                    .await?;
                sign_in(&browser, &base, &operator_key).await?;
                browser
                    .wait_for_text("#accounts", "team-x", Duration::from_secs(10))
                    .await?;
                click(&browser, "#account-team-x button.danger").await?;
                let question = browser.client.get_alert_text().await?;
                ensure!(
                    question.contains("Delete account team-x?"),
                    "asked: {question}"
                );
                browser.client.accept_alert().await?;
                let deadline = Instant::now() + Duration::from_secs(10);
                while browser
                    .client
                    .find(Locator::Css("#account-team-x"))
                    .await
                    .is_ok()
                {
                    ensure!(Instant::now() < deadline, "team-x is still listed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(())
            })
            .await?;
        browser.close().await
    })
}
