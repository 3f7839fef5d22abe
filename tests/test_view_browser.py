"""`atomix view` in a real browser: headless Chromium (Debian's `chromium` and
`chromium-driver`, which .ci/run installs) driven by Selenium, over a real tau_retail run made
here and a tau_retail_llm run recorded with the bundled Gemma 3 270M (tests/fixtures/).

Each test opens a page, acts on it as a reader would (filters, clicks through to a failed
trial and to the side-by-side view, hovers a plot) and checks what the page then says. Every
page is saved as a screenshot under the test's tmp dir (`pytest --basetemp DIR` keeps them
somewhere known). Skipped, saying why, when Chromium, its driver or Selenium is missing.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli import app

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.select import Select  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "view_llm_run"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or DRIVER is None,
    reason="headless Chromium not found: apt-get install chromium chromium-driver (.ci/run does)",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results directory with a real tau_retail run and the recorded LLM run."""
    out = tmp_path_factory.mktemp("results")
    res = CliRunner().invoke(app, [
        "run", str(ROOT / "configs" / "tau_retail.yaml"), "--trials", "12", "--jobs", "1",
        "--quiet", "--out", str(out),
    ])
    assert res.exit_code == 0, res.output
    shutil.copytree(FIXTURE, out / "tau_retail_llm" / "20260101-000000")
    return out


@pytest.fixture(scope="module")
def server(results: Path) -> Iterator[str]:
    import uvicorn

    from harness.view.app import create_app

    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(results), host="127.0.0.1", port=port,
                                        log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started, "the view server did not start"
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000", "--hide-scrollbars"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(str(DRIVER)), options=options)
    except WebDriverException as exc:
        pytest.skip(f"headless Chromium did not start: {exc.msg}")
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def shot(driver: Any, tmp_path: Path, name: str) -> Path:
    """A screenshot of the whole page (up to 3,000 px tall) under the test's tmp dir."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, max(800, min(int(height) + 40, 3000)))
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    assert path.stat().st_size > 10_000, f"{path}: the screenshot is blank"
    return path


def wait(driver: Any, timeout: float = 20) -> Any:
    return WebDriverWait(driver, timeout)


def test_runs_page_lists_and_filters(browser: Any, server: str, tmp_path: Path) -> None:
    browser.get(server + "/")
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.run-row")
    assert len(rows) == 2
    text = browser.find_element(By.ID, "runs").text
    assert "tau_retail_llm" in text and "288" in text  # the llm run and the 288-trial run
    assert "trials=12" in text  # the override the run was made with
    shot(browser, tmp_path, "runs")
    box = browser.find_element(By.ID, "run-filter")
    box.send_keys("tau_retail_llm")
    wait(browser).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.run-row")) == 1)
    assert "tau_retail_llm" in browser.find_element(By.ID, "runs").text
    assert "q=tau_retail_llm" in browser.current_url  # the filter is in the URL (htmx pushes it)
    shot(browser, tmp_path, "runs-filtered")


def _open_run(browser: Any, server: str, config: str) -> None:
    browser.get(server + "/")
    link = next(a for a in browser.find_elements(By.CSS_SELECTOR, "a.run-link")
                if a.text.strip() == config)
    link.click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "run-head")))


def test_run_page_tables_verdicts_and_interactive_plot(browser: Any, server: str, tmp_path: Path) -> None:
    _open_run(browser, server, "tau_retail")
    verdicts = browser.find_element(By.ID, "verdicts").text
    assert "tx-full" in verdicts and "no evidence" in verdicts
    table = browser.find_element(By.ID, "table-clean").text
    assert "Clean task success" in table and "saga" in table and "fp=0.3" in table
    assert "[" in table  # the intervals
    plot = browser.find_element(By.ID, "plot-clean")
    wait(browser).until(lambda d: plot.get_attribute("data-drawn") == "yes")
    bars = plot.find_elements(By.CSS_SELECTOR, "g.point path")
    assert len(bars) >= 8  # a bar per mode and cell (empty bars have no path)
    ActionChains(browser).move_to_element(bars[-1]).perform()
    hover = wait(browser).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#plot-clean g.hovertext"))
    assert "N = 12" in hover[0].text and "CI" in hover[0].text
    shot(browser, tmp_path, "run")


def test_trials_filter_failed_trial_and_side_by_side(browser: Any, server: str, tmp_path: Path) -> None:
    _open_run(browser, server, "tau_retail")
    browser.find_element(By.ID, "failed-trials").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "trial-count")))
    assert "outcome=not+clean" in browser.current_url
    total = int(browser.find_element(By.CSS_SELECTOR, "#trial-count b").text.replace(",", ""))
    assert 0 < total < 288
    # Narrow it in the page (htmx swaps the table): committed trials that missed the goal.
    old = browser.find_element(By.ID, "trials")
    Select(browser.find_element(By.ID, "f-outcome")).select_by_visible_text("goal missed")
    wait(browser).until(EC.staleness_of(old))  # htmx swapped the table in place
    assert "outcome=goal%20missed" in browser.current_url
    missed = int(browser.find_element(By.CSS_SELECTOR, "#trial-count b").text)
    assert 0 < missed <= total
    rows = browser.find_elements(By.CSS_SELECTOR, "table.trials tbody tr")
    assert rows and all("goal missed" in r.text for r in rows)
    old = browser.find_element(By.ID, "trials")
    Select(browser.find_element(By.ID, "f-fault")).select_by_value("any")
    wait(browser).until(EC.staleness_of(old))
    assert "fault=any" in browser.current_url
    rows = browser.find_elements(By.CSS_SELECTOR, "table.trials tbody tr")
    assert rows and all("F" in r.find_elements(By.TAG_NAME, "td")[6].text for r in rows)
    shot(browser, tmp_path, "trials")
    browser.find_elements(By.CSS_SELECTOR, "a.trial-link")[0].click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "timeline")))
    title = browser.find_element(By.ID, "trial-title").text
    timeline = browser.find_element(By.ID, "timeline").text
    assert "replayed from the run config" in timeline
    assert "injected F" in timeline  # the fault, placed on its call
    assert "agent reacts" in timeline or "✗" in timeline
    diff = browser.find_element(By.ID, "goal-diff").text
    assert "retail." in diff  # where the final DB differs from the gold one
    assert "replay DIFFERS" not in browser.page_source
    shot(browser, tmp_path, "trial")
    links = browser.find_elements(By.CSS_SELECTOR, "a.compare-link")
    assert len(links) == 7  # the seven other modes on the same trial
    # Prefer a partner whose steps differ (one of them did not miss the goal).
    target = next((a for a in links if "✗" not in a.text), links[0])
    other = target.text.replace("✗", "").strip()
    target.click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "divergence")))
    head = browser.find_element(By.CSS_SELECTOR, "table.side thead").text
    assert title.split(" · ")[0] in head and other in head
    divergence = browser.find_element(By.ID, "divergence").text
    if "part at step" in divergence:
        marked = browser.find_elements(By.CSS_SELECTOR, "tr.first-divergence")
        assert len(marked) == 1
    else:
        assert "step for step the same" in divergence
    assert browser.find_elements(By.CSS_SELECTOR, "table.side tbody tr")
    shot(browser, tmp_path, "side-by-side")


def test_llm_trial_shows_conversation(browser: Any, server: str, tmp_path: Path) -> None:
    _open_run(browser, server, "tau_retail_llm")
    assert "tau_retail_llm" in browser.find_element(By.ID, "run-head").text
    shot(browser, tmp_path, "llm-run")
    browser.find_element(By.ID, "failed-trials").click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "trial-count")))
    links = browser.find_elements(By.CSS_SELECTOR, "a.trial-link")
    assert links, "the recorded LLM run has no failed trial to open"
    links[0].click()
    wait(browser).until(EC.presence_of_element_located((By.ID, "conversation")))
    conversation = browser.find_element(By.ID, "conversation").text
    assert "conversation 1" in conversation
    timeline = browser.find_element(By.ID, "timeline").text
    assert "from the stored record" in timeline
    shot(browser, tmp_path, "llm-trial")


def test_unknown_trial_is_a_clear_404(browser: Any, server: str) -> None:
    browser.get(server + "/trial?run=tau_retail_llm/20260101-000000&key=nope")
    assert "no trial 'nope'" in browser.find_element(By.ID, "error").text
