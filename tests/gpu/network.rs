//! The real host's NICs and NCCL's view of them (issue 17, point 3): read from this host's sysfs,
//! the real GPUs' PCI addresses joined with a fake sysfs tree, and NCCL's topology dump.

use super::open;
use peerlink::backend::Backend;
use peerlink::document::topo::TopoDocument;
use peerlink::launch::nccl_topology;
use peerlink::topology::nccl_view::NcclView;
use peerlink::topology::pci::PciAddress;
use peerlink::topology::sysfs::Sysfs;
use peerlink::topology::{nics, Link};
use std::path::Path;

#[test]
#[ignore = "needs a GPU"]
fn the_hosts_nics_come_from_its_sysfs() {
    let b = open();
    let t = b.topology();
    let net = t.network.as_ref().expect("a real host reads its NICs");
    println!("{}", serde_json::to_string_pretty(net).unwrap());
    assert_eq!(net.source, "sysfs");
    assert_eq!(net.hosts.len(), 1);
    assert_eq!(net.hosts[0].gpus.len(), t.devices.len());
    assert!(
        net.gpudirect.how.contains("nvidia-peermem"),
        "{}",
        net.gpudirect.how
    );
    let all: Vec<usize> = (0..t.devices.len()).collect();
    let text = peerlink::report::topo::text(&TopoDocument::new(t, &all));
    if net.nics.is_empty() {
        // The lent H200s are VMs without RDMA NICs.
        assert!(text.contains("no RDMA NIC found"), "{text}");
    } else {
        // Every GPU is placed in the PCI tree next to every NIC that is.
        assert!(text.contains("RDMA NICs (sysfs)"), "{text}");
        for g in 0..t.devices.len() {
            assert!(net.nearest(g).is_some(), "GPU {g} has no class to any NIC");
        }
    }
}

/// A fake tree with this GPU's real PCI address under a switch and a NIC under the same switch.
fn beside_a_fake_nic(dir: &Path, bus_id: &str) {
    let bdf = PciAddress::parse(bus_id)
        .expect("the driver's bus id")
        .sysfs_form();
    let switch = "pci0000:00/0000:00:01.0/0000:f0:00.0";
    for (name, path) in [
        (bdf.as_str(), format!("{switch}/0000:f1:00.0/{bdf}")),
        (
            "0000:f3:00.0",
            format!("{switch}/0000:f1:01.0/0000:f3:00.0"),
        ),
    ] {
        let real = dir.join("sys/devices").join(&path);
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("numa_node"), "0\n").unwrap();
        let link = dir.join("sys/bus/pci/devices").join(name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&real, link).unwrap();
    }
    let nic = dir.join("sys/class/infiniband/mlx5_0");
    std::fs::create_dir_all(nic.join("ports/1")).unwrap();
    std::fs::write(nic.join("ports/1/rate"), "400 Gb/sec (4X NDR)\n").unwrap();
    std::os::unix::fs::symlink(
        dir.join(format!("sys/devices/{switch}/0000:f1:01.0/0000:f3:00.0")),
        nic.join("device"),
    )
    .unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn the_real_gpus_addresses_find_their_place_in_a_sysfs_tree() {
    let b = open();
    let gpu = &b.topology().devices[..1];
    let dir = tempfile::tempdir().unwrap();
    beside_a_fake_nic(dir.path(), &gpu[0].pci_bus_id);
    let net = nics::discover(&Sysfs::at(dir.path()), gpu);
    let nearest = net.nearest(0).expect("GPU 0 found in the tree");
    assert_eq!((nearest.link, nearest.gpudirect_benefit), (Link::Pix, true));
    assert_eq!(net.nics[0].rate_gbit, Some(400.0));
}

#[test]
#[ignore = "needs a GPU"]
fn nccl_topology_dump_names_every_gpu() {
    let b = open();
    let devices: Vec<usize> = (0..b.topology().devices.len()).collect();
    if let Err(why) = b.collectives().nccl() {
        eprintln!("skipped: NCCL is not available here: {why}");
        return;
    }
    let (xml, file) = nccl_topology::run_nccl(&b, &devices).unwrap();
    assert!(xml.contains("<system"), "{xml}");
    let view = NcclView::compare(&xml, &file.display().to_string(), b.topology()).unwrap();
    let mut doc = TopoDocument::new(b.topology(), &devices);
    doc.nccl = Some(view.clone());
    println!("{}", peerlink::report::topo::text(&doc));
    let mut seen: Vec<usize> = view.gpus.iter().filter_map(|g| g.index).collect();
    seen.sort_unstable();
    assert_eq!(
        seen, devices,
        "every GPU of NCCL's dump is one of peerlink's"
    );
    assert!(
        view.disagreements
            .iter()
            .all(|d| !d.contains("NCCL sees a GPU")),
        "{:#?}",
        view.disagreements
    );
}
