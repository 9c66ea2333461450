//! Progress for long measurements: a trait the library reports to, and a stderr bar that appears only
//! once the work has taken more than a second, with the time left at the rate so far.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where the bench reports how far it has got.
pub trait Progress {
    /// A new stage of `steps` steps begins.
    fn start(&self, stage: &str, steps: u64);
    /// One step finished.
    fn step(&self);
    /// The stage is over.
    fn finish(&self);
}

/// Reports nothing (for `--json` runs, tests and library users who do not care).
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _stage: &str, _steps: u64) {}
    fn step(&self) {}
    fn finish(&self) {}
}

/// A bar on stderr, drawn only when a stage has run for more than [`Bar::DELAY`] (or the
/// milliseconds in `PEERLINK_PROGRESS_DELAY_MS`, which the tests set to 0 to see every bar).
pub struct Bar {
    state: Mutex<Option<(ProgressBar, Instant)>>,
    delay: Duration,
}

impl Bar {
    /// Work shorter than this shows no bar.
    pub const DELAY: Duration = Duration::from_secs(1);
    /// The stage, the bar, steps done of all, time spent and time left.
    const TEMPLATE: &'static str = "{msg:>16} [{bar:30}] {pos}/{len} {elapsed}, ETA {eta}";

    pub fn new() -> Bar {
        let delay = std::env::var("PEERLINK_PROGRESS_DELAY_MS")
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map_or(Bar::DELAY, Duration::from_millis);
        Bar {
            state: Mutex::new(None),
            delay,
        }
    }
}

impl Default for Bar {
    fn default() -> Self {
        Bar::new()
    }
}

impl Progress for Bar {
    fn start(&self, stage: &str, steps: u64) {
        let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::hidden());
        if let Ok(style) = ProgressStyle::with_template(Bar::TEMPLATE) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(stage.to_string());
        if self.delay.is_zero() {
            // No delay asked for: shown from the start, however short the stage.
            bar.set_draw_target(ProgressDrawTarget::stderr());
            bar.tick();
        }
        if let Ok(mut state) = self.state.lock() {
            if let Some((old, _)) = state.take() {
                old.finish_and_clear();
            }
            *state = Some((bar, Instant::now()));
        }
    }

    fn step(&self) {
        if let Ok(state) = self.state.lock() {
            if let Some((bar, started)) = state.as_ref() {
                bar.inc(1);
                if bar.is_hidden() && started.elapsed() >= self.delay {
                    bar.set_draw_target(ProgressDrawTarget::stderr());
                    // Time spent and left move between steps too.
                    bar.enable_steady_tick(Duration::from_millis(250));
                    // Drawn now: a stage that ends before the next tick is still seen.
                    bar.tick();
                }
            }
        }
    }

    fn finish(&self) {
        if let Ok(mut state) = self.state.lock() {
            if let Some((bar, _)) = state.take() {
                bar.finish_and_clear();
            }
        }
    }
}
