//! `peerlink report` of the committed two-GPU run (`benchmarks/h200-x2/`), loaded in a real headless
//! browser, Debian's chromium: no console error, every expected chart's `<svg>` present with a
//! size, and a screenshot in which each chart's area is drawn (enough pixels that are not the
//! white background).
//!
//! The report has no script; the test loads a copy with one added (a harness) that records errors
//! and the charts' boxes into the page, which `--dump-dom` then prints. Chromium is installed by
//! `.ci/run`; under CI (`CI=true`) a missing chromium fails the test, elsewhere it is skipped with
//! a line saying how to install it. `PEERLINK_BLESS=1` keeps the screenshot as
//! `benchmarks/h200-x2/report.png`.

mod common;

use common::{peerlink, succeeds};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const RUN: &str = "benchmarks/h200-x2";

/// The documents of the run, as the issue names them: topology, bench, sweep, explain, the
/// engine, compare against the simulator, and the workloads (peerlink's; the torch-*.json beside
/// them are PyTorch's).
const DOCUMENTS: &[&str] = &[
    "topo.json",
    "bench.json",
    "sweep.json",
    "explain-8B.json",
    "explain-64KiB.json",
    "explain-256MiB.json",
    "engine-256MiB.json",
    "engine-1GiB.json",
    "engine-batch.json",
    "engine-sweep.json",
    "engine-sweep-profile.json",
    "compare-sim.json",
    "compare-sim-separate-run.json",
    "workload/workload-all-reduce-bf16.json",
    "workload/workload-all-reduce-f32.json",
    "workload/workload-all-reduce-f32-to-4MiB.json",
    "workload/workload-halo.json",
    "workload/workload-pipeline.json",
    "workload/workload-send-recv.json",
];

/// Every chart the report of [`DOCUMENTS`] must hold, in order: `d<N>` is the N-th document.
const CHARTS: &[&str] = &[
    "d1-topology-graph",
    "d1-topology-matrix",
    "d2-ce-write",
    "d2-ce-read",
    "d2-ce-bidir-write",
    "d2-h2d",
    "d2-d2h",
    "d2-local",
    "d2-copy-latency",
    "d2-issue-cost",
    "d2-e2e-latency",
    "d2-pointer-chase",
    "d2-pointer-chase-resident",
    "d2-ping-pong",
    "d3-ce-write-sweep-gpu0-gpu1",
    "d3-ce-write-sweep-gpu1-gpu0",
    "d3-ce-read-sweep-gpu0-gpu1",
    "d3-ce-read-sweep-gpu1-gpu0",
    "d3-sm-write-sweep-gpu0-gpu1",
    "d3-sm-write-sweep-gpu1-gpu0",
    "d3-sm-read-sweep-gpu0-gpu1",
    "d3-sm-read-sweep-gpu1-gpu0",
    "d3-staged-sweep-gpu0-gpu1",
    "d3-staged-sweep-gpu1-gpu0",
    "d4-waterfall",
    "d4-setup",
    "d4-ce-write-sweep-gpu0-gpu1",
    "d5-waterfall",
    "d5-setup",
    "d5-ce-write-sweep-gpu0-gpu1",
    "d6-waterfall",
    "d6-setup",
    "d6-ce-write-sweep-gpu0-gpu1",
    "d7-plan",
    "d8-plan",
    "d9-batch-predicted",
    "d9-batch-measured",
    "d10-engine-sweep",
    "d11-engine-sweep",
    "d12-compare-gb-s",
    "d12-compare-us",
    "d12-compare-ns",
    "d13-compare-gb-s",
    "d13-compare-us",
    "d13-compare-ns",
    "d14-all-reduce-bf16-issued-by-graphs-peerlink-against-nccl",
    "d14-all-reduce-bf16-issued-by-stream-peerlink-against-nccl",
    "d15-all-reduce-f32-issued-by-graphs-peerlink-against-nccl",
    "d15-all-reduce-f32-issued-by-stream-peerlink-against-nccl",
    "d16-all-reduce-f32-issued-by-graphs-peerlink-against-nccl",
    "d16-all-reduce-f32-issued-by-stream-peerlink-against-nccl",
    "d17-halo-1-d-issued-by-graphs-peerlink-against-nccl",
    "d17-halo-1-d-issued-by-stream-peerlink-against-nccl",
    "d17-halo-2-d-issued-by-graphs-peerlink-against-nccl",
    "d17-halo-2-d-issued-by-stream-peerlink-against-nccl",
    "d18-pipeline-issued-by-stream-peerlink-against-nccl",
    "d19-send-recv-both-issued-by-graphs-peerlink-against-nccl",
    "d19-send-recv-both-issued-by-stream-peerlink-against-nccl",
    "d19-send-recv-one-way-issued-by-graphs-peerlink-against-nccl",
    "d19-send-recv-one-way-issued-by-stream-peerlink-against-nccl",
];

/// The page width the report is laid out and photographed at.
const WIDTH: u32 = 1600;

/// Records load errors, script errors and policy violations, and on load writes them and every
/// chart's box (page coordinates) into the page as JSON.
const HARNESS: &str = r#"<script>
window.peerlinkErrors = [];
window.addEventListener('error', e => peerlinkErrors.push('error: ' + (e.message
    || 'a resource failed: ' + (e.target && (e.target.src || e.target.href)))), true);
document.addEventListener('securitypolicyviolation',
    e => peerlinkErrors.push('policy: ' + e.violatedDirective + ' ' + e.blockedURI));
window.addEventListener('load', () => {
  const charts = [...document.querySelectorAll('svg[data-chart]')].map(svg => {
    const r = svg.getBoundingClientRect();
    return {id: svg.dataset.chart, x: r.left + scrollX, y: r.top + scrollY, w: r.width, h: r.height};
  });
  const out = document.createElement('pre');
  out.id = 'peerlink-results';
  out.textContent = JSON.stringify({errors: peerlinkErrors, charts,
      height: document.documentElement.scrollHeight});
  document.body.appendChild(out);
});
</script>"#;

/// Debian's chromium (or `PEERLINK_CHROMIUM`), if installed.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PEERLINK_CHROMIUM") {
        return Some(path.into());
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// Runs headless chromium on `page` with `args`, at most two minutes: stdout and stderr.
fn browse(
    browser: &Path,
    profile: &Path,
    page: &Path,
    height: u32,
    args: &[&str],
) -> (String, String) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(browser)
        .args([
            "--headless",
            // CI runs as root, where chromium's sandbox cannot start.
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--virtual-time-budget=5000",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={WIDTH},{height}"))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The JSON the harness wrote into the page.
fn results(dom: &str) -> Value {
    let start = dom
        .find("<pre id=\"peerlink-results\">")
        .expect("the harness wrote its results: the page loaded")
        + "<pre id=\"peerlink-results\">".len();
    let end = start + dom[start..].find("</pre>").unwrap();
    let text = dom[start..end]
        .replace("&quot;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&");
    serde_json::from_str(&text).unwrap()
}

/// Console messages chromium logged (a policy violation, a failed load, a script error).
fn console_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(":CONSOLE")).collect()
}

/// Pixels of `image` in the box that are not the white background, and the box's size.
fn drawn_pixels(image: &(u32, u32, Vec<u8>, usize), chart: &Value) -> (usize, usize) {
    let (width, height, pixels, channels) = image;
    let at = |key: &str| chart[key].as_f64().unwrap().round() as u32;
    let (x0, y0) = (at("x"), at("y"));
    let (x1, y1) = ((x0 + at("w")).min(*width), (y0 + at("h")).min(*height));
    let mut drawn = 0;
    for y in y0..y1 {
        for x in x0..x1 {
            let i = (y as usize * *width as usize + x as usize) * channels;
            if pixels[i..i + 3].iter().any(|&c| c < 240) {
                drawn += 1;
            }
        }
    }
    (drawn, ((x1 - x0) * (y1 - y0)) as usize)
}

fn decode(path: &Path) -> (u32, u32, Vec<u8>, usize) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).unwrap();
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let channels = info.color_type.samples();
    assert!(channels >= 3, "a colour screenshot");
    (info.width, info.height, pixels, channels)
}

#[test]
fn the_two_gpu_report_loads_cleanly_and_every_chart_is_drawn_in_chromium() {
    let Some(browser) = chromium() else {
        let how = "install Debian's chromium (`apt-get update && apt-get install -y chromium`, \
                   as root; .ci/run does) or name a Chromium in PEERLINK_CHROMIUM";
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("chromium is missing, and CI must run the browser test: {how}");
        }
        eprintln!("skipped: no chromium to load the report in: {how}");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.html");
    succeeds(
        peerlink()
            .current_dir(RUN)
            .arg("report")
            .args(DOCUMENTS)
            .arg("-o")
            .arg(&report),
    );
    let html = std::fs::read_to_string(&report).unwrap();

    // Self-contained: nothing to fetch, no script.
    assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("url("));
    assert!(
        html.split("href=\"")
            .skip(1)
            .all(|rest| rest.starts_with('#')),
        "links only within the page"
    );

    let harness = dir.path().join("harness.html");
    std::fs::write(
        &harness,
        html.replacen("<head>", &format!("<head>\n{HARNESS}"), 1)
            .replacen(
                "default-src 'none';",
                "default-src 'none'; script-src 'unsafe-inline';",
                1,
            ),
    )
    .unwrap();
    let profile = dir.path().join("chromium-profile");
    let (dom, stderr) = browse(&browser, &profile, &harness, 1000, &["--dump-dom"]);
    let found = results(&dom);
    assert_eq!(found["errors"], serde_json::json!([]), "errors in the page");
    assert_eq!(
        console_lines(&stderr),
        Vec::<&str>::new(),
        "console messages"
    );
    let charts = found["charts"].as_array().unwrap();
    let ids: Vec<&str> = charts.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, CHARTS, "the charts on the page");
    for chart in charts {
        assert!(
            chart["w"].as_f64().unwrap() > 100.0 && chart["h"].as_f64().unwrap() > 100.0,
            "a chart with no size: {chart}"
        );
    }

    // The whole page in one screenshot: the window as tall as the page.
    let height = found["height"].as_f64().unwrap().ceil() as u32;
    let shot = dir.path().join("report.png");
    let screenshot = format!("--screenshot={}", shot.display());
    let (_, stderr) = browse(&browser, &profile, &harness, height, &[&screenshot]);
    assert_eq!(
        console_lines(&stderr),
        Vec::<&str>::new(),
        "console messages"
    );
    let image = decode(&shot);
    assert_eq!((image.0, image.1), (WIDTH, height));
    for chart in charts {
        let (drawn, area) = drawn_pixels(&image, chart);
        assert!(
            drawn * 100 >= area && drawn >= 500,
            "chart {} looks blank: {drawn} of {area} pixels drawn",
            chart["id"]
        );
    }

    // The page itself (1.4 MB, most of it plotters' SVG) is made again by one command; the
    // screenshot is kept.
    if std::env::var_os("PEERLINK_BLESS").is_some() {
        std::fs::copy(&shot, Path::new(RUN).join("report.png")).unwrap();
    }
}
