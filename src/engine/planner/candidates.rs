//! The candidates: every strategy usable between two GPUs, each at its best, and why the others
//! cannot be used.

use super::{chunking, Planner};
use crate::backend::CopyMethod;
use crate::engine::plan::{PathShare, Plan, Route, Strategy, Ways};
use crate::{Error, Result};

impl Planner {
    /// The strategies that cannot move `bytes` from `src` to `dst` here, each with the reason.
    pub fn unusable(&self, src: usize, dst: usize, bytes: u64) -> Result<Vec<(Strategy, String)>> {
        self.check(src, dst, bytes)?;
        let usable: Vec<Strategy> = self
            .candidates(src, dst, bytes, Ways::One)
            .iter()
            .map(|p| p.strategy)
            .collect();
        // A strategy not offered (no resident workers run) is not listed as unusable either.
        Ok(self
            .family(src, dst)
            .iter()
            .copied()
            .filter(|s| !usable.contains(s) && (self.resident || *s != Strategy::Resident))
            .map(|s| (s, self.unavailable(s, src, dst).to_string()))
            .collect())
    }

    /// The strategies that could move data between `src` and `dst`: those within one host, or
    /// those between hosts.
    pub(super) fn family(&self, src: usize, dst: usize) -> &'static [Strategy] {
        if self.model.topology().crosses_hosts(src, dst) {
            &Strategy::NETWORK
        } else {
            &Strategy::ALL
        }
    }

    pub(super) fn unavailable(&self, strategy: Strategy, src: usize, dst: usize) -> Error {
        let across = self.model.topology().crosses_hosts(src, dst);
        if across != strategy.crosses_hosts() {
            return Error::usage(if across {
                format!(
                    "{strategy} moves data within one host, and GPU {src} and GPU {dst} are on \
                     different hosts: use gpudirect-rdma or net-staged"
                )
            } else {
                format!(
                    "{strategy} moves data between hosts, and GPU {src} and GPU {dst} are on one"
                )
            });
        }
        let link = self
            .model
            .topology()
            .pair(src, dst)
            .map_or_else(|| "the same GPU".to_string(), |p| p.link.to_string());
        Error::usage(match strategy {
            Strategy::DirectCe | Strategy::DirectSm => format!(
                "{strategy} needs P2P access from GPU {src} to GPU {dst}, which their link ({link}) \
                 does not allow; use staged, relay or split"
            ),
            Strategy::Relay => format!(
                "relay needs a third GPU with P2P access to both GPU {src} and GPU {dst}; this \
                 host has none"
            ),
            Strategy::Split => format!(
                "split needs two routes from GPU {src} to GPU {dst} that would each carry bytes; \
                 here one route outruns the others or shares their links"
            ),
            Strategy::Staged => format!("staged cannot be used from GPU {src} to GPU {dst}"),
            Strategy::GpudirectRdma => format!(
                "gpudirect-rdma needs an RDMA NIC on each GPU's host and GPUDirect RDMA \
                 (nvidia-peermem, or dma-buf), which GPU {src} → GPU {dst} lacks; use net-staged"
            ),
            Strategy::NetStaged => format!(
                "net-staged needs an RDMA NIC on the hosts of both GPU {src} and GPU {dst}"
            ),
            Strategy::Resident if !self.resident => "resident needs resident workers: open the \
                 fabric with FabricBuilder::resident (on the command line, plan --resident)"
                .to_string(),
            Strategy::Resident => format!(
                "resident needs P2P access from GPU {src} to GPU {dst}, which their link ({link}) \
                 does not allow; use staged, relay or split"
            ),
        })
    }

    /// Every usable strategy's best plan (alternatives left empty).
    pub(super) fn candidates(&self, src: usize, dst: usize, bytes: u64, ways: Ways) -> Vec<Plan> {
        if self.model.topology().crosses_hosts(src, dst) {
            return self.network_candidates(src, dst, bytes);
        }
        let mut plans = Vec::new();
        let resident = self
            .resident
            .then_some((Strategy::Resident, Route::Resident));
        let direct = [
            (Strategy::DirectCe, Route::Direct(CopyMethod::CopyEngine)),
            (Strategy::DirectSm, Route::Direct(CopyMethod::SmKernel)),
        ];
        for (strategy, route) in direct.into_iter().chain(resident) {
            if let Some(h) = self.hops(route, src, dst, ways) {
                let time = self.direct_us(&h, bytes);
                plans.push(self.single(src, dst, bytes, strategy, route, time));
            }
        }
        let host = [Route::Host];
        plans.extend(self.best_chunked(src, dst, bytes, Strategy::Staged, &host, ways));
        let relays: Vec<Route> = self.relays(src, dst).collect();
        plans.extend(self.best_chunked(src, dst, bytes, Strategy::Relay, &relays, ways));
        plans.extend(self.best_split(src, dst, bytes, ways));
        plans
    }

    /// Between GPUs of different hosts: GPUDirect RDMA where the model prices it, and through
    /// host memory at each end.
    pub(super) fn network_candidates(&self, src: usize, dst: usize, bytes: u64) -> Vec<Plan> {
        let mut plans = Vec::new();
        let route = Route::GpudirectRdma;
        if let Some(h) = self.hops(route, src, dst, Ways::One) {
            let time = self.direct_us(&h, bytes);
            plans.push(self.single(src, dst, bytes, Strategy::GpudirectRdma, route, time));
        }
        let net = [Route::NetStaged];
        plans.extend(self.best_chunked(src, dst, bytes, Strategy::NetStaged, &net, Ways::One));
        plans
    }

    pub(super) fn relays(&self, src: usize, dst: usize) -> impl Iterator<Item = Route> + '_ {
        self.devices
            .iter()
            .copied()
            .filter(move |&r| r != src && r != dst)
            .map(Route::Relay)
            .filter(move |&route| self.hops(route, src, dst, Ways::One).is_some())
    }

    pub(super) fn single(
        &self,
        src: usize,
        dst: usize,
        bytes: u64,
        strategy: Strategy,
        route: Route,
        predicted_us: f64,
    ) -> Plan {
        Plan {
            src,
            dst,
            bytes,
            strategy,
            chunk_bytes: bytes,
            paths: vec![PathShare {
                route,
                offset: 0,
                bytes,
                predicted_us,
            }],
            predicted_us,
            alternatives: Vec::new(),
        }
    }

    /// The fastest of `routes` (each a pipeline) at its best chunk size.
    pub(super) fn best_chunked(
        &self,
        src: usize,
        dst: usize,
        bytes: u64,
        strategy: Strategy,
        routes: &[Route],
        ways: Ways,
    ) -> Option<Plan> {
        let mut best: Option<(f64, Route, u64)> = None;
        for &route in routes {
            let Some(h) = self.hops(route, src, dst, ways) else {
                continue;
            };
            for target in Self::chunk_targets(bytes) {
                let time = h.pipelined_us(&h.costs, h.issue_us, bytes, target);
                if best.is_none_or(|(t, _, _)| time < t) {
                    best = Some((time, route, target));
                }
            }
        }
        let (predicted_us, route, target) = best?;
        Some(Plan {
            chunk_bytes: chunking(bytes, target).0,
            ..self.single(src, dst, bytes, strategy, route, predicted_us)
        })
    }
}
