//! The `peerlink` command line: each verb parses its options into the library's types, calls the
//! library once, and prints what it returns — text on stdout, or one JSON document with `--json`.
//!
//! This module is the binary's alone (clap and anyhow are behind the `cli` feature), so a program
//! embedding the library does not compile them.

pub mod args;
mod check;
mod compare;
mod doctor;
mod export;
mod html_report;
mod launch;
mod outputs;
mod plan;
mod topo;
mod tune;
mod workload;

use anyhow::Result;
use args::{Cli, Global, Verb};
use peerlink::backend::{self, Choice, Opened};
use peerlink::bench::document::{BenchDocument, ExplainDocument};
use peerlink::bench::layout::Layout;
use peerlink::bench::{self, explain, progress};
use peerlink::document;
use peerlink::echo::one_line;
use peerlink::report;
use peerlink::report::export::Tables;
use peerlink::units::parse::{parse_size, parse_sizes};

/// Runs one command line.
pub fn run(cli: Cli) -> Result<()> {
    outputs::check_stdout()?;
    outputs::check(&cli)?;
    let global = &cli.global;
    // Under a launcher every rank meets the others first (`peerlink launch` itself is none).
    let group = match &cli.verb {
        Verb::Launch(_) => None,
        _ => launch::join()?,
    };
    if !launch::this_rank_runs(&cli.verb, group.as_ref()) {
        return Ok(());
    }
    match cli.verb {
        Verb::Topo(args) => topo::run(global, &args),
        Verb::Bench(args) => {
            let opened = global.open()?;
            let options = bench::Options {
                tests: args.tests,
                devices: global.devices.clone(),
                size: args.size.as_deref().map(bench::Size::parse).transpose()?,
                samples: args.samples,
                iterations: args.iterations,
                warmup: args.warmup,
                rotation: args
                    .rotation
                    .as_deref()
                    .map(bench::parse_rotation)
                    .transpose()?,
                sizes: args.sizes.as_deref().map(parse_sizes).transpose()?,
            };
            let backend = opened.backend.as_ref();
            let layout = Layout::of(group.as_ref().map(|(_, g)| g));
            // Across processes rank 0 prints what every rank measured; the others print nothing.
            let Some(kept) = bench::run_laid_out(layout, backend, &options, &*global.progress())?
            else {
                return Ok(());
            };
            let mut doc = BenchDocument::new(opened.backend.topology(), kept.found);
            doc.header.partial |= kept.failure.is_some();
            if args.csv {
                global.show(&doc, &report::bench::csv(&doc))?;
            } else {
                global.print(&doc, || report::bench::text(&doc))?;
            }
            failed(kept.failure)
        }
        Verb::Explain(args) => {
            let opened = global.open_for(&[args.src, args.dst])?;
            global.check_in_use(opened.backend.topology(), &[args.src, args.dst])?;
            let size = parse_size(&args.size)?;
            let explain = match args.memory.as_str() {
                "device" => explain::run,
                "managed" => explain::run_managed,
                other => {
                    return Err(peerlink::Error::usage(format!(
                        "--memory `{other}` is not a kind of memory explain knows: say `device` \
                         or `managed`"
                    ))
                    .into())
                }
            };
            let found = explain(
                opened.backend.as_ref(),
                args.src,
                args.dst,
                size,
                &*global.progress(),
            )?;
            let doc = ExplainDocument::new(opened.backend.topology(), found);
            global.print(&doc, || report::bench::explain_text(&doc))
        }
        Verb::Plan(args) => plan::run(global, &args),
        Verb::Tune(args) => tune::run(global, &args),
        Verb::Compare(args) => compare::run(global, &args),
        Verb::Check(args) => check::run(global, &args),
        Verb::Workload(args) => workload::run(global, &args, group.as_ref().map(|(_, g)| g)),
        Verb::Report(args) => html_report::run(global, &args),
        Verb::Doctor(args) => doctor::run(global, &args),
        Verb::Launch(args) => launch::run(global, &args),
        Verb::Ranks(args) => launch::ranks(global, &args, group),
    }
}

/// The failure that stopped a run part-way, once what it measured before is printed.
fn failed(failure: Option<peerlink::Error>) -> Result<()> {
    failure.map_or(Ok(()), |e| Err(e.into()))
}

/// The first Ctrl-C (or SIGTERM) asks the measuring loops to stop now, dropping the measurement in
/// progress, so that what was measured before is still printed (marked partial); a second one
/// quits at once.
pub fn stop_on_signals() {
    let installed = ctrlc::set_handler(|| {
        if peerlink::interrupt::requested() {
            std::process::exit(130);
        }
        peerlink::interrupt::request();
        eprintln!(
            "\npeerlink: stopping now, keeping what was measured before (Ctrl-C again to quit \
             at once)"
        );
    });
    if let Err(e) = installed {
        eprintln!("peerlink: note: Ctrl-C will quit at once, losing the results so far: {e}");
    }
}

/// Writes `text` to stdout without control characters or bidirectional overrides (names and paths
/// from presets, documents and the host are in it: [`peerlink::echo`]). A reader that went away
/// (`peerlink … | head -1`) ends the output quietly, as Unix tools do: what it did not read was not
/// wanted.
pub(crate) fn emit(text: &str) -> Result<()> {
    use std::io::Write;
    let text = peerlink::echo::printable(text);
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

impl Global {
    fn choice(&self) -> Choice {
        match (&self.sim, self.gpu) {
            (Some(preset), _) => Choice::Sim(preset.clone()),
            (None, true) => Choice::Gpu,
            (None, false) => Choice::Auto,
        }
    }

    /// Opens the backend for the GPUs of `--devices` (all where not given), printing the
    /// simulator fallback notice on stderr.
    fn open(&self) -> peerlink::Result<Opened> {
        self.open_among(self.devices.as_deref())
    }

    /// Opens the backend for a verb that touches `gpus` alone (`--src`, `--dst`), or those of
    /// `--devices` where given.
    fn open_for(&self, gpus: &[usize]) -> peerlink::Result<Opened> {
        self.open_among(Some(self.devices.as_deref().unwrap_or(gpus)))
    }

    /// Opens the backend for the GPUs `in_use` (all where `None`): a simulated host then holds
    /// their pairs alone.
    fn open_among(&self, in_use: Option<&[usize]>) -> peerlink::Result<Opened> {
        let opened = backend::open_among(&self.choice(), in_use)?;
        if let Some(notice) = &opened.notice {
            eprintln!("peerlink: {}", one_line(notice));
        }
        for notice in opened.backend.notices() {
            eprintln!("peerlink: note: {}", one_line(&notice));
        }
        Ok(opened)
    }

    /// Refuses the global options a verb that opens no GPU would otherwise ignore in silence.
    fn refuse_backend_options(&self, verb: &str) -> peerlink::Result<()> {
        let given: Vec<&str> = [
            (self.sim.is_some(), "--sim"),
            (self.gpu, "--gpu"),
            (self.devices.is_some(), "--devices"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        if given.is_empty() {
            return Ok(());
        }
        Err(peerlink::Error::usage(format!(
            "`{verb}` reads files and uses no GPU, so {} {} not apply: leave {} out",
            given.join(" and "),
            if given.len() == 1 { "does" } else { "do" },
            if given.len() == 1 { "it" } else { "them" },
        )))
    }

    /// With `--devices`, the GPUs a verb names must be among them.
    fn check_in_use(
        &self,
        topology: &peerlink::topology::Topology,
        gpus: &[usize],
    ) -> peerlink::Result<()> {
        let in_use = topology.select(self.devices.as_deref())?;
        match gpus.iter().find(|gpu| !in_use.contains(gpu)) {
            Some(&gpu) if self.devices.is_some() => {
                Err(peerlink::topology::not_in_use(gpu, &in_use))
            }
            _ => Ok(()),
        }
    }

    /// The one emitter of every verb: prints `doc` as JSON with `--json`, else the text `text`
    /// makes (made only then), and writes the exports asked for.
    fn print(&self, doc: &impl Tables, text: impl FnOnce() -> String) -> Result<()> {
        if self.json {
            self.show(doc, &format!("{}\n", document::to_json(doc)))
        } else {
            self.show(doc, &text())
        }
    }

    /// Writes the exports of `doc`, then `shown` on stdout.
    fn show(&self, doc: &impl Tables, shown: &str) -> Result<()> {
        self.exports.write(doc, shown)?;
        emit(shown)
    }

    /// A progress bar on stderr where stderr is a terminal (with `--json` too: the document is on
    /// stdout); nothing where it is a file or a pipe.
    fn progress(&self) -> Box<dyn progress::Progress> {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            Box::new(progress::Bar::new())
        } else {
            Box::new(progress::Silent)
        }
    }
}
