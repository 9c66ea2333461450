//! PCI addresses, in the spellings of the driver, NVML and sysfs.

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
}
