//! The host's own facts the doctor needs — the PCIe tree above each GPU, its links, the IOMMU, ACS,
//! signs of a virtual machine — read from Linux's sysfs and procfs through [`Sysfs`] (rooted at `/`
//! on the host itself, a fake tree in tests, or a tree captured from another host).
//!
//! Every reader answers `None` (or says why) where a file is missing or unreadable: a container, a
//! kernel without the file, or config space that only root may read. Nothing here writes.

use crate::topology::sysfs::Sysfs;
use crate::topology::PciAddress;

/// What the host's IOMMU does to a GPU's DMA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Iommu {
    /// No IOMMU groups: no IOMMU, or turned off.
    Off,
    /// Groups exist, and the GPU's DMA is not translated (`iommu=pt`, group type `identity`).
    Passthrough,
    /// The GPU's DMA is translated (group type `DMA` or `DMA-FQ`, or no `iommu=pt`): P2P between
    /// PCIe devices has to cross the IOMMU, which blocks or slows it.
    Translating,
    /// The device belongs to a VFIO or blocked group (handed to a guest, or not in use).
    Other(String),
}

/// A PCIe link as sysfs shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysfsLink {
    pub generation: u32,
    pub width: u32,
    pub max_generation: u32,
    pub max_width: u32,
}

/// The ACS control bits of a PCIe bridge (PCIe base spec, ACS Extended Capability).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcsControl(pub u16);

/// ACS control bits and lspci's names for them, in register order.
const ACS_BITS: [&str; 7] = [
    "SrcValid",
    "TransBlk",
    "ReqRedir",
    "CmpltRedir",
    "UpstreamFwd",
    "EgressCtrl",
    "DirectTrans",
];
const REQUEST_REDIRECT: u16 = 1 << 2;
const COMPLETION_REDIRECT: u16 = 1 << 3;

impl AcsControl {
    /// Whether peer requests or completions are redirected up to the root complex.
    pub fn redirects(self) -> bool {
        self.0 & (REQUEST_REDIRECT | COMPLETION_REDIRECT) != 0
    }

    /// As lspci prints it: `SrcValid+ TransBlk- ReqRedir+ …`.
    pub fn describe(self) -> String {
        ACS_BITS
            .iter()
            .enumerate()
            .map(|(bit, name)| {
                let on = self.0 & (1 << bit) != 0;
                format!("{name}{}", if on { '+' } else { '-' })
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A bridge's ACS, as far as it could be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acs {
    Control(AcsControl),
    /// The bridge has no ACS capability (nothing to redirect).
    Absent,
    /// Why it could not be read.
    Unreadable(String),
}

/// The ACS Extended Capability's id (PCIe base spec).
const ACS_CAPABILITY: u32 = 0x000D;
/// Where extended capabilities start in config space.
const EXTENDED_CAPABILITIES: usize = 0x100;

fn device_dir(address: PciAddress) -> String {
    format!("sys/bus/pci/devices/{}", address.sysfs_form())
}

/// The kernel's command line.
pub fn cmdline(files: &Sysfs) -> Option<String> {
    files.read("proc/cmdline")
}

/// The IOMMU parameters on the kernel's command line (`iommu=pt`, `intel_iommu=on`, …).
pub fn iommu_parameters(files: &Sysfs) -> Vec<String> {
    cmdline(files)
        .unwrap_or_default()
        .split_whitespace()
        .filter(|p| {
            ["iommu=", "intel_iommu=", "amd_iommu="]
                .iter()
                .any(|k| p.starts_with(k))
        })
        .map(str::to_string)
        .collect()
}

/// How many IOMMU groups the kernel made; `None` where sysfs has no such directory.
pub fn iommu_groups(files: &Sysfs) -> Option<usize> {
    files.count("sys/kernel/iommu_groups")
}

/// The IOMMU's treatment of one device, and the evidence it was read from.
pub fn iommu(files: &Sysfs, address: PciAddress) -> Option<(Iommu, String)> {
    let groups = iommu_groups(files)?;
    if groups == 0 {
        return Some((Iommu::Off, "/sys/kernel/iommu_groups is empty".into()));
    }
    let dir = device_dir(address);
    if let Some(kind) = files.read(&format!("{dir}/iommu_group/type")) {
        let state = match kind.as_str() {
            "identity" => Iommu::Passthrough,
            "DMA" | "DMA-FQ" => Iommu::Translating,
            other => Iommu::Other(other.to_string()),
        };
        return Some((
            state,
            format!("{}: iommu_group type `{kind}`", address.sysfs_form()),
        ));
    }
    // Kernels before 5.11 have no group type: the command line says whether it passes through.
    let parameters = iommu_parameters(files);
    let state = if parameters.iter().any(|p| p == "iommu=pt") {
        Iommu::Passthrough
    } else {
        Iommu::Translating
    };
    let shown = if parameters.is_empty() {
        "no iommu parameter".to_string()
    } else {
        parameters.join(" ")
    };
    Some((
        state,
        format!("{groups} IOMMU groups; /proc/cmdline: {shown}"),
    ))
}

/// The DMI system vendor and product name.
pub fn dmi(files: &Sysfs) -> (Option<String>, Option<String>) {
    (
        files.read("sys/class/dmi/id/sys_vendor"),
        files.read("sys/class/dmi/id/product_name"),
    )
}

/// Whether the CPU says it runs under a hypervisor (the `hypervisor` flag); `None` where
/// /proc/cpuinfo has no flags line.
pub fn hypervisor_flag(files: &Sysfs) -> Option<bool> {
    let cpuinfo = files.read("proc/cpuinfo")?;
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags"))?;
    Some(flags.split_whitespace().any(|f| f == "hypervisor"))
}

/// The PCI path from the host bridge down to a device: the host bridge's name (`pci0000:00`)
/// and the bridges above the device, topmost first (the device itself left out).
pub fn upstream(files: &Sysfs, address: PciAddress) -> Option<(String, Vec<PciAddress>)> {
    let real = files.real_path(&device_dir(address))?;
    let mut host_bridge = None;
    let mut chain = Vec::new();
    for part in real.components().map(|c| c.as_os_str().to_string_lossy()) {
        if part.starts_with("pci") && part.contains(':') {
            host_bridge = Some(part.to_string());
            chain.clear();
        } else if let Some(bridge) = PciAddress::parse(&part) {
            chain.push(bridge);
        }
    }
    match chain.pop() {
        Some(last) if last == address => Some((host_bridge?, chain)),
        _ => None,
    }
}

/// The link a device trained and its maximum, from sysfs (`current_link_speed` …).
pub fn link(files: &Sysfs, address: PciAddress) -> Option<SysfsLink> {
    let dir = device_dir(address);
    let read = |name: &str| files.read(&format!("{dir}/{name}"));
    Some(SysfsLink {
        generation: generation_of(&read("current_link_speed")?)?,
        width: read("current_link_width")?.parse().ok()?,
        max_generation: generation_of(&read("max_link_speed")?)?,
        max_width: read("max_link_width")?.parse().ok()?,
    })
}

/// A bridge's ACS control register, from its config space in sysfs.
pub fn acs(files: &Sysfs, address: PciAddress) -> Acs {
    match files.read_bytes(&format!("{}/config", device_dir(address))) {
        Err(why) => Acs::Unreadable(why),
        Ok(config) => acs_in_config(&config),
    }
}

/// The PCIe generation of a sysfs link speed (`32.0 GT/s PCIe`, older kernels `8 GT/s`).
fn generation_of(speed: &str) -> Option<u32> {
    let rate: f64 = speed.split_whitespace().next()?.parse().ok()?;
    [
        (2.5, 1),
        (5.0, 2),
        (8.0, 3),
        (16.0, 4),
        (32.0, 5),
        (64.0, 6),
    ]
    .iter()
    .find(|(gts, _)| (rate - gts).abs() < 0.01)
    .map(|&(_, generation)| generation)
}

/// The ACS control register found by walking the extended capabilities of a config space dump.
fn acs_in_config(config: &[u8]) -> Acs {
    if config.len() <= EXTENDED_CAPABILITIES {
        return Acs::Unreadable(format!(
            "only {} bytes of config space are readable (the extended capabilities need root)",
            config.len()
        ));
    }
    let dword = |at: usize| {
        config
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut at = EXTENDED_CAPABILITIES;
    // Each capability names the next; a list longer than config space can hold is broken.
    for _ in 0..(config.len() / 4) {
        let Some(header) = dword(at) else {
            break;
        };
        if header == 0 || header == u32::MAX {
            break;
        }
        if header & 0xffff == ACS_CAPABILITY {
            return match config.get(at + 6..at + 8) {
                Some(b) => Acs::Control(AcsControl(u16::from_le_bytes([b[0], b[1]]))),
                None => Acs::Unreadable("the ACS capability is cut off".into()),
            };
        }
        let next = ((header >> 20) & 0xffc) as usize;
        if next < EXTENDED_CAPABILITIES {
            break;
        }
        at = next;
    }
    Acs::Absent
}

/// The ACS control of every device `lspci -D -vvv` printed one for, by address.
pub fn lspci_acs(text: &str) -> Vec<(PciAddress, AcsControl)> {
    let mut found = Vec::new();
    let mut current = None;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            current = line.split_whitespace().next().and_then(PciAddress::parse);
            continue;
        }
        let (Some(device), Some(flags)) = (current, line.trim().strip_prefix("ACSCtl:")) else {
            continue;
        };
        let bits = flags.split_whitespace().fold(0u16, |bits, flag| {
            match ACS_BITS.iter().position(|name| flag == format!("{name}+")) {
                Some(bit) => bits | 1 << bit,
                None => bits,
            }
        });
        found.push((device, AcsControl(bits)));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn addr(text: &str) -> PciAddress {
        PciAddress::parse(text).unwrap()
    }

    /// A fake host: a root port, a switch (upstream and downstream port) and a GPU below it,
    /// linked from /sys/bus/pci/devices as the kernel links them.
    fn host_with_switch() -> (tempfile::TempDir, Sysfs) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let chain = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0";
        fs::create_dir_all(root.join(chain)).unwrap();
        fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        let mut path = String::from("sys/devices/pci0000:00");
        for bdf in [
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:08.0",
            "0000:05:00.0",
        ] {
            path = format!("{path}/{bdf}");
            std::os::unix::fs::symlink(
                format!("../../../../{path}"),
                root.join(format!("sys/bus/pci/devices/{bdf}")),
            )
            .unwrap();
        }
        let files = Sysfs::at(root);
        (dir, files)
    }

    fn write(files: &Sysfs, relative: &str, text: &str) {
        let path = files.root().join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn the_upstream_chain_follows_the_sysfs_link() {
        let (_dir, files) = host_with_switch();
        let (host_bridge, chain) = upstream(&files, addr("0000:05:00.0")).unwrap();
        assert_eq!(host_bridge, "pci0000:00");
        assert_eq!(
            chain,
            [
                addr("0000:00:01.0"),
                addr("0000:01:00.0"),
                addr("0000:02:08.0")
            ]
        );
        assert!(upstream(&files, addr("0000:09:00.0")).is_none());
    }

    #[test]
    fn link_speeds_become_generations() {
        let (_dir, files) = host_with_switch();
        let gpu = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0";
        write(
            &files,
            &format!("{gpu}/current_link_speed"),
            "16.0 GT/s PCIe\n",
        );
        write(&files, &format!("{gpu}/max_link_speed"), "32.0 GT/s PCIe\n");
        write(&files, &format!("{gpu}/current_link_width"), "8\n");
        write(&files, &format!("{gpu}/max_link_width"), "16\n");
        let link = link(&files, addr("0000:05:00.0")).unwrap();
        assert_eq!(
            link,
            SysfsLink {
                generation: 4,
                width: 8,
                max_generation: 5,
                max_width: 16
            }
        );
        assert_eq!(generation_of("8 GT/s"), Some(3));
        assert_eq!(generation_of("2.5 GT/s PCIe"), Some(1));
        assert_eq!(generation_of("Unknown"), None);
    }

    #[test]
    fn the_iommu_is_read_from_the_group_type_or_the_command_line() {
        let (_dir, files) = host_with_switch();
        let gpu = addr("0000:05:00.0");
        assert_eq!(iommu(&files, gpu), None, "no iommu_groups directory");
        fs::create_dir_all(files.root().join("sys/kernel/iommu_groups")).unwrap();
        assert_eq!(iommu(&files, gpu).unwrap().0, Iommu::Off);

        fs::create_dir_all(files.root().join("sys/kernel/iommu_groups/7")).unwrap();
        write(
            &files,
            "proc/cmdline",
            "BOOT_IMAGE=/vmlinuz ro intel_iommu=on quiet",
        );
        let (state, evidence) = iommu(&files, gpu).unwrap();
        assert_eq!(state, Iommu::Translating);
        assert!(evidence.contains("intel_iommu=on"), "{evidence}");
        write(&files, "proc/cmdline", "ro intel_iommu=on iommu=pt");
        assert_eq!(iommu(&files, gpu).unwrap().0, Iommu::Passthrough);

        let group = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0";
        fs::create_dir_all(files.root().join("sys/kernel/iommu_groups/7")).unwrap();
        std::os::unix::fs::symlink(
            files.root().join("sys/kernel/iommu_groups/7"),
            files.root().join(format!("{group}/iommu_group")),
        )
        .unwrap();
        write(&files, "sys/kernel/iommu_groups/7/type", "DMA-FQ\n");
        let (state, evidence) = iommu(&files, gpu).unwrap();
        assert_eq!(
            state,
            Iommu::Translating,
            "the group type wins over iommu=pt"
        );
        assert!(evidence.contains("DMA-FQ"), "{evidence}");
        write(&files, "sys/kernel/iommu_groups/7/type", "identity\n");
        assert_eq!(iommu(&files, gpu).unwrap().0, Iommu::Passthrough);
    }

    #[test]
    fn virtual_machines_show_in_dmi_and_cpu_flags() {
        let (_dir, files) = host_with_switch();
        assert_eq!(hypervisor_flag(&files), None);
        write(&files, "sys/class/dmi/id/sys_vendor", "QEMU\n");
        write(
            &files,
            "sys/class/dmi/id/product_name",
            "Standard PC (Q35 + ICH9, 2009)\n",
        );
        write(
            &files,
            "proc/cpuinfo",
            "processor\t: 0\nflags\t\t: fpu vme sse2 hypervisor lahf_lm\n",
        );
        assert_eq!(hypervisor_flag(&files), Some(true));
        assert_eq!(
            dmi(&files),
            (
                Some("QEMU".into()),
                Some("Standard PC (Q35 + ICH9, 2009)".into())
            )
        );
        write(&files, "proc/cpuinfo", "flags\t\t: fpu vme sse2\n");
        assert_eq!(hypervisor_flag(&files), Some(false));
    }

    /// 4 KiB of config space with an AER capability at 0x100 pointing to ACS at 0x148.
    fn config_with_acs(control: u16) -> Vec<u8> {
        let mut config = vec![0u8; 4096];
        let aer: u32 = 0x0001 | (1 << 16) | (0x148 << 20);
        config[0x100..0x104].copy_from_slice(&aer.to_le_bytes());
        let acs: u32 = ACS_CAPABILITY | (1 << 16);
        config[0x148..0x14c].copy_from_slice(&acs.to_le_bytes());
        config[0x14e..0x150].copy_from_slice(&control.to_le_bytes());
        config
    }

    #[test]
    fn acs_is_found_in_extended_config_space() {
        let (_dir, files) = host_with_switch();
        let port = addr("0000:02:08.0");
        let config = "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/config";
        let path = files.root().join(config);
        fs::write(&path, config_with_acs(0b0001_1101)).unwrap();
        let Acs::Control(control) = acs(&files, port) else {
            panic!("{:?}", acs(&files, port))
        };
        assert!(control.redirects());
        assert_eq!(
            control.describe(),
            "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
        );
        fs::write(&path, config_with_acs(0b0001_0001)).unwrap();
        assert_eq!(acs(&files, port), Acs::Control(AcsControl(0b1_0001)));
        assert!(!AcsControl(0b1_0001).redirects());

        // What a user other than root reads: the first 64 bytes.
        fs::write(&path, [0u8; 64]).unwrap();
        assert!(matches!(acs(&files, port), Acs::Unreadable(why) if why.contains("need root")));
        let mut without = config_with_acs(0);
        without[0x100..0x104].copy_from_slice(&0x0001_0001u32.to_le_bytes());
        fs::write(&path, without).unwrap();
        assert_eq!(acs(&files, port), Acs::Absent);
        assert!(matches!(
            acs(&files, addr("0000:7f:00.0")),
            Acs::Unreadable(_)
        ));
    }

    #[test]
    fn a_looping_capability_list_ends() {
        let mut config = vec![0u8; 4096];
        let looping: u32 = 0x0001 | (0x100 << 20);
        config[0x100..0x104].copy_from_slice(&looping.to_le_bytes());
        assert_eq!(acs_in_config(&config), Acs::Absent);
    }

    #[test]
    fn lspci_acs_lines_are_read_per_device() {
        let text = include_str!("../../tests/fixtures/doctor/lspci-vvv.txt");
        let found = lspci_acs(text);
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].0, addr("0000:02:08.0"));
        assert!(found[0].1.redirects());
        assert_eq!(found[1].0, addr("0000:02:10.0"));
        assert!(!found[1].1.redirects());
        assert_eq!(found[1].1, AcsControl(0b1_0001));
    }

    #[test]
    fn iommu_parameters_are_picked_from_the_command_line() {
        let (_dir, files) = host_with_switch();
        write(
            &files,
            "proc/cmdline",
            "ro amd_iommu=on iommu=pt quiet noiommu=1",
        );
        assert_eq!(iommu_parameters(&files), ["amd_iommu=on", "iommu=pt"]);
    }
}
