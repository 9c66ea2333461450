//! The ranks' agreement: every step of a run across processes ends with each rank's outcome
//! handed to all ([`exchange`], [`agreed`]), so that where one rank fails every rank stops, the one
//! at fault with its own error and the others with [`Error::Group`] naming it; and the one rule of
//! which GPU each rank takes ([`one_gpu_each`]).

use super::Group;
use crate::backend::Backend;
use crate::{Error, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What a rank hands the others at each step: its part, or why it failed.
#[derive(Serialize, Deserialize)]
enum Part<T> {
    Done(T),
    Failed(String),
}

/// Every rank's part of one step, in rank order. Where some rank failed, every rank stops: this
/// rank with its own error, the others with one naming the rank that failed.
pub fn exchange<T: Serialize + DeserializeOwned>(group: &Group, mine: Result<T>) -> Result<Vec<T>> {
    let part = match &mine {
        Ok(value) => Part::Done(value),
        Err(e) => Part::Failed(e.to_string()),
    };
    let encoded = serde_json::to_vec(&part).expect("parts serialise");
    let parts = group.all_gather(&encoded)?;
    mine?;
    let mut out = Vec::with_capacity(parts.len());
    for (rank, bytes) in parts.iter().enumerate() {
        let part: Part<T> = serde_json::from_slice(bytes).map_err(|e| {
            Error::Group(format!(
                "rank {rank} sent a part this rank cannot read ({e}): run one peerlink version \
                 on every rank"
            ))
        })?;
        match part {
            Part::Done(value) => out.push(value),
            Part::Failed(why) => {
                return Err(Error::Group(format!(
                    "rank {rank} failed, so this rank stops too: {why}"
                )))
            }
        }
    }
    Ok(out)
}

/// `mine`, once every rank has succeeded too; where some rank failed, every rank stops (see
/// [`exchange`]).
pub fn agreed<T>(group: &Group, mine: Result<T>) -> Result<T> {
    let (value, outcome) = match mine {
        Ok(value) => (Some(value), Ok(())),
        Err(e) => (None, Err(e)),
    };
    exchange(group, outcome)?;
    Ok(value.expect("exchange returns this rank's own error"))
}

/// Each rank's GPU (its `LOCAL_RANK`), in rank order, where the group can run `verb` across
/// processes: two ranks or more, all of this host, one per GPU of it; else a usage error, the same
/// on every rank.
pub fn one_gpu_each(backend: &dyn Backend, group: &Group, verb: &str) -> Result<Vec<usize>> {
    let gpus: Vec<usize> = group
        .members()
        .iter()
        .map(|m| m.identity.local_rank)
        .collect();
    let world = gpus.len();
    if world < 2 {
        return Err(Error::usage(format!(
            "{verb} across processes needs at least 2 ranks: launch it with -n 2 or more"
        )));
    }
    if let Some(far) = (0..world).find(|&r| !group.same_host(r)) {
        return Err(Error::usage(format!(
            "rank {far} runs on another host: {verb} across processes pairs processes of one \
             host (CUDA IPC); run it on one host"
        )));
    }
    let topology = backend.topology();
    let count = topology.devices.len();
    if let Some(rank) = (0..world).find(|&r| gpus[r] >= count) {
        let local = gpus[rank];
        return Err(Error::usage(match &topology.visible_devices {
            // A launcher that gives each rank its own GPU alone (Slurm's --gpus-per-task, say):
            // a rank must see its peers' GPUs to reach them.
            Some(visible) => format!(
                "rank {rank} has LOCAL_RANK {local} but this process sees {count} GPU(s) \
                 (CUDA_VISIBLE_DEVICES={visible}): {verb} across processes reaches the peers' \
                 GPUs, so every rank must see every GPU of the job, each taking the one of its \
                 LOCAL_RANK; launch the ranks without a CUDA_VISIBLE_DEVICES of their own (under \
                 Slurm, --gpu-bind=none)"
            ),
            None => format!(
                "rank {rank} has LOCAL_RANK {local} but this host has {count} GPUs: launch at \
                 most one process per GPU"
            ),
        }));
    }
    if let Some(rank) = (1..world).find(|&r| gpus[..r].contains(&gpus[r])) {
        return Err(Error::usage(format!(
            "rank {rank} shares GPU {} with another rank: {verb} across processes takes one \
             process per GPU",
            gpus[rank]
        )));
    }
    Ok(gpus)
}

/// Which GPU each rank runs on, as a document's note says it: "rank 0 → GPU 0, rank 1 → GPU 1".
pub fn layout_text(gpus: &[usize]) -> String {
    gpus.iter()
        .enumerate()
        .map(|(rank, gpu)| format!("rank {rank} → GPU {gpu}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::tests::{on_ranks, rendezvous};

    #[test]
    fn a_failing_rank_stops_every_rank_and_the_others_name_it() {
        let results = on_ranks(3, &rendezvous(20_000), |group| {
            let mine = match group.identity().rank {
                1 => Err(Error::usage("rank one's own trouble")),
                rank => Ok(rank),
            };
            exchange(&group, mine).map_err(|e| (e.exit_code(), e.to_string()))
        });
        let (code, own) = results[1].clone().unwrap_err();
        assert_eq!((code, own.as_str()), (2, "rank one's own trouble"));
        for rank in [0, 2] {
            let (code, said) = results[rank].clone().unwrap_err();
            assert_eq!(code, crate::error::GROUP_FAILED, "{said}");
            assert!(
                said.contains("rank 1") && said.contains("own trouble"),
                "{said}"
            );
        }
    }
}
