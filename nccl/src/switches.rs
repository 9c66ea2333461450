//! The switches, read once from the environment at the first call: `PEERLINK_NCCL_SERVE` (whether
//! calls may be served by peerlink) and `PEERLINK_NCCL_DEBUG` (how much the library logs).

/// Names the real NCCL to forward to, in place of the search.
pub const LIBRARY_VARIABLE: &str = "PEERLINK_NCCL_LIB";
/// Which calls peerlink may serve itself.
pub const SERVE_VARIABLE: &str = "PEERLINK_NCCL_SERVE";
/// How much the library logs on stderr.
pub const DEBUG_VARIABLE: &str = "PEERLINK_NCCL_DEBUG";

/// `PEERLINK_NCCL_SERVE`: whether calls are served by peerlink or forwarded to NCCL. This version
/// serves none: every value forwards every call; the value is still checked and logged.
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
        Switches {
            serve,
            debug,
            refused,
        }
    }

    /// Why a communicator's calls are all forwarded, for the log.
    pub fn why_forwarded(&self) -> String {
        match self.serve {
            Serve::None => format!("{SERVE_VARIABLE}=none"),
            Serve::Auto | Serve::All => format!(
                "forwarding only: this version of the library serves no calls \
                 ({SERVE_VARIABLE}={})",
                self.serve.name()
            ),
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
    fn the_log_says_why_calls_are_forwarded() {
        assert_eq!(
            read(&[(SERVE_VARIABLE, "none")]).why_forwarded(),
            "PEERLINK_NCCL_SERVE=none"
        );
        assert!(read(&[]).why_forwarded().starts_with("forwarding only"));
    }
}
