//! A real host's RDMA NICs, read from sysfs: each entry of /sys/class/infiniband, its PCI function
//! (its `device` link, followed into /sys/devices), its first port, and the network interfaces on
//! the same function (/sys/class/net/*/device); each GPU's distance to each NIC in the PCI tree
//! ([`PciPlace`]); and whether GPUDirect RDMA is available ([`gpudirect`]).

use super::network::{GpuDirect, GpuNic, Host, Network, Nic};
use super::pci::{PciAddress, PciPlace};
use super::sysfs::Sysfs;
use super::Device;

/// The first Linux release with dma-buf for peer devices (`ibv_reg_dmabuf_mr`).
const DMA_BUF_KERNEL: (u32, u32) = (5, 12);

/// The NICs of this host and how `devices` reach them: one host, named from the kernel.
pub fn discover(sysfs: &Sysfs, devices: &[Device]) -> Network {
    let nics_at: Vec<(Nic, Option<PciPlace>)> = sysfs
        .entries("sys/class/infiniband")
        .into_iter()
        .enumerate()
        .map(|(index, name)| nic(sysfs, index, name))
        .collect();
    let gpus: Vec<(usize, Option<PciPlace>)> = devices
        .iter()
        .map(|d| (d.index, gpu_place(sysfs, &d.pci_bus_id)))
        .collect();
    let mut gpu_nics = Vec::new();
    for (gpu, gpu_at) in &gpus {
        for (nic, nic_at) in &nics_at {
            if let (Some(g), Some(n)) = (gpu_at, nic_at) {
                gpu_nics.push(GpuNic {
                    gpu: *gpu,
                    nic: nic.index,
                    link: g.class_to(n),
                });
            }
        }
    }
    let host = Host {
        index: 0,
        name: sysfs.host_name().unwrap_or_else(|| "this host".into()),
        gpus: devices.iter().map(|d| d.index).collect(),
        nics: (0..nics_at.len()).collect(),
    };
    let nics = nics_at.into_iter().map(|(nic, _)| nic).collect();
    Network::new("sysfs", vec![host], nics, gpu_nics, gpudirect(sysfs), None)
}

/// The device directory a sysfs link leads to, and its place in the PCI tree.
fn place_of(sysfs: &Sysfs, link: &str) -> Option<(String, PciPlace)> {
    let real = sysfs.resolve(link)?;
    let under = real.strip_prefix("sys/devices/")?;
    let parts: Vec<&str> = under.split('/').collect();
    let numa = sysfs
        .read(&format!("{real}/numa_node"))
        .and_then(|n| n.parse::<i32>().ok())
        .filter(|&n| n >= 0);
    Some((real.clone(), PciPlace::from_sysfs(&parts, numa)?))
}

fn gpu_place(sysfs: &Sysfs, bus_id: &str) -> Option<PciPlace> {
    let address = PciAddress::parse(bus_id)?;
    let link = format!("sys/bus/pci/devices/{}", address.sysfs_form());
    Some(place_of(sysfs, &link)?.1)
}

/// One RDMA device: its PCI function, its first port and its network interfaces.
fn nic(sysfs: &Sysfs, index: usize, name: String) -> (Nic, Option<PciPlace>) {
    let class = format!("sys/class/infiniband/{name}");
    let at = place_of(sysfs, &format!("{class}/device"));
    let function = at.as_ref().map(|(real, _)| real.clone());
    let netdevs = sysfs
        .entries("sys/class/net")
        .into_iter()
        .filter(|n| {
            function.is_some() && sysfs.resolve(&format!("sys/class/net/{n}/device")) == function
        })
        .collect();
    let mut ports: Vec<String> = sysfs.entries(&format!("{class}/ports"));
    ports.sort_by_key(|p| p.parse::<u32>().unwrap_or(u32::MAX));
    let port = |file: &str| {
        let first = ports.first()?;
        sysfs.read(&format!("{class}/ports/{first}/{file}"))
    };
    let nic = Nic {
        index,
        host: 0,
        pci_bus_id: function
            .as_deref()
            .and_then(|f| f.rsplit('/').next())
            .map(str::to_string),
        numa_node: at.as_ref().and_then(|(_, p)| p.numa_node),
        netdevs,
        link_layer: port("link_layer"),
        // "400 Gb/sec (4X NDR)"
        rate_gbit: port("rate").and_then(|r| r.split_whitespace().next()?.parse().ok()),
        // "4: ACTIVE"
        state: port("state").map(|s| s.rsplit(':').next().unwrap_or(&s).trim().to_string()),
        rail: None,
        name,
    };
    (nic, at.map(|(_, place)| place))
}

/// Whether the NICs can reach GPU memory directly, and how that was decided: the nvidia-peermem
/// module loaded (/sys/module/nvidia_peermem, or Mellanox's older nv_peer_mem), or dma-buf, which
/// needs a kernel of 5.12 or later (/proc/sys/kernel/osrelease) and NVIDIA's open kernel module
/// (/proc/driver/nvidia/version names it "Open Kernel Module").
pub fn gpudirect(sysfs: &Sysfs) -> GpuDirect {
    let peermem =
        sysfs.exists("sys/module/nvidia_peermem") || sysfs.exists("sys/module/nv_peer_mem");
    let kernel = sysfs.read("proc/sys/kernel/osrelease");
    let recent = kernel
        .as_deref()
        .and_then(kernel_version)
        .map(|v| v >= DMA_BUF_KERNEL);
    let open = sysfs
        .read("proc/driver/nvidia/version")
        .map(|v| v.contains("Open Kernel Module"));
    let dma_buf = match (recent, open) {
        (Some(true), Some(true)) => Some(true),
        (Some(false), _) | (_, Some(false)) => Some(false),
        _ => None,
    };
    let available = match dma_buf {
        _ if peermem => Some(true),
        Some(true) => Some(true),
        Some(false) => Some(false),
        None => None,
    };
    let (major, minor) = DMA_BUF_KERNEL;
    let how = format!(
        "nvidia-peermem {} (/sys/module/nvidia_peermem); dma-buf needs Linux ≥ {major}.{minor} \
         (here {}) and the NVIDIA open kernel module (here {})",
        if peermem { "loaded" } else { "not loaded" },
        kernel.as_deref().unwrap_or("unknown"),
        match open {
            Some(true) => "the open module",
            Some(false) => "the proprietary module",
            None => "no NVIDIA driver found in /proc/driver/nvidia/version",
        }
    );
    GpuDirect {
        available,
        peermem: Some(peermem),
        dma_buf,
        how,
    }
}

/// `6.8.0-45-generic` → (6, 8).
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    /// A fake sysfs tree, built file by file in a temporary directory.
    pub struct FakeSysfs {
        pub dir: tempfile::TempDir,
    }

    impl FakeSysfs {
        pub fn new() -> FakeSysfs {
            FakeSysfs {
                dir: tempfile::tempdir().expect("a temporary directory"),
            }
        }

        pub fn sysfs(&self) -> super::Sysfs {
            super::Sysfs::at(self.dir.path())
        }

        pub fn file(&self, relative: &str, text: &str) -> &Self {
            let path = self.dir.path().join(relative);
            std::fs::create_dir_all(path.parent().expect("a file in a directory")).unwrap();
            std::fs::write(path, format!("{text}\n")).unwrap();
            self
        }

        fn link(&self, relative: &str, target: &Path) {
            let path = self.dir.path().join(relative);
            std::fs::create_dir_all(path.parent().expect("a link in a directory")).unwrap();
            std::os::unix::fs::symlink(target, path).unwrap();
        }

        /// A PCI device at `path` under /sys/devices (`pci0000:00/0000:00:01.0/…`), on `numa`,
        /// listed in /sys/bus/pci/devices.
        pub fn pci(&self, path: &str, numa: i32) -> &Self {
            let real = format!("sys/devices/{path}");
            self.file(&format!("{real}/numa_node"), &numa.to_string());
            let name = path.rsplit('/').next().expect("a device name");
            self.link(
                &format!("sys/bus/pci/devices/{name}"),
                &self.dir.path().join(&real),
            );
            self
        }

        /// An RDMA NIC `name` on the PCI device at `path` (made with [`FakeSysfs::pci`]), one port
        /// at `rate`, with a network interface `netdev`.
        pub fn nic(&self, name: &str, path: &str, rate: &str, netdev: &str) -> &Self {
            let device = self.dir.path().join(format!("sys/devices/{path}"));
            let class = format!("sys/class/infiniband/{name}");
            self.link(&format!("{class}/device"), &device);
            self.file(&format!("{class}/ports/1/rate"), rate);
            self.file(&format!("{class}/ports/1/link_layer"), "InfiniBand");
            self.file(&format!("{class}/ports/1/state"), "4: ACTIVE");
            self.link(&format!("sys/class/net/{netdev}/device"), &device);
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::FakeSysfs;
    use super::*;
    use crate::topology::test_support::device;
    use crate::topology::Link;

    /// Two GPUs and the NIC placed by `nic_path`, on a fake host whose GPU 0 sits under the
    /// switch 0000:01:00.0 of socket 0 and GPU 1 under socket 1.
    fn host_with_nic(nic_path: &str, nic_numa: i32) -> (FakeSysfs, Vec<Device>) {
        let fake = FakeSysfs::new();
        fake.pci(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
            0,
        )
        .pci("pci0000:80/0000:80:01.0/0000:81:00.0", 1)
        .pci(nic_path, nic_numa)
        .nic("mlx5_0", nic_path, "400 Gb/sec (4X NDR)", "ibp4s0");
        let devices = vec![
            device(0, Some(0), "00000000:03:00.0"),
            device(1, Some(1), "00000000:81:00.0"),
        ];
        (fake, devices)
    }

    fn class_of(nic_path: &str, nic_numa: i32) -> Link {
        let (fake, devices) = host_with_nic(nic_path, nic_numa);
        let net = discover(&fake.sysfs(), &devices);
        net.gpu_nics
            .iter()
            .find(|g| g.gpu == 0)
            .expect("GPU 0 reaches the NIC")
            .link
    }

    #[test]
    fn each_pcie_class_is_read_from_the_tree() {
        let switch = "pci0000:00/0000:00:01.0/0000:01:00.0";
        for (path, numa, want) in [
            (format!("{switch}/0000:02:01.0/0000:04:00.0"), 0, Link::Pix),
            (
                format!("{switch}/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0"),
                0,
                Link::Pxb,
            ),
            ("pci0000:00/0000:00:02.0/0000:08:00.0".into(), 0, Link::Phb),
            ("pci0000:40/0000:40:01.0/0000:41:00.0".into(), 0, Link::Node),
            ("pci0000:c0/0000:c0:01.0/0000:c1:00.0".into(), 1, Link::Sys),
        ] {
            assert_eq!(class_of(&path, numa), want, "{path}");
        }
    }

    #[test]
    fn the_nic_is_described_as_sysfs_says() {
        let path = "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0";
        let (fake, devices) = host_with_nic(path, 0);
        fake.file("proc/sys/kernel/hostname", "node17");
        let net = discover(&fake.sysfs(), &devices);
        assert_eq!(net.source, "sysfs");
        assert_eq!(net.hosts[0].name, "node17");
        assert_eq!(net.hosts[0].gpus, vec![0, 1]);
        let nic = &net.nics[0];
        assert_eq!(nic.name, "mlx5_0");
        assert_eq!(nic.pci_bus_id.as_deref(), Some("0000:04:00.0"));
        assert_eq!(nic.numa_node, Some(0));
        assert_eq!(nic.netdevs, vec!["ibp4s0"]);
        assert_eq!(nic.rate_gbit, Some(400.0));
        assert_eq!(nic.link_layer.as_deref(), Some("InfiniBand"));
        assert_eq!(nic.state.as_deref(), Some("ACTIVE"));
        // GPU 0 shares the NIC's switch; GPU 1 is on the other socket: flagged.
        assert!(net.nearest(0).unwrap().gpudirect_benefit);
        let far = net.nearest(1).unwrap();
        assert_eq!(far.link, Link::Sys);
        assert!(!far.gpudirect_benefit);
    }

    #[test]
    fn a_host_without_infiniband_devices_has_no_nic() {
        let fake = FakeSysfs::new();
        fake.pci("pci0000:00/0000:00:06.0", 0);
        // A plain Ethernet interface is no RDMA NIC.
        fake.file("sys/class/net/eth0/operstate", "up");
        let devices = vec![device(0, Some(0), "00000000:00:06.0")];
        let net = discover(&fake.sysfs(), &devices);
        assert!(net.nics.is_empty());
        assert!(net.gpu_nics.is_empty());
        assert!(net.nearest(0).is_none());
        assert_eq!(net.hosts[0].gpus, vec![0]);
    }

    #[test]
    fn gpudirect_comes_from_peermem_or_dma_buf() {
        let decide = |files: &[(&str, &str)]| {
            let fake = FakeSysfs::new();
            for (path, text) in files {
                fake.file(path, text);
            }
            gpudirect(&fake.sysfs())
        };
        let open = (
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05",
        );
        let proprietary = (
            "proc/driver/nvidia/version",
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05",
        );
        let new_kernel = ("proc/sys/kernel/osrelease", "6.8.0-45-generic");
        let old_kernel = ("proc/sys/kernel/osrelease", "5.4.0-150-generic");

        let peermem = decide(&[("sys/module/nvidia_peermem/refcnt", "0"), proprietary]);
        assert_eq!(
            (peermem.available, peermem.peermem, peermem.dma_buf),
            (Some(true), Some(true), Some(false))
        );
        let dma_buf = decide(&[open, new_kernel]);
        assert_eq!(
            (dma_buf.available, dma_buf.dma_buf),
            (Some(true), Some(true))
        );
        assert!(dma_buf.how.contains("6.8.0-45-generic"), "{}", dma_buf.how);
        let neither = decide(&[open, old_kernel]);
        assert_eq!(
            (neither.available, neither.dma_buf),
            (Some(false), Some(false))
        );
        let unknown = decide(&[new_kernel]);
        assert_eq!((unknown.available, unknown.dma_buf), (None, None));
        assert!(unknown.how.contains("no NVIDIA driver"), "{}", unknown.how);
    }

    #[test]
    fn kernel_releases_read_as_major_minor() {
        assert_eq!(kernel_version("6.8.0-45-generic"), Some((6, 8)));
        assert_eq!(kernel_version("5.12"), Some((5, 12)));
        assert_eq!(kernel_version("5.15.0+"), Some((5, 15)));
        assert_eq!(kernel_version("weird"), None);
    }
}
