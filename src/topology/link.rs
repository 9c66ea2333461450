//! The link between two GPUs, in `nvidia-smi topo -m`'s vocabulary.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// How two GPUs are connected, best first.
///
/// NVLink is direct; the PCIe classes name the farthest thing a transfer crosses: `PIX` one PCIe
/// switch, `PXB` several switches but no host bridge, `PHB` a host bridge (the CPU's root complex),
/// `NODE` several host bridges inside one NUMA node, `SYS` the link between CPU sockets. `NET` joins
/// GPUs of different hosts (NCCL's name for a path through the network): no P2P, only NICs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Link {
    /// Direct NVLink (or NVSwitch) with this many links.
    NvLink(u32),
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
    /// Different hosts: the bytes go through NICs and the network.
    Net,
}

impl Link {
    /// Whether the pair talks over NVLink.
    pub fn is_nvlink(self) -> bool {
        matches!(self, Link::NvLink(_))
    }

    /// Whether traffic between the pair crosses the CPU sockets' interconnect.
    pub fn crosses_sockets(self) -> bool {
        self == Link::Sys
    }

    /// Whether the two ends sit on different hosts.
    pub fn crosses_hosts(self) -> bool {
        self == Link::Net
    }

    /// Whether the path goes through the CPU between host bridges (`NODE`) or sockets (`SYS`):
    /// where a GPU's nearest NIC is that far, GPUDirect RDMA brings no benefit.
    pub fn crosses_cpu(self) -> bool {
        matches!(self, Link::Node | Link::Sys)
    }

    /// Whether this is one of the PCIe path classes (`PIX` … `SYS`).
    pub fn is_pcie(self) -> bool {
        !self.is_nvlink() && !self.crosses_hosts()
    }

    /// One-line meaning, for legends.
    pub fn meaning(self) -> &'static str {
        match self {
            Link::NvLink(_) => "NVLink with this many bonded links (direct, or through NVSwitch)",
            Link::Pix => "PCIe, at most one PCIe switch",
            Link::Pxb => "PCIe, several PCIe switches, no host bridge",
            Link::Phb => "PCIe through a host bridge (CPU root complex)",
            Link::Node => "PCIe across host bridges within one NUMA node",
            Link::Sys => "PCIe across the CPU sockets' interconnect (QPI/UPI/xGMI)",
            Link::Net => "different hosts: through their NICs and the network, no P2P",
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Link::NvLink(n) => write!(f, "NV{n}"),
            Link::Pix => f.write_str("PIX"),
            Link::Pxb => f.write_str("PXB"),
            Link::Phb => f.write_str("PHB"),
            Link::Node => f.write_str("NODE"),
            Link::Sys => f.write_str("SYS"),
            Link::Net => f.write_str("NET"),
        }
    }
}

impl FromStr for Link {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let upper = s.trim().to_ascii_uppercase();
        match upper.as_str() {
            "PIX" => Ok(Link::Pix),
            "PXB" => Ok(Link::Pxb),
            "PHB" => Ok(Link::Phb),
            "NODE" => Ok(Link::Node),
            "SYS" => Ok(Link::Sys),
            "NET" => Ok(Link::Net),
            _ => match upper.strip_prefix("NV").map(str::parse::<u32>) {
                Some(Ok(n)) if n > 0 => Ok(Link::NvLink(n)),
                _ => Err(format!(
                    "unknown link `{s}`: expected NV<n> (n ≥ 1), PIX, PXB, PHB, NODE, SYS or NET"
                )),
            },
        }
    }
}

impl Serialize for Link {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Link {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Link {
    fn schema_name() -> Cow<'static, str> {
        "Link".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "How two GPUs are connected, in `nvidia-smi topo -m`'s vocabulary: \
                            `NV<n>` (n bonded NVLinks, direct or through NVSwitch), `PIX`, `PXB`, \
                            `PHB`, `NODE`, `SYS`; `NET` between GPUs of different hosts.",
            "type": "string",
            "pattern": "^(NV[1-9][0-9]*|PIX|PXB|PHB|NODE|SYS|NET)$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_nvidia_smi_vocabulary() {
        for text in ["NV18", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS", "NET"] {
            let link: Link = text.parse().unwrap();
            assert_eq!(link.to_string(), text);
        }
        assert_eq!("nv2".parse::<Link>().unwrap(), Link::NvLink(2));
    }

    #[test]
    fn rejects_unknown_and_zero_links() {
        assert!("NV0".parse::<Link>().is_err());
        assert!("NVX".parse::<Link>().is_err());
        assert!("QPI".parse::<Link>().is_err());
    }

    #[test]
    fn orders_best_first() {
        assert!(Link::NvLink(2) < Link::Pix);
        assert!(Link::Pix < Link::Sys);
        assert!(Link::Sys < Link::Net);
        assert!(Link::Sys.crosses_sockets());
        assert!(!Link::Node.crosses_sockets());
    }

    #[test]
    fn serializes_as_a_string() {
        let json = serde_json::to_string(&Link::NvLink(4)).unwrap();
        assert_eq!(json, "\"NV4\"");
        let back: Link = serde_json::from_str("\"SYS\"").unwrap();
        assert_eq!(back, Link::Sys);
    }
}
