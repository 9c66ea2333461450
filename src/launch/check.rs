//! `peerlink ranks`: the group checked end to end — every rank's view gathered, a broadcast
//! echoed back, file descriptors passed around each host's ranks and read back, barriers timed.

use super::{Group, Launcher};
use crate::{Error, Result};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// How many barriers are timed.
const BARRIERS: usize = 20;

/// What the checks found.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Each rank's `CUDA_VISIBLE_DEVICES`, where set.
    pub visible_devices: Vec<Option<String>>,
    /// Whether a file descriptor reached each rank from the previous rank of its host and read
    /// back right; `None` for a rank alone on its host.
    pub fds: Vec<Option<bool>>,
    /// The median time of one barrier on rank 0's clock, in µs (control messages on this host's
    /// CPUs and network, measured).
    pub barrier_median_us: f64,
}

/// Runs the checks on every rank (each rank calls it).
pub fn run(group: &Group) -> Result<Report> {
    let me = group.identity().rank;
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let visible_devices = group
        .all_gather(visible.as_deref().unwrap_or("\u{0}").as_bytes())?
        .into_iter()
        .map(|bytes| match bytes.as_slice() {
            b"\0" => None,
            text => Some(String::from_utf8_lossy(text).into_owned()),
        })
        .collect();

    let token = format!("peerlink rank 0, pid {}", std::process::id());
    let received = group.broadcast(0, (me == 0).then_some(token.as_bytes()))?;
    let echoes = group.all_gather(&received)?;
    if let Some(rank) = echoes.iter().position(|echo| *echo != echoes[0]) {
        return Err(Error::Group(format!(
            "rank {rank} received other bytes from rank 0's broadcast than rank 0: report this \
             bug in peerlink's rendezvous"
        )));
    }

    let fd_verdict = pass_fds_around_host(group)?;
    let fds = group
        .all_gather(&[fd_verdict])?
        .into_iter()
        .map(|verdict| match verdict.as_slice() {
            [1] => Some(true),
            [2] => Some(false),
            _ => None,
        })
        .collect();

    let mut barrier_us = Vec::with_capacity(BARRIERS);
    for _ in 0..BARRIERS {
        let start = Instant::now();
        group.barrier()?;
        barrier_us.push(start.elapsed().as_secs_f64() * 1e6);
    }
    barrier_us.sort_by(f64::total_cmp);
    Ok(Report {
        visible_devices,
        fds,
        barrier_median_us: barrier_us[BARRIERS / 2],
    })
}

/// Keeps the group together for `hold` (rank 0's, so that every rank makes the same calls), a
/// barrier each second, until then or a stop is requested ([`crate::interrupt`]); the seconds
/// held.
pub fn hold(group: &Group, hold: Option<Duration>) -> Result<u64> {
    let seconds = hold.map_or(0, |hold| hold.as_secs_f64().ceil() as u64);
    let is_root = group.identity().rank == 0;
    let rounds = group.broadcast(0, is_root.then_some(&seconds.to_le_bytes()[..]))?;
    let rounds = u64::from_le_bytes(rounds.try_into().unwrap_or_default());
    for round in 0..rounds {
        std::thread::sleep(Duration::from_secs(1));
        if crate::interrupt::requested() {
            return Ok(round);
        }
        group.barrier()?;
    }
    Ok(rounds)
}

/// Each rank writes a line into a pipe and passes its read end to the next rank of its host,
/// which reads it back: 1 where the line read back right, 2 where not, 0 alone on the host.
fn pass_fds_around_host(group: &Group) -> Result<u8> {
    let me = group.identity().rank;
    let local: Vec<usize> = (0..group.identity().world)
        .filter(|&rank| rank == me || group.same_host(rank))
        .collect();
    if local.len() < 2 {
        return Ok(0);
    }
    let place = local
        .iter()
        .position(|&rank| rank == me)
        .expect("me among them");
    let next = local[(place + 1) % local.len()];
    let previous = local[(place + local.len() - 1) % local.len()];
    let line = |rank: usize| format!("peerlink rank {rank} passed this pipe\n");
    let io = |e: std::io::Error| Error::Group(format!("rank {me} cannot use a pipe: {e}"));
    let (reader, mut writer) = std::io::pipe().map_err(io)?;
    writer.write_all(line(me).as_bytes()).map_err(io)?;
    drop(writer);
    group.send_fds(next, &[reader.as_fd()])?;
    drop(reader);
    let received = group.recv_fds(previous, 1)?;
    let mut text = String::new();
    let read = received
        .into_iter()
        .next()
        .map(std::fs::File::from)
        .map(|mut file| file.read_to_string(&mut text));
    Ok(if matches!(read, Some(Ok(_))) && text == line(previous) {
        1
    } else {
        2
    })
}

/// The report as rank 0 prints it.
pub fn text(group: &Group, launcher: Launcher, report: &Report) -> String {
    let members = group.members();
    let mut out = format!(
        "{} ranks ({launcher}) met at the rendezvous; timeout {} s\n\n",
        members.len(),
        group.timeout().as_secs_f64()
    );
    let rows: Vec<[String; 6]> = members
        .iter()
        .zip(&report.visible_devices)
        .zip(&report.fds)
        .map(|((member, visible), fds)| {
            let id = member.identity;
            [
                id.rank.to_string(),
                format!("{}/{}", id.local_rank, id.local_world),
                member.host.clone(),
                member.pid.to_string(),
                visible.clone().unwrap_or_else(|| "-".into()),
                match fds {
                    Some(true) => "ok".into(),
                    Some(false) => "WRONG".into(),
                    None => "alone on host".into(),
                },
            ]
        })
        .collect();
    let header = [
        "rank",
        "local",
        "host",
        "pid",
        "CUDA_VISIBLE_DEVICES",
        "fd passing",
    ];
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in std::iter::once(header.map(String::from)).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&format!(
        "\nall_gather and broadcast: every rank got every rank's bytes\nbarrier: {:.0} µs median of \
         {BARRIERS} (measured on rank 0's clock: control messages only, no data)\n",
        report.barrier_median_us
    ));
    out
}
