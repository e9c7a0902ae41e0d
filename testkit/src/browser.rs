//! Headless Chromium for the console's browser tests: the distribution's `chromedriver` on a free
//! port (a child process, killed with its owner), and a WebDriver session on it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use fantoccini::ClientBuilder;
pub use fantoccini::{Client, Locator};

use crate::proc;
use crate::relay::RelayProcess;

const INSTALL: &str =
    "install Debian's packages `chromium chromium-driver` (`scripts/install-deps` installs every \
     tool the tests need)";

/// A Chromium session through its own chromedriver.
pub struct Browser {
    pub client: Client,
    /// Killed when the browser is dropped.
    _driver: RelayProcess,
}

fn find(names: &[&str]) -> Option<PathBuf> {
    names.iter().find_map(proc::which).or_else(|| {
        names
            .iter()
            .map(|n| PathBuf::from("/usr/bin").join(n))
            .find(|p| proc::is_executable(p))
    })
}

impl Browser {
    /// Starts chromedriver and a headless Chromium (1280x1000); panics, saying what to install,
    /// when either is missing.
    pub async fn start() -> Browser {
        let driver_bin =
            find(&["chromedriver"]).unwrap_or_else(|| panic!("chromedriver is missing: {INSTALL}"));
        let chromium = find(&["chromium", "chromium-browser"])
            .unwrap_or_else(|| panic!("chromium is missing: {INSTALL}"));
        let port = proc::free_port();
        let mut cmd = Command::new(&driver_bin);
        cmd.arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let driver = RelayProcess::spawn("chromedriver", cmd, None).expect("spawn chromedriver");
        crate::wait_until(
            "chromedriver listening",
            Duration::from_secs(20),
            || async { proc::port_accepts(port) },
        )
        .await;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,1000", "--hide-scrollbars", "--no-first-run",
                    "--disable-extensions", "--lang=en-US"
                ]
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = tokio::time::timeout(
            Duration::from_secs(60),
            ClientBuilder::new(connector)
                .capabilities(caps)
                .connect(&format!("http://127.0.0.1:{port}")),
        )
        .await
        .expect("a Chromium session within 60 s")
        .unwrap_or_else(|e| panic!("starting headless Chromium failed ({e}); {INSTALL}"));
        Browser {
            client,
            _driver: driver,
        }
    }

    /// Ends the session (closing Chromium); chromedriver goes with the value.
    pub async fn close(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
    }
}

impl Drop for Browser {
    /// A test that panicked never closed its session: Chromium (chromedriver's child) goes first,
    /// so that it does not outlive the test; chromedriver follows with its handle.
    fn drop(&mut self) {
        for pid in proc::children_of(self._driver.pid()) {
            let _ = proc::send_signal(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}
