//! Groups (`ncclGroupStart` … `ncclGroupEnd`), per thread: the all-reduces held from the
//! group's first one, and what its end serves or forwards whole (see the module above).

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};

use super::comm::{Clique, Comm, Peers, State};
use super::windows::HeldWindow;
use super::{
    capturable, capturing, run_clique, run_lone, server, AllReduce, Real, Server, SUCCESS,
};
use crate::stats::Route;

/// An all-reduce held in a group, with the call that forwards it to NCCL.
pub struct Held {
    pub call: AllReduce,
    pub forward: Box<dyn FnOnce() -> i32>,
}

/// The first of two result codes that is a failure, else success.
fn first_failure(first: i32, then: i32) -> i32 {
    if first != SUCCESS {
        first
    } else {
        then
    }
}

/// This thread's group: how deep, what is held, and whether some call of it reached NCCL
/// already (then the rest goes there as it comes).
#[derive(Default)]
struct Group {
    depth: u32,
    held: Vec<Held>,
    forwarded: bool,
    /// Symmetric windows registered in the group, adopted at its end.
    windows: Vec<HeldWindow>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Whether this thread is inside a group.
pub fn in_group() -> bool {
    GROUP.try_with(|g| g.borrow().depth > 0).unwrap_or(false)
}

/// `ncclGroupStart`: NCCL's, and one level deeper here.
pub fn group_start(real: &dyn Real) -> i32 {
    let code = real.group_start();
    if code == SUCCESS {
        let _ = GROUP.try_with(|g| g.borrow_mut().depth += 1);
    }
    code
}

/// Forwards what the group holds, in order (inside NCCL's group, still open); the first failure's
/// code, else success.
fn flush(group: &mut Group) -> i32 {
    group.forwarded = true;
    forward_all(std::mem::take(&mut group.held))
}

/// Forwards `held`, in order: the first failure's code, else success.
fn forward_all(held: Vec<Held>) -> i32 {
    let mut code = SUCCESS;
    for held in held {
        held.call.count_as(Route::Forwarded);
        code = first_failure(code, (held.forward)());
    }
    code
}

/// A call of another kind than all-reduce that a group may hold (a collective, a send or
/// receive, a communicator's creation, a registration): what the group held goes to NCCL first,
/// then this call, so NCCL sees every call in the caller's order.
pub fn other_call(forward: impl FnOnce() -> i32) -> i32 {
    let flushed = GROUP
        .try_with(|g| {
            let mut group = g.borrow_mut();
            if group.depth == 0 {
                return SUCCESS;
            }
            flush(&mut group)
        })
        .unwrap_or(SUCCESS);
    let code = forward();
    first_failure(flushed, code)
}

/// Holds `window` to the end of this thread's group; gives it back outside any group.
pub fn hold_window(window: HeldWindow) -> Option<HeldWindow> {
    let mut window = Some(window);
    let _ = GROUP.try_with(|g| {
        let mut group = g.borrow_mut();
        if group.depth > 0 {
            group.windows.extend(window.take());
        }
    });
    window
}

/// `ncclGroupSimulateEnd`: NCCL simulates the group as NCCL holds it, so what this group held
/// goes to NCCL first; the group ends there.
pub fn group_simulate_end(forward: impl FnOnce() -> i32) -> i32 {
    let flushed = GROUP
        .try_with(|g| {
            let mut group = g.borrow_mut();
            let code = if group.held.is_empty() {
                SUCCESS
            } else {
                flush(&mut group)
            };
            group.depth = group.depth.saturating_sub(1);
            if group.depth == 0 {
                group.forwarded = false;
                // A simulated group registers nothing.
                group.windows.clear();
            }
            code
        })
        .unwrap_or(SUCCESS);
    let code = forward();
    first_failure(flushed, code)
}

/// `ncclAllReduce`: served, held (inside a group), or forwarded.
pub fn all_reduce(real: &dyn Real, call: AllReduce, forward: Box<dyn FnOnce() -> i32>) -> i32 {
    let server = server();
    let mut forward = Some(forward);
    // Inside a group: `Some(None)` held, `Some(Some(code))` what the group held was forwarded.
    let in_group = GROUP.try_with(|g| {
        let mut group = g.borrow_mut();
        if group.depth == 0 {
            return None;
        }
        if !group.forwarded && server.candidate(&call) {
            let forward = forward.take().expect("taken once");
            group.held.push(Held { call, forward });
            return Some(None);
        }
        Some(Some(flush(&mut group)))
    });
    let forward = match (in_group, forward) {
        (Ok(Some(None)), _) | (_, None) => return SUCCESS,
        (Ok(Some(Some(flushed))), Some(forward)) => {
            call.count_as(Route::Forwarded);
            let code = forward();
            return first_failure(flushed, code);
        }
        // Outside any group (or while this thread's locals are torn down).
        (_, Some(forward)) => forward,
    };
    server.serve_lone(real, &call).unwrap_or_else(|| {
        call.count_as(Route::Forwarded);
        forward()
    })
}

/// `ncclGroupEnd`: at the outermost end, the held all-reduces served, or forwarded whole.
pub fn group_end(real: &dyn Real) -> i32 {
    let taken = GROUP.try_with(|g| {
        let mut group = g.borrow_mut();
        group.depth = group.depth.saturating_sub(1);
        if group.depth > 0 {
            return None;
        }
        group.forwarded = false;
        Some((
            std::mem::take(&mut group.held),
            std::mem::take(&mut group.windows),
        ))
    });
    let (held, windows) = match taken {
        Ok(Some(taken)) if !taken.0.is_empty() || !taken.1.is_empty() => taken,
        _ => return real.group_end(),
    };
    // NCCL's group holds none of the all-reduces: close it (which registers the windows), adopt
    // the windows, then set up and serve, or forward the all-reduces as a group of their own.
    let closed = real.group_end();
    if closed != SUCCESS {
        return closed;
    }
    server().register_windows(real, windows);
    if held.is_empty() {
        return SUCCESS;
    }
    if let Some(code) = server().serve_group(real, &held) {
        return code;
    }
    let started = real.group_start();
    let code = first_failure(started, forward_all(held));
    first_failure(code, real.group_end())
}

impl Server {
    /// A group's held all-reduces (every one a candidate): served where they are one call, or
    /// one per rank of one served communicator's clique, all alike; `None` to forward them whole.
    fn serve_group(&self, real: &dyn Real, held: &[Held]) -> Option<i32> {
        let backend = self.backend()?;
        let calls: Vec<AllReduce> = held.iter().map(|h| h.call).collect();
        if (1..calls.len()).any(|i| calls[..i].iter().any(|c| c.comm == calls[i].comm)) {
            return None;
        }
        let entries: Vec<Arc<Mutex<Comm>>> = calls
            .iter()
            .map(|c| self.comm(real, c.comm))
            .collect::<Option<_>>()?;
        let mut guards: Vec<MutexGuard<'_, Comm>> = entries
            .iter()
            .map(|e| e.lock().ok())
            .collect::<Option<_>>()?;
        let captured =
            (0..guards.len()).any(|i| capturing(backend, &mut guards[i], calls[i].stream));
        let pending: Vec<usize> = (0..guards.len())
            .filter(|&i| matches!(guards[i].state, State::Pending))
            .collect();
        // A set-up waits for its all-gather on the host, which no capture allows.
        if captured && !pending.is_empty() {
            return None;
        }
        if !pending.is_empty() {
            let streams: Vec<u64> = pending.iter().map(|&i| calls[i].stream).collect();
            let mut comms: Vec<&mut Comm> = guards
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| pending.contains(i))
                .map(|(_, g)| &mut **g)
                .collect();
            self.set_up(backend, real, &mut comms, &streams);
        }
        let peers: Vec<Peers> = guards
            .iter()
            .map(|comm| comm.served_peers())
            .collect::<Option<_>>()?;
        if let ([peers], [call]) = (&peers[..], &calls[..]) {
            if captured && !capturable(backend, &mut guards[0], call) {
                return None;
            }
            let outcome = run_lone(
                backend,
                self.model(backend),
                &mut guards[0],
                peers.clone(),
                call,
            );
            return Some(self.result(call, outcome));
        }
        let clique = one_clique(&peers, &calls)?;
        let mut comms: Vec<&mut Comm> = guards.iter_mut().map(|g| &mut **g).collect();
        let outcome = run_clique(backend, &clique, &mut comms, &calls, captured)?;
        for call in &calls[1..] {
            call.count_as(Route::Served);
        }
        Some(self.result(&calls[0], outcome))
    }
}

/// The clique every call's communicator belongs to, where the calls are one per rank of it and
/// alike (count, type, operation); `None` otherwise.
fn one_clique(peers: &[Peers], calls: &[AllReduce]) -> Option<Arc<Clique>> {
    let clique_of = |peers: &Peers| match peers {
        Peers::Threads(clique) => Some(clique.clone()),
        Peers::Alone | Peers::Processes => None,
    };
    let first = clique_of(peers.first()?)?;
    let same = peers
        .iter()
        .all(|p| clique_of(p).is_some_and(|c| Arc::ptr_eq(&c, &first)));
    let alike = calls
        .iter()
        .all(|c| (c.count, c.datatype, c.op) == (calls[0].count, calls[0].datatype, calls[0].op));
    (same && alike && calls.len() == first.gpus.len()).then_some(first)
}
