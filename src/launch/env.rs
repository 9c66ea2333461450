//! Who this process is in a multi-process run, read from the variables a launcher sets.
//!
//! Precedence, most specific first: torchrun's variables (`RANK`, `WORLD_SIZE`, …; `peerlink
//! launch` sets the same ones and marks itself with `PEERLINK_LAUNCHED`), then Open MPI's
//! (`OMPI_COMM_WORLD_*`), then Slurm's (`SLURM_PROCID`, … of an `srun` step). torchrun or mpirun run
//! inside a Slurm allocation see Slurm's variables of the allocation too; theirs describe the process.

use super::{Identity, Launcher, Rendezvous, DEFAULT_TIMEOUT};
use crate::{Error, Result};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// The port torchrun uses when `MASTER_PORT` is not given; also peerlink's default.
const DEFAULT_PORT: u16 = 29500;

/// Reads who this process is from the environment; `None` where no launcher's variables are set,
/// or `PEERLINK_ALONE` is (a single-process run: a peerlink a rank of some other job runs for
/// itself).
pub fn from_env() -> Result<Option<(Launcher, Identity, Rendezvous)>> {
    from_vars(|name| std::env::var(name).ok())
}

/// [`from_env`] over any lookup of variables (the tests' environments).
pub fn from_vars(
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<(Launcher, Identity, Rendezvous)>> {
    let vars = Vars(&var);
    if vars
        .get("PEERLINK_ALONE")
        .is_some_and(|value| value.trim() != "0")
    {
        return Ok(None);
    }
    let (launcher, identity) = if vars.has("RANK") || vars.has("WORLD_SIZE") {
        let launcher = if vars.has("PEERLINK_LAUNCHED") {
            Launcher::Peerlink
        } else {
            Launcher::Torchrun
        };
        (
            launcher,
            vars.identity(["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])?,
        )
    } else if vars.has("OMPI_COMM_WORLD_RANK") || vars.has("OMPI_COMM_WORLD_SIZE") {
        let names = [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ];
        (Launcher::OpenMpi, vars.identity(names)?)
    } else if vars.has("SLURM_PROCID") && vars.slurm_step() {
        (Launcher::Slurm, vars.slurm_identity()?)
    } else {
        return Ok(None);
    };
    let rendezvous = vars.rendezvous(launcher, &identity)?;
    Ok(Some((launcher, identity, rendezvous)))
}

struct Vars<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Vars<'_, F> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).filter(|value| !value.trim().is_empty())
    }

    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// A whole number variable, where set.
    fn number(&self, name: &str) -> Result<Option<usize>> {
        self.get(name)
            .map(|text| {
                text.trim().parse().map_err(|_| {
                    Error::usage(format!(
                        "{name}={text} is not a whole number: the launcher's variables must be \
                         set by the launcher or to numbers"
                    ))
                })
            })
            .transpose()
    }

    fn required(&self, name: &str, other: &str) -> Result<usize> {
        self.number(name)?.ok_or_else(|| {
            Error::usage(format!(
                "{other} is set but {name} is not: set both, as the launcher does (or neither, \
                 for a single-process run)"
            ))
        })
    }

    /// Rank and world from the first two names, local rank and local world from the last two
    /// (absent: one host, so local equals global).
    fn identity(&self, [rank, world, local_rank, local_world]: [&str; 4]) -> Result<Identity> {
        let identity = Identity {
            rank: self.required(rank, world)?,
            world: self.required(world, rank)?,
            local_rank: 0,
            local_world: 0,
        };
        let local = match (self.number(local_rank)?, self.number(local_world)?) {
            (Some(local_rank), Some(local_world)) => (local_rank, local_world),
            (None, None) => (identity.rank, identity.world),
            (Some(_), None) => (0, self.required(local_world, local_rank)?),
            (None, Some(_)) => (self.required(local_rank, local_world)?, 0),
        };
        check(
            Identity {
                local_rank: local.0,
                local_world: local.1,
                ..identity
            },
            [rank, world, local_rank, local_world],
        )
    }

    /// Whether Slurm's variables come from a task of an `srun` step: a batch script's shell has
    /// `SLURM_PROCID=0` and the job's `SLURM_NTASKS` too, but is one process, not rank 0 of many.
    fn slurm_step(&self) -> bool {
        self.has("SLURM_STEP_ID") || self.has("SLURM_STEPID")
    }

    fn slurm_identity(&self) -> Result<Identity> {
        let world_name = if self.has("SLURM_STEP_NUM_TASKS") {
            "SLURM_STEP_NUM_TASKS"
        } else {
            "SLURM_NTASKS"
        };
        let rank = self.required("SLURM_PROCID", world_name)?;
        let world = self.required(world_name, "SLURM_PROCID")?;
        let local_rank = self.number("SLURM_LOCALID")?.unwrap_or(0);
        let local_world = match self.get("SLURM_STEP_TASKS_PER_NODE") {
            Some(per_node) => {
                let node = self.number("SLURM_NODEID")?.unwrap_or(0);
                tasks_on_node(&per_node, node)?
            }
            None => world,
        };
        check(
            Identity {
                rank,
                world,
                local_rank,
                local_world,
            },
            [
                "SLURM_PROCID",
                world_name,
                "SLURM_LOCALID",
                "SLURM_STEP_TASKS_PER_NODE",
            ],
        )
    }

    fn rendezvous(&self, launcher: Launcher, identity: &Identity) -> Result<Rendezvous> {
        let timeout = match self.get("PEERLINK_TIMEOUT") {
            Some(text) => parse_timeout(&text)
                .map_err(|e| Error::usage(format!("PEERLINK_TIMEOUT={text}: {e}")))?,
            None => DEFAULT_TIMEOUT,
        };
        let one_host = identity.local_world == identity.world;
        let host = match self.get("MASTER_ADDR") {
            Some(host) => host,
            None if one_host => "127.0.0.1".to_string(),
            None => {
                return Err(Error::usage(format!(
                    "{} ranks run on several hosts but MASTER_ADDR is not set: set it to the \
                     name or address of rank 0's host{}",
                    identity.world,
                    if launcher == Launcher::Slurm {
                        " (export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" \
                         | head -n1))"
                    } else {
                        ""
                    }
                )))
            }
        };
        let port = self.port(launcher)?;
        let addr = resolve(&host, port)?;
        Ok(Rendezvous { addr, timeout })
    }

    /// `PEERLINK_PORT`, else `MASTER_PORT` (under torchrun one above it: torchrun's own store
    /// listens on `MASTER_PORT`), else a port of the Slurm job's, else 29500.
    fn port(&self, launcher: Launcher) -> Result<u16> {
        let parse = |name: &str| -> Result<Option<u16>> {
            self.get(name)
                .map(|text| match text.trim().parse::<u16>() {
                    Ok(port) if port > 0 => Ok(port),
                    _ => Err(Error::usage(format!(
                        "{name}={text} is not a port: give a number from 1 to 65535"
                    ))),
                })
                .transpose()
        };
        if let Some(port) = parse("PEERLINK_PORT")? {
            return Ok(port);
        }
        if let Some(port) = parse("MASTER_PORT")? {
            return match launcher {
                Launcher::Torchrun if self.has("TORCHELASTIC_RUN_ID") => {
                    port.checked_add(1).ok_or_else(|| {
                        Error::usage(
                            "MASTER_PORT=65535 leaves no port above it for peerlink's rendezvous \
                             under torchrun: set PEERLINK_PORT",
                        )
                    })
                }
                _ => Ok(port),
            };
        }
        if launcher == Launcher::Slurm {
            // Jobs sharing a node each get their own port; steps of one job too.
            let job = self.number("SLURM_JOB_ID")?.unwrap_or(0);
            let step = self
                .number("SLURM_STEP_ID")?
                .or(self.number("SLURM_STEPID")?)
                .unwrap_or(0);
            return Ok(20_000 + (job % 1000 * 20 + step % 20) as u16);
        }
        Ok(DEFAULT_PORT)
    }
}

/// Refuses an identity whose numbers do not fit together, naming the variables.
fn check(
    identity: Identity,
    [rank, world, local_rank, local_world]: [&str; 4],
) -> Result<Identity> {
    let Identity {
        rank: r,
        world: w,
        local_rank: lr,
        local_world: lw,
    } = identity;
    let wrong = if w == 0 {
        Some(format!("{world}=0: a group has at least one process"))
    } else if r >= w {
        Some(format!(
            "{rank}={r} is not below {world}={w}: ranks count from 0"
        ))
    } else if lw == 0 || lw > w {
        Some(format!("{local_world}={lw} must be from 1 to {world}={w}"))
    } else if lr >= lw {
        Some(format!(
            "{local_rank}={lr} is not below {local_world}={lw}: local ranks count from 0"
        ))
    } else {
        None
    };
    match wrong {
        Some(what) => Err(Error::usage(format!(
            "{what}; check the launcher's variables of this process"
        ))),
        None => Ok(identity),
    }
}

/// Tasks on node `node` from Slurm's `SLURM_STEP_TASKS_PER_NODE`: `2(x3),1` is 2, 2, 2, 1.
fn tasks_on_node(per_node: &str, node: usize) -> Result<usize> {
    let bad = || {
        Error::usage(format!(
            "SLURM_STEP_TASKS_PER_NODE={per_node} is not Slurm's list of tasks per node \
             (like 4(x2),3)"
        ))
    };
    let mut nodes = 0;
    for part in per_node.split(',') {
        let (tasks, repeat) = match part.trim().split_once("(x") {
            Some((tasks, rest)) => (tasks, rest.strip_suffix(')').ok_or_else(bad)?),
            None => (part.trim(), "1"),
        };
        let tasks: usize = tasks.parse().map_err(|_| bad())?;
        let repeat: usize = repeat.parse().map_err(|_| bad())?;
        nodes += repeat;
        if node < nodes {
            return Ok(tasks);
        }
    }
    Err(Error::usage(format!(
        "SLURM_NODEID={node} is beyond the {nodes} nodes of SLURM_STEP_TASKS_PER_NODE={per_node}"
    )))
}

/// A timeout in seconds as a user types it (`30`, `2.5`): more than 0, at most a day.
pub fn parse_timeout(text: &str) -> Result<Duration> {
    match text.trim().parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs <= 86_400.0 => Ok(Duration::from_secs_f64(secs)),
        _ => Err(Error::usage(format!(
            "`{text}` is not a timeout: give seconds, more than 0 and at most 86400"
        ))),
    }
}

/// The first address `host:port` resolves to.
fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    let not_found = |why: String| {
        Error::usage(format!(
            "MASTER_ADDR={host} does not resolve to an address ({why}): set it to the name or \
             address of rank 0's host"
        ))
    };
    (host.trim(), port)
        .to_socket_addrs()
        .map_err(|e| not_found(e.to_string()))?
        .next()
        .ok_or_else(|| not_found("no address".into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<Option<(Launcher, Identity, Rendezvous)>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_vars(|name| map.get(name).cloned())
    }

    fn found(vars: &[(&str, &str)]) -> (Launcher, Identity, Rendezvous) {
        read(vars).unwrap().expect("a launcher's variables")
    }

    fn refused(vars: &[(&str, &str)]) -> String {
        match read(vars) {
            Err(e @ Error::Usage(_)) => e.to_string(),
            other => panic!("{vars:?} gave {other:?}"),
        }
    }

    fn id(rank: usize, world: usize, local_rank: usize, local_world: usize) -> Identity {
        Identity {
            rank,
            world,
            local_rank,
            local_world,
        }
    }

    #[test]
    fn nothing_set_is_a_single_process_run() {
        assert!(read(&[]).unwrap().is_none());
        assert!(read(&[("PATH", "/bin"), ("RANK", " ")]).unwrap().is_none());
    }

    #[test]
    fn peerlink_alone_runs_alone_under_any_launcher() {
        let torchrun = [("RANK", "1"), ("WORLD_SIZE", "2"), ("PEERLINK_ALONE", "1")];
        assert!(read(&torchrun).unwrap().is_none());
        let off = [("RANK", "1"), ("WORLD_SIZE", "2"), ("PEERLINK_ALONE", "0")];
        assert!(read(&off).unwrap().is_some());
    }

    #[test]
    fn torchrun_sets_every_variable() {
        let (launcher, identity, rendezvous) = found(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "1234"),
        ]);
        assert_eq!(launcher, Launcher::Torchrun);
        assert_eq!(identity, id(5, 8, 1, 4));
        assert_eq!(rendezvous.addr, "127.0.0.1:1234".parse().unwrap());
        assert_eq!(rendezvous.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn torchrun_agent_holds_master_port_so_peerlink_takes_the_next() {
        let (_, _, rendezvous) = found(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "none"),
        ]);
        assert_eq!(rendezvous.addr.port(), 29501);
        let (_, _, chosen) = found(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("PEERLINK_PORT", "4000"),
        ]);
        assert_eq!(chosen.addr.port(), 4000);
    }

    #[test]
    fn peerlink_launch_marks_itself_and_sets_the_timeout() {
        let (launcher, identity, rendezvous) = found(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("PEERLINK_LAUNCHED", "1"),
            ("PEERLINK_TIMEOUT", "2.5"),
        ]);
        assert_eq!(launcher, Launcher::Peerlink);
        // Without LOCAL_*, one host: local equals global; the rendezvous is on this host.
        assert_eq!(identity, id(1, 2, 1, 2));
        assert_eq!(rendezvous.addr, "127.0.0.1:29500".parse().unwrap());
        assert_eq!(rendezvous.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn open_mpi() {
        let (launcher, identity, _) = found(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ]);
        assert_eq!(launcher, Launcher::OpenMpi);
        assert_eq!(identity, id(3, 4, 3, 4));
    }

    #[test]
    fn slurm_step_with_tasks_per_node() {
        let (launcher, identity, rendezvous) = found(&[
            ("SLURM_PROCID", "6"),
            ("SLURM_NTASKS", "99"),
            ("SLURM_STEP_NUM_TASKS", "7"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "4,3"),
            ("SLURM_STEP_ID", "2"),
            ("SLURM_JOB_ID", "123456"),
            ("MASTER_ADDR", "127.0.0.1"),
        ]);
        assert_eq!(launcher, Launcher::Slurm);
        assert_eq!(identity, id(6, 7, 2, 3));
        assert_eq!(rendezvous.addr.port(), 20_000 + 456 * 20 + 2);
    }

    #[test]
    fn a_slurm_batch_shell_is_no_rank() {
        // sbatch's script has SLURM_PROCID=0 and the job's task count, but is not an srun task.
        let batch = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_ID", "1"),
        ];
        assert!(read(&batch).unwrap().is_none());
    }

    #[test]
    fn slurm_on_several_nodes_needs_master_addr() {
        let text = refused(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_STEP_TASKS_PER_NODE", "8(x2)"),
            ("SLURM_STEPID", "0"),
        ]);
        assert!(text.contains("MASTER_ADDR is not set"), "{text}");
        assert!(text.contains("scontrol show hostnames"), "{text}");
    }

    #[test]
    fn tasks_per_node_expands_slurms_repeats() {
        assert_eq!(tasks_on_node("4(x2),3", 0).unwrap(), 4);
        assert_eq!(tasks_on_node("4(x2),3", 1).unwrap(), 4);
        assert_eq!(tasks_on_node("4(x2),3", 2).unwrap(), 3);
        assert!(tasks_on_node("4(x2),3", 3).is_err());
        assert!(tasks_on_node("4(x2", 0).is_err());
        assert!(tasks_on_node("four", 0).is_err());
    }

    #[test]
    fn torchruns_variables_win_over_mpis_and_slurms() {
        let (launcher, identity, _) = found(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_STEP_ID", "0"),
        ]);
        assert_eq!((launcher, identity.rank), (Launcher::Torchrun, 1));
        let (launcher, _, _) = found(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("SLURM_STEP_ID", "0"),
        ]);
        assert_eq!(launcher, Launcher::OpenMpi);
    }

    #[test]
    fn bad_values_are_refused_in_one_sentence() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("RANK", "0")], "RANK is set but WORLD_SIZE is not"),
            (&[("WORLD_SIZE", "2")], "WORLD_SIZE is set but RANK is not"),
            (
                &[("RANK", "x"), ("WORLD_SIZE", "2")],
                "RANK=x is not a whole number",
            ),
            (
                &[("RANK", "2"), ("WORLD_SIZE", "2")],
                "RANK=2 is not below WORLD_SIZE=2",
            ),
            (&[("RANK", "0"), ("WORLD_SIZE", "0")], "WORLD_SIZE=0"),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")],
                "LOCAL_RANK is set but LOCAL_WORLD_SIZE is not",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_RANK", "2"),
                    ("LOCAL_WORLD_SIZE", "2"),
                ],
                "LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("LOCAL_RANK", "0"),
                    ("LOCAL_WORLD_SIZE", "3"),
                ],
                "LOCAL_WORLD_SIZE=3 must be from 1 to WORLD_SIZE=2",
            ),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "0")],
                "MASTER_PORT=0 is not a port",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("PEERLINK_TIMEOUT", "-1"),
                ],
                "PEERLINK_TIMEOUT=-1",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "4"),
                    ("LOCAL_RANK", "0"),
                    ("LOCAL_WORLD_SIZE", "2"),
                ],
                "MASTER_ADDR is not set",
            ),
            (
                &[("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "1")],
                "OMPI_COMM_WORLD_RANK=1 is not below OMPI_COMM_WORLD_SIZE=1",
            ),
        ];
        for (vars, expected) in cases {
            let text = refused(vars);
            assert!(text.contains(expected), "{vars:?}: {text}");
            assert!(!text.contains('\n'), "one sentence: {text}");
        }
    }

    #[test]
    fn timeouts_are_seconds() {
        assert_eq!(parse_timeout("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_timeout("0.25").unwrap(), Duration::from_millis(250));
        for bad in ["0", "-2", "day", "1e9", "NaN"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}
