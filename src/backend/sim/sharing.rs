//! Max-min fair sharing of resources among concurrent transfers (progressive filling).
//!
//! All unfrozen flows grow at the same pace until a resource fills up or a flow reaches its own
//! cap; those flows freeze and the rest keep growing. The result is the unique max-min fair
//! allocation: no flow can get more without taking from a flow that has less.

use super::links::ResourceId;

/// One transfer: the resources it crosses and its own cap (bytes per µs, may be infinite).
pub(super) struct Demand<'a> {
    pub resources: &'a [ResourceId],
    pub cap: f64,
}

/// Rates for `flows` over resources of the given capacities (same unit as the capacities).
pub(super) fn max_min_rates(capacity: &[f64], flows: &[Demand<'_>]) -> Vec<f64> {
    let mut rate = vec![0.0; flows.len()];
    let mut frozen = vec![false; flows.len()];
    let mut left: Vec<f64> = capacity.to_vec();
    let mut users = vec![0usize; capacity.len()];
    for f in flows {
        for &r in f.resources {
            users[r] += 1;
        }
    }
    let mut touched: Vec<ResourceId> = flows
        .iter()
        .flat_map(|f| f.resources.iter().copied())
        .collect();
    touched.sort_unstable();
    touched.dedup();
    let mut active = flows.len();
    while active > 0 {
        let mut step = f64::INFINITY;
        for &r in &touched {
            if users[r] > 0 {
                step = step.min(left[r] / users[r] as f64);
            }
        }
        for (i, f) in flows.iter().enumerate() {
            if !frozen[i] {
                step = step.min(f.cap - rate[i]);
            }
        }
        if !step.is_finite() {
            // Neither a resource nor a cap limits what is left: nothing real looks like this,
            // since every path crosses at least one resource.
            for (i, r) in rate.iter_mut().enumerate() {
                if !frozen[i] {
                    *r = f64::INFINITY;
                }
            }
            break;
        }
        for (i, f) in flows.iter().enumerate() {
            if !frozen[i] {
                rate[i] += step;
                for &r in f.resources {
                    left[r] -= step;
                }
            }
        }
        let full = |r: ResourceId| left[r] <= capacity[r] * 1e-12;
        for (i, f) in flows.iter().enumerate() {
            if frozen[i] {
                continue;
            }
            let capped = rate[i] >= f.cap * (1.0 - 1e-12);
            if capped || f.resources.iter().any(|&r| full(r)) {
                frozen[i] = true;
                active -= 1;
                for &r in f.resources {
                    users[r] -= 1;
                }
            }
        }
    }
    rate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(resources: &[ResourceId], cap: f64) -> Demand<'_> {
        Demand { resources, cap }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn two_flows_out_of_one_port_each_get_half() {
        // resource 0: the shared egress port; 1 and 2: two distinct ingress ports.
        let cap = [400.0, 400.0, 400.0];
        let r = max_min_rates(
            &cap,
            &[
                demand(&[0, 1], f64::INFINITY),
                demand(&[0, 2], f64::INFINITY),
            ],
        );
        assert!(close(r[0], 200.0) && close(r[1], 200.0), "{r:?}");
    }

    #[test]
    fn a_capped_flow_leaves_the_rest_to_the_other() {
        let cap = [100.0];
        let r = max_min_rates(&cap, &[demand(&[0], 30.0), demand(&[0], f64::INFINITY)]);
        assert!(close(r[0], 30.0) && close(r[1], 70.0), "{r:?}");
    }

    #[test]
    fn flows_on_disjoint_routes_do_not_slow_each_other() {
        let cap = [100.0, 50.0];
        let r = max_min_rates(
            &cap,
            &[demand(&[0], f64::INFINITY), demand(&[1], f64::INFINITY)],
        );
        assert!(close(r[0], 100.0) && close(r[1], 50.0), "{r:?}");
    }

    #[test]
    fn a_flow_bottlenecked_elsewhere_frees_share_on_a_common_resource() {
        // Flow 0 crosses 0 and the narrow 1; flow 1 only crosses 0: it gets what flow 0 cannot use.
        let cap = [100.0, 10.0];
        let r = max_min_rates(
            &cap,
            &[demand(&[0, 1], f64::INFINITY), demand(&[0], f64::INFINITY)],
        );
        assert!(close(r[0], 10.0) && close(r[1], 90.0), "{r:?}");
    }

    #[test]
    fn three_way_sharing_with_a_chain() {
        // Classic example: A over 0 and 1, B over 0, C over 1; all capacities 1 -> all get 1/2.
        let cap = [1.0, 1.0];
        let r = max_min_rates(
            &cap,
            &[
                demand(&[0, 1], f64::INFINITY),
                demand(&[0], f64::INFINITY),
                demand(&[1], f64::INFINITY),
            ],
        );
        for x in r {
            assert!(close(x, 0.5), "{x}");
        }
    }
}
