//! The group on 127.0.0.1: ranks as threads of the test, and hand-played ranks (raw sockets
//! speaking the rendezvous' messages) that die or fall silent on cue.

use super::wire::{self, Message};
use super::*;
use crate::Error;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::thread;
use std::time::{Duration, Instant};

/// A port nobody listens on now (the kernel's pick), so that tests running at once do not meet.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn rendezvous(timeout_ms: u64) -> Rendezvous {
    Rendezvous {
        addr: ([127, 0, 0, 1], free_port()).into(),
        timeout: Duration::from_millis(timeout_ms),
    }
}

fn identity(rank: usize, world: usize) -> Identity {
    Identity {
        rank,
        world,
        local_rank: rank,
        local_world: world,
    }
}

/// Runs `body` on every rank of a group of `world` threads; what each returned, by rank.
pub(crate) fn on_ranks<T: Send + 'static>(
    world: usize,
    rendezvous: &Rendezvous,
    body: impl Fn(Group) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let threads: Vec<_> = (0..world)
        .map(|rank| {
            let (rendezvous, body) = (rendezvous.clone(), body.clone());
            thread::spawn(move || body(Group::join(identity(rank, world), &rendezvous).unwrap()))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn group_error(result: crate::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(Error::Group(sentence)) => {
            assert!(!sentence.contains('\n'), "one sentence: {sentence}");
            sentence
        }
        other => panic!("expected the group to fail, got {other:?}"),
    }
}

#[test]
fn all_gather_broadcast_and_barrier_round_trip() {
    let rendezvous = rendezvous(5000);
    let outcomes = on_ranks(4, &rendezvous, |group| {
        let me = group.identity().rank;
        assert_eq!(group.members().len(), 4);
        assert!(group.same_host((me + 1) % 4));
        let gathered = group.all_gather(&vec![me as u8; me * 10]).unwrap();
        for (rank, part) in gathered.iter().enumerate() {
            assert_eq!(part, &vec![rank as u8; rank * 10]);
        }
        let id = (me == 2).then_some(&b"nccl-unique-id"[..]);
        assert_eq!(group.broadcast(2, id).unwrap(), b"nccl-unique-id");
        for _ in 0..20 {
            group.barrier().unwrap();
        }
        let members: Vec<usize> = group.members().iter().map(|m| m.identity.rank).collect();
        (members, group.members()[me].pid)
    });
    for (members, pid) in outcomes {
        assert_eq!(members, vec![0, 1, 2, 3]);
        assert_eq!(pid, std::process::id());
    }
}

#[test]
fn file_descriptors_pass_between_ranks_of_one_host() {
    let rendezvous = rendezvous(5000);
    on_ranks(3, &rendezvous, |group| {
        let me = group.identity().rank;
        let (next, previous) = ((me + 1) % 3, (me + 2) % 3);
        // Each rank passes the read ends of two pipes it wrote into to the next rank, twice.
        for round in 0..2 {
            let mut ends = Vec::new();
            for pipe in 0..2 {
                let (reader, mut writer) = std::io::pipe().unwrap();
                writeln!(writer, "rank {me} round {round} pipe {pipe}").unwrap();
                ends.push(reader);
            }
            let borrowed: Vec<_> = ends.iter().map(|end| end.as_fd()).collect();
            group.send_fds(next, &borrowed).unwrap();
            drop(ends); // the receiver holds its own descriptors
            let fds = group.recv_fds(previous, 2).unwrap();
            for (pipe, fd) in fds.into_iter().enumerate() {
                let mut text = String::new();
                std::fs::File::from(fd).read_to_string(&mut text).unwrap();
                assert_eq!(text, format!("rank {previous} round {round} pipe {pipe}\n"));
            }
        }
        group.barrier().unwrap();
    });
}

#[test]
fn wrong_fd_passings_are_refused() {
    let rendezvous = rendezvous(1000);
    let outcomes = on_ranks(2, &rendezvous, |group| {
        let me = group.identity().rank;
        let usage = [
            group.send_fds(me, &[]).map(drop),
            group.send_fds(5, &[]).map(drop),
            group.send_fds(1 - me, &[]).map(drop),
            group.recv_fds(1 - me, 0).map(drop),
        ];
        assert!(
            usage.iter().all(|r| matches!(r, Err(Error::Usage(_)))),
            "{usage:?}"
        );
        if me == 0 {
            let (reader, _writer) = std::io::pipe().unwrap();
            group.send_fds(1, &[reader.as_fd()]).unwrap();
            group.barrier().unwrap();
            // Alive, but passing nothing while rank 1 waits.
            thread::sleep(Duration::from_millis(1200));
            group.barrier().unwrap();
            None
        } else {
            // Rank 0 passes one where two are taken.
            let mismatch = group_error(group.recv_fds(0, 2));
            group.barrier().unwrap();
            // And none at all within the timeout.
            let start = Instant::now();
            let late = group_error(group.recv_fds(0, 1));
            assert!(start.elapsed() < Duration::from_secs(3));
            group.barrier().unwrap();
            Some((mismatch, late))
        }
    });
    let (mismatch, late) = outcomes[1].clone().unwrap();
    assert!(
        mismatch.contains("rank 0 passed 1 file descriptors where rank 1 takes 2"),
        "{mismatch}"
    );
    assert!(
        late.contains("rank 0 passed rank 1 no file descriptors within 1 s"),
        "{late}"
    );
}

#[test]
fn a_rank_that_never_arrives_fails_every_rank_naming_it() {
    let rendezvous = rendezvous(1000);
    let start = Instant::now();
    let threads: Vec<_> = [0, 1]
        .into_iter()
        .map(|rank| {
            let rendezvous = rendezvous.clone();
            thread::spawn(move || group_error(Group::join(identity(rank, 3), &rendezvous)))
        })
        .collect();
    for thread in threads {
        let sentence = thread.join().unwrap();
        assert!(
            sentence.starts_with("rank 2 of 3 did not join the rendezvous"),
            "{sentence}"
        );
        assert!(sentence.contains("within 1 s"), "{sentence}");
    }
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn without_rank_zero_the_others_give_up_within_the_timeout() {
    let rendezvous = rendezvous(1000);
    let start = Instant::now();
    let sentence = group_error(Group::join(identity(1, 2), &rendezvous));
    assert!(
        sentence.starts_with("cannot reach rank 0's rendezvous at 127.0.0.1:"),
        "{sentence}"
    );
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn processes_of_another_world_are_turned_away() {
    let rendezvous = rendezvous(1000);
    let stray = {
        let rendezvous = rendezvous.clone();
        thread::spawn(move || group_error(Group::join(identity(1, 3), &rendezvous)))
    };
    let zero = group_error(Group::join(identity(0, 2), &rendezvous));
    let stray = stray.join().unwrap();
    assert!(
        stray.contains("says rank 1 of 3, where rank 0 has a world of 2"),
        "{stray}"
    );
    assert!(zero.starts_with("rank 1 of 2 did not join"), "{zero}");
    assert!(zero.contains("rank 0 turned away"), "{zero}");
}

/// Rank 1 of 2 played by hand: joins, then does what the test says.
fn hand_played_rank_one(rendezvous: &Rendezvous) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(5);
    let stream = loop {
        match TcpStream::connect(rendezvous.addr) {
            Ok(stream) => break stream,
            Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("{e}"),
        }
    };
    let member = Member {
        identity: identity(1, 2),
        pid: 1,
        host: "elsewhere".into(),
        host_id: "another-kernel".into(),
    };
    let hello = Message::Hello {
        member,
        fd_socket: "none".into(),
    };
    wire::send(&stream, &hello).unwrap();
    loop {
        match wire::receive(&stream).unwrap() {
            Some(Message::Welcome { .. }) => return stream,
            Some(Message::Heartbeat) => continue,
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_rank_that_dies_mid_run_fails_the_pending_call() {
    let rendezvous = rendezvous(2000);
    let zero = {
        let rendezvous = rendezvous.clone();
        thread::spawn(move || {
            let group = Group::join(identity(0, 2), &rendezvous).unwrap();
            assert!(!group.same_host(1));
            let start = Instant::now();
            let sentence = group_error(group.barrier());
            (sentence, start.elapsed(), group_error(group.barrier()))
        })
    };
    let stream = hand_played_rank_one(&rendezvous);
    thread::sleep(Duration::from_millis(100));
    drop(stream); // no goodbye: as the kernel closes a killed process's sockets
    let (sentence, took, next) = zero.join().unwrap();
    assert!(
        sentence.starts_with("rank 1 left the group during barrier: its connection closed"),
        "{sentence}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(next, sentence, "later calls fail with the same sentence");
}

#[test]
fn a_silent_rank_is_taken_for_hung_within_the_timeout() {
    let rendezvous = rendezvous(1000);
    let zero = {
        let rendezvous = rendezvous.clone();
        thread::spawn(move || {
            let group = Group::join(identity(0, 2), &rendezvous).unwrap();
            let start = Instant::now();
            (group_error(group.all_gather(b"x")), start.elapsed())
        })
    };
    // Joined, connected, and silent from then on: what SIGSTOP makes of a rank.
    let _stream = hand_played_rank_one(&rendezvous);
    let (sentence, took) = zero.join().unwrap();
    assert!(
        sentence.starts_with("rank 1 stopped answering"),
        "{sentence}"
    );
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

#[test]
fn a_silent_rank_zero_is_taken_for_hung_by_the_others() {
    let rendezvous = rendezvous(1000);
    let listener = TcpListener::bind(rendezvous.addr).unwrap();
    let one = {
        let rendezvous = rendezvous.clone();
        thread::spawn(move || {
            let group = Group::join(identity(1, 2), &rendezvous).unwrap();
            let start = Instant::now();
            (group_error(group.barrier()), start.elapsed())
        })
    };
    // Rank 0 played by hand: welcomes rank 1, then says nothing.
    let (stream, _) = listener.accept().unwrap();
    let Some(Message::Hello { member, fd_socket }) = wire::receive(&stream).unwrap() else {
        panic!("a hello first")
    };
    let zero = Member {
        identity: identity(0, 2),
        ..member.clone()
    };
    let welcome = Message::Welcome {
        members: vec![zero, member],
        fd_sockets: vec!["none".into(), fd_socket],
    };
    wire::send(&stream, &welcome).unwrap();
    let (sentence, took) = one.join().unwrap();
    assert!(
        sentence.starts_with("rank 0 stopped answering"),
        "{sentence}"
    );
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

#[test]
fn a_rank_that_does_not_reach_a_call_is_named() {
    let rendezvous = rendezvous(1000);
    let outcomes = on_ranks(3, &rendezvous, |group| {
        let me = group.identity().rank;
        let start = Instant::now();
        let outcome = if me == 2 {
            // Alive (its heartbeats go on) but busy elsewhere for longer than the timeout.
            thread::sleep(Duration::from_millis(3000));
            group_error(group.barrier())
        } else {
            group_error(group.barrier())
        };
        (outcome, start.elapsed())
    });
    for (rank, (sentence, took)) in outcomes.iter().enumerate() {
        assert!(
            sentence.starts_with("rank 2 did not reach barrier within 1 s"),
            "rank {rank}: {sentence}"
        );
        if rank != 2 {
            assert!(*took < Duration::from_millis(2500), "rank {rank}: {took:?}");
        }
    }
}

#[test]
fn calls_out_of_order_and_early_leavers_fail_the_group() {
    let rendezvous = rendezvous(2000);
    let outcomes = on_ranks(2, &rendezvous, |group| match group.identity().rank {
        0 => group_error(group.barrier()),
        _ => group_error(group.all_gather(b"x")),
    });
    for sentence in outcomes {
        assert!(
            sentence.contains("every rank must make the same group calls"),
            "{sentence}"
        );
    }

    let rendezvous = self::rendezvous(2000);
    let outcomes = on_ranks(2, &rendezvous, |group| match group.identity().rank {
        0 => {
            thread::sleep(Duration::from_millis(200));
            Some(group_error(group.barrier()))
        }
        _ => None, // drops the group: a goodbye, then gone
    });
    let sentence = outcomes[0].clone().unwrap();
    assert!(
        sentence.starts_with("rank 1 left the group (it dropped it, done) before barrier"),
        "{sentence}"
    );
}

#[test]
fn a_group_that_finishes_together_fails_nobody() {
    let rendezvous = rendezvous(300);
    on_ranks(3, &rendezvous, |group| {
        group.barrier().unwrap();
        // The ranks drop the group at different times: goodbyes, not failures.
        thread::sleep(Duration::from_millis(100 * group.identity().rank as u64));
    });
}

#[test]
fn too_much_for_the_rendezvous_is_refused() {
    let group = Group::join(identity(0, 1), &rendezvous(100)).unwrap();
    let huge = vec![0u8; MAX_MESSAGE];
    assert!(matches!(group.all_gather(&huge), Err(Error::Usage(_))));
    assert!(matches!(group.broadcast(1, None), Err(Error::Usage(_))));
    assert!(matches!(group.broadcast(0, None), Err(Error::Usage(_))));
}

#[test]
fn rank_0_may_hold_the_rendezvous_at_a_port_it_bound_itself() {
    // The kernel's pick of port, told the others out of band (as the NCCL-API library does).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let timeout = Duration::from_secs(5);
    let others: Vec<_> = (1..3)
        .map(|rank| {
            thread::spawn(move || {
                let group = Group::join(identity(rank, 3), &Rendezvous { addr, timeout }).unwrap();
                group.all_gather(&[rank as u8]).unwrap()
            })
        })
        .collect();
    let zero = Group::join_listening(identity(0, 3), listener, timeout).unwrap();
    let gathered = zero.all_gather(&[0]).unwrap();
    assert_eq!(gathered, vec![vec![0], vec![1], vec![2]]);
    for other in others {
        assert_eq!(other.join().unwrap(), gathered);
    }
    let spare = TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = group_error(Group::join_listening(identity(1, 2), spare, timeout));
    assert!(refused.contains("rank 0 holds"), "{refused}");
}
