//! PCI addresses, and how far apart two PCI devices are in `nvidia-smi topo -m`'s classes.
//!
//! The distance is read the way NCCL reads it (`src/graph/xml.cc`, `ncclTopoGetXmlFromSys`, and
//! `src/graph/paths.cc`): from a device, its parent in the tree is the bridge two directories up,
//! the upstream port of the PCIe switch it hangs from (the downstream port between is skipped),
//! until the directory above is no PCI address but the host bridge (`pci0000:00`). Two devices are
//! then `PIX` when one switch joins them, `PXB` when several do, `PHB` when only their host bridge
//! does, `NODE` across host bridges of one NUMA node and `SYS` across NUMA nodes. NCCL's own view
//! has no host bridges (it hangs every tree of a NUMA node from one CPU), so what it calls `PHB`
//! is `PHB` or `NODE` here.

use super::Link;

/// A PCI address, parsed from any of the driver's, NVML's or sysfs's spellings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddress {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

impl PciAddress {
    /// Parses `0000:18:00.0` (driver, sysfs) or `00000000:18:00.0` (NVML), in either case.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().trim_end_matches('\0').split(':');
        let (domain, bus, rest) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let (device, function) = rest.split_once('.')?;
        Some(PciAddress {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u8::from_str_radix(bus, 16).ok()?,
            device: u8::from_str_radix(device, 16).ok()?,
            function: u8::from_str_radix(function, 16).ok()?,
        })
    }

    /// NVML's and `nvidia-smi -q`'s spelling, `00000000:18:00.0`: the one peerlink reports.
    pub fn nvml_form(self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// The directory name under /sys/bus/pci/devices: lower case, four-digit domain.
    pub fn sysfs_form(self) -> String {
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// Where a PCI device hangs in its host's tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciPlace {
    /// The host bridge above it (`pci0000:00`); `None` where the source does not say (NCCL's
    /// dump).
    pub root: Option<String>,
    /// The NUMA node of its root, where known.
    pub numa_node: Option<i32>,
    /// The PCIe switches above it, topmost first, each named by its upstream port's address.
    pub switches: Vec<PciAddress>,
}

impl PciPlace {
    /// The place of the device at `path`, the directories from /sys/devices down to it
    /// (`["pci0000:00", "0000:00:01.0", …, "0000:1a:00.0"]`), or `None` where it hangs from no
    /// PCI host bridge.
    pub fn from_sysfs(path: &[&str], numa_node: Option<i32>) -> Option<PciPlace> {
        let root = path.first().filter(|c| c.starts_with("pci"))?;
        let addresses: Vec<Option<PciAddress>> =
            path.iter().map(|c| PciAddress::parse(c)).collect();
        addresses.last()?.as_ref()?;
        let mut switches = Vec::new();
        let mut at = path.len() - 1;
        // Two directories up at a time while both are PCI addresses (index 0 is the host bridge).
        while at >= 3 {
            match (addresses[at - 1], addresses[at - 2]) {
                (Some(_), Some(upstream)) => {
                    switches.push(upstream);
                    at -= 2;
                }
                _ => break,
            }
        }
        switches.reverse();
        Some(PciPlace {
            root: Some(root.to_ascii_lowercase()),
            numa_node,
            switches,
        })
    }

    /// How far apart two devices are, in `nvidia-smi topo -m`'s PCIe classes.
    pub fn class_to(&self, other: &PciPlace) -> Link {
        if let (Some(a), Some(b)) = (self.numa_node, other.numa_node) {
            if a != b {
                return Link::Sys;
            }
        }
        let shared = self
            .switches
            .iter()
            .zip(&other.switches)
            .take_while(|(a, b)| a == b)
            .count();
        if shared > 0 {
            // The lowest shared switch, and every switch below it on either side.
            let crossed = 1 + (self.switches.len() - shared) + (other.switches.len() - shared);
            return if crossed == 1 { Link::Pix } else { Link::Pxb };
        }
        match (&self.root, &other.root) {
            (Some(a), Some(b)) if a != b => Link::Node,
            _ => Link::Phb,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> PciAddress {
        PciAddress::parse(text).unwrap()
    }

    #[test]
    fn bus_ids_of_driver_and_nvml_spellings_are_one_address() {
        let from_driver = addr("0000:18:00.0");
        let from_nvml = addr("00000000:18:00.0");
        assert_eq!(from_driver, from_nvml);
        assert_eq!(from_driver.nvml_form(), "00000000:18:00.0");
        assert_eq!(addr("0000:c7:00.0").nvml_form(), "00000000:C7:00.0");
        assert_eq!(addr("00000001:C7:1F.3").sysfs_form(), "0001:c7:1f.3");
    }

    #[test]
    fn malformed_bus_ids_are_rejected() {
        for bad in [
            "",
            "18:00.0",
            "0000:18:00",
            "0000:18:00.0:1",
            "zz:18:00.0",
            "0000:180:00.0",
        ] {
            assert!(PciAddress::parse(bad).is_none(), "{bad}");
        }
    }

    fn place(path: &str, numa: i32) -> PciPlace {
        let parts: Vec<&str> = path.split('/').collect();
        PciPlace::from_sysfs(&parts, Some(numa)).unwrap()
    }

    #[test]
    fn a_switch_is_named_by_its_upstream_port_two_levels_up() {
        // Root port 00:01.0, switch upstream 01:00.0, downstream 02:00.0, device 03:00.0.
        let p = place(
            "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0",
            0,
        );
        assert_eq!(p.switches, vec![addr("0000:01:00.0")]);
        assert_eq!(p.root.as_deref(), Some("pci0000:00"));
        // A device on a root port has no switch above it; so has one right under the host bridge
        // (a virtual machine's flat bus).
        assert!(place("pci0000:00/0000:00:01.0/0000:05:00.0", 0)
            .switches
            .is_empty());
        assert!(place("pci0000:00/0000:00:06.0", 0).switches.is_empty());
        // Not under a PCI host bridge, or not a PCI device: no place.
        assert!(PciPlace::from_sysfs(&["platform", "virtio0"], None).is_none());
        assert!(PciPlace::from_sysfs(&["pci0000:00", "0000:00:01.0", "net"], None).is_none());
    }

    #[test]
    fn classes_follow_what_joins_the_two_devices() {
        let sw = "pci0000:00/0000:00:01.0/0000:01:00.0";
        let gpu = place(&format!("{sw}/0000:02:00.0/0000:03:00.0"), 0);
        let same_switch = place(&format!("{sw}/0000:02:01.0/0000:04:00.0"), 0);
        assert_eq!(gpu.class_to(&same_switch), Link::Pix);
        // Under a second-level switch below the first: two switches.
        let deeper = place(
            &format!("{sw}/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0"),
            0,
        );
        assert_eq!(gpu.class_to(&deeper), Link::Pxb);
        let other_port = place("pci0000:00/0000:00:02.0/0000:08:00.0", 0);
        assert_eq!(gpu.class_to(&other_port), Link::Phb);
        let other_bridge = place("pci0000:40/0000:40:01.0/0000:41:00.0", 0);
        assert_eq!(gpu.class_to(&other_bridge), Link::Node);
        let other_socket = place("pci0000:80/0000:80:01.0/0000:81:00.0", 1);
        assert_eq!(gpu.class_to(&other_socket), Link::Sys);
        assert_eq!(other_socket.class_to(&gpu), Link::Sys);
    }
}
