//! A real headless Chromium driven through chromedriver (WebDriver), for the console suite:
//! started on a free loopback port with its own profile, flags that keep it off the network,
//! and a screenshot of the page saved whenever a step fails.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use fantoccini::{Client, ClientBuilder, Locator};

/// Where the suite's screenshots go: `$CARGO_TARGET_DIR/console-screenshots` (or the
/// system's temporary directory).
pub fn screenshot_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join("console-screenshots")
}

/// chromedriver with one Chromium session; both stop when dropped.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    /// Where this test's screenshots go.
    pub shots: PathBuf,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session (`test` names the screenshot
    /// directory). Fails with a clear message when Chromium or chromedriver is missing.
    pub async fn start(test: &str) -> anyhow::Result<Self> {
        for program in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            if !Path::new(program).exists() {
                bail!(
                    "{program} is missing: install the chromium and chromium-driver packages (tests/run does)"
                );
            }
        }
        let port = crate::free_port()?;
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so Chromium (its child) goes with it.
            .process_group(0)
            .spawn()
            .context("starting chromedriver")?;
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if started.elapsed() > Duration::from_secs(20) {
                bail!("chromedriver did not listen on {port} within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir()?;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        // The service's certificate is signed by its own CA, which this profile does not know.
        capabilities.insert("acceptInsecureCerts".into(), true.into());
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .context("opening a Chromium session through chromedriver")?;
        let shots = screenshot_dir().join(test);
        std::fs::create_dir_all(&shots)?;
        Ok(Browser {
            client,
            driver,
            _profile: profile,
            shots,
        })
    }

    /// Saves the page as `NAME.png` in this test's screenshot directory.
    pub async fn screenshot(&self, name: &str) -> anyhow::Result<PathBuf> {
        let png = self.client.screenshot().await?;
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }

    /// Runs one step; when it fails, saves a screenshot named after it and says where.
    pub async fn step<T>(
        &self,
        name: &str,
        step: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        match step.await {
            Ok(value) => Ok(value),
            Err(err) => {
                let shot = match self.screenshot(&format!("failed-{name}")).await {
                    Ok(path) => format!("screenshot: {}", path.display()),
                    Err(shot_err) => format!("no screenshot: {shot_err:#}"),
                };
                Err(err.context(format!("console step {name:?} failed ({shot})")))
            }
        }
    }

    /// Waits (at most `within`) until the element at `css` has text containing `text`.
    pub async fn wait_for_text(
        &self,
        css: &str,
        text: &str,
        within: Duration,
    ) -> anyhow::Result<Duration> {
        self.wait_for(css, &format!("text {text:?}"), within, |shown| {
            shown.contains(text)
        })
        .await
    }

    /// Waits (at most `within`) until the text of the element at `css` satisfies `wanted`
    /// (`what` says what it waits for). The element is looked up again on every try: live
    /// regions replace their elements, so one found a moment ago may be gone.
    pub async fn wait_for(
        &self,
        css: &str,
        what: &str,
        within: Duration,
        wanted: impl Fn(&str) -> bool,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut last = String::new();
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await
                && let Ok(shown) = element.text().await
            {
                if wanted(&shown) {
                    return Ok(started.elapsed());
                }
                last = shown;
            }
            if started.elapsed() > within {
                bail!("{css:?} did not show {what} within {within:?} (it showed {last:?})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Types `text` into the field at `css` (cleared first). Live regions replace their
    /// elements, so a field replaced between finding and typing is found again (a few tries).
    pub async fn fill(&self, css: &str, text: &str) -> anyhow::Result<()> {
        self.retrying(css, |element| async move {
            element.clear().await?;
            element.send_keys(text).await
        })
        .await
    }

    /// Clicks the element at `css`, finding it again if a live update replaced it.
    pub async fn click(&self, css: &str) -> anyhow::Result<()> {
        self.retrying(css, |element| async move { element.click().await })
            .await
    }

    async fn retrying<F, Fut>(&self, css: &str, act: F) -> anyhow::Result<()>
    where
        F: Fn(fantoccini::elements::Element) -> Fut,
        Fut: std::future::Future<Output = Result<(), fantoccini::error::CmdError>>,
    {
        let mut tries = 0;
        loop {
            let element = self.client.find(Locator::Css(css)).await?;
            match act(element).await {
                Ok(()) => return Ok(()),
                Err(fantoccini::error::CmdError::Standard(err))
                    if err.error == fantoccini::error::ErrorStatus::StaleElementReference
                        && tries < 10 =>
                {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// The text of the element at `css`, read again if a live update replaced it meanwhile.
    pub async fn text(&self, css: &str) -> anyhow::Result<String> {
        let mut tries = 0;
        loop {
            let element = self.client.find(Locator::Css(css)).await?;
            match element.text().await {
                Ok(text) => return Ok(text),
                Err(_) if tries < 10 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(err) => return Err(err.into()),
            }
        }
    }

    /// The page's whole HTML.
    pub async fn html(&self) -> anyhow::Result<String> {
        Ok(self.client.source().await?)
    }
}

impl Browser {
    /// Ends the WebDriver session (Chromium exits), then chromedriver.
    pub async fn close(self) -> anyhow::Result<()> {
        self.client.clone().close().await?;
        Ok(())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: chromedriver and any Chromium it left.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.wait();
    }
}
