//! The switches, read once from the environment at the first call: `PEERLINK_NCCL_SERVE` (whether
//! calls may be served by peerlink) and `PEERLINK_NCCL_DEBUG` (how much the library logs).

/// Names the real NCCL to forward to, in place of the search.
pub const LIBRARY_VARIABLE: &str = "PEERLINK_NCCL_LIB";
/// Which calls peerlink may serve itself.
pub const SERVE_VARIABLE: &str = "PEERLINK_NCCL_SERVE";
/// How much the library logs on stderr.
pub const DEBUG_VARIABLE: &str = "PEERLINK_NCCL_DEBUG";
/// Runs the served calls on the simulator preset it names (for tests, and trying without a GPU).
pub const SIM_VARIABLE: &str = "PEERLINK_NCCL_SIM";
/// Names the `peerlink tune` profile of this host the kernels are picked by.
pub const PROFILE_VARIABLE: &str = "PEERLINK_NCCL_PROFILE";

/// `PEERLINK_NCCL_SERVE`: whether calls are served by peerlink or forwarded to NCCL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// Forward every call (`none`).
    None,
    /// Serve the calls peerlink is faster at (`auto`, the default).
    Auto,
    /// Serve every call peerlink can (`all`).
    All,
}

/// `PEERLINK_NCCL_DEBUG`: `WARN` (the default) says only what went wrong; `INFO` also logs the NCCL
/// found, each communicator, and a summary of the calls at exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Debug {
    /// Warnings only.
    Warn,
    /// Warnings, the NCCL found, each communicator and the summary at exit.
    Info,
}

/// The switches as read, and a sentence for each value that was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switches {
    pub serve: Serve,
    pub debug: Debug,
    /// One sentence per refused value (each then taken as its default or as `none`).
    pub refused: Vec<String>,
    /// `PEERLINK_NCCL_SIM`: the simulator preset served calls run on, instead of the GPUs.
    pub sim: Option<String>,
    /// `PEERLINK_NCCL_TABLE`: the measurement `auto` decides by.
    pub table: Option<std::path::PathBuf>,
    /// `PEERLINK_NCCL_PROFILE`: the measured costs the kernels are picked by.
    pub profile: Option<std::path::PathBuf>,
}

impl Switches {
    /// Reads both switches through `variable` (the environment, or a test's map). A bad value of
    /// `PEERLINK_NCCL_SERVE` is taken as `none`: a typo never turns serving on.
    pub fn read(variable: impl Fn(&str) -> Option<String>) -> Switches {
        let mut refused = Vec::new();
        let serve = match variable(SERVE_VARIABLE) {
            None => Serve::Auto,
            Some(value) => parse_serve(&value).unwrap_or_else(|| {
                refused.push(format!(
                    "{SERVE_VARIABLE}={value:?} is not none, auto or all: taken as none, so every \
                     call is forwarded to NCCL"
                ));
                Serve::None
            }),
        };
        let debug = match variable(DEBUG_VARIABLE) {
            None => Debug::Warn,
            Some(value) => parse_debug(&value).unwrap_or_else(|| {
                refused.push(format!(
                    "{DEBUG_VARIABLE}={value:?} is not WARN or INFO: taken as WARN"
                ));
                Debug::Warn
            }),
        };
        let named = |name: &str| variable(name).filter(|value| !value.trim().is_empty());
        Switches {
            serve,
            debug,
            refused,
            sim: named(SIM_VARIABLE).map(|preset| preset.trim().to_string()),
            table: named(crate::serve::table::TABLE_VARIABLE).map(std::path::PathBuf::from),
            profile: named(PROFILE_VARIABLE).map(std::path::PathBuf::from),
        }
    }
}

impl Serve {
    /// The switch's value as written.
    pub fn name(self) -> &'static str {
        match self {
            Serve::None => "none",
            Serve::Auto => "auto",
            Serve::All => "all",
        }
    }
}

fn parse_serve(value: &str) -> Option<Serve> {
    match value.trim().to_ascii_lowercase().as_str() {
        "none" => Some(Serve::None),
        "auto" | "" => Some(Serve::Auto),
        "all" => Some(Serve::All),
        _ => None,
    }
}

/// As NCCL_DEBUG reads its values: any case.
fn parse_debug(value: &str) -> Option<Debug> {
    match value.trim().to_ascii_uppercase().as_str() {
        "WARN" | "" => Some(Debug::Warn),
        "INFO" => Some(Debug::Info),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pairs: &[(&str, &str)]) -> Switches {
        Switches::read(|name| {
            pairs
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn unset_switches_mean_auto_and_warnings() {
        let switches = read(&[]);
        assert_eq!((switches.serve, switches.debug), (Serve::Auto, Debug::Warn));
        assert!(switches.refused.is_empty());
    }

    #[test]
    fn every_value_is_read_in_any_case() {
        for (value, serve) in [
            ("none", Serve::None),
            ("AUTO", Serve::Auto),
            (" all ", Serve::All),
        ] {
            assert_eq!(read(&[(SERVE_VARIABLE, value)]).serve, serve);
        }
        assert_eq!(read(&[(DEBUG_VARIABLE, "info")]).debug, Debug::Info);
        assert_eq!(read(&[(DEBUG_VARIABLE, "WARN")]).debug, Debug::Warn);
    }

    #[test]
    fn a_bad_serve_value_is_refused_in_a_sentence_and_forwards_everything() {
        let switches = read(&[(SERVE_VARIABLE, "yes"), (DEBUG_VARIABLE, "loud")]);
        assert_eq!((switches.serve, switches.debug), (Serve::None, Debug::Warn));
        assert_eq!(switches.refused.len(), 2);
        assert!(
            switches.refused[0].contains("PEERLINK_NCCL_SERVE=\"yes\" is not none, auto or all")
        );
        assert!(switches.refused[1].contains("PEERLINK_NCCL_DEBUG=\"loud\""));
    }

    #[test]
    fn the_simulator_the_table_and_the_profile_are_named_or_absent() {
        let switches = read(&[
            (SIM_VARIABLE, " dgx-h100 "),
            ("PEERLINK_NCCL_TABLE", ""),
            (PROFILE_VARIABLE, "/etc/peerlink/h200.json"),
        ]);
        assert_eq!(switches.sim.as_deref(), Some("dgx-h100"));
        assert_eq!(switches.table, None);
        let profile = switches.profile.as_deref().and_then(|p| p.to_str());
        assert_eq!(profile, Some("/etc/peerlink/h200.json"));
        assert_eq!(read(&[]).profile, None);
        assert_eq!(read(&[]).sim, None);
    }
}
